"""The draft kernel P_n( . | y) = N(m^p_n(y), s_n^2 I) (algorithms.md section 2).

A draft only supplies the mean m^p; the scale is the target's. Exactness never depends on the
draft, only speed does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import torch

from ..kernels import Kernel


def _per_level(coefficient: torch.Tensor, d: int, x: torch.Tensor) -> torch.Tensor:
    """Depth d's scalar coefficients (A,) shaped to broadcast against nodes x (P, A, *shape)."""
    return coefficient[d].view(1, -1, *[1] * (x.dim() - 2))


@dataclass
class AffineLevels:
    """A draft whose mean is piecewise affine in the state, per trajectory and depth d below the root:

        m^p_d(x) = a_d x + b_d + g_d clip(h_d x + o_d)

    a, g, h (L, A) scalars; b, o (L, A, *shape), or (1, A, *shape) where they are the same at every
    depth; g None where the mean is affine (then h and o are None too); clip: the kernel's clip range.
    `output` (A, *shape): the target's own mean with this output frozen at every depth (freeze out:
    a, b, g, h, o = A, B out, C, D, E out of the kernel at the depth's step, made on demand), which the
    sampling round forms from the step coefficients it gathers anyway. The round drafts a whole round
    of such a draft as one linear recursion in (x, h x + o) (specdemo.sampling.round). Called as
    means(d, x) it gives m^p at nodes x (P, A, *shape) of depth d."""

    a: torch.Tensor | None = None
    b: torch.Tensor | None = None
    g: torch.Tensor | None = None
    h: torch.Tensor | None = None
    o: torch.Tensor | None = None
    clip: float | None = None
    output: torch.Tensor | None = None
    kernel: Kernel | None = None
    steps: torch.Tensor | None = None
    network_levels = 0

    @classmethod
    def of_output(cls, kernel: Kernel, steps: torch.Tensor, output: torch.Tensor) -> AffineLevels:
        return cls(clip=kernel.clip_range, output=output, kernel=kernel, steps=steps)

    def explicit(self) -> AffineLevels:
        """The same draft with a, b, g, h, o made (an output form's from the kernel's coefficients)."""
        output, kernel, steps = self.output, self.kernel, self.steps
        if output is None:
            return self
        assert kernel is not None and steps is not None  # of_output gives an output form all three
        k = kernel.step_scalars(steps, output.dtype)
        lift = lambda c: c.view(*steps.shape, *[1] * (output.dim() - 1))
        out = output[None]
        clipped = self.clip is not None
        return AffineLevels(
            k.A,
            lift(k.B) * out,
            k.C if clipped else None,
            k.D if clipped else None,
            lift(k.E) * out if clipped else None,
            self.clip,
        )

    def __call__(self, d: int, x: torch.Tensor) -> torch.Tensor:
        if self.output is not None:
            return self.explicit()(d, x)
        return self._mean(lambda rows: rows[min(d, rows.shape[0] - 1)], lambda c: _per_level(c, d, x), x)

    def at_levels(self, x: torch.Tensor) -> torch.Tensor:
        """m^p_d(x[d]) for every depth d < D at once, x (D, A, *shape) holding depth d's nodes at x[d]: what
        calling the draft at each depth in turn gives, in one pass (planning.forms prices every level so)."""
        if self.output is not None:
            return self.explicit().at_levels(x)
        depth = x.shape[0]
        return self._mean(lambda rows: rows[:depth], lambda c: c[:depth].view(depth, -1, *[1] * (x.dim() - 2)), x)

    def _mean(
        self,
        rows: Callable[[torch.Tensor], torch.Tensor],
        scalars: Callable[[torch.Tensor], torch.Tensor],
        x: torch.Tensor,
    ) -> torch.Tensor:
        """a x + b + g clip(h x + o) at nodes x: b and o (one row for every depth, or a row each) taken by `rows`,
        the (L, A) scalars a, g and h shaped against x by `scalars`."""
        assert self.a is not None and self.b is not None  # an explicit draft's coefficients
        m = torch.addcmul(rows(self.b), scalars(self.a), x)
        if self.g is not None:
            assert self.o is not None and self.h is not None and self.clip is not None  # g comes with h, o and clip
            inner = torch.addcmul(rows(self.o), scalars(self.h), x).clamp_(-self.clip, self.clip)
            m.addcmul_(scalars(self.g), inner)
        return m


class LevelFunction:
    """A draft whose mean at depth d is any function of the nodes: level(d, x (P, A, *shape)) -> m^p
    (P, A, *shape) (a draft network: one call a level); network_levels: the draft-network calls a round
    of it makes."""

    def __init__(self, level: Callable[[int, torch.Tensor], torch.Tensor], network_levels: int = 0) -> None:
        self.level, self.network_levels = level, network_levels

    def __call__(self, d: int, x: torch.Tensor) -> torch.Tensor:
        return self.level(d, x)


LevelMeans = AffineLevels | LevelFunction


class FrozenHistory(TypedDict, total=False):
    """The history Draft.frozen_value reads where the draft has frozen_history (its `previous` and `earlier`)."""

    previous: torch.Tensor
    earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


D = TypeVar("D", bound="Draft")


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
    exact_at_known_root = False  # where the round's root output is known, m^p at depth 0 is the target's mean
    frozen_is_output = False  # frozen_value returns the output itself

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        """m^p for a round of A trajectories over L levels, steps (L, A) the step n + d of each
        depth d below each root: AffineLevels where the mean is piecewise affine in the state, else a
        LevelFunction, both taking the nodes of a depth as (P, A, *shape). frozen (A, *frozen_shape) is
        each trajectory's frozen value, cond its conditioning. What depends on the steps alone is set up
        here once per round, not once per level."""
        raise NotImplementedError

    def check(self, kernel: Kernel) -> None:
        """Refuse a kernel this draft cannot serve, with a reason."""

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one trajectory's frozen value."""
        return tuple(shape)

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
        """What a draft that uses_frozen keeps from a target evaluation (out at states x (A, *shape), steps
        n (A,)). Only a draft with frozen_history is passed, where the sampler has them, `previous`
        (A, *frozen_shape), the value the trajectory held before (zeros for a trajectory that held
        none), and `earlier` (out, x, n), the target output at the node one step above (the parent of
        the node evaluated, from the same call; at the same step as n where that node is the root).
        cond: the trajectories' conditioning (a draft that calls its network there)."""
        raise NotImplementedError

    def cold_value(
        self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, int]:
        """A cold_start draft's frozen value (A, *frozen_shape) for trajectories' first round, before any
        target output of them exists (states x (A, *shape) at steps n (A,)), and the draft-network calls
        it took."""
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def parts(self) -> tuple[Draft, ...]:
        """This draft, then the drafts it is made of, outermost first (a wrapper lists its base's parts)."""
        return (self,)

    def part(self, kind: type[D]) -> D | None:
        """The outermost of parts() that is a `kind`, or None: what a caller looks for in a draft, without
        unwrapping it by type."""
        return next((p for p in self.parts() if isinstance(p, kind)), None)
