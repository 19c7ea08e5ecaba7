"""Which target output starts a trajectory's next round (algorithms.md section 2, "prefetch").

A frozen draft plugs the most recent target output into the step formula; after a round, the
policy picks the evaluated node whose output is frozen next, and whether a round's leaves are
evaluated too (so that a round that keeps its leaf knows the exact target output there):

  nearest  the evaluated sibling nearest to the committed state (same step), else the parent's;
  parent   the parent of the committed state (one step stale);
  none     no output kept: the next round re-evaluates its root (one extra call a round);
  leaves   as nearest, and every round's leaves are evaluated;
  auto     as nearest, and the leaves evaluated at the steps where a planned topology
           (--tree auto, specdemo.trees.auto) finds it pays.
"""

from __future__ import annotations

import numpy as np
import torch

from ..trees import Topology, TopologyPlan


class Prefetch:
    name: str

    def leaf_table(self, tree: Topology | TopologyPlan, num_steps: int) -> np.ndarray:
        """(N, 2) bool: whether a round rooted at step n, its root's output known (column 1) or not,
        evaluates its leaves."""
        return np.zeros((num_steps, 2), dtype=bool)

    def source(self, state) -> torch.Tensor | list[int] | None:
        """The node of each row of a walked round whose output is frozen next: (A,) on the device, or
        a host list for a chain (known from the host's committed depths, no gather); None: keep none."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


def parent_of_commit(state) -> torch.Tensor | list[int]:
    """The evaluated node closest above the committed state: the node whose verification ended the
    round, or the committed leaf itself when the leaves were evaluated."""
    lay = state.layout
    if lay.max_width == 1:  # a chain: node e - 1 (depth e - 1) ended a corrected round; a kept round's
        # leaf (node e) if it was evaluated, else its parent, node e - 1
        return [e - 1 if c or not state.evaluate_leaves else e for e, c in zip(state.end_host, state.corrected_host)]
    if state.evaluate_leaves:
        return state.cur
    return torch.where(state.corrected, state.cur, lay.parent[state.cur])


class ParentOutput(Prefetch):
    name = "parent"

    def source(self, state):
        return parent_of_commit(state)


class Reevaluate(Prefetch):
    name = "none"

    def source(self, state):
        return None


class NearestSibling(Prefetch):
    name = "nearest"

    def source(self, state):
        """Where a corrected draw ended the round, the evaluated child of its parent (a rejected
        sibling, at the same step) nearest to it, if the level was evaluated."""
        lay, cur = state.layout, state.cur
        if lay.max_width == 1:  # a chain: the one sibling is the rejected child (node e, at the corrected
            # draw's step), if evaluated; else the parent of the commit
            evaluated = lay.evaluated_depth
            return [e if c and e <= evaluated else p
                    for e, c, p in zip(state.end_host, state.corrected_host, parent_of_commit(state))]
        fallback = parent_of_commit(state)
        width = lay.max_width
        sib = lay.first_child[cur][:, None] + torch.arange(width, device=cur.device)
        valid = (torch.arange(width, device=cur.device)[None] < lay.num_children[cur][:, None]) \
            & (lay.node_depth[cur] < state.evaluated_depth)[:, None] & state.corrected[:, None]
        sib = torch.where(valid, sib, 0)
        ar = torch.arange(cur.numel(), device=cur.device)[:, None]
        dist = (state.x[ar, sib] - state.y_new[:, None]).flatten(2).norm(dim=2)
        best = torch.where(valid, dist, float("inf")).argmin(1)
        return torch.where(valid.any(1), sib[ar[:, 0], best], fallback)


class EvaluatedLeaves(NearestSibling):
    name = "leaves"

    def leaf_table(self, tree, num_steps):
        return np.ones((num_steps, 2), dtype=bool)


class PlannedLeaves(NearestSibling):
    name = "auto"

    def leaf_table(self, tree, num_steps):
        if not isinstance(tree, TopologyPlan):
            return super().leaf_table(tree, num_steps)
        return np.array([[tree.leaves_at(n, False), tree.leaves_at(n, True)] for n in range(num_steps)], dtype=bool)


PREFETCH = {p.name: p for p in (NearestSibling, ParentOutput, Reevaluate, EvaluatedLeaves, PlannedLeaves)}
