"""Unnormalised 2-D densities for Langevin (ULA) sampling, with analytic scores."""

from __future__ import annotations

import torch

from ..errors import SpecdemoError
from ..kernels import Kernel, LangevinKernel


class Density:
    """An unnormalised density pi on R^2: log_density (up to a constant) and its gradient."""

    name: str
    shape = (2,)
    dim = 2

    def log_density(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def score(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def network(self, kernel: Kernel) -> DensityScore:
        if not isinstance(kernel, LangevinKernel):
            raise SpecdemoError(
                f"{self.name} is an unnormalised density: it runs with the langevin kernel only, not {kernel.name}"
            )
        return DensityScore(self)


class DensityScore:
    """Network protocol (x [R, 2], n [R]) -> grad log pi(x); the step does not matter."""

    def __init__(self, density: Density):
        self.density = density

    def __call__(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return self.density.score(x)


class Banana(Density):
    """log pi(x) = -x1^2 / (2 a^2) - (x2 - b (x1^2 - a^2))^2 / 2 (a bent Gaussian)."""

    name = "banana"

    def __init__(self, a: float = 1.5, b: float = 0.5):
        self.a, self.b = a, b

    def log_density(self, x):
        x1, x2 = x[..., 0], x[..., 1]
        return -0.5 * x1**2 / self.a**2 - 0.5 * (x2 - self.b * (x1**2 - self.a**2)) ** 2

    def score(self, x):
        x1, x2 = x[..., 0], x[..., 1]
        r = x2 - self.b * (x1**2 - self.a**2)
        return torch.stack((-x1 / self.a**2 + 2 * self.b * x1 * r, -r), -1)


class Ring(Density):
    """log pi(x) = -(||x|| - radius)^2 / (2 width^2) (a thin annulus)."""

    name = "ring"

    def __init__(self, radius: float = 2.0, width: float = 0.3):
        self.radius, self.width = radius, width

    def log_density(self, x):
        return -0.5 * (x.norm(dim=-1) - self.radius) ** 2 / self.width**2

    def score(self, x):
        norm = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return -(norm - self.radius) / self.width**2 * x / norm
