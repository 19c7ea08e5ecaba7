"""Planning: what a run measures and keeps to plan its setting, behind one entry, plan(problem) -> Plan.

An auto topology (--tree auto) is planned per step from measured deltas (planner.py, with planning/programme.py's
programme); the time objective prices each round with the target's measured cost of a call by its rows and
the driver's own cost (costs.py). The deltas come, by default, from the setting's own runs: until
config.pilot_samples trajectories have been measured, a run samples with the online plan (a block chain as
deep as the budget, a fixed draft form: planner.online_problem) and adds the deltas of its verified paths to
the plan cache (stats.learn); the run after that plans from them and stores the plan. Under --freeze auto the
runs price each draft form along their committed paths instead (forms.py), for every topology of the model:
a fixed tree's runs learn its per-step table too. No run pays a pilot. With --pilot, pilot runs measure
them before the first run instead, one of each form under --freeze auto. Plans and statistics are kept per
setting in the plan cache (cache.py). Statistics of the app's default settings ship with the package
(specdemo/plans/), not plans: a plan is priced on the machine that runs it. Planning reads a problem as a
Setup (setup.py) and never imports the pipeline.

Where a plan comes from, the first rule that applies:

| rule | plan_source |
|---|---|
| a plan of the setting in this cache (not under --replan) | cache |
| --pilot | pilot: pilots measure the deltas, and the plan is priced here |
| the setting's own statistics in this cache hold config.pilot_samples trajectories | runs: priced here |
| the cache holds none of the setting's statistics, nor --replan, and the package ships them | shipped: priced here |
| otherwise | online: the online plan, whose runs learn |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ..drafts import BiasedDraft, Draft, FrozenPerStep, StepwiseDraft
from ..limits import Cancel
from ..resolve import AUTO_FORMS, PILOT_DEPTH
from ..sampling import Cost
from ..trees import Topology, TopologyPlan
from ..verifiers import Verifier, get_verifier
from .cache import SHIPPED_PLANS, cache_folder, key_name, load_plan, plan_from_dict, plan_key, plan_to_dict, store_plan
from .cost_model import CostModel
from .costs import call_seconds, call_sizes, plain_seconds
from .forms import learns_table, load_forms, priced_count, replanned, table_wanted
from .forms import options as forms_options
from .planner import Report, auto_draft, best_plan, online_draft, online_problem, plan_tree, planned_options, quiet
from .programme import DeltaStats
from .record import Measuring, measuring, record
from .setup import S, Setup, settled
from .stats import draft_options, learnt_seed, load_stats

if TYPE_CHECKING:
    from ..parallel import Broadcast

__all__ = [
    "AUTO_FORMS",
    "MEASURED_MIN",
    "PILOT_DEPTH",
    "SHIPPED_PLANS",
    "Measuring",
    "Plan",
    "Report",
    "Setup",
    "best_plan",
    "call_seconds",
    "call_sizes",
    "draft_options",
    "key_name",
    "learnt_seed",
    "load_stats",
    "measuring",
    "plan",
    "plan_key",
    "plan_tree",
    "planned_options",
    "quiet",
    "record",
]


# plans priced here from shipped statistics where no cache folder keeps them (--cache-dir off): by key name
PRICED: dict[str, tuple[dict, str]] = {}
MEASURED_MIN = 2  # runs that must have measured a plan before their seconds count against plain sampling's
MEASURED_MARGIN = 1.1  # ... and by how much they must exceed them: one loaded run does not turn a plan off


@dataclass(frozen=True)
class Plan:
    """What planning settles for a problem, each field the problem's of that name, which the pipeline applies
    (pipeline's Problem.planned): the tree (a fixed one, the online plan or an auto topology), the draft (with its
    freeze table) and the verifier; plan_source:
    "pilot", "runs", "cache", "shipped", "online" or "default" (a fixed tree, --freeze auto's first table:
    learning_table, the run prices the forms for later runs),
    None where nothing was planned; the cost model (time objective), the measured deltas and the pilot's cost
    when this build measured them, the seconds planning took, whether the plan was learnt from runs
    (Setup.stream_seed), and under the time objective the expected seconds of plain sampling, the candidate
    an auto topology is weighed against (where it wins, the tree is Topology(()): the run samples plainly, and
    `declined` keeps the planned problem it did not run; measured_s: what runs under the plan took, per batch of slots,
    when at least MEASURED_MIN runs measured it)."""

    tree: Topology | TopologyPlan | None
    draft: Draft | None
    verifier: Verifier | None
    plan_source: str | None = None
    learning_table: bool = False
    cost_model: CostModel | None = None
    stats: DeltaStats | None = None
    pilot: Cost | None = None
    calibration_s: float = 0.0
    planning_calls: int = 0
    learnt: bool = False
    plain_s: float | None = None
    declined: Setup | None = None
    measured_s: float | None = None

    @classmethod
    def of(cls, problem: Setup) -> Plan:
        return cls(**{f.name: getattr(problem, f.name) for f in fields(cls)})


def plan(problem: Setup, cancel: Cancel | None = None, share: Broadcast | None = None, report: Report = quiet) -> Plan:
    """The problem's plan (module docstring); cancel stops planning between its measurements and the pilots
    between rounds; share: under accelerate launch, the main process plans and the others take its plan;
    report hears the share of a plan's measurements done and what is measured next (a plan priced here)."""
    return Plan.of(_planned(problem, cancel, share, report))


