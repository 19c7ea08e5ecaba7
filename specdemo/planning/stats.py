"""The deltas a plan is made from: measured by the setting's own runs (learn, kept in the plan cache), or by
pilot runs before the first run (--pilot: draft_options)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..drafts import BiasedDraft, Draft
from ..limits import Cancel
from ..resolve import PILOT_DEPTH
from ..sampling import Cost, RoundTrace, sample
from ..trees import Topology
from ..verifiers import get_verifier
from .cache import (
    KEPT_PER_CELL,
    MACHINE,
    cache_folder,
    drop_plan,
    index_ranges,
    load_plan,
    parse_cell,
    plan_key,
    range_indices,
    store_plan,
)
from .forms import candidates, options
from .programme import DeltaStats
from .setup import Setup


def learnt_seed(seed: int) -> int:
    """The seed of a run's random streams under a plan learnt from runs: a hash of its seed, in 0..2**63 - 1.
    The learning runs drew from the streams of their own seeds; a planned run of the same seed drawing from
    them again would sample with a plan that is a function of its own draws (docs/algorithms.md, section 6,
    "Plans learnt from runs")."""
    return _hashed_seed("specdemo-learnt-plan", seed)


def pilot_seed(seed: int) -> int:
    """The seed of the pilots' random streams for a run of `seed`: a hash of it in a domain of its own, in
    0..2**63 - 1, so that the run's plan is no function of its own draws. An offset (seed + k) would give the
    pilot of seed s the streams of a user's run of seed s + k, and leave the seed's range at its top."""
    return _hashed_seed("specdemo-pilot", seed)


def _hashed_seed(domain: str, seed: int) -> int:
    """SHA-256 of the domain and the seed, reduced to 0..2**63 - 1: the streams of two domains, or of a domain
    and the users' seeds, are as independent as those of two seeds."""
    digest = hashlib.sha256(f"{domain}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def stats_key(key: dict) -> dict:
    """Where a setting's learnt deltas are kept: beside its plan, under a key of their own, without the machine
    a plan priced by time is kept for (batch, device, dtype, launch): deltas do not depend on it, so that
    statistics shipped with the package serve every machine."""
    return {**{k: v for k, v in key.items() if k not in MACHINE}, "record": "stats"}


def load_stats(key: dict, folder: Path | None) -> tuple[DeltaStats, int] | None:
    """The deltas the setting's runs left in the cache, and how many trajectories measured them."""
    record = _stats_record(key, folder)
    return None if record is None else _stats_of(record)


def _stats_record(key: dict, folder: Path | None) -> dict | None:
    stored = load_plan(stats_key(key), folder)
    return None if stored is None else stored[0]


def _stats_of(record: dict) -> tuple[DeltaStats, int]:
    deltas = {parse_cell(cell): values for cell, values in record["deltas"].items()}
    return DeltaStats(deltas, int(record["num_steps"])), int(record["trajectories"])


def learn(problem: Setup, trace: Sequence[RoundTrace], indices: Sequence[int]) -> None:
    """Add a run's deltas (its trace: the verified paths' deltas, as a pilot measures them) to the
    setting's statistics in the plan cache, those of its trajectories (`indices`) not learnt from yet: a
    trajectory is the stream of its index under its seed, so a run repeated with a seed draws the same
    deltas again, which would weigh them twice. The record keeps the trajectories learnt from, per seed
    ("learnt"; a record written without it learnt from none that it knows of). Under --replan they replace
    the ones kept (and the plan goes, so that the next run plans from the new ones). A cache that cannot be
    written is skipped."""
    folder = cache_folder(problem.config.cache_dir)
    if folder is None:
        return
    key = plan_key(problem)
    record = None if problem.config.replan else _stats_record(key, folder)
    stats, count = _stats_of(record) if record is not None else (DeltaStats({}, problem.kernel.num_steps), 0)
    learnt = {} if record is None else record.get("learnt", {})
    seed = str(problem.stream_seed)
    known = range_indices(learnt.get(seed, []))
    new = set(indices) - known
    if not new:
        return  # a repeat: every trajectory's deltas are kept already
    fresh = [rnd.restricted(np.isin(rnd.trajectories, sorted(new))) for rnd in trace]
    for cell, values in DeltaStats.from_traces(fresh, problem.kernel.num_steps).deltas.items():
        stats.deltas.setdefault(cell, []).extend(values)
    if problem.config.replan:
        drop_plan(key, folder)
    store_plan(
        stats_key(key),
        {
            "num_steps": stats.num_steps,
            "trajectories": count + len(new),
            "learnt": {**learnt, seed: index_ranges(known | new)},
            "deltas": {
                f"{n},{d}": [float(f"{v:.5g}") for v in values[:KEPT_PER_CELL]]
                for (n, d), values in sorted(stats.deltas.items())
            },
        },
        folder,
    )


MEASURED_RUNS = 8  # a plan's measured seconds: the running mean of at most this many runs


def observe(problem: Setup, wall_s: float, trajectories: int) -> None:
    """Keep a planned run's measured seconds per batch of slots in its plan record, a running mean over at
    most MEASURED_RUNS runs (measured_s, measured_runs), which planning weighs against plain sampling's
    expected seconds (planning._plain_if_faster): where the cost model prices a round below what it takes,
    the runs say so. A repeated seed counts again here, unlike in learn: its draws are the same, but its
    seconds are a new measurement of what the plan takes on this machine now (its load, its warm caches),
    and what the runs a user repeats take is what plain sampling is weighed against. A cache that cannot be
    written, or a plan not in it, is skipped."""
    folder = cache_folder(problem.config.cache_dir)
    stored = None if folder is None else load_plan(plan_key(problem), folder)
    if stored is None:
        return
    record = {k: v for k, v in stored[0].items() if k != "key"}
    seconds = wall_s / math.ceil(trajectories / problem.slots)
    runs = min(int(record.get("measured_runs", 0)), MEASURED_RUNS - 1)
    record["measured_s"] = (record.get("measured_s", 0.0) * runs + seconds) / (runs + 1)
    record["measured_runs"] = runs + 1
    store_plan(plan_key(problem), record, folder)


def draft_options(
    problem: Setup, auto_freeze: bool, cancel: Cancel | None = None
) -> tuple[Cost, list[tuple[DeltaStats, Draft]]]:
    """The pilots' cost and the drafts they leave to choose from, each with its deltas. With --freeze
    auto, one pilot for each candidate form (forms.candidates), chosen among per step by forms.options."""
    assert problem.draft is not None  # a speculative method's
    if not auto_freeze:
        stats, cost = _pilot(problem, problem.draft, cancel)
        return cost, [(stats, problem.draft)]
    drafts = candidates(problem)
    pilots = [_pilot(problem, draft, cancel) for _, draft in drafts]
    cost = pilots[0][1]
    for more in pilots[1:]:
        cost = _add_costs(cost, more[1])
    return cost, options(problem, [(form, stats) for (form, _), (stats, _) in zip(drafts, pilots, strict=True)])


def _pilot(problem: Setup, draft: Draft, cancel: Cancel | None) -> tuple[DeltaStats, Cost]:
    """Deltas on the verified path of config.pilot_samples trajectories drafted by a deep chain.
    PILOT_DEPTH, not the deepest level a plan may reach: a chain's deep levels are reached only by
    the trajectories whose draft fits best, so their deltas flatter the wider trees a plan builds
    (on gm512, a pilot as deep as the horizon planned slower trees than one of PILOT_DEPTH). Its streams are
    pilot_seed's, not the run's."""
    c = problem.config
    if c.draft_bias:
        draft = BiasedDraft(draft, c.draft_bias)
    depth = max(1, min(PILOT_DEPTH, int(problem.kernel.stochastic_run_lengths().max())))
    pilot = sample(
        problem.network,
        problem.kernel,
        problem.target.shape,
        c.pilot_samples,
        tree=Topology.chain(depth),
        draft=draft,
        verifier=get_verifier("rmc"),
        prefetch=c.prefetch,
        seed=pilot_seed(c.seed),
        cond={k: v[:1].expand(c.pilot_samples, *v.shape[1:]) for k, v in problem.cond.items()},
        device=problem.device,
        dtype=problem.dtype,
        trace=True,
        trace_states=False,
        cancel=cancel,
    )
    assert pilot.trace is not None  # run with trace=True
    return DeltaStats.from_traces(pilot.trace, problem.kernel.num_steps), pilot.cost


def _add_costs(a: Cost, b: Cost) -> Cost:
    return Cost(
        method="pilot",
        steps=a.steps,
        stochastic_steps=a.stochastic_steps,
        calls_per_trajectory=a.calls_per_trajectory + b.calls_per_trajectory,
        counted_calls=a.counted_calls + b.counted_calls,
        rows_per_trajectory=a.rows_per_trajectory + b.rows_per_trajectory,
        target_calls=a.target_calls + b.target_calls,
        wall_s=a.wall_s + b.wall_s,
        target_s=a.target_s + b.target_s,
    )
