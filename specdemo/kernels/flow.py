"""Flow matching with churn (algorithms.md section 1, third row).

x_t = (1 - t) x0 + t xi, velocity v = (x - E[x0 | x_t]) / t. With dt = t_next - t < 0,
g^2 = 2t / (1 - t) and k = c^2 g^2 / (2t):

    m_n(x) = x (1 + dt k) + v(x) dt (1 + k (1 - t)),    s_n = c g(t) sqrt(-dt).

The first step (t = 1, where g diverges) and the last (t_next = 0) are deterministic Euler steps.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ..errors import SpecdemoError
from .base import Kernel, scheduler_settings


class FlowChurnKernel(Kernel):
    """The t grid is the one the given FlowMatchEulerDiscreteScheduler makes (its shift and sigmas; by
    default shift 1 and 1,000 training steps: t_n = linspace(1000, 1, T)[n] / 1000, then 0). The
    network gets 1000 t as its timestep, as diffusers flow models do.
    """

    name = "flow-churn"
    prediction_type = "velocity"

    def __init__(
        self, num_inference_steps: int, churn: float, scheduler: FlowMatchEulerDiscreteScheduler | None = None
    ) -> None:
        if churn < 0:
            raise SpecdemoError(f"churn must be >= 0, got {churn}")
        scheduler = FlowMatchEulerDiscreteScheduler.from_config((scheduler or FlowMatchEulerDiscreteScheduler()).config)
        scheduler.set_timesteps(num_inference_steps)
        self.scheduler, self.churn = scheduler, churn
        t_grid = scheduler.sigmas.to(torch.float64)
        t, t_next = t_grid[:-1], t_grid[1:]
        dt = t_next - t
        stochastic = (t < 1) & (t_next > 0) & (churn > 0)
        g2 = torch.where(stochastic, 2 * t / (1 - t).clamp_min(1e-300), torch.zeros_like(t))
        k = churn**2 * g2 / (2 * t)
        self.t = t
        self.signal, self.noise = 1 - t, t  # x_t = (1 - t) x0 + t xi
        mean_x, mean_o = 1 + dt * k, dt * (1 + k * (1 - t))
        # x0-hat = x - t v
        coefficients = torch.stack([mean_x, mean_o, torch.zeros_like(t), torch.ones_like(t), -t], 1)
        super().__init__(churn * g2.sqrt() * (-dt).sqrt(), scheduler.timesteps.clone(), coefficients)

    def config(self) -> dict[str, Any]:
        return {
            "kernel": "flow-churn",
            "steps": self.num_steps,
            "churn": self.churn,
            "scheduler": scheduler_settings(self.scheduler),
        }
