"""What a run measures and keeps to plan its setting: the runs' own deltas (or pilot runs), the cost of a
round, the plan.

An auto topology (--tree auto) is planned per step from measured deltas (trees/auto.py); the time
objective prices each round with the target's measured cost of a call by its rows and the driver's
own cost (trees/cost_model.py). The deltas come, by default, from the setting's own runs: until
config.pilot_samples trajectories have been measured, a run samples with the online plan (a block
chain as deep as the budget, a fixed draft form: online_problem) and adds the deltas of its verified
paths to the plan cache (learn); the run after that plans from them and stores the plan. No run pays
a pilot. With --pilot, pilot runs measure them before the first run instead, and --freeze auto picks,
per step, what the frozen draft freezes from a pilot of each form. Plans and statistics are stored per
setting in a plan cache (a JSON file per key); plans of the app's default settings ship with the
package (specdemo/plans/).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.special import ndtr

from .config import PLANNED_VERIFIERS
from .drafts import BiasedDraft, CorrectedNetworkDraft, Draft, FrozenDraft, NetworkDraft, StepwiseDraft
from .drafts.frozen import FORMS
from .drafts.stepwise import RESIDUAL
from .errors import SpecdemoError
from .limits import Cancel
from .sampling import Cost, sample
from .trees import Topology, TopologyPlan
from .trees.topology import MAX_DEPTH
from .trees.auto import DeltaStats, plan_topology
from .trees.cost_model import CostModel, call_size
from .verifiers import get_verifier

if TYPE_CHECKING:
    from .parallel import Broadcast
    from .pipeline import Problem

PILOT_DEPTH, PILOT_SEED_OFFSET = 12, 7919
AUTO_FORMS = ("out", "x0", "x0-linear", "gaussian")  # --freeze auto: the forms the pilots compare, a pilot each


def pilot_runs(tree_auto: bool, freeze: str | None, network: bool = False, pilot: bool = False) -> int:
    """The pilot runs a setting pays before sampling: none without --pilot (plans are learnt from runs);
    with it one per form of AUTO_FORMS under --freeze auto, and one more for the corrected draft network
    with a draft network (they serve --tree auto too), else one chain pilot for --tree auto."""
    if not pilot:
        return 0
    return len(AUTO_FORMS) + network if freeze == "auto" else int(tree_auto)
LEAF_OPTIONS = {"auto": (False, True), "leaves": (True,)}  # by prefetch: may the planner evaluate leaves
PLAN_FORMAT = "specdemo-plan/6"
KEPT_PER_CELL = 64  # deltas a stored statistics record keeps per (step, depth): DeltaStats.pooled reads 24
SHIPPED_PLANS = Path(__file__).with_name("plans")
CALL_REPEATS = 5
DRIVER_REPEATS = 3  # timed runs of each chain _driver_costs prices rounds and levels from, the median kept
MEASURED_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # padded call sizes, 2 an octave


def cache_folder(setting: str | None) -> Path | None:
    """Where plans are kept: `setting` (a folder, or "off" for none), else $SPECDEMO_CACHE, else
    $XDG_CACHE_HOME/specdemo, else ~/.cache/specdemo."""
    setting = setting or os.environ.get("SPECDEMO_CACHE")
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdemo"


def plan_key(problem: Problem) -> dict:
    """Everything a plan depends on: the model, kernel, draft (its start too), verifier (as configured: auto or a
    name; the record keeps the one planned with) and budget, the pilot's
    size, and for the time objective the batch, device and dtype it was priced for. Not the seed:
    any plan is exact, so a setting's plan serves every seed (and the same seed gives the same
    samples once the plan is kept)."""
    c = problem.config
    from . import __version__

    key = {"format": PLAN_FORMAT, "version": __version__, "model": c.model, "kernel": problem.kernel.config(),
           "method": c.method, "tree": c.tree, "verifier": c.verifier, "draft": c.draft, "freeze": c.freeze,
           "start": c.start,
           "draft_bias": c.draft_bias, "prefetch": c.prefetch, "budget": c.budget, "objective": c.objective,
           "class_label": c.class_label, "pilot_samples": c.pilot_samples, "device": problem.device.type,
           "dtype": str(problem.dtype), "prompt": c.prompt, "negative_prompt": c.negative_prompt,
           "guidance_scale": c.guidance_scale}
    if c.objective == "time":
        key["batch"] = problem.slots
    if problem.device.type == "cuda":  # how the networks are launched prices their calls
        key["launch"] = c.launch
    return key


def key_name(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20] + ".json"


def load_plan(key: dict, folder: Path | None) -> tuple[dict, str] | None:
    """A stored calibration for this key: from the cache folder, else shipped with the package."""
    for where, source in ((folder, "cache"), (SHIPPED_PLANS, "shipped")):
        if where is None:
            continue
        path = where / key_name(key)
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if stored.get("key") == json.loads(json.dumps(key, default=str)):
            return stored, source
    return None


def store_plan(key: dict, record: dict, folder: Path | None) -> None:
    """Write atomically; a cache that cannot be written is skipped (the run goes on)."""
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key_name(key)}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"key": key, **record}, default=str))
        tmp.replace(folder / key_name(key))
    except OSError:
        pass


def plan_to_dict(plan: TopologyPlan) -> dict:
    return {"trees": [list(t.widths) for t in plan.trees], "leaves": list(plan.leaves),
            "known_trees": [list(t.widths) for t in plan.known_trees], "known_leaves": list(plan.known_leaves),
            "expected_calls": plan.expected_calls, "expected_s": plan.expected_s, "objective": plan.objective,
            "name": plan.name}


def plan_from_dict(d: dict) -> TopologyPlan:
    trees = {}
    topology = lambda widths: trees.setdefault(tuple(widths), Topology(tuple(widths)))
    return TopologyPlan(trees=tuple(topology(w) for w in d["trees"]), leaves=tuple(d["leaves"]),
                        known_trees=tuple(topology(w) for w in d["known_trees"]),
                        known_leaves=tuple(d["known_leaves"]), expected_calls=float(d["expected_calls"]),
                        expected_s=d["expected_s"], objective=d["objective"], name=d["name"])


# ---------------------------------------------------------------------------------------------- calibration
def calibrate(problem: Problem, cancel: Cancel | None = None, share: Broadcast | None = None) -> Problem:
    """What is planned from measurements: --tree auto (widths planned per step, specdemo.trees.auto,
    priced by a measured cost model for the time objective) and --freeze auto (a per-step choice among
    freezing the output, x0-hat, x0-hat extrapolated in time and the fitted Gaussian, and with a draft
    network that network corrected by the target's residual). Returns the calibrated problem: from the
    plan cache when this setting was planned before; else planned from the deltas its earlier runs left
    (learn), once they hold config.pilot_samples trajectories; else the online problem, which samples
    without a plan and learns (online_problem). With --pilot, pilot runs (chains with their own seeds,
    their cost kept in problem.pilot, apart from the run's) measure the deltas instead. cancel stops the
    pilots between rounds. share: under accelerate launch, the main process calibrates and the others
    take its calibration, so that every process samples with the same plan (a plan priced by time
    differs with each process's measurements)."""
    c = problem.config
    auto_tree = problem.tree is None
    auto_freeze = isinstance(problem.draft, (FrozenDraft, NetworkDraft)) and c.freeze == "auto"
    if c.prefetch == "auto" and not auto_tree:
        raise SpecdemoError("--prefetch auto lets the planner choose leaf evaluation per step, which needs --tree auto; "
                            f"with tree {problem.tree} use nearest, parent, none or leaves")
    if auto_freeze and not problem.kernel.has_denoised:
        raise SpecdemoError(f"--freeze auto chooses between the output and x0-hat, which the {problem.kernel.name} "
                            "kernel has not; use --freeze out")
    if not (auto_tree or auto_freeze):
        return _with_bias(problem)
    if share is not None and not share.is_main:
        return _with_bias(_from_record(problem, *share.receive(), auto_tree, auto_freeze))
    folder = cache_folder(c.cache_dir)
    key = plan_key(problem)
    stored = None if c.replan else load_plan(key, folder)
    learnt = None if c.replan or c.pilot or stored is not None or not auto_tree else load_stats(key, folder)
    if stored is not None:
        problem = _from_record(problem, *stored, auto_tree, auto_freeze)
    elif c.pilot or (learnt is not None and learnt[1] >= c.pilot_samples):
        t0 = time.perf_counter()
        if c.pilot:
            pilot, options = draft_options(problem, auto_freeze, cancel)
            stats, draft = options[0]
            problem = replace(problem, draft=draft, stats=stats, pilot=pilot, plan_source="pilot")
        else:
            stats, draft = learnt[0], online_draft(problem, auto_freeze)
            options = [(stats, draft)]
            problem = replace(problem, draft=draft, stats=stats, plan_source="runs", learnt=True)
        if auto_tree:
            problem = best_plan(planned_options(problem, options), c.objective)
        problem = replace(problem, calibration_s=time.perf_counter() - t0)
        stored = ({"plan": plan_to_dict(problem.tree) if auto_tree else None, "verifier": problem.verifier.name,
                   "forms": list(problem.draft.forms.tolist()) if auto_freeze else None,
                   "cost_model": problem.cost_model.to_dict() if problem.cost_model else None,
                   "pilot": {"calls": pilot.target_calls, "s": problem.calibration_s} if c.pilot else None,
                   "learnt_from": None if c.pilot else learnt[1]}, problem.plan_source)
        store_plan(key, stored[0], folder)
    else:
        stored = ({"online": True}, "online")
        problem = online_problem(problem, auto_tree, auto_freeze)
    if share is not None:
        share.send(stored)
    return _with_bias(problem)


def _from_record(problem: Problem, record: dict, source: str, auto_tree: bool, auto_freeze: bool) -> Problem:
    """The problem calibrated as a stored record says (the plan cache's, or the main process's)."""
    if record.get("online"):
        return online_problem(problem, auto_tree, auto_freeze)
    draft = _auto_draft(problem, tuple(record["forms"])) if auto_freeze else problem.draft
    cost = CostModel.from_dict(record["cost_model"]) if record.get("cost_model") else None
    tree = plan_from_dict(record["plan"]) if auto_tree else problem.tree
    return replace(problem, draft=draft, tree=tree, verifier=get_verifier(record["verifier"]), cost_model=cost,
                   plan_source=source, learnt=record.get("learnt_from") is not None)


# ---------------------------------------------------------------------------------------------- online
def online_form(problem: Problem) -> int:
    """The draft form a setting takes before its table is measured: the corrected draft network where
    there is one (RESIDUAL), else the fitted Gaussian where the kernel has x0-hat (it holds freezing
    x0-hat as lambda = 0, and was the best single form on the digits model: docs/benchmarks.md, section
    online), else the output."""
    if isinstance(problem.draft, NetworkDraft):
        return RESIDUAL
    return FORMS["gaussian"] if problem.kernel.has_denoised else FORMS["out"]


def online_draft(problem: Problem, auto_freeze: bool) -> Draft:
    """The draft a setting samples and plans with without pilots: under --freeze auto its table holds
    online_form at every step; any other draft as configured."""
    return _auto_draft(problem, (online_form(problem),) * problem.kernel.num_steps) if auto_freeze else problem.draft


def online_plan(problem: Problem) -> TopologyPlan:
    """The plan of a run that learns: at every step the block-verifiable chain of as many target rows as
    the budget (one level more where the root's output is known: that level costs no row), leaves not
    evaluated. Under the calls objective no chain of at most that many rows commits more steps a
    round; it is the same for every trajectory and every run, so the run's samples depend on nothing
    measured."""
    budget, steps = problem.config.budget, problem.kernel.num_steps
    chain, known = Topology.chain(min(budget, MAX_DEPTH)), Topology.chain(min(budget + 1, MAX_DEPTH))
    return TopologyPlan((chain,) * steps, (False,) * steps, (known,) * steps, (False,) * steps,
                        expected_calls=math.nan, objective=problem.config.objective, name=f"online({budget} rows)")


def online_problem(problem: Problem, auto_tree: bool, auto_freeze: bool) -> Problem:
    """The problem sampled while its setting has no plan: the online plan (--tree auto) with block
    verification (under --verifier auto), and online_draft (--freeze auto). Its runs learn."""
    tree = online_plan(problem) if auto_tree else problem.tree
    verifier = problem.verifier or get_verifier("block")
    return replace(problem, tree=tree, draft=online_draft(problem, auto_freeze), verifier=verifier,
                   plan_source="online" if auto_tree else "default")


def learnt_seed(seed: int) -> int:
    """The seed of a run's random streams under a plan learnt from runs: a hash of its seed, in 0..2**63 - 1.
    The learning runs drew from the streams of their own seeds; a planned run of the same seed drawing from
    them again would sample with a plan that is a function of its own draws (docs/algorithms.md, section 6,
    "Plans learnt from runs")."""
    digest = hashlib.sha256(f"specdemo-learnt-plan/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def stats_key(key: dict) -> dict:
    """Where a setting's learnt deltas are kept: beside its plan, under a key of their own."""
    return {**key, "record": "stats"}


def load_stats(key: dict, folder: Path | None) -> tuple[DeltaStats, int] | None:
    """The deltas the setting's runs left in the cache, and how many trajectories measured them."""
    stored = load_plan(stats_key(key), folder)
    if stored is None or stored[1] != "cache":
        return None
    record = stored[0]
    deltas = {tuple(int(v) for v in cell.split(",")): values for cell, values in record["deltas"].items()}
    return DeltaStats(deltas, int(record["num_steps"])), int(record["trajectories"])


def learn(problem: Problem, trace, trajectories: int) -> None:
    """Add a run's deltas (its trace: the verified paths' deltas, as a pilot measures them) to the
    setting's statistics in the plan cache; under --replan they replace the ones kept (and the plan
    goes, so that the next run plans from the new ones). A cache that cannot be written is skipped."""
    folder = cache_folder(problem.config.cache_dir)
    if folder is None:
        return
    key = plan_key(problem)
    kept = None if problem.config.replan else load_stats(key, folder)
    stats, count = kept if kept is not None else (DeltaStats({}, problem.kernel.num_steps), 0)
    for cell, values in DeltaStats.from_traces(trace, problem.kernel.num_steps).deltas.items():
        stats.deltas.setdefault(cell, []).extend(values)
    if problem.config.replan:
        (folder / key_name(key)).unlink(missing_ok=True)
    store_plan(stats_key(key), {"num_steps": stats.num_steps, "trajectories": count + trajectories,
                                "deltas": {f"{n},{d}": [float(f"{v:.5g}") for v in values[:KEPT_PER_CELL]]
                                           for (n, d), values in sorted(stats.deltas.items())}}, folder)


def _with_bias(problem: Problem) -> Problem:
    c = problem.config
    draft = BiasedDraft(problem.draft, c.draft_bias) if c.draft_bias and problem.draft is not None else problem.draft
    if draft is not None:
        draft.check(problem.kernel)
    return replace(problem, draft=draft)


def draft_options(problem: Problem, auto_freeze: bool, cancel: Cancel | None = None
                  ) -> tuple[Cost, list[tuple[DeltaStats, Draft]]]:
    """The pilots' cost and the drafts they leave to choose from, each with its deltas. With --freeze
    auto, one pilot for each form the frozen draft can take (AUTO_FORMS: the output, x0-hat, its
    extrapolation in time, the fitted Gaussian), and with a draft network one for that network corrected
    by the target's residual; the first option drafts each step with the form of highest mean
    acceptance (a tie goes to the earlier form). Where that gives some steps to the network, the second
    drafts with the frozen forms alone: a network level costs a draft call, which the time objective
    weighs (planned_options)."""
    if not auto_freeze:
        stats, cost = _pilot(problem, problem.draft, cancel)
        return cost, [(stats, problem.draft)]
    n_steps = problem.kernel.num_steps
    candidates = [(FORMS[mode], FrozenDraft(mode, start=problem.config.start)) for mode in AUTO_FORMS]
    if isinstance(problem.draft, NetworkDraft):
        candidates.append((RESIDUAL, CorrectedNetworkDraft(problem.draft.network, problem.draft.name)))
    pilots = [_pilot(problem, draft, cancel) for _, draft in candidates]
    acceptance = np.array([[_mean_acceptance(stats, m) for m in range(n_steps)] for stats, _ in pilots])
    options = []
    for kinds in (len(candidates), len(AUTO_FORMS)):  # every form, then the frozen forms alone
        table = tuple(candidates[i][0] for i in acceptance[:kinds].argmax(0).tolist())
        stats = DeltaStats({k: v for (form, _), (st, _) in zip(candidates, pilots) for k, v in st.deltas.items()
                            if table[k[0]] == form}, n_steps)
        options.append((stats, _auto_draft(problem, table)))
        if RESIDUAL not in table:
            break
    cost = pilots[0][1]
    for more in pilots[1:]:
        cost = _add_costs(cost, more[1])
    return cost, options


def planned_options(problem: Problem, options: list[tuple[DeltaStats, Draft]]) -> list[Problem]:
    """The problem planned (--tree auto) with each draft option and each verifier (the configured one, or
    under --verifier auto each of PLANNED_VERIFIERS: block verification accepts more a round, RMC costs
    the driver less a level, so which is faster depends on the device and the batch): under the time
    objective each with the cost model of its own draft and verifier (the target's calls measured once),
    under the calls objective with the first draft option alone (it accepts at least as much at every
    step)."""
    verifiers = [problem.verifier] if problem.verifier else [get_verifier(name) for name in PLANNED_VERIFIERS]
    if problem.config.objective != "time":
        stats, draft = options[0]
        return [replace(planned, tree=plan(planned, problem.config.budget))
                for planned in (replace(problem, draft=draft, stats=stats, verifier=v, cost_model=None)
                                for v in verifiers)]
    calls = _call_costs(problem)
    planned = []
    for stats, draft in options:
        for verifier in verifiers:
            priced = replace(problem, draft=draft, stats=stats, verifier=verifier)
            priced = replace(priced, cost_model=CostModel(*calls, **_driver_costs(priced), batch=problem.slots))
            planned.append(replace(priced, tree=plan(priced, problem.config.budget)))
    return planned


def best_plan(planned: list[Problem], objective: str) -> Problem:
    """The planned option of fewest expected seconds (time objective) or calls; the first of equals."""
    return min(planned, key=lambda p: p.tree.expected_s if objective == "time" else p.tree.expected_calls)


def _auto_draft(problem: Problem, forms: tuple[int, ...]) -> Draft:
    """--freeze auto's draft from its per-step table: the frozen draft's forms, and with a draft network
    the stepwise draft (the network corrected by the target's residual where the table says RESIDUAL; the
    frozen draft alone where it never does, which spares the network's call at every commit)."""
    if isinstance(problem.draft, NetworkDraft) and RESIDUAL in forms:
        return StepwiseDraft(CorrectedNetworkDraft(problem.draft.network, problem.draft.name), forms)
    return FrozenDraft("auto", forms, start=problem.config.start)


def plan(problem: Problem, budget: int) -> TopologyPlan:
    """The auto topology of the problem's verifier, method and objective for `budget` target rows
    a round, planned from the pilot's deltas (problem.stats): chains for method chain or a
    verifier of chains, trees of widths up to 8 (or the verifier's limit) otherwise."""
    if problem.stats is None:
        raise SpecdemoError("planning needs the pilot's deltas: build the problem with tree auto and a budget "
                            "(and replan, not a plan from the cache)")
    c = problem.config
    draft = problem.draft.base if isinstance(problem.draft, BiasedDraft) else problem.draft
    frozen = draft.uses_frozen  # only a frozen draft evaluates leaves or knows a root's output
    return plan_topology(problem.stats, problem.verifier, budget, problem.kernel.stochastic_run_lengths(),
                         max_width=1 if c.method == "chain" else 8,
                         leaf_options=LEAF_OPTIONS.get(c.prefetch, (False,)) if frozen else (False,),
                         exact_known_root=frozen and not c.draft_bias, warm_up=frozen and not draft.cold_start,
                         cost=problem.cost_model if c.objective == "time" else None,
                         network_steps=(draft.forms == RESIDUAL).numpy() if isinstance(draft, StepwiseDraft) else None)


def _pilot(problem: Problem, draft: Draft, cancel: Cancel | None) -> tuple[DeltaStats, Cost]:
    """Deltas on the verified path of config.pilot_samples trajectories drafted by a deep chain.
    PILOT_DEPTH, not the deepest level a plan may reach: a chain's deep levels are reached only by
    the trajectories whose draft fits best, so their deltas flatter the wider trees a plan builds
    (on gm512, a pilot as deep as the horizon, 28, planned trees 2% slower than a pilot of 12)."""
    c = problem.config
    if c.draft_bias:
        draft = BiasedDraft(draft, c.draft_bias)
    depth = max(1, min(PILOT_DEPTH, int(problem.kernel.stochastic_run_lengths().max())))
    pilot = sample(problem.network, problem.kernel, problem.target.shape, c.pilot_samples, tree=Topology.chain(depth),
                   draft=draft, verifier=get_verifier("rmc"), prefetch=c.prefetch, seed=c.seed + PILOT_SEED_OFFSET,
                   cond={k: v[:1].expand(c.pilot_samples, *v.shape[1:]) for k, v in problem.cond.items()},
                   device=problem.device, dtype=problem.dtype, trace=True, trace_states=False, cancel=cancel)
    return DeltaStats.from_traces(pilot.trace, problem.kernel.num_steps), pilot.cost


def _mean_acceptance(stats: DeltaStats, step: int) -> float:
    """Mean single-child acceptance 2 Phi(-delta/2) of the nodes verified at `step`, all depths."""
    deltas = [v for (s, _), vals in stats.deltas.items() if s == step for v in vals]
    return float(np.mean(2 * ndtr(-np.asarray(deltas) / 2))) if deltas else 0.0


def _add_costs(a: Cost, b: Cost) -> Cost:
    return Cost(method="pilot", steps=a.steps, stochastic_steps=a.stochastic_steps,
                calls_per_trajectory=a.calls_per_trajectory + b.calls_per_trajectory,
                counted_calls=a.counted_calls + b.counted_calls, rows_per_trajectory=a.rows_per_trajectory + b.rows_per_trajectory,
                target_calls=a.target_calls + b.target_calls, wall_s=a.wall_s + b.wall_s, target_s=a.target_s + b.target_s)


# ---------------------------------------------------------------------------------------------- cost model
def _call_costs(problem: Problem) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The target's call at a few row counts up to the batch times the budget: (rows, seconds), the
    median of CALL_REPEATS after a warm-up call each."""
    top = call_size(problem.slots * (problem.config.budget + 1))
    rows = tuple(r for r in MEASURED_SIZES if r < top) + (top,)
    return rows, tuple(statistics.median(call_seconds(problem, r, CALL_REPEATS)) for r in rows)


def _driver_costs(problem: Problem) -> dict[str, float]:
    """The driver's own cost per round and per level with the problem's draft (round_s, level_s,
    network_level_s), from chains of two depths sampled with an instant network (0.5 x) in place of
    the target. For the stepwise draft, whose levels call its network at some steps only, the levels
    are priced as the frozen draft's, and a level that calls the network by what a chain that calls it
    at every level costs more."""
    shallow, deep = 1, max(2, min(8, problem.config.budget, int(problem.kernel.stochastic_run_lengths().max())))
    draft = problem.draft
    stepwise = isinstance(draft, StepwiseDraft)
    # the stepwise draft as it drafts where its levels take a frozen form (it still keeps r_f at every commit)
    levels_draft = StepwiseDraft(draft.network, draft.frozen.forms.tolist()) if stepwise else draft
    chains = [(levels_draft, shallow), (levels_draft, deep)]
    if stepwise:
        chains.append((StepwiseDraft(draft.network, (RESIDUAL,) * problem.kernel.num_steps), deep))
    per_round = _driver_seconds(problem, chains)
    level_s = max(0.0, (per_round[1] - per_round[0]) / (deep - shallow))
    network_level_s = max(0.0, (per_round[2] - per_round[1]) / deep) if stepwise else 0.0
    return {"round_s": max(0.0, per_round[0] - level_s * shallow), "level_s": level_s,
            "network_level_s": network_level_s}


def call_seconds(problem: Problem, rows: int, repeats: int) -> list[float]:
    """Seconds of `repeats` target calls of `rows` rows of random states at random steps, after a
    first call of that shape (which sets up the network's kernels for it)."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, *problem.target.shape), generator=generator).to(problem.device, problem.dtype)
    n = torch.randint(0, problem.kernel.num_steps, (rows,), generator=generator).to(problem.device)
    cond = {k: v[:1].expand(rows, *v.shape[1:]).to(problem.device) for k, v in problem.cond.items()}
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
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
    sizes = {call_size(batch)}
    for t in tree.topologies:
        for depth in range(1, t.depth + 1):
            cut = Topology(t.widths[:depth])
            sizes |= {call_size(batch * (cut.rows_per_round(leaves) - known)) for leaves in (False, True)
                      for known in (0, 1) if cut.rows_per_round(leaves) > known}
    return sizes


def _driver_seconds(problem: Problem, chains: list[tuple[Draft, int]]) -> list[float]:
    """Seconds per round outside the target call of each chain (draft, depth), sampled with an
    instant network in place of the target: the median of DRIVER_REPEATS runs, the chains in turn,
    after an untimed first run of each (the first run of a layout in a process allocates its round
    buffers, and a lone timing of it priced a level up to twice as dear at batch 1)."""
    slots = problem.slots

    def seconds(draft: Draft, depth: int) -> float:
        cost = sample(lambda x, n, **cond: 0.5 * x, problem.kernel, problem.target.shape, slots,
                      tree=Topology.chain(depth), draft=draft, verifier=problem.verifier, prefetch="nearest",
                      seed=problem.config.seed, cond={k: v[:slots] for k, v in problem.cond.items()},
                      device=problem.device, dtype=problem.dtype).cost
        return (cost.wall_s - cost.target_s) / max(cost.rounds, 1)

    for chain in chains:
        seconds(*chain)
    return np.median([[seconds(*chain) for chain in chains] for _ in range(DRIVER_REPEATS)], axis=0).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
