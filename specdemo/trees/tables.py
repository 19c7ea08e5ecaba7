"""A topology's index tables on the host (numpy), for the verifiers' walks and the round's bookkeeping.

Nodes are breadth-first (topology.py): node 0 is the root, the nodes of depth d are
level_starts[d]..level_starts[d + 1] - 1, the children of a node are contiguous. The parents (nodes
with children) are the first `num_parents` nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .topology import Topology


@dataclass(frozen=True, eq=False)
class TreeTables:
    """widths, depth, num_nodes, num_parents, level_starts; per node: parent (-1 at the root), node_depth,
    first_child (num_nodes at a leaf), num_children, position (among its siblings); kids (num_parents,
    max_width): each parent's children, padded with its last one; leftmost (num_nodes, depth): node n's
    leftmost descent (n itself at j = 0, the leaf repeated past it), length: its nodes down to the leaf
    (n included); max_attempts = 1 + sum_d (w_d - 1), the most paths one whole-tree walk can weigh."""

    topology: Topology
    widths: tuple[int, ...]
    depth: int
    num_nodes: int
    num_parents: int
    max_width: int
    level_starts: tuple[int, ...]
    parent: np.ndarray
    node_depth: np.ndarray
    first_child: np.ndarray
    num_children: np.ndarray
    position: np.ndarray
    kids: np.ndarray
    leftmost: np.ndarray
    length: np.ndarray
    max_attempts: int

    @property
    def is_chain(self) -> bool:
        return self.max_width == 1


@lru_cache(maxsize=512)
def tables(topology: Topology) -> TreeTables:
    """The tables of a topology, built once per process."""
    depth, m = topology.depth, topology.num_nodes
    parent = topology.parent.numpy()
    node_depth = topology.node_depth.numpy()
    first = topology.first_child.numpy()
    widths = np.array((*topology.widths, 0), dtype=np.int64)
    num_children = widths[node_depth]
    num_parents = topology.level_starts[depth]
    max_width = max(topology.widths, default=1)
    position = np.zeros(m, dtype=np.int64)
    position[1:] = np.arange(1, m) - first[parent[1:]]
    j = np.arange(max_width)
    kids = np.minimum(first[:num_parents, None] + j[None], (first + num_children - 1)[:num_parents, None])
    leftmost = np.repeat(np.arange(m)[:, None], max(depth, 1), 1)
    clipped = np.minimum(first, m - 1)
    for step in range(1, depth):
        deeper = node_depth + step <= depth
        leftmost[:, step] = np.where(deeper, clipped[leftmost[:, step - 1]], leftmost[:, step - 1])
    return TreeTables(
        topology,
        topology.widths,
        depth,
        m,
        num_parents,
        max_width,
        topology.level_starts,
        parent,
        node_depth,
        first,
        num_children,
        position,
        kids,
        leftmost,
        depth - node_depth + 1,
        1 + sum(w - 1 for w in topology.widths),
    )