def _planned(problem: S, cancel: Cancel | None, share: Broadcast | None, report: Report) -> S:  # noqa: PLR0912 (issue 56 splits it)
    """The problem as its plan settles it (the module docstring's table): from the plan cache when the setting
    was planned before; else from pilots (--pilot: chains with streams of their own, stats.pilot_seed, their
    cost kept in problem.pilot apart from the run's); else planned from the deltas its earlier runs left
    (stats.learn), once they hold config.pilot_samples trajectories, or where the cache holds none of its own
    from the statistics shipped with the package, priced here; else the online problem, which samples
    without a plan and learns. Under
    accelerate launch the main process plans and sends its record to the others (a plan priced by time
    differs with each process's measurements)."""
    c, request = problem.config, problem.request
    if request is None:
        return _with_bias(problem)
    auto_tree, auto_freeze = request.tree, request.freeze
    if share is not None and not share.is_main:
        record, source = share.receive()
        return _with_bias(_plain_if_faster(_from_record(problem, record, source, auto_tree, auto_freeze)))
    folder = cache_folder(c.cache_dir)
    key = plan_key(problem)
    learnt, source = _statistics(problem, key, folder)
    stored = None if c.replan else load_plan(key, folder) if folder is not None else PRICED.get(key_name(key))
    # a fixed tree plans from runs only its --freeze auto table
    from_runs = not c.pilot and learnt is not None and learnt[1] >= c.pilot_samples and (auto_tree or auto_freeze)
    if stored is not None:
        problem = _from_record(problem, *stored, auto_tree, auto_freeze)
    elif c.pilot or from_runs:
        t0 = time.perf_counter()
        if c.pilot:
            pilot, options = draft_options(problem, auto_freeze, cancel)
            problem = settled(problem, pilot=pilot, plan_source="pilot")
        else:
            assert learnt is not None  # from_runs
            options = learnt[0]()
            problem = settled(problem, plan_source=source, learnt=True)
        stats, draft = options[0]
        problem = settled(problem, draft=draft, stats=stats)
        if auto_tree:
            problem = best_plan(planned_options(problem, options, cancel, report), c.objective)
        if auto_tree and c.objective == "time":
            report(1.0, "timing plain sampling's steps")
            problem = settled(problem, plain_s=plain_seconds(problem, cancel.check if cancel else lambda: None))
        problem = settled(problem, calibration_s=time.perf_counter() - t0)
        verifier, source = problem.verifier, problem.plan_source
        assert verifier is not None and source is not None  # settled above: by "pilot", "runs" or "shipped"
        plan_record: dict | None = None
        forms: list[int] | None = None
        if auto_tree:
            assert isinstance(problem.tree, TopologyPlan)  # best_plan's
            plan_record = plan_to_dict(problem.tree)
        if auto_freeze:
            assert isinstance(problem.draft, (FrozenPerStep, StepwiseDraft))  # auto_draft's
            forms = list(problem.draft.forms.tolist())
        stored = (
            {
                "plan": plan_record,
                "verifier": verifier.name,
                "plain_s": problem.plain_s,
                "forms": forms,
                "cost_model": problem.cost_model.to_dict() if problem.cost_model else None,
                "pilot": {"calls": pilot.target_calls, "s": problem.calibration_s} if c.pilot else None,
                "learnt_from": None if c.pilot or learnt is None else learnt[1],
            },
            source,
        )
        store_plan(key, stored[0], folder)
        if folder is None and source == "shipped":  # no cache keeps it: this process does
            PRICED[key_name(key)] = stored
    else:
        stored = ({"online": True}, "online")
        problem = online_problem(problem, auto_tree, auto_freeze)
        problem = settled(problem, learning_table=learns_table(problem) and table_wanted(problem))
    if share is not None:
        share.send(stored)
    return _with_bias(_plain_if_faster(problem))


