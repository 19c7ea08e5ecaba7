"""Unadjusted Langevin (ULA) for an unnormalised density pi (algorithms.md section 1, last row).

m_n(x) = x + gamma grad log pi(x), s_n = sqrt(2 gamma); the network output is the score.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import SpecdemoError
from .base import Kernel


class LangevinKernel(Kernel):
    """N steps of size gamma from Y_0 ~ N(0, init_std^2 I). Every step is stochastic."""

    name = "langevin"
    prediction_type = "score"

    def __init__(self, num_steps: int, gamma: float, init_std: float = 1.0) -> None:
        if not gamma > 0:
            raise SpecdemoError(f"Langevin step size gamma must be > 0, got {gamma}")
        self.gamma, self.init_std = gamma, init_std
        coefficients = torch.tensor([[1.0, gamma, 0.0, float("nan"), float("nan")]], dtype=torch.float64)
        super().__init__(
            torch.full((num_steps,), math.sqrt(2 * gamma), dtype=torch.float64),
            torch.zeros(num_steps),
            coefficients.repeat(num_steps, 1),
            has_denoised=False,
        )

    def prior(
        self, shape: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        return self.init_std * torch.randn(shape, generator=generator, device=device, dtype=dtype)

    def config(self) -> dict[str, Any]:
        return {"kernel": "langevin", "steps": self.num_steps, "gamma": self.gamma, "init_std": self.init_std}
