"""The draft kernel P_n( . | y) = N(m^p_n(y), s_n^2 I) (algorithms.md section 2).

A draft only supplies the mean m^p; the scale is the target's. Exactness never depends on the
draft, only speed does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels import Kernel

# m^p of the nodes at one depth of a round: (depth below the root, x (A, P, *shape), out) -> (A, P, *shape)
LevelMeans = Callable[..., torch.Tensor]


class Draft:
    """uses_frozen: the mean needs a frozen target output from an earlier target call (the
    sampler keeps one per trajectory). calls_network: each level of a round is one draft-network call.
    """

    uses_frozen = False
    calls_network = False

    def for_round(self, kernel: Kernel, step: torch.Tensor, depth: int, frozen: torch.Tensor | None,
                  cond: dict[str, torch.Tensor]) -> LevelMeans:
        """m^p for a round of A trajectories rooted at steps `step` (A,), for `depth` levels: a
        function of (d, x, out=None) giving the means at nodes x (A, P, *shape) at depth d below the
        root (step + d), written into `out` when given. frozen (A, *frozen_shape) is each
        trajectory's frozen value, cond its conditioning. What depends on the steps alone is set up
        here once per round, not once per level."""
        raise NotImplementedError

    def means(self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor | None,
              cond: dict[str, torch.Tensor]) -> torch.Tensor:
        """m^p_n at the P nodes of each of A trajectories: x (A, P, *shape), n (A,) the nodes' step."""
        return self.for_round(kernel, n, 1, frozen, cond)(0, x)

    def check(self, kernel: Kernel) -> None:
        """Refuse a kernel this draft cannot serve, with a reason."""

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one trajectory's frozen value."""
        return tuple(shape)

    def frozen_value(self, kernel: Kernel, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """What a draft that uses_frozen keeps from a target evaluation."""
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError
