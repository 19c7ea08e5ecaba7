"""A topology per step: the tree a round uses depends on the step it starts from."""

from __future__ import annotations

from dataclasses import dataclass

from .topology import Topology


@dataclass(frozen=True)
class TopologyPlan:
    """trees[n] is the tree of a round whose root is at step n (truncated at the horizon as any tree)."""

    trees: tuple[Topology, ...]
    name: str = "plan"

    def at(self, step: int) -> Topology:
        return self.trees[min(step, len(self.trees) - 1)]

    @property
    def max_depth(self) -> int:
        return max(t.depth for t in self.trees)

    @property
    def topologies(self) -> tuple[Topology, ...]:
        return tuple(dict.fromkeys(self.trees))

    @property
    def widths(self) -> tuple[int, ...]:
        """The widest tree's widths (for summaries)."""
        return max(self.trees, key=lambda t: t.num_nodes).widths

    def rows_per_round(self, evaluate_leaves: bool = False) -> float:
        """Mean target rows of a full round over the planned steps."""
        return sum(t.rows_per_round(evaluate_leaves) for t in self.trees) / len(self.trees)

    def __str__(self) -> str:
        return self.name
