"""Variance-preserving kernels (DDPM ancestral, DDIM with eta > 0), written in one linear form.

With x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, every VP step of algorithms.md section 1 reads

    m_n(x) = a_n * clip(x0-hat) + b_n * x + c_n * eps-hat,

and x0-hat, eps-hat are linear in (x, network output) for eps-, v- and x0-prediction. The
coefficient tables come from a diffusers scheduler (its own alphas and variances), so a kernel
built here reproduces `scheduler.step` with the noise removed.
"""

from __future__ import annotations

import torch

from ..errors import SpecdemoError
from .base import Kernel

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


class VPKernel(Kernel):
    """A VP kernel from per-step tables: a_n, b_n, c_n, s_n and sqrt(abar_t), sqrt(1 - abar_t)."""

    def __init__(self, *, timesteps, a, b, c, scales, alphas_cumprod_t, prediction_type, clip_sample_range=None):
        if prediction_type not in PREDICTION_TYPES:
            raise SpecdemoError(f"prediction type {prediction_type!r} is not one of {', '.join(PREDICTION_TYPES)}")
        super().__init__(scales, timesteps)
        self.prediction_type = prediction_type
        self.clip_sample_range = clip_sample_range
        self.signal = alphas_cumprod_t.to(torch.float64).sqrt()  # sqrt(abar_t): x_t = signal x0 + noise eps
        self.noise = (1 - alphas_cumprod_t.to(torch.float64)).sqrt()
        s0, s1 = self.signal, self.noise
        # x0-hat = x0_x * x + x0_o * out ; eps-hat = eps_x * x + eps_o * out
        if prediction_type == "epsilon":
            self.x0_x, self.x0_o, self.eps_x, self.eps_o = 1 / s0, -s1 / s0, torch.zeros_like(s0), torch.ones_like(s0)
        elif prediction_type == "v_prediction":
            self.x0_x, self.x0_o, self.eps_x, self.eps_o = s0, -s1, s1, s0
        else:
            self.x0_x, self.x0_o, self.eps_x, self.eps_o = torch.zeros_like(s0), torch.ones_like(s0), 1 / s1, -s0 / s1
        self.a, self.b, self.c = a.to(torch.float64), b.to(torch.float64), c.to(torch.float64)
        if clip_sample_range is None:
            self.mean_x = self.a * self.x0_x + self.b + self.c * self.eps_x
            self.mean_o = self.a * self.x0_o + self.c * self.eps_o
        else:
            self.mean_x = self.b + self.c * self.eps_x
            self.mean_o = self.c * self.eps_o

    def mean(self, out, x, n):
        m = self.per_row("mean_x", self.mean_x, n, x) * x
        m.addcmul_(self.per_row("mean_o", self.mean_o, n, x), out)
        if self.clip_sample_range is not None:
            r = self.clip_sample_range
            m.addcmul_(self.per_row("a", self.a, n, x), self.denoised(out, x, n).clamp_(-r, r))
        return m

    def denoised(self, out, x, n):
        x0 = self.per_row("x0_x", self.x0_x, n, x) * x
        return x0.addcmul_(self.per_row("x0_o", self.x0_o, n, x), out)

    def output_from_denoised(self, x0, x, n):
        # invert x0 = x0_x x + x0_o out for out; x0_o != 0 for every VP parameterisation
        out = x0 - self.per_row("x0_x", self.x0_x, n, x) * x
        return out.div_(self.per_row("x0_o", self.x0_o, n, x))
