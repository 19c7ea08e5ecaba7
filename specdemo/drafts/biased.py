"""A perturbed draft, for teaching and tests: any draft plus a known bias. Samples stay exact."""

from __future__ import annotations

import torch

from .base import Draft, LevelMeans


class BiasedDraft(Draft):
    """m^p_n(y) = base m^p_n(y) + bias * s_n * e, e the fixed unit direction (1, ..., 1) / sqrt(d).

    Shifting by bias * s_n adds about `bias` to every node's delta.
    """

    def __init__(self, base: Draft, bias: float):
        self.base, self.bias = base, float(bias)
        self.uses_frozen, self.calls_network = base.uses_frozen, base.calls_network
        self.frozen_history, self.cold_start = base.frozen_history, base.cold_start

    def check(self, kernel):
        self.base.check(kernel)

    def frozen_shape(self, shape):
        return self.base.frozen_shape(shape)

    def frozen_value(self, kernel, out, x, n, **history):
        return self.base.frozen_value(kernel, out, x, n, **history)

    def cold_value(self, kernel, x, n, cond):
        return self.base.cold_value(kernel, x, n, cond)

    def for_round(self, kernel, steps, frozen, cond):
        base = self.base.for_round(kernel, steps, frozen, cond)

        def level(d, x, out=None):
            m = base(d, x, out)
            return m.add_(kernel.scale(steps[:, d], x) * (self.bias / x[0, 0].numel() ** 0.5))
        return LevelMeans(level, network_levels=base.network_levels)

    def config(self):
        return {**self.base.config(), "draft_bias": self.bias}
