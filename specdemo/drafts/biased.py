"""A perturbed draft, for teaching and tests: any draft plus a known bias. Samples stay exact."""

from __future__ import annotations

import math
from dataclasses import replace

from .base import AffineLevels, Draft, LevelFunction


class BiasedDraft(Draft):
    """m^p_n(y) = base m^p_n(y) + bias * s_n * e, e the fixed unit direction (1, ..., 1) / sqrt(d).

    Shifting by bias * s_n adds about `bias` to every node's delta.
    """

    def __init__(self, base: Draft, bias: float):
        self.base, self.bias = base, float(bias)
        self.uses_frozen, self.calls_network = base.uses_frozen, base.calls_network
        self.frozen_history, self.cold_start = base.frozen_history, base.cold_start
        self.frozen_is_output = base.frozen_is_output

    def check(self, kernel):
        self.base.check(kernel)

    def parts(self) -> tuple[Draft, ...]:
        return (self, *self.base.parts())

    def frozen_shape(self, shape):
        return self.base.frozen_shape(shape)

    def frozen_value(self, kernel, out, x, n, **history):
        return self.base.frozen_value(kernel, out, x, n, **history)

    def cold_value(self, kernel, x, n, cond):
        return self.base.cold_value(kernel, x, n, cond)

    def for_round(self, kernel, steps, frozen, cond):
        base = self.base.for_round(kernel, steps, frozen, cond)
        if isinstance(base, AffineLevels):  # the shift joins the constant term b
            base = base.explicit()
            shape = base.b.shape[2:]
            shift = kernel.scale(steps, base.b[:1]) * (self.bias / math.prod(shape) ** 0.5)
            return replace(base, b=base.b + shift.to(base.b.dtype))

        def level(d, x):
            return base(d, x).add_(kernel.scale(steps[d : d + 1], x) * (self.bias / x[0, 0].numel() ** 0.5))

        return LevelFunction(level, network_levels=base.network_levels)

    def config(self):
        return {**self.base.config(), "draft_bias": self.bias}
