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

    def __init__(
        self,
        *,
        timesteps: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        scales: torch.Tensor,
        alphas_cumprod_t: torch.Tensor,
        prediction_type: str,
        clip_sample_range: float | None = None,
    ) -> None:
        if prediction_type not in PREDICTION_TYPES:
            raise SpecdemoError(f"prediction type {prediction_type!r} is not one of {', '.join(PREDICTION_TYPES)}")
        self.prediction_type = prediction_type
        self.signal = alphas_cumprod_t.to(torch.float64).sqrt()  # sqrt(abar_t): x_t = signal x0 + noise eps
        self.noise = (1 - alphas_cumprod_t.to(torch.float64)).sqrt()
        s0, s1 = self.signal, self.noise
        # x0-hat = x0_x * x + x0_o * out ; eps-hat = eps_x * x + eps_o * out
        if prediction_type == "epsilon":
            x0_x, x0_o, eps_x, eps_o = 1 / s0, -s1 / s0, torch.zeros_like(s0), torch.ones_like(s0)
        elif prediction_type == "v_prediction":
            x0_x, x0_o, eps_x, eps_o = s0, -s1, s1, s0
        else:
            x0_x, x0_o, eps_x, eps_o = torch.zeros_like(s0), torch.ones_like(s0), 1 / s1, -s0 / s1
        a, b, c = a.to(torch.float64), b.to(torch.float64), c.to(torch.float64)
        if clip_sample_range is None:  # a_n x0-hat folds into the linear part
            mean_x, mean_o, clipped = a * x0_x + b + c * eps_x, a * x0_o + c * eps_o, torch.zeros_like(a)
        else:
            mean_x, mean_o, clipped = b + c * eps_x, c * eps_o, a
        super().__init__(scales, timesteps, torch.stack([mean_x, mean_o, clipped, x0_x, x0_o], 1), clip_sample_range)
