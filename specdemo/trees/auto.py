"""Auto topology: widths per depth chosen for each step by a dynamic programme.

A round rooted at step n verifies level d (the children of the node at depth d - 1) only if
levels 1..d-1 kept a drafted child, and each verified level commits one step. With a_d(w) the
probability that a node at depth d - 1 with w children keeps one,

    E[steps per round] = 1 + a_1(w_1) + a_1(w_1) a_2(w_2) + ... ,

for one target call and 1 + w_1 + w_1 w_2 + ... + w_1...w_{L-1} target rows (the internal nodes).
a_d(w) is the verifier's closed-form acceptance averaged over the deltas measured at step
n + d - 1 and depth d (a pilot run, `DeltaStats`). For every step the programme picks the widths
with the most expected steps within a budget of rows: G(d, m, B) = max_w 1 + a_d(w) G(d + 1, m w,
B - m w), where m is the number of nodes at depth d - 1 and B the rows left.

The last level's width does not enter E: its verification commits one step whether it keeps a
child or not, and no level follows. So the plans end in a single leaf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..errors import SpecdemoError
from ..verifiers import Verifier
from .plan import TopologyPlan
from .topology import MAX_DEPTH, Topology

DELTA_GRID = np.geomspace(1e-4, 64.0, 241)
MIN_SAMPLES = 24


@dataclass
class DeltaStats:
    """deltas[(step, depth)]: delta at verified nodes of depth - 1 whose children were at `depth`,
    `step` being the verified node's step."""

    deltas: dict[tuple[int, int], list[float]]
    num_steps: int

    @classmethod
    def from_traces(cls, traces, num_steps: int) -> "DeltaStats":
        deltas: dict[tuple[int, int], list[float]] = {}
        for rnd in traces:
            rows, nodes = np.nonzero(~np.isnan(rnd.delta))
            for r, node in zip(rows.tolist(), nodes.tolist()):
                depth = int(rnd.node_depth[node])
                deltas.setdefault((int(rnd.step[r]) + depth, depth + 1), []).append(float(rnd.delta[r, node]))
        return cls(deltas, num_steps)

    def pooled(self, step: int, depth: int) -> np.ndarray:
        """Deltas at (step, depth), widened over neighbouring steps, then shallower depths, until
        there are MIN_SAMPLES of them (deeper levels are reached less often in a pilot)."""
        for d in range(depth, 0, -1):
            for radius in (0, 1, 2, 4, 8, 16):
                vals = [v for s in range(step - radius, step + radius + 1) for v in self.deltas.get((s, d), ())]
                if len(vals) >= MIN_SAMPLES:
                    return np.asarray(vals)
        everything = [v for vals in self.deltas.values() for v in vals]
        if not everything:
            raise SpecdemoError("the pilot run verified no node: auto topology has no deltas to plan with")
        return np.asarray(everything)


@lru_cache(maxsize=None)
def _acceptance_curves(verifier_type: type, max_width: int) -> np.ndarray:
    grid = torch.tensor(DELTA_GRID, dtype=torch.float64)
    verifier = verifier_type()
    widths = range(1, min(verifier.max_children or max_width, max_width) + 1)
    return np.stack([verifier.acceptance(grid, w).numpy() for w in widths])


def acceptance_curves(verifier: Verifier, max_width: int) -> np.ndarray:
    """A(delta, w) on DELTA_GRID for w = 1..max_width (closed forms of section 3), cached."""
    return _acceptance_curves(type(verifier), max_width)


def plan_topology(stats: DeltaStats, verifier: Verifier, budget: int, run_lengths, max_width: int = 8,
                  max_depth: int = MAX_DEPTH) -> TopologyPlan:
    """The best widths for every step, at most `budget` target rows a round (the root included)."""
    if budget < 1:
        raise SpecdemoError(f"the rows budget must be >= 1, got {budget}")
    curves = acceptance_curves(verifier, max_width)
    log_grid = np.log(DELTA_GRID)

    @lru_cache(maxsize=None)
    def accept(step: int, depth: int) -> tuple[float, ...]:
        deltas = np.log(np.clip(stats.pooled(step, depth), DELTA_GRID[0], DELTA_GRID[-1]))
        return tuple(np.interp(deltas, log_grid, c).mean() for c in curves)

    trees = []
    for n in range(stats.num_steps):
        horizon = min(int(run_lengths[n]), max_depth, MAX_DEPTH)
        trees.append(_best_tree(lambda d, n=n: accept(n + d - 1, d), horizon, budget - 1) if horizon else Topology(()))
    return TopologyPlan(tuple(trees), name=f"auto({budget} rows)")


def _best_tree(accept, horizon: int, budget: int) -> Topology:
    """Maximise E[steps] = G(1, 1, budget) over widths; accept(d)[w - 1] = a_d(w)."""

    @lru_cache(maxsize=None)
    def value(d: int, m: int, rows: int) -> tuple[float, tuple[int, ...]]:
        best = (-math.inf, ())
        for w, a in enumerate(accept(d), start=1):
            more, tail = 0.0, ()
            if d < horizon and m * w <= rows:  # level d internal: its nodes are evaluated
                more, tail = value(d + 1, m * w, rows - m * w)
            total = 1.0 + a * more
            if total > best[0] + 1e-12:  # ties go to the narrower tree (fewer rows)
                best = (total, (w, *tail))
            if m * w > rows:
                break  # wider still would not fit either
        return best

    return Topology(value(1, 1, budget)[1])
