"""An independent draft network of the same parameterisation as the target (algorithms.md section 2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels import Kernel
from .base import Draft, LevelFunction, LevelMeans


class NetworkDraft(Draft):
    """m^p_n(y) = formula(y, n, draft_network(y, n)); one draft call per level of a round."""

    calls_network = True

    def __init__(self, network: Callable[..., torch.Tensor], name: str = "network") -> None:
        self.network, self.name = network, name

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        def level(d: int, x: torch.Tensor) -> torch.Tensor:
            p = x.shape[0]
            rows = x.flatten(0, 1)  # (P A, *shape): node-major
            n_rows = steps[d].repeat(p)
            cond_rows = {k: v.repeat(p, *[1] * (v.dim() - 1)) for k, v in cond.items()}
            output = self.level_output(self.network(rows, n_rows, **cond_rows).view_as(x), frozen)
            return kernel.mean(output.flatten(0, 1), rows, n_rows).view_as(x)

        return LevelFunction(level, network_levels=steps.shape[0])

    def level_output(self, output: torch.Tensor, frozen: torch.Tensor | None) -> torch.Tensor:
        """The output the draft's mean is formed from, given the network's at the level's nodes (P, A, *shape)."""
        return output

    def config(self) -> dict[str, Any]:
        return {"draft": self.name}
