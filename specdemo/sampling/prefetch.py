"""Which target output starts a trajectory's next round (algorithms.md section 2, "prefetch").

A frozen draft plugs the most recent target output into the step formula; after a round, the
policy picks the evaluated node whose output is frozen next, and whether a round's leaves are
evaluated too (so that a round that keeps its leaf knows the exact target output there):

  nearest  the evaluated sibling nearest to the committed state (same step), else the parent's;
  parent   the parent of the committed state (one step stale);
  none     no output kept: the next round re-evaluates its root (one extra call a round);
  leaves   as nearest, and every round's leaves are evaluated;
  auto     as nearest, and the leaves evaluated at the steps where a planned topology
           (--tree auto, specdemo.planning.programme) finds it pays.
"""

from __future__ import annotations

import numpy as np

from ..trees import Topology, TopologyPlan
from ..trees.tables import TreeTables
from ..verifiers import Walk


class Prefetch:
    name: str

    def leaf_table(self, tree: Topology | TopologyPlan, num_steps: int) -> np.ndarray:
        """(N, 2) bool: whether a round rooted at step n, its root's output known (column 1) or not,
        evaluates its leaves."""
        return np.zeros((num_steps, 2), dtype=bool)

    def source(
        self, tree: TreeTables, walk: Walk, leaves: bool, sibling_gram: np.ndarray, factor: np.ndarray, k: int
    ) -> np.ndarray | None:
        """The node of each row of a walked round whose output is frozen next (R,); None: keep none.
        sibling_gram (R, K + 1, K + 1): the inner products of z = x - mp of the children of the node each
        row stopped at (and mq - mp, index k), whose corrected draw is child + factor (mq - mp)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


def parent_of_commit(tree: TreeTables, walk: Walk, leaves: bool) -> np.ndarray:
    """The evaluated node closest above the committed state: the node whose verification ended the
    round, or the committed leaf itself when the leaves were evaluated."""
    kept_leaf = walk.node if leaves else np.maximum(tree.parent[walk.node], 0)
    return np.where(walk.corrected, walk.node, kept_leaf)


class ParentOutput(Prefetch):
    name = "parent"

    def source(
        self, tree: TreeTables, walk: Walk, leaves: bool, sibling_gram: np.ndarray, factor: np.ndarray, k: int
    ) -> np.ndarray | None:
        return parent_of_commit(tree, walk, leaves)


class Reevaluate(Prefetch):
    name = "none"

    def source(
        self, tree: TreeTables, walk: Walk, leaves: bool, sibling_gram: np.ndarray, factor: np.ndarray, k: int
    ) -> np.ndarray | None:
        return None


class NearestSibling(Prefetch):
    name = "nearest"

    def source(
        self, tree: TreeTables, walk: Walk, leaves: bool, sibling_gram: np.ndarray, factor: np.ndarray, k: int
    ) -> np.ndarray | None:
        """Where a corrected draw ended the round, the evaluated child of its parent (a rejected
        sibling, at the same step) nearest to it, if the level was evaluated: with z = x - mp,
        ||x_j - y||^2 = ||z_j - z_c||^2 - 2 f <z_j - z_c, mq - mp> + f^2 ||mq - mp||^2 for the draw
        y = x_c + f (mq - mp)."""
        fallback = parent_of_commit(tree, walk, leaves)
        evaluated = tree.depth if leaves else tree.depth - 1
        stop = walk.node
        level_evaluated = walk.corrected & (tree.node_depth[stop] + 1 <= evaluated)
        if not level_evaluated.any():
            return fallback
        g = sibling_gram
        r = np.arange(g.shape[0])
        c = tree.position[walk.child]
        diag = np.diagonal(g, axis1=1, axis2=2)[:, :k]  # ||z_j||^2
        dist = (
            diag
            + diag[r, c][:, None]
            - 2 * g[r, c, :k]
            - 2 * factor[:, None] * (g[:, :k, k] - g[r, c, k][:, None])
            + (factor**2 * g[:, k, k])[:, None]
        )
        width = tree.num_children[np.minimum(stop, tree.num_parents - 1)]
        dist = np.where(np.arange(k)[None] < width[:, None], dist, np.inf)
        nearest = tree.first_child[np.minimum(stop, tree.num_parents - 1)] + dist.argmin(1)
        return np.where(level_evaluated, nearest, fallback)


class EvaluatedLeaves(NearestSibling):
    name = "leaves"

    def leaf_table(self, tree: Topology | TopologyPlan, num_steps: int) -> np.ndarray:
        return np.ones((num_steps, 2), dtype=bool)


class PlannedLeaves(NearestSibling):
    name = "auto"

    def leaf_table(self, tree: Topology | TopologyPlan, num_steps: int) -> np.ndarray:
        if not isinstance(tree, TopologyPlan):
            return super().leaf_table(tree, num_steps)
        return np.array([[tree.leaves_at(n, False), tree.leaves_at(n, True)] for n in range(num_steps)], dtype=bool)


PREFETCH = {p.name: p for p in (NearestSibling, ParentOutput, Reevaluate, EvaluatedLeaves, PlannedLeaves)}
