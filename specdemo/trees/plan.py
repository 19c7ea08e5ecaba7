"""A topology per step: the tree a round uses depends on the step it starts from, on whether the
target output at its root is already known, and the plan says whether its leaves are evaluated."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .topology import Topology


@dataclass(frozen=True)
class ReachRule:
    """Each trajectory cuts its chain, round by round, from its own earlier rounds (algorithms.md
    section 6, the online plan): with A levels accepted of E examined in its rounds so far, its
    acceptance estimate is a^ = (A + prior_accepted) / (E + prior_examined), level j of a chain is
    reached with probability about a^(j - 1), and the round drafts the levels reached with probability
    at least `reach`: d = 1 + floor(ln reach / ln a^) target rows, within [1, most]. The prior, a
    mean of 7/8 weighing as two levels, starts a trajectory on 16 rows at reach 1/8 (the whole chain of
    the CPU's default budget, a quarter of the GPU's) and gives way after a round or two. A trajectory's
    depth depends on its own earlier draws alone, never on the round's own nor on other trajectories'."""

    reach: float = 1 / 8
    prior_accepted: float = 1.75
    prior_examined: float = 2.0

    def __post_init__(self):
        if not 0 < self.reach < 1 or not 0 < self.prior_accepted < self.prior_examined:
            raise ValueError(f"a reach rule needs 0 < reach < 1 and 0 < prior_accepted < prior_examined: {self}")

    def rows(self, accepted: np.ndarray, examined: np.ndarray, most: int) -> np.ndarray:
        """The target rows of each trajectory's next round, from its accepted and examined levels so far."""
        estimate = (accepted + self.prior_accepted) / (examined + self.prior_examined)
        return np.clip(1 + np.floor(math.log(self.reach) / np.log(estimate)), 1, most).astype(np.int64)


@dataclass(frozen=True)
class TopologyPlan:
    """trees[n] is the tree of a round whose root is at step n with its target output not yet
    known, leaves[n] whether that round's leaves are evaluated; known_trees[n] and known_leaves[n]
    the same for a root whose output is known (after a warm-up, or a committed evaluated leaf).
    Trees are truncated at the horizon as any tree. expected_calls, expected_s: the planner's
    prediction of the target calls per trajectory and of the run's seconds (None without a cost
    model), the warm-up included; objective: what the plan minimises, "calls" or "time"; rule: where
    set, every tree is a chain, and each trajectory cuts its round's chain to the rows the rule gives
    it (ReachRule), one level more where its root's output is known."""

    trees: tuple[Topology, ...]
    leaves: tuple[bool, ...]
    known_trees: tuple[Topology, ...]
    known_leaves: tuple[bool, ...]
    expected_calls: float
    expected_s: float | None = None
    objective: str = "calls"
    name: str = "plan"
    rule: ReachRule | None = None

    def __post_init__(self):
        n = len(self.trees)
        for name in ("leaves", "known_trees", "known_leaves"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"a plan of {n} steps needs {n} {name}, got {len(getattr(self, name))}")
        if self.rule is not None and not all(t.is_chain for t in self.topologies):
            raise ValueError("a plan cut by a reach rule is a plan of chains")

    def _index(self, step: int) -> int:
        return min(step, len(self.trees) - 1)

    def at(self, step: int, root_known: bool = False) -> Topology:
        return (self.known_trees if root_known else self.trees)[self._index(step)]

    def leaves_at(self, step: int, root_known: bool = False) -> bool:
        return (self.known_leaves if root_known else self.leaves)[self._index(step)]

    @property
    def predicts(self) -> bool:
        """Whether the plan states expectations (the online plan, made before anything is measured, does not)."""
        return math.isfinite(self.expected_calls)

    @property
    def max_depth(self) -> int:
        return max(t.depth for t in self.topologies)

    @property
    def topologies(self) -> tuple[Topology, ...]:
        return tuple(dict.fromkeys(self.trees + self.known_trees))

    @property
    def widths(self) -> tuple[int, ...]:
        """The widest tree's widths (for summaries)."""
        return max(self.trees, key=lambda t: t.num_nodes).widths

    def rows_per_round(self, evaluate_leaves: bool = False) -> float:
        """Mean target rows of a full round, its root's output not known, over the planned steps."""
        return sum(
            t.rows_per_round(evaluate_leaves or leaves) for t, leaves in zip(self.trees, self.leaves, strict=True)
        ) / len(self.trees)

    def __str__(self) -> str:
        return self.name
