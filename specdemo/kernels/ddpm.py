"""DDPM ancestral sampling (algorithms.md section 1, first row), tables from a DDPMScheduler."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import DDPMScheduler

from ..errors import SpecdemoError
from .base import scheduler_settings
from .vp import VPKernel

VARIANCE_TYPES = ("fixed_small", "fixed_small_log", "fixed_large")  # fixed_large_log: diffusers' own step gives NaN


def default_ddpm_scheduler(**overrides: Any) -> DDPMScheduler:
    """The scheduler the analytic targets use: 1,000 linear betas, no x0 clipping."""
    return DDPMScheduler(**{"num_train_timesteps": 1000, "beta_schedule": "linear", "clip_sample": False, **overrides})


class DDPMKernel(VPKernel):
    """m_n(x) = (x - beta_t / sqrt(1 - abar_t) eps) / sqrt(alpha_t), written as the scheduler does:
    coef_x0 * x0-hat + coef_x * x with x0-hat clipped when the scheduler clips; s_n from the
    scheduler's own `_get_variance` ("fixed_small" is sqrt(beta~_t), "fixed_large" sqrt(beta_t)),
    and s_n = 0 at t = 0, where the scheduler adds no noise.
    """

    name = "ddpm"

    def __init__(self, scheduler: DDPMScheduler, num_inference_steps: int) -> None:
        scheduler = DDPMScheduler.from_config(scheduler.config)
        variance_type = scheduler.config.variance_type
        if variance_type not in VARIANCE_TYPES:
            raise SpecdemoError(
                f"DDPM variance type {variance_type!r} is not supported (a learned variance is not a fixed "
                f"Gaussian scale, and diffusers' fixed_large_log step gives NaN); accepted: {', '.join(VARIANCE_TYPES)}"
            )
        if scheduler.config.thresholding:
            raise SpecdemoError("dynamic thresholding is not supported; use clip_sample or no clipping")
        scheduler.set_timesteps(num_inference_steps)
        self.scheduler = scheduler
        alphas_cumprod = scheduler.alphas_cumprod.to(torch.float64)
        one = torch.as_tensor(scheduler.one, dtype=torch.float64)
        a, b, scales, abar = [], [], [], []
        for t in scheduler.timesteps.tolist():
            prev_t = int(scheduler.previous_timestep(t))
            abar_t = alphas_cumprod[t]
            abar_prev = alphas_cumprod[prev_t] if prev_t >= 0 else one
            alpha_t = abar_t / abar_prev
            a.append(abar_prev.sqrt() * (1 - alpha_t) / (1 - abar_t))
            b.append(alpha_t.sqrt() * (1 - abar_prev) / (1 - abar_t))
            abar.append(abar_t)
            if t > 0:
                v = torch.as_tensor(scheduler._get_variance(t), dtype=torch.float64)
                scales.append(v if variance_type == "fixed_small_log" else v.sqrt())  # _log returns the std itself
            else:
                scales.append(torch.zeros((), dtype=torch.float64))
        stack = torch.stack
        clip = scheduler.config.clip_sample_range if scheduler.config.clip_sample else None
        super().__init__(
            timesteps=scheduler.timesteps.clone(),
            a=stack(a),
            b=stack(b),
            c=torch.zeros(len(a), dtype=torch.float64),
            scales=stack(scales),
            alphas_cumprod_t=stack(abar),
            prediction_type=scheduler.config.prediction_type,
            clip_sample_range=clip,
        )

    def config(self) -> dict[str, Any]:
        return {"kernel": "ddpm", "steps": self.num_steps, "scheduler": scheduler_settings(self.scheduler)}