def _statistics(problem: Setup, key: dict, folder: Path | None) -> tuple[tuple[Callable, int] | None, str]:
    """What a plan would be learnt from (_learnt), and its plan_source: the setting's own statistics in the cache
    ("runs"); where the cache holds none of its own, or too few, the statistics shipped with the package
    ("shipped": priced here). Once its runs keep statistics here (--replan learns anew), they plan it (the
    forms are kept for every topology at once: there, once its own --replan priced them)."""
    c = problem.config
    learnt = None if c.replan else _learnt(problem, key, folder)
    own = replanned(problem) if learns_table(problem) else learnt is not None
    if not own and not c.replan and not c.pilot and (learnt is None or learnt[1] < c.pilot_samples):
        shipped = _learnt(problem, key, SHIPPED_PLANS, shipped=True)
        if shipped is not None:
            return shipped, "shipped"
    return learnt, "runs"


def _learnt(
    problem: Setup, key: dict, folder: Path | None, shipped: bool = False
) -> tuple[Callable[[], list[tuple[DeltaStats, Draft]]], int] | None:
    """What the setting's runs measured (the cache's in `folder`; with `shipped`, the statistics shipped with
    the package, in SHIPPED_PLANS): how to make the draft options from it (made only where planned from it),
    and how many trajectories measured it. Under --freeze auto the forms priced along the runs' paths
    (forms.py), else the deltas of their verified paths under the configured draft (stats.learn)."""
    if learns_table(problem):
        where = folder if shipped else None
        count = priced_count(problem, where)
        return None if count is None else (lambda: _priced_options(problem, where), count)
    kept = load_stats(key, folder)
    auto_freeze = problem.request is not None and problem.request.freeze  # on a kernel without x0-hat
    return None if kept is None else (lambda: [(kept[0], online_draft(problem, auto_freeze))], kept[1])


def _priced_options(problem: Setup, folder: Path | None) -> list[tuple[DeltaStats, Draft]]:
    priced = load_forms(problem, folder)
    assert priced is not None  # priced_count read the record
    return forms_options(problem, priced[0])


def _plain_if_faster(problem: S) -> S:
    """Plain sampling where it is expected at least as fast as the planned topology, or where the plan's runs
    measured (measured_s) exceed plain sampling's expected seconds by MEASURED_MARGIN (the time objective): the
    problem then samples plainly (tree Topology(()), no draft, no verifier), and keeps the planned problem in
    `declined` and plain sampling's expected seconds in plain_s, to say why."""
    plan = problem.tree
    if problem.plain_s is None or not isinstance(plan, TopologyPlan) or plan.expected_s is None:
        return problem
    if plan.expected_s < problem.plain_s and (
        problem.measured_s is None or problem.measured_s < problem.plain_s * MEASURED_MARGIN
    ):
        return problem
    return settled(problem, tree=Topology(()), draft=None, verifier=None, declined=problem)


def _from_record(problem: S, record: dict, source: str, auto_tree: bool, auto_freeze: bool) -> S:
    """The problem planned as a stored record says (the plan cache's, or the main process's)."""
    if record.get("online"):
        return online_problem(problem, auto_tree, auto_freeze)
    draft = auto_draft(problem, tuple(record["forms"])) if auto_freeze else problem.draft
    cost = CostModel.from_dict(record["cost_model"]) if record.get("cost_model") else None
    tree = plan_from_dict(record["plan"]) if auto_tree else problem.tree
    measured = record.get("measured_s") if record.get("measured_runs", 0) >= MEASURED_MIN else None
    return settled(
        problem,
        draft=draft,
        tree=tree,
        verifier=get_verifier(record["verifier"]),
        cost_model=cost,
        plan_source=source,
        learnt=record.get("learnt_from") is not None,
        plain_s=record.get("plain_s"),
        measured_s=measured,
    )


def _with_bias(problem: S) -> S:
    c = problem.config
    draft = BiasedDraft(problem.draft, c.draft_bias) if c.draft_bias and problem.draft is not None else problem.draft
    if draft is not None:
        draft.check(problem.kernel)
    return settled(problem, draft=draft)
