"""A perturbed draft, for teaching and tests: any draft plus a known bias. Samples stay exact."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from ..kernels import Kernel
from .base import AffineLevels, Draft, LevelFunction, LevelMeans


class BiasedDraft(Draft):
    """m^p_n(y) = base m^p_n(y) + bias * s_n * e, e the fixed unit direction (1, ..., 1) / sqrt(d).

    Shifting by bias * s_n adds about `bias` to every node's delta.
    """

    def __init__(self, base: Draft, bias: float) -> None:
        self.base, self.bias = base, float(bias)
        self.uses_frozen, self.calls_network = base.uses_frozen, base.calls_network
        self.frozen_history, self.cold_start = base.frozen_history, base.cold_start
        self.frozen_is_output = base.frozen_is_output

    def check(self, kernel: Kernel) -> None:
        self.base.check(kernel)

    def parts(self) -> tuple[Draft, ...]:
        return (self, *self.base.parts())

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.base.frozen_shape(shape)

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return self.base.frozen_value(kernel, out, x, n, previous=previous, earlier=earlier, cond=cond)

    def cold_value(
        self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, int]:
        return self.base.cold_value(kernel, x, n, cond)

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        base = self.base.for_round(kernel, steps, frozen, cond)
        if isinstance(base, AffineLevels):  # the shift joins the constant term b
            base = base.explicit()
            assert base.b is not None  # explicit() makes the coefficients
            shape = base.b.shape[2:]
            shift = kernel.scale(steps, base.b[:1]) * (self.bias / math.prod(shape) ** 0.5)
            return replace(base, b=base.b + shift.to(base.b.dtype))

        def level(d: int, x: torch.Tensor) -> torch.Tensor:
            return base(d, x).add_(kernel.scale(steps[d : d + 1], x) * (self.bias / x[0, 0].numel() ** 0.5))

        return LevelFunction(level, network_levels=base.network_levels)

    def config(self) -> dict[str, Any]:
        return {**self.base.config(), "draft_bias": self.bias}
