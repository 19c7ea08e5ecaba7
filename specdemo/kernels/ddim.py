"""DDIM with eta > 0 (algorithms.md section 1, second row), tables from a DDIMScheduler."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import DDIMScheduler

from ..errors import SpecdemoError
from .base import scheduler_settings
from .vp import VPKernel


class DDIMKernel(VPKernel):
    """m_n(x) = sqrt(abar_prev) clip(x0-hat) + sqrt(1 - abar_prev - s_n^2) eps-hat,
    s_n = eta * sqrt((1 - abar_prev) / (1 - abar_t)) * sqrt(1 - abar_t / abar_prev),
    the variance taken from the scheduler's own `_get_variance`. eta = 0 makes every step
    deterministic (no speculation possible).
    """

    name = "ddim"

    def __init__(self, scheduler: DDIMScheduler, num_inference_steps: int, eta: float) -> None:
        if not 0.0 <= eta <= 1.0:
            raise SpecdemoError(f"DDIM eta must be in [0, 1], got {eta}")
        scheduler = DDIMScheduler.from_config(scheduler.config)
        if scheduler.config.thresholding:
            raise SpecdemoError("dynamic thresholding is not supported; use clip_sample or no clipping")
        scheduler.set_timesteps(num_inference_steps)
        self.scheduler, self.eta = scheduler, eta
        alphas_cumprod = scheduler.alphas_cumprod.to(torch.float64)
        final = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=torch.float64)
        stride = scheduler.config.num_train_timesteps // num_inference_steps
        a, c, scales, abar = [], [], [], []
        for t in scheduler.timesteps.tolist():
            prev_t = t - stride
            abar_prev = alphas_cumprod[prev_t] if prev_t >= 0 else final
            std = eta * torch.as_tensor(scheduler._get_variance(t, prev_t), dtype=torch.float64).sqrt()
            a.append(abar_prev.sqrt())
            c.append((1 - abar_prev - std**2).clamp_min(0).sqrt())
            scales.append(std)
            abar.append(alphas_cumprod[t])
        stack = torch.stack
        clip = scheduler.config.clip_sample_range if scheduler.config.clip_sample else None
        super().__init__(
            timesteps=scheduler.timesteps.clone(),
            a=stack(a),
            b=torch.zeros(len(a), dtype=torch.float64),
            c=stack(c),
            scales=stack(scales),
            alphas_cumprod_t=stack(abar),
            prediction_type=scheduler.config.prediction_type,
            clip_sample_range=clip,
        )

    def config(self) -> dict[str, Any]:
        return {
            "kernel": "ddim",
            "steps": self.num_steps,
            "eta": self.eta,
            "scheduler": scheduler_settings(self.scheduler),
        }
