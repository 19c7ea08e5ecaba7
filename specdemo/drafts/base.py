"""The draft kernel P_n( . | y) = N(m^p_n(y), s_n^2 I) (algorithms.md section 2).

A draft only supplies the mean m^p; the scale is the target's. Exactness never depends on the
draft, only speed does.
"""

from __future__ import annotations

import torch

from ..kernels import Kernel


class Draft:
    """uses_frozen: the mean needs a frozen target output from an earlier target call (the
    sampler keeps one per trajectory). calls_network: each `means` call is one draft-network call.
    """

    uses_frozen = False
    calls_network = False

    def means(self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor | None,
              cond: dict[str, torch.Tensor]) -> torch.Tensor:
        """m^p_n at the P nodes of each of A trajectories: x (A, P, *shape), n (A,) the nodes' step,
        frozen (A, *shape) the trajectory's frozen value, cond per trajectory."""
        raise NotImplementedError

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
