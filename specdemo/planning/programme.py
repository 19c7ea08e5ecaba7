"""Auto topology: widths per depth and leaf evaluation chosen for each step by dynamic programming.

The objective is the expected cost from a state to the end of the schedule, V(n, k), where k says
whether the target output at Y_n is already known (after a warm-up, or a round that committed an
evaluated leaf). A round of R target rows and L levels costs price(R, L): one call ([R > 0], the
calls objective), or its seconds t(R, L_net) on the run's device (the time objective,
planning/cost_model.py; L_net of its L levels draft their step with a draft network, as the stepwise
draft's table says), so that a wider or deeper round is chosen only where the steps it is expected
to commit pay for it. A round rooted at step n verifies level d (the children
of the node kept at depth d - 1) only if levels 1..d-1 kept a drafted child. Level d rejected:
d steps committed (the corrected draw), the next root's output unknown. Every level kept: L
steps committed, the next root's output known iff the leaves were evaluated. So

    V(n, k) = price(rows, L) + sum_d P(stop at d) V(n + d, 0) + P(all kept) V(n + L, leaves),

for 1 - k + w_1 + w_1 w_2 + ... + w_1...w_{L-1} (+ w_1...w_L with leaves) target rows, at most
the budget. P comes from a_d(w), the probability that a node at depth d - 1 with w children keeps
one: the verifier's closed-form acceptance (section 3) averaged over the deltas a pilot run (or the
setting's own runs) measured at step n + d - 1 and depth d (`DeltaStats`). With the root's output known the frozen
draft's first level is exact (delta = 0, a_1 = 1; not so for a biased draft); deeper levels are
read as in a round whose root's output was not known (the nearest-sibling prefetch usually
freezes an output of the root's own step too). Over shapes, for m nodes at depth d - 1 and B rows
left,

    C(d, m, B) = min_w a_d(w) [C(d + 1, m w, B - m w) or, stopping at d, V(n + d, leaves)]
                     + (1 - a_d(w)) V(n + d, 0),

and V is filled backwards from V(N, .) = 0. C(1, 1, B) comes out for every rows budget B at once:
the calls objective takes the full budget, the time objective the B that minimises
price(rows of its shape, 0) + C(1, 1, B) (the cheapest shape of at most B rows is among those). Under
the time objective a shape that goes on below level d also pays, whatever the verdict at d, for
drafting level d + 1 with a draft network (network_level_s where the table gives step n + d to it):
inside C, so that shapes of equal rows and other depths are weighed by it too.
Without leaf evaluation the last level's width does
not matter (both outcomes leave the next root unknown), so such plans end in a single leaf; with
it, a wider last level keeps a leaf, hence a known next root, more often. Parent and no prefetch
are never better than the nearest sibling (docs/benchmarks.md), so the per-step prefetch choice
is between nearest and nearest with the leaves evaluated.

Block verification (verifiers/block.py) weighs a chain as a whole: where it stops depends on every
node's delta and u, not on one level's acceptance. Its plans are fans (K, 1, ..., 1), K <= 4 (a chain
at K = 1; on a whole tree the root's child is chosen by rank-aware selection and its chain weighed
with that child's ratio against the selection's density: block_fan_stop_probabilities; trees that
branch below the root add too little in expectation to pay for their planning: docs/experiments/branching.md),
whose shape
minimises

    V(n, k) = price(1 - k + K (L - 1 + leaves), L) + sum_{j < L} P(eta = j) V(n + j + 1, 0) + P(eta = L) V(n + L, leaves),

with P(eta = j | L) estimated from BLOCK_PLAN_CHAINS chains drawn per step: delta_d from the pilot's
deltas at (n + d - 1, d), u_d ~ N(0, 1) (the drafted node under its draft), the same chains for
every L. For a chain truncated at L the weights h_0..h_{L-1} do not change and h_L = p_L, so
P(eta = j | L) = E[h_j prod_{j < i < L} (1 - h_i) (1 - p_L)] for j < L and E[p_L] for j = L.
The pilot is verified node by node, so its deltas at depth d come from chains whose first d - 1
levels were accepted, and depths are drawn independently. The plan's expected calls against the measured
ones are in docs/benchmarks.md (block section): close within few rows, low at many rows and few steps, where
the pilot's deepest cells at the last steps are sparse and `pooled` widens them over easier earlier steps
(docs/algorithms.md, section 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import torch

from ..errors import SpecdemoError
from ..sampling.record import RoundTrace
from ..trees import MAX_DEPTH, Topology, TopologyPlan
from ..verifiers import Verifier
from ..verifiers.block import log_ratios, path_weights, select_root_child
from .cost_model import CostModel

DELTA_GRID = np.geomspace(1e-4, 64.0, 241)
MIN_SAMPLES = 24
BLOCK_PLAN_CHAINS = 512  # Monte Carlo chains per step and root state for a block-verified plan
BLOCK_FAN_WIDTHS = 4  # a block-verified plan's widest root: fans (K, 1, ..., 1), K = 1 a chain


@dataclass
class DeltaStats:
    """deltas[(step, depth)]: delta at verified nodes of depth - 1 (whose children are at `depth`),
    `step` being the verified node's step. The root of a round whose root output was known is left
    out: the frozen draft is exact there, which the planner knows without measuring."""

    deltas: dict[tuple[int, int], list[float]]
    num_steps: int

    @classmethod
    def from_traces(cls, traces: Iterable[RoundTrace], num_steps: int) -> DeltaStats:
        deltas: dict[tuple[int, int], list[float]] = {}
        for rnd in traces:
            rows, nodes = np.nonzero(~np.isnan(rnd.delta))
            for r, node in zip(rows.tolist(), nodes.tolist(), strict=True):
                depth = int(rnd.node_depth[node])
                if depth or not rnd.root_known[r]:
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


@cache
def _acceptance_curves(verifier_type: type, max_width: int) -> np.ndarray:
    verifier = verifier_type()
    widths = range(1, min(verifier.max_children or max_width, max_width) + 1)
    return np.stack([verifier.acceptance(DELTA_GRID, w) for w in widths])


def acceptance_curves(verifier: Verifier, max_width: int) -> np.ndarray:
    """A(delta, w) on DELTA_GRID for w = 1..max_width (closed forms of section 3), cached."""
    return _acceptance_curves(type(verifier), max_width)  # type: ignore[arg-type]  # a class is hashable (mypy checks its instances)


Objective = Callable[[int, int], float]  # price(rows, depth) of a round: its target rows and drafted levels


def calls_price(rows: int, depth: int) -> float:
    """The calls objective: a round costs one target call if it evaluates any row."""
    return 1.0 if rows else 0.0


class RoundPrice:
    """What a round costs in the objective's unit: one call if it evaluates any row (cost None, the calls
    objective), or its seconds t(R, L_net) priced by `cost` (the time objective), L_net of its levels drafted
    with a draft network (network_steps (num_steps,) bool: the stepwise draft's table)."""

    def __init__(self, cost: CostModel | None, network_steps: np.ndarray | None, num_steps: int) -> None:
        self.cost = cost
        # network levels below a root n of depth L: levels draft steps n..n+L-1 (a level's step is its parent's)
        self.network = (
            np.concatenate([[0], np.cumsum(np.asarray(network_steps, dtype=np.int64))])
            if network_steps is not None
            else np.zeros(num_steps + 1, dtype=np.int64)
        )

    def seconds(self, n: int, rows: int, depth: int) -> float:
        """A round's seconds, rooted at n with `rows` rows and `depth` levels (0 without a cost model)."""
        return self.cost.round_time(rows, int(self.network[n + depth] - self.network[n])) if self.cost else 0.0

    def at(self, n: int) -> Objective:
        """price(rows, depth) of a round rooted at n."""
        return calls_price if self.cost is None else lambda rows, depth: self.seconds(n, rows, depth)

    def network_level(self, n: int, depth: int) -> float:
        """The seconds of drafting level `depth` below a root n with the draft network (0 where a frozen form
        drafts it)."""
        assert self.cost is not None  # the stepwise draft's network levels are priced under the time objective
        return self.cost.network_level_s * int(self.network[n + depth] - self.network[n + depth - 1])


class LevelAcceptance:
    """a_d(w) at (step, depth) for w = 1..max_width: the verifier's closed-form acceptance averaged over the
    deltas measured there (DeltaStats.pooled), interpolated on DELTA_GRID; cached per cell."""

    def __init__(self, stats: DeltaStats, verifier: Verifier, max_width: int) -> None:
        self.stats, self.curves = stats, acceptance_curves(verifier, max_width)
        self.exact = (1.0,) * len(self.curves)  # a level drafted exactly (the frozen draft under a known root)
        self._cells: dict[tuple[int, int], tuple[float, ...]] = {}

    def __call__(self, step: int, depth: int) -> tuple[float, ...]:
        if (step, depth) not in self._cells:
            deltas = np.log(np.clip(self.stats.pooled(step, depth), DELTA_GRID[0], DELTA_GRID[-1]))
            self._cells[step, depth] = tuple(np.interp(deltas, np.log(DELTA_GRID), c).mean() for c in self.curves)
        return self._cells[step, depth]


class BlockStops:
    """The stop probabilities of block-verified fans rooted at a step (block_fan_stop_probabilities), from
    BLOCK_PLAN_CHAINS Monte Carlo chains whose deltas at depth d are drawn from the pooled deltas at
    (n + d - 1, d). The chains' generator is seeded once, so a plan is the same every time for the same
    sequence of calls."""

    def __init__(self, stats: DeltaStats, max_width: int, seed: int = 0) -> None:
        self.stats, self.max_width = stats, max_width
        self.chains = np.random.default_rng(seed)
        self.pooled = lru_cache(maxsize=None)(stats.pooled)

    def __call__(self, n: int, length: int, first_exact: bool) -> np.ndarray:
        """(K, length, length + 1) for widths K = 1..min(BLOCK_FAN_WIDTHS, max_width); K = 1 alone where the
        root's level is exact (its first child is then always kept)."""
        deltas = np.stack(
            [
                np.zeros(BLOCK_PLAN_CHAINS)
                if first_exact and d == 1
                else self.chains.choice(self.pooled(n + d - 1, d), BLOCK_PLAN_CHAINS)
                for d in range(1, length + 1)
            ],
            1,
        )
        widths = 1 if first_exact else min(BLOCK_FAN_WIDTHS, self.max_width)
        return block_fan_stop_probabilities(
            deltas,
            self.chains.standard_normal(deltas.shape),
            self.chains.standard_normal((BLOCK_PLAN_CHAINS, widths)),
            self.chains.random(BLOCK_PLAN_CHAINS),
        )


@dataclass(frozen=True)
class RoundChoice:
    """The round chosen at a step and root state: its expected value to the end (the objective's unit), its
    widths and leaf evaluation, its target rows, and its outcomes (steps committed, next root known,
    probability)."""

    value: float
    widths: tuple[int, ...]
    leaves: bool
    rows: int
    outcomes: list[tuple[int, int, float]]


def best_round(
    n: int,
    known: int,
    value: np.ndarray,
    horizon: int,
    budget: int,
    verifier: Verifier,
    accept: LevelAcceptance,
    block_stops: BlockStops | None,
    price: RoundPrice,
    leaf_options: tuple[bool, ...],
    exact_known_root: bool,
) -> RoundChoice:
    """The round of least expected value V(n, known) at step n (module docstring), value[j] = V(j, .) filled
    for every j > n: the best tree (or, for a verifier that weighs the whole tree, the best fan), a free
    exact level where the root's output is known and leaves are not evaluated, or a plain step."""
    first_exact = bool(known) and exact_known_root
    ahead, cost = value[n:], price.at(n)
    if verifier.weighs_whole_tree:
        longest = min(horizon, budget + known)  # a chain of L nodes has L - k rows, and a leaf row
        assert block_stops is not None  # made for a verifier that weighs the whole tree
        fans = block_stops(n, longest, first_exact)
        after, widths, leaves = _best_block_round(
            fans, ahead, budget - 1 + known, leaf_options, lambda r, depth: cost(r + 1 - known, depth)
        )
        outcomes = _chain_outcomes(fans[widths[0] - 1], len(widths), leaves)
    else:
        level_accept = lambda d: accept.exact if first_exact and d == 1 else accept(n + d - 1, d)
        timed = price.cost is not None
        after, widths, leaves = _best_round(
            level_accept,
            ahead,
            horizon,
            budget - 1 + known,
            leaf_options,
            (lambda r: cost(r + 1 - known, 0)) if timed else None,
            (lambda d: price.network_level(n, d)) if timed else None,
        )
        outcomes = _tree_outcomes(level_accept, widths, leaves)
    rows = Topology(widths).rows_per_round(leaves) - known if widths else 0
    options = [RoundChoice(cost(rows, len(widths)) + after, widths, leaves, rows, outcomes)]
    if first_exact and False in leaf_options:
        # one exact level, leaves not evaluated: no target row, a free step that also refreshes the frozen output
        options.append(RoundChoice(cost(0, 1) + value[n + 1, 0], (1,), False, 0, [(1, 0, 1.0)]))
    if not known:  # a plain step, when no tree fits
        options.append(RoundChoice(cost(1, 0) + value[n + 1, 0], (), False, 1, [(1, 0, 1.0)]))
    return min(options, key=lambda o: o.value)  # the first of equals


def plan_topology(
    stats: DeltaStats,
    verifier: Verifier,
    budget: int,
    run_lengths: torch.Tensor,
    max_width: int = 8,
    max_depth: int = MAX_DEPTH,
    leaf_options: tuple[bool, ...] = (False,),
    exact_known_root: bool = True,
    warm_up: bool = True,
    cost: CostModel | None = None,
    network_steps: np.ndarray | None = None,
) -> TopologyPlan:
    """The tree (and whether its leaves are evaluated, among leaf_options) for every step and both
    root states that minimises the expected target calls to the end (cost None), or the expected
    wall-clock to the end priced by `cost`, with at most `budget` target rows a round (the root
    included when its output is not known). exact_known_root: the draft is exact at a root whose
    output is known (the frozen draft, unbiased); warm_up: trajectories start with a call that
    makes the first root's output known (the frozen draft started warm), which the plan's expectations count.
    network_steps (num_steps,) bool: the steps whose level the draft drafts with its network (the
    stepwise draft's table), each such level of a round priced cost.network_level_s more. The plan
    states its expected calls, and its expected seconds when priced by a cost model. V is filled backwards
    (best_round at each step and root state); a deterministic step is one target call, none when the
    output at Y_n is known."""
    if budget < 1:
        raise SpecdemoError(f"the rows budget must be >= 1, got {budget}")
    num_steps = stats.num_steps
    price = RoundPrice(cost, network_steps, num_steps)
    accept = LevelAcceptance(stats, verifier, max_width)
    block_stops = BlockStops(stats, max_width) if verifier.weighs_whole_tree else None
    value = np.zeros((num_steps + 1, 2))  # V(n, k) in the objective's unit
    calls = np.zeros((num_steps + 1, 2))  # expected target calls to the end under the plan
    seconds = np.zeros((num_steps + 1, 2))  # expected seconds to the end under the plan (with a cost model)
    rounds: list[tuple[tuple[Topology, bool], ...]] = [()] * num_steps
    for n in reversed(range(num_steps)):
        horizon = min(int(run_lengths[n]), max_depth, MAX_DEPTH)
        plans = []
        for known in (0, 1):
            if horizon:
                choice = best_round(
                    n,
                    known,
                    value,
                    horizon,
                    budget,
                    verifier,
                    accept,
                    block_stops,
                    price,
                    leaf_options,
                    exact_known_root,
                )
            else:  # a deterministic step
                choice = RoundChoice(price.at(n)(1 - known, 0) + value[n + 1, 0], (), False, 1 - known, [(1, 0, 1.0)])
            value[n, known] = choice.value
            calls[n, known] = (choice.rows > 0) + sum(p * calls[n + j, k] for j, k, p in choice.outcomes)
            seconds[n, known] = price.seconds(n, choice.rows, len(choice.widths)) + sum(
                p * seconds[n + j, k] for j, k, p in choice.outcomes
            )
            plans.append((Topology(choice.widths), choice.leaves))
        rounds[n] = tuple(plans)
    start = 1 if warm_up else 0  # the warm-up call makes the first root's output known
    return TopologyPlan(
        tuple(r[0][0] for r in rounds),
        name=f"auto({budget} rows)",
        leaves=tuple(r[0][1] for r in rounds),
        known_trees=tuple(r[1][0] for r in rounds),
        known_leaves=tuple(r[1][1] for r in rounds),
        expected_calls=float(start + calls[0, start]),
        expected_s=None if cost is None else float((cost.round_time(1) if warm_up else 0.0) + seconds[0, start]),
        objective="calls" if cost is None else "time",
    )


def _tree_outcomes(
    accept: Callable[[int], tuple[float, ...]], widths: tuple[int, ...], leaves: bool
) -> list[tuple[int, int, float]]:
    """(steps committed, next root known, probability) of a node-by-node verified round."""
    outcomes, reach = [], 1.0
    for d, w in enumerate(widths, start=1):
        a = accept(d)[w - 1]
        outcomes.append((d, 0, reach * (1 - a)))
        reach *= a
    return outcomes + [(len(widths), int(leaves), reach)]


def _chain_outcomes(stops: np.ndarray, length: int, leaves: bool) -> list[tuple[int, int, float]]:
    """The same for a block-verified chain (or fan) of depth `length`: eta = j < L commits j + 1 steps."""
    p = stops[length - 1]
    return [(j + 1, 0, float(p[j])) for j in range(length)] + [(length, int(leaves), float(p[length]))]


def _best_round(
    accept: Callable[[int], tuple[float, ...]],
    calls_ahead: np.ndarray,
    horizon: int,
    budget: int,
    leaf_options: tuple[bool, ...],
    price: Callable[[int], float] | None = None,
    level_price: Callable[[int], float] | None = None,
) -> tuple[float, tuple[int, ...], bool]:
    """min over widths (and leaf evaluation) of sum_d P(stop at d) V(n + d, .) for a round rooted
    at n: C(1, 1, budget) of the module docstring. accept(d)[w - 1] = a_d(w); calls_ahead[j] =
    V(n + j, .). With `price` (of the rows below the root), the round minimising price + that sum
    over every rows count up to the budget instead; with `level_price` (of drafting level d: a draft
    network's call at its step, paid whatever the verdict by every shape that reaches depth d), that
    too, inside C so that shapes of equal rows and other depths are weighed by it (level 1's, which
    every shape pays, is left to the caller). Returns (expected value after the round, level prices
    left out; widths; leaves evaluated).

    C(d, m, B) is computed level by level from the deepest, for every node count m (a product of
    widths) and every rows-left B at once; options are, in this order, a single leaf left
    unevaluated, then for w = 1, 2, ...: w children as evaluated leaves, or w children and the
    levels below. Ties within 1e-12 go to the first option in that order."""
    grid = _width_options(len(accept(1)), budget)
    counts, index, fits = grid.counts, grid.index, grid.fits
    horizon = min(horizon, budget + 1)  # every level but an unevaluated last one takes a row
    below = np.full(fits.shape[1:], math.inf)  # C(d + 1, m, B)
    choices = []
    for d in range(horizon, 0, -1):
        rejected, a = calls_ahead[d, 0], np.asarray(accept(d))[:, None, None]
        # a leaf at step N is the sample itself: the driver never evaluates it, nor may the plan
        leaf_after = calls_ahead[d, 1] if d < calls_ahead.shape[0] - 1 else math.inf
        # (value after the level, what the round pays for it whatever the verdict): stopping here with
        # evaluated leaves, or going on, which drafts level d + 1 (its network price, if any)
        afters = ([(np.full(fits.shape, leaf_after), 0.0)] if True in leaf_options else []) + [
            (below[index[:, :, None], grid.left], level_price(d + 1) if level_price else 0.0)
            if d < horizon
            else (np.full(fits.shape, math.inf), 0.0)
        ]
        by_width = []
        for after, paid in afters:  # (w, m, B)
            ok = fits & (after < math.inf)
            by_width.append(np.where(ok, a * np.where(ok, after, 0.0) + (1 - a) * rejected + paid, math.inf))
        first = np.full((1, *below.shape), rejected if False in leaf_options else math.inf)
        options = np.concatenate([first, np.stack(by_width, 1).reshape(-1, *below.shape)])
        best = options.min(0)
        choices.append(np.argmax(options <= best + 1e-12, 0).astype(np.int8))  # the first within 1e-12 of the best
        below = best
    per_width = 1 + (True in leaf_options)

    def shape(rows: int) -> tuple[tuple[int, ...], bool, int]:
        """Follow the choices from the root with `rows` rows below it: (widths, leaves, rows used)."""
        chosen: list[int] = []
        m, left = 0, rows
        for choice in reversed(choices):
            k = int(choice[m, left])
            if k == 0:
                return (*chosen, 1), False, rows - left
            w, leaf_stop = (k - 1) // per_width + 1, per_width == 2 and (k - 1) % 2 == 0
            chosen.append(w)
            left -= counts[m] * w
            if leaf_stop:
                return tuple(chosen), True, rows - left
            m = int(index[w - 1, m])
        raise AssertionError("a plan deeper than its horizon")

    values = below[0]  # C(1, 1, B) for every B: counts[0] = 1
    if price is None:
        rows = budget
    else:
        finite = [b for b in range(budget + 1) if values[b] < math.inf]
        if not finite:
            return math.inf, (), False
        rows = min(finite, key=lambda b: price(shape(b)[2]) + values[b])  # the first (fewest rows) of equals
    if values[rows] == math.inf:
        return math.inf, (), False
    widths, leaves, _ = shape(rows)
    levels = sum(level_price(d) for d in range(2, len(widths) + 1)) if level_price else 0.0  # level 1: every shape's
    return float(values[rows]) - levels, widths, leaves


@dataclass(frozen=True)
class _WidthOptions:
    """For node counts m (every product of widths up to the rows) and widths w: counts[i] = m,
    index[w - 1, i] = the position of m w in counts (0 where m w is over the rows), fits[w - 1, i, B]
    = m w <= B, left[w - 1, i, B] = B - m w (0 where it does not fit)."""

    counts: np.ndarray
    index: np.ndarray
    fits: np.ndarray
    left: np.ndarray


@cache
def _width_options(max_width: int, budget: int) -> _WidthOptions:
    counts, frontier = {1}, {1}
    while frontier:
        frontier = {m * w for m in frontier for w in range(2, max_width + 1) if m * w <= budget} - counts
        counts |= frontier
    sizes = np.array(sorted(counts))
    position = {int(m): i for i, m in enumerate(sizes)}
    children = np.arange(1, max_width + 1)[:, None] * sizes[None, :]  # (w, m)
    index = np.vectorize(lambda c: position.get(int(c), 0), otypes=[np.int64])(children)
    left = np.arange(budget + 1)[None, None, :] - children[:, :, None]
    return _WidthOptions(sizes, index, left >= 0, np.maximum(left, 0))


def block_stop_probabilities(delta: np.ndarray, u: np.ndarray) -> np.ndarray:
    """P[L - 1, j] = P(eta = j | the chain truncated at L), L = 1..L_max, j = 0..L (zero past L),
    averaged over chains whose delta_d and u_d (S, L_max) are given (module docstring)."""
    return _stop_matrices(log_ratios(delta, u), delta).mean(0)


def _stop_matrices(log_rho: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """block_stop_probabilities per chain, from log rho_d (S, L_max): (S, L_max, L_max + 1)."""
    s, top = delta.shape
    log_p, h = path_weights(log_rho, delta, np.full(s, top))
    p = np.exp(log_p)
    # (1 - h_i) for i < L, 1 at and past L: tail[., L - 1, j] = prod_{j < i < L} (1 - h_i)
    below = np.arange(top)[None, :] < np.arange(1, top + 1)[:, None]  # [L - 1, i]: i < L
    miss = np.where(below[None], 1 - h[:, None, :top], 1.0)
    tail = np.concatenate([np.flip(np.cumprod(np.flip(miss, 2), 2), 2)[:, :, 1:], np.ones((s, top, 1))], 2)
    stop = np.where(below[None], h[:, None, :top] * tail * (1 - p[:, 1:, None]), 0.0)
    probs = np.concatenate([stop, np.zeros((s, top, 1))], 2)
    probs[:, np.arange(top), np.arange(1, top + 1)] = p[:, 1:]
    return probs


def block_fan_stop_probabilities(
    delta: np.ndarray, u: np.ndarray, kids: np.ndarray, rank_uniform: np.ndarray
) -> np.ndarray:
    """F[K - 1, L - 1, j] for the fans (K, 1, ..., 1) of depth L, K = 1..K_max, under whole-tree block
    verification (verifiers/block.py): the probability that the round ends with eta = j on the
    weighed path (j = 0: 1 step, the root's residual; 0 < j < L: j + 1 steps; L: the leaf), averaged
    over S Monte Carlo chains with deltas delta (S, L_max), the root's first, and projections u
    (S, L_max) under the draft. With K > 1 the root's child is chosen by rank-aware selection among
    K children (kids[:, :K], rank_uniform (S,)), and its ratio phi(u - delta) / g(u) replaces the
    first node's; the rest of the chain is the same for every K, so every K and L come from K chain
    weighings."""
    log_rho = log_ratios(delta, u)
    fans = [_stop_matrices(log_rho, delta).mean(0)]
    for k in range(2, kids.shape[1] + 1):
        log_rho[:, 0] = select_root_child(delta[:, 0], kids[:, :k], rank_uniform).log_ratio
        fans.append(_stop_matrices(log_rho, delta).mean(0))
    return np.stack(fans)


def _best_block_round(
    fans: np.ndarray,
    calls_ahead: np.ndarray,
    budget: int,
    leaf_options: tuple[bool, ...],
    price: Objective = lambda rows, depth: 0.0,
) -> tuple[float, tuple[int, ...], bool]:
    """The fan (K, 1, ..., 1) of depth L (K = 1: a chain), and leaf evaluation, that minimises the
    expected value after a block-verified round plus its price (of the rows below the root and the depth):
    fans[K - 1, L - 1, j] = P(eta = j | K, L); budget: rows left after the root. Returns (expected
    value after, widths, leaves)."""
    best: tuple[float, float, tuple[int, ...], bool] = (math.inf, math.inf, (), False)
    for width in range(1, fans.shape[0] + 1):
        for length in range(1, fans.shape[1] + 1):
            for leaves in leaf_options:
                rows = width * (length - 1 + leaves)
                if rows > budget or (leaves and length >= calls_ahead.shape[0] - 1):  # no leaf row at step N
                    continue
                p = fans[width - 1, length - 1]
                after = float(
                    p[:length] @ calls_ahead[1 : length + 1, 0] + p[length] * calls_ahead[length, int(leaves)]
                )
                if price(rows, length) + after < best[0] - 1e-12:  # ties go to the narrower, shorter round (fewer rows)
                    best = (price(rows, length) + after, after, (width,) + (1,) * (length - 1), leaves)
    return best[1:]
