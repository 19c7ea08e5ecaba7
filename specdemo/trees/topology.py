"""Draft topologies (algorithms.md section 4): widths per depth, stored breadth-first.

Node 0 is the root (the committed state); every node at depth d - 1 has widths[d - 1] children.
Breadth-first order puts a parent before its children and makes the tree truncated at depth l
a prefix of the node list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import torch

from ..config import TOPOLOGY_HELP
from ..errors import SpecdemoError

MAX_DEPTH = 128  # at 1,000 steps, where nearly every node is accepted, chains still gain past depth 64
MAX_NODES = 4096
MAX_TEXT = 600  # characters of a topology string (a chain of MAX_DEPTH written out takes 255)


def _bounded(value: int, limit: int, what: str) -> int:
    if value > limit:
        raise SpecdemoError(f"tree {what} {value} is over the limit of {limit}; accepted: {TOPOLOGY_HELP}")
    return value


@dataclass(frozen=True)
class Topology:
    """widths = (w_1, ..., w_L). () is plain target sampling: no speculation."""

    widths: tuple[int, ...]

    def __post_init__(self):
        if any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise SpecdemoError(
                f"tree widths must be positive integers, got {list(self.widths)}; accepted: {TOPOLOGY_HELP}"
            )
        if len(self.widths) > MAX_DEPTH:
            raise SpecdemoError(f"tree depth {len(self.widths)} is over the limit of {MAX_DEPTH}")
        if self.num_drafted > MAX_NODES:
            raise SpecdemoError(
                f"tree {self} drafts {self.num_drafted} nodes per round, over the limit of {MAX_NODES}; "
                "use fewer or narrower levels"
            )

    @classmethod
    def chain(cls, length: int) -> Topology:
        return cls((1,) * length)

    @classmethod
    def uniform(cls, k: int, depth: int) -> Topology:
        return cls((k,) * depth)

    @classmethod
    def parse(cls, text: str) -> Topology:
        """Parse "3,2,1", "4x4", "1x5" or "chain:5"; refuse anything else with a reason."""
        spec = str(text).strip().lower().replace(" ", "")
        if len(spec) > MAX_TEXT:
            raise SpecdemoError(
                f"tree {spec[:24]!r}... is {len(spec)} characters long, over the limit of {MAX_TEXT}; "
                f"accepted: {TOPOLOGY_HELP}"
            )
        if m := re.fullmatch(r"chain:(\d+)", spec):
            tree = cls.chain(_bounded(int(m.group(1)), MAX_DEPTH, "depth"))
        elif m := re.fullmatch(r"(\d+)x(\d+)", spec):
            # sizes are checked before the widths are built: "1x3000000000" would take gigabytes
            tree = cls.uniform(
                _bounded(int(m.group(1)), MAX_NODES, "width"), _bounded(int(m.group(2)), MAX_DEPTH, "depth")
            )
        elif re.fullmatch(r"\d+(,\d+)*", spec):
            tree = cls(tuple(int(w) for w in spec.split(",")))
        else:
            raise SpecdemoError(f"cannot read tree {text!r}; accepted: {TOPOLOGY_HELP}")
        if not tree.widths:
            raise SpecdemoError(
                f"tree {text!r} has depth 0: a draft needs depth >= 1 (plain sampling is method target)"
            )
        return tree

    def __str__(self) -> str:
        if not self.widths:
            return "none"
        if len(set(self.widths)) == 1:
            return f"{self.widths[0]}x{self.depth}"
        return ",".join(map(str, self.widths))

    def text(self, leaves_evaluated: bool) -> str:
        """The tree in the words every view uses (the plan line, the round view, the export): widths
        as the parser reads them, and whether the target evaluates its leaves ("1x15, leaves
        evaluated": 15 levels drafted, the 15th evaluated too)."""
        return f"{self}, leaves evaluated" if leaves_evaluated else str(self)

    @property
    def depth(self) -> int:
        return len(self.widths)

    # a fixed topology is the plan that uses it at every step (see TopologyPlan)
    def at(self, step: int, root_known: bool = False) -> Topology:
        return self

    def leaves_at(self, step: int, root_known: bool = False) -> bool:
        return False  # evaluated leaves come from the draft's prefetch "leaves"

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def topologies(self) -> tuple[Topology, ...]:
        return (self,)

    @property
    def is_chain(self) -> bool:
        return all(w == 1 for w in self.widths)

    @cached_property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes at depths 0..L (1 for the root)."""
        sizes = [1]
        for w in self.widths:
            sizes.append(sizes[-1] * w)
        return tuple(sizes)

    @cached_property
    def level_starts(self) -> tuple[int, ...]:
        """Index of the first node of each depth 0..L, then the total node count."""
        starts = [0]
        for size in self.level_sizes:
            starts.append(starts[-1] + size)
        return tuple(starts)

    @property
    def num_nodes(self) -> int:
        """All nodes, the root included."""
        return self.level_starts[-1]

    @property
    def num_drafted(self) -> int:
        """B = w_1 + w_1 w_2 + ...: the nodes a round drafts."""
        return self.num_nodes - 1

    def nodes_to_depth(self, depth: int) -> int:
        """How many nodes the tree truncated at `depth` has (a prefix)."""
        return self.level_starts[depth + 1]

    def rows_per_round(self, evaluate_leaves: bool = False) -> int:
        """Target rows of one full round: internal nodes (the root included), plus leaves if evaluated."""
        return self.num_nodes if evaluate_leaves else self.level_starts[self.depth]

    @cached_property
    def parent(self) -> torch.Tensor:
        """parent[i] for every node (-1 for the root)."""
        parent = [-1]
        for d, w in enumerate(self.widths):
            parent += [p for p in range(self.level_starts[d], self.level_starts[d + 1]) for _ in range(w)]
        return torch.tensor(parent, dtype=torch.long)

    @cached_property
    def node_depth(self) -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(self.depth + 1), torch.tensor(self.level_sizes))

    @cached_property
    def first_child(self) -> torch.Tensor:
        """Index of node i's first child (its children are contiguous); num_nodes for leaves."""
        first = torch.full((self.num_nodes,), self.num_nodes, dtype=torch.long)
        for d, w in enumerate(self.widths):
            lo, hi = self.level_starts[d], self.level_starts[d + 1]
            first[lo:hi] = self.level_starts[d + 1] + w * torch.arange(hi - lo)
        return first
