"""The draft kernel P_n( . | y) = N(m^p_n(y), s_n^2 I) (algorithms.md section 2).

A draft only supplies the mean m^p; the scale is the target's. Exactness never depends on the
draft, only speed does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels import Kernel


class LevelMeans:
    """m^p of the nodes at one depth of a round: means(d, x (A, P, *shape), out=None) -> (A, P, *shape),
    d the depth below the root.

    affine: (alpha (A, L), beta (A, L, *shape)) where m^p at depth d is alpha_d x + beta_d whatever the
    state x (a frozen draft without a clamp on x), else None; a chain is then drafted with one
    operation a level (specdemo.sampling.phases).

    network_levels: how many of the round's levels call a draft network (one call each)."""

    def __init__(self, level: Callable[..., torch.Tensor],
                 affine: tuple[torch.Tensor, torch.Tensor] | None = None, network_levels: int = 0):
        self.level, self.affine, self.network_levels = level, affine, network_levels

    def __call__(self, d: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.level(d, x, out)


class Draft:
    """uses_frozen: the mean needs a frozen target output from an earlier target call (the
    sampler keeps one per trajectory). calls_network: each level of a round is one draft-network call.
    frozen_history: frozen_value also reads the trajectory's previous frozen value and the target
    output one node above the frozen one (a draft that extrapolates in time). cold_start: a draft that
    uses_frozen can draft a trajectory's first round before any target output of it exists
    (cold_value); one that cannot spends a warm-up call on the trajectory's root.
    """

    uses_frozen = False
    calls_network = False
    frozen_history = False
    cold_start = False

    def for_round(self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None,
                  cond: dict[str, torch.Tensor]) -> LevelMeans:
        """m^p for a round of A trajectories over L levels, steps (A, L) the step n + d of each
        depth d below each root: the means at nodes x (A, P, *shape) at depth d, written into `out`
        when given. frozen (A, *frozen_shape) is each trajectory's frozen value, cond its
        conditioning. What depends on the steps alone is set up here once per round, not once per level."""
        raise NotImplementedError

    def means(self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor | None,
              cond: dict[str, torch.Tensor]) -> torch.Tensor:
        """m^p_n at the P nodes of each of A trajectories: x (A, P, *shape), n (A,) the nodes' step."""
        return self.for_round(kernel, n[:, None], frozen, cond)(0, x)

    def check(self, kernel: Kernel) -> None:
        """Refuse a kernel this draft cannot serve, with a reason."""

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one trajectory's frozen value."""
        return tuple(shape)

    def frozen_value(self, kernel: Kernel, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor,
                     previous: torch.Tensor | None = None,
                     earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     cond: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """What a draft that uses_frozen keeps from a target evaluation (out at states x (A, *shape), steps
        n (A,)). Only a draft with frozen_history is passed, where the sampler has them, `previous`
        (A, *frozen_shape), the value the trajectory held before (zeros for a trajectory that held
        none), and `earlier` (out, x, n), the target output at the node one step above (the parent of
        the node evaluated, from the same call; at the same step as n where that node is the root).
        cond: the trajectories' conditioning (a draft that calls its network there)."""
        raise NotImplementedError

    def cold_value(self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor,
                   cond: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """A cold_start draft's frozen value (A, *frozen_shape) for trajectories' first round, before any
        target output of them exists (states x (A, *shape) at steps n (A,)), and the draft-network calls
        it took."""
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError
