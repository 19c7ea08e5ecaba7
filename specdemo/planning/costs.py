"""What a round costs on the run's device, for the time objective: the target's call by its rows, and the
driver's own cost per round and per level (planning/cost_model.py prices a round with them).

Measuring takes a bounded time whatever the batch: calls are timed up to MOST_ROWS rows (the cost model
extrapolates larger ones with the last slope), each for at most CALL_BUDGET_S; the driver is timed over a
few rounds (TIMED_ROUNDS) of at most the larger of MEASURED_BATCHES trajectories, and a larger batch's
cost is extrapolated from the two (the driver's cost per round grows linearly with its trajectories once
they fill its vectorised operations)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

import numpy as np
import torch
from scipy.optimize import isotonic_regression

from ..drafts import StepwiseDraft
from ..drafts.stepwise import RESIDUAL
from ..sampling import sample
from ..sampling.padding import call_size
from ..trees import Topology
from .setup import Setup

CALL_REPEATS = 5  # turns of timing every call size once, the median of each size kept ...
CALL_BUDGET_S = 0.25  # ... fewer where the turns would take longer than this per size timed (one at least)
MEASURED_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # padded call sizes, 2 an octave
MOST_ROWS = MEASURED_SIZES[-1]  # the largest call timed
TIMED_ROUNDS = 6  # rounds of the driver timed per measurement, the median kept (after WARM_ROUNDS untimed)
WARM_ROUNDS = 2
MEASURED_BATCHES = (128, 512)  # trajectories the driver is timed with, where a run's batch is larger


class CallCosts(NamedTuple):
    rows: tuple[int, ...]  # row counts timed, increasing
    seconds: tuple[float, ...]  # a call's seconds at each
    calls: int  # target calls made to time them


def call_costs(
    problem: Setup, check: Callable[[], None] = lambda: None, on_size: Callable[[int, int], None] = lambda i, n: None
) -> CallCosts:
    """The target's call at a few row counts up to the batch times the budget, at most MOST_ROWS. Each count is
    called once untimed (which sets its kernels up), then the counts are timed in turns, one call each a
    turn, up to CALL_REPEATS turns while they take at most CALL_BUDGET_S per count (one at least): a
    burst of load then falls on every count alike instead of on one. A call of more rows never costs less,
    so the medians are fitted with a non-decreasing curve (isotonic regression). `check` (a cancel's) is
    called before each count's first call and each turn, and `on_size(i, n)` as the i-th of n is set up."""
    budget = problem.config.budget
    assert budget is not None  # --tree auto plans within a budget
    top = min(call_size(problem.slots * (budget + 1)), MOST_ROWS)
    rows = tuple(r for r in MEASURED_SIZES if r < top) + (top,)
    first = []
    for i, r in enumerate(rows):
        check()
        on_size(i, len(rows))
        first.append(call_seconds(problem, r, 1)[0])
    turns = max(1, min(CALL_REPEATS, int(CALL_BUDGET_S * len(rows) / max(sum(first), 1e-9))))
    times: list[list[float]] = [[] for _ in rows]
    for _ in range(turns):
        check()
        for r, timed in zip(rows, times, strict=True):
            timed += call_seconds(problem, r, 1, warm=False)
    medians = [statistics.median(t) for t in times]
    fitted = isotonic_regression(medians).x
    return CallCosts(rows, tuple(float(s) for s in fitted), len(rows) * (1 + turns))


class DriverCosts(TypedDict):
    """driver_costs' seconds (CostModel's fields of the same names)."""

    round_s: float
    level_s: float
    network_level_s: float


def driver_costs(problem: Setup, check: Callable[[], None] = lambda: None) -> DriverCosts:
    """The driver's own cost per round and per level with the problem's draft (round_s, level_s,
    network_level_s), from chains of two depths sampled with an instant network (0.5 x) in place of
    the target (driver_seconds). For the stepwise draft, whose levels call its network at some steps only, the levels
    are priced as the frozen draft's, and a level that calls the network by what a chain that calls it
    at every level costs more."""
    budget, draft = problem.config.budget, problem.draft
    assert budget is not None and draft is not None  # a speculative method's, planned within a budget
    shallow, deep = 1, max(2, min(8, budget, int(problem.kernel.stochastic_run_lengths().max())))
    stepwise = draft.part(StepwiseDraft)
    # the stepwise draft as it drafts where its levels take a frozen form (it still keeps r_f at every commit)
    levels_draft = StepwiseDraft(stepwise.network, tuple(stepwise.frozen.forms.tolist())) if stepwise else draft
    chains = [(levels_draft, shallow), (levels_draft, deep)]
    if stepwise:
        chains.append((StepwiseDraft(stepwise.network, (RESIDUAL,) * problem.kernel.num_steps), deep))
    per_round = [
        driver_seconds(problem, check, tree=Topology.chain(depth), draft=d, verifier=problem.verifier)
        for d, depth in chains
    ]
    level_s = max(0.0, (per_round[1] - per_round[0]) / (deep - shallow))
    network_level_s = max(0.0, (per_round[2] - per_round[1]) / deep) if stepwise else 0.0
    return {
        "round_s": max(0.0, per_round[0] - level_s * shallow),
        "level_s": level_s,
        "network_level_s": network_level_s,
    }


def plain_seconds(problem: Setup, check: Callable[[], None] = lambda: None) -> float:
    """The expected seconds of plain sampling of the problem's batch: a call of the batch at every step
    (the problem's cost model: its calls were measured by call_costs), and the plain sampler's own cost per
    step (driver_seconds of plain rounds: a round is a step)."""
    assert problem.cost_model is not None  # the time objective's, measured by call_costs
    steps = problem.kernel.num_steps
    return steps * (problem.cost_model.call(problem.slots) + driver_seconds(problem, check))


class _Timed(Exception):
    """Raised by a timed run's callback once its rounds are timed."""


def driver_seconds(problem: Setup, check: Callable[[], None] = lambda: None, **run: Any) -> float:
    """Seconds per round outside the target call of a run of the problem's batch with `run` (sample's tree,
    draft, verifier; default plain sampling), with an instant network in place of the target: the median of
    TIMED_ROUNDS rounds after WARM_ROUNDS (the first rounds of a layout in a process allocate its buffers),
    with at most the larger of MEASURED_BATCHES trajectories; a larger batch's from those two, extrapolated
    linearly (module docstring). `check` (a cancel's) is called after each round."""
    slots = problem.slots
    if slots <= MEASURED_BATCHES[-1]:
        return _median_round(problem, slots, check, run)
    low, high = (_median_round(problem, b, check, run) for b in MEASURED_BATCHES)
    slope = max(0.0, (high - low) / (MEASURED_BATCHES[1] - MEASURED_BATCHES[0]))
    return high + slope * (slots - MEASURED_BATCHES[1])


def _median_round(problem: Setup, batch: int, check: Callable[[], None], run: dict) -> float:
    stamps: list[float] = []

    def timed(info: dict) -> None:
        check()
        stamps.append(time.perf_counter())
        if len(stamps) > WARM_ROUNDS + TIMED_ROUNDS:
            raise _Timed

    try:
        sample(
            lambda x, n, **cond: 0.5 * x,
            problem.kernel,
            problem.target.shape,
            batch,
            prefetch="nearest",
            seed=problem.config.seed,
            cond={k: v[:batch] for k, v in problem.cond.items()},
            device=problem.device,
            dtype=problem.dtype,
            callback=timed,
            **run,
        )
    except _Timed:
        pass
    gaps = np.diff(stamps[WARM_ROUNDS - 1 :]) if len(stamps) > WARM_ROUNDS else np.diff(stamps)
    return float(np.median(gaps)) if len(gaps) else 0.0


def call_seconds(problem: Setup, rows: int, repeats: int, warm: bool = True) -> list[float]:
    """Seconds of `repeats` target calls of `rows` rows of random states at random steps, after a
    first call of that shape (which sets up the network's kernels for it) unless `warm` is False."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, *problem.target.shape), generator=generator).to(problem.device, problem.dtype)
    n = torch.randint(0, problem.kernel.num_steps, (rows,), generator=generator).to(problem.device)
    cond = {k: v[:1].expand(rows, *v.shape[1:]).to(problem.device) for k, v in problem.cond.items()}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + warm):
            _sync(problem.device)
            t0 = time.perf_counter()
            problem.network(x, n, **cond)
            _sync(problem.device)
            times.append(time.perf_counter() - t0)
    return times[int(warm) :]


def call_sizes(problem: Setup) -> set[int]:
    """The padded sizes of the target calls a run of this problem can make: every tree the plan
    (or the fixed topology) uses, cut short at any depth, with or without its root and leaves, for
    the batch; and a batch of lone roots (warm-ups, plain and deterministic steps)."""
    batch, tree = problem.slots, problem.tree
    assert tree is not None  # planned
    sizes = {call_size(batch)}
    for t in tree.topologies:
        for depth in range(1, t.depth + 1):
            cut = Topology(t.widths[:depth])
            sizes |= {
                call_size(batch * (cut.rows_per_round(leaves) - known))
                for leaves in (False, True)
                for known in (0, 1)
                if cut.rows_per_round(leaves) > known
            }
    return sizes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
