"""What a round costs on the run's device, for the time objective: the target's call by its rows, and the
driver's own cost per round and per level (trees/cost_model.py prices a round with them)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch

from ..drafts import Draft, StepwiseDraft
from ..drafts.stepwise import RESIDUAL
from ..sampling import sample
from ..trees import Topology
from ..trees.cost_model import call_size

if TYPE_CHECKING:
    from ..pipeline import Problem

CALL_REPEATS = 5
DRIVER_REPEATS = 3  # timed runs of each chain _driver_costs prices rounds and levels from, the median kept
MEASURED_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # padded call sizes, 2 an octave


def call_costs(problem: Problem, check: Callable[[], None] = lambda: None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The target's call at a few row counts up to the batch times the budget: (rows, seconds), the
    median of CALL_REPEATS after a warm-up call each; `check` (a cancel's) is called before each count."""
    budget = problem.config.budget
    assert budget is not None  # --tree auto plans within a budget
    top = call_size(problem.slots * (budget + 1))
    rows = tuple(r for r in MEASURED_SIZES if r < top) + (top,)
    seconds = []
    for r in rows:
        check()
        seconds.append(statistics.median(call_seconds(problem, r, CALL_REPEATS)))
    return rows, tuple(seconds)


class DriverCosts(TypedDict):
    """driver_costs' seconds (CostModel's fields of the same names)."""

    round_s: float
    level_s: float
    network_level_s: float


def driver_costs(problem: Problem) -> DriverCosts:
    """The driver's own cost per round and per level with the problem's draft (round_s, level_s,
    network_level_s), from chains of two depths sampled with an instant network (0.5 x) in place of
    the target. For the stepwise draft, whose levels call its network at some steps only, the levels
    are priced as the frozen draft's, and a level that calls the network by what a chain that calls it
    at every level costs more."""
    budget, draft = problem.config.budget, problem.draft
    assert budget is not None and draft is not None  # a speculative method's, planned within a budget
    shallow, deep = 1, max(2, min(8, budget, int(problem.kernel.stochastic_run_lengths().max())))
    stepwise = isinstance(draft, StepwiseDraft)
    # the stepwise draft as it drafts where its levels take a frozen form (it still keeps r_f at every commit)
    levels_draft = (
        StepwiseDraft(draft.network, tuple(draft.frozen.forms.tolist())) if isinstance(draft, StepwiseDraft) else draft
    )
    chains = [(levels_draft, shallow), (levels_draft, deep)]
    if isinstance(draft, StepwiseDraft):
        chains.append((StepwiseDraft(draft.network, (RESIDUAL,) * problem.kernel.num_steps), deep))
    per_round = _driver_seconds(problem, chains)
    level_s = max(0.0, (per_round[1] - per_round[0]) / (deep - shallow))
    network_level_s = max(0.0, (per_round[2] - per_round[1]) / deep) if stepwise else 0.0
    return {
        "round_s": max(0.0, per_round[0] - level_s * shallow),
        "level_s": level_s,
        "network_level_s": network_level_s,
    }


def plain_seconds(problem: Problem) -> float:
    """The expected seconds of plain sampling of the problem's batch: a call of the batch at every step
    (the problem's cost model: its calls were measured by call_costs), and the plain sampler's own cost per
    step (a run with an instant network in place of the target, after an untimed first one; the median of
    DRIVER_REPEATS)."""
    slots, steps = problem.slots, problem.kernel.num_steps
    assert problem.cost_model is not None  # the time objective's, measured by call_costs
    call = problem.cost_model.call(slots)

    def overhead() -> float:
        cost = sample(
            lambda x, n, **cond: 0.5 * x,
            problem.kernel,
            problem.target.shape,
            slots,
            seed=problem.config.seed,
            cond={k: v[:slots] for k, v in problem.cond.items()},
            device=problem.device,
            dtype=problem.dtype,
        ).cost
        return cost.wall_s - cost.target_s

    overhead()
    return steps * call + statistics.median(overhead() for _ in range(DRIVER_REPEATS))


def call_seconds(problem: Problem, rows: int, repeats: int) -> list[float]:
    """Seconds of `repeats` target calls of `rows` rows of random states at random steps, after a
    first call of that shape (which sets up the network's kernels for it)."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, *problem.target.shape), generator=generator).to(problem.device, problem.dtype)
    n = torch.randint(0, problem.kernel.num_steps, (rows,), generator=generator).to(problem.device)
    cond = {k: v[:1].expand(rows, *v.shape[1:]).to(problem.device) for k, v in problem.cond.items()}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            _sync(problem.device)
            t0 = time.perf_counter()
            problem.network(x, n, **cond)
            _sync(problem.device)
            times.append(time.perf_counter() - t0)
    return times[1:]


def call_sizes(problem: Problem) -> set[int]:
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


def _driver_seconds(problem: Problem, chains: list[tuple[Draft, int]]) -> list[float]:
    """Seconds per round outside the target call of each chain (draft, depth), sampled with an
    instant network in place of the target: the median of DRIVER_REPEATS runs, the chains in turn,
    after an untimed first run of each (the first run of a layout in a process allocates its round
    buffers, and a lone timing of it priced a level up to twice as dear at batch 1)."""
    slots = problem.slots

    def seconds(draft: Draft, depth: int) -> float:
        cost = sample(
            lambda x, n, **cond: 0.5 * x,
            problem.kernel,
            problem.target.shape,
            slots,
            tree=Topology.chain(depth),
            draft=draft,
            verifier=problem.verifier,
            prefetch="nearest",
            seed=problem.config.seed,
            cond={k: v[:slots] for k, v in problem.cond.items()},
            device=problem.device,
            dtype=problem.dtype,
        ).cost
        return (cost.wall_s - cost.target_s) / max(cost.rounds, 1)

    for chain in chains:
        seconds(*chain)
    return np.median([[seconds(*chain) for chain in chains] for _ in range(DRIVER_REPEATS)], axis=0).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
