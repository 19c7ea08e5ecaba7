"""The plan of a setting: the online plan a run samples with before anything is measured, and from measured
deltas the auto topology (planning/programme.py's programme) for each draft option and verifier, the best kept."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

from ..config import PLANNED_VERIFIERS
from ..drafts import CorrectedNetworkDraft, Draft, FrozenPerStep, NetworkDraft, StepwiseDraft
from ..drafts.frozen import FORMS
from ..drafts.stepwise import RESIDUAL
from ..errors import SpecdemoError
from ..kernels import Kernel
from ..limits import Cancel
from ..trees import ReachRule, Topology, TopologyPlan
from ..trees.topology import MAX_DEPTH
from ..verifiers import get_verifier
from .cost_model import CostModel
from .costs import call_costs, driver_costs
from .programme import DeltaStats, plan_topology
from .setup import S, Setup, settled

Report = Callable[[float, str], None]  # planning's progress: (share done, what it measures now)


def quiet(done: float, what: str) -> None:
    """A Report that tells no one."""


LEAF_OPTIONS = {"auto": (False, True), "leaves": (True,)}  # by prefetch: may the planner evaluate leaves


def online_form(problem: Setup) -> int:
    """The draft form a setting takes before its table is measured: the corrected draft network where
    there is one (RESIDUAL), else the fitted Gaussian where the kernel has x0-hat (it holds freezing
    x0-hat as lambda = 0, and was the best single form on the digits model: docs/benchmarks.md, section
    online), else the output."""
    if problem.draft is not None and problem.draft.part(NetworkDraft):
        return RESIDUAL
    return online_frozen_form(problem.kernel)


def online_frozen_form(kernel: Kernel) -> int:
    """online_form among the frozen forms alone."""
    return FORMS["gaussian"] if kernel.has_denoised else FORMS["out"]


def online_draft(problem: Setup, auto_freeze: bool) -> Draft:
    """The draft a setting samples and plans with without pilots: under --freeze auto its table holds
    online_form at every step; any other draft as configured."""
    if auto_freeze:
        return auto_draft(problem, (online_form(problem),) * problem.kernel.num_steps)
    assert problem.draft is not None  # planning is for speculative methods, which have a draft
    return problem.draft


def online_plan(problem: Setup) -> TopologyPlan:
    """The plan of a run that learns: at every step the block-verifiable chain of as many target rows as
    the budget (one level more where the root's output is known: that level costs no row), leaves not
    evaluated. Under the calls objective no chain of at most that many rows commits more steps a round,
    and every trajectory takes it whole. Under the time objective each trajectory cuts it by its own
    acceptance so far (ReachRule): a level costs a row whether or not the walk reaches it, and on a
    device where a call of many rows costs many times a call of few (an SD-sized UNet on a GPU, and every
    CPU), rows no walk reaches cost the run more than the levels they add. Either way a trajectory's chain
    depends on nothing measured before the run, nor on the other trajectories, so its samples depend on
    the seed alone."""
    budget, steps = problem.config.budget, problem.kernel.num_steps
    assert budget is not None  # --tree auto plans within a budget
    chain, known = Topology.chain(min(budget, MAX_DEPTH)), Topology.chain(min(budget + 1, MAX_DEPTH))
    return TopologyPlan(
        (chain,) * steps,
        (False,) * steps,
        (known,) * steps,
        (False,) * steps,
        expected_calls=math.nan,
        objective=problem.config.objective,
        name=f"online({budget} rows)",
        rule=ReachRule() if problem.config.objective == "time" else None,
    )


def online_problem(problem: S, auto_tree: bool, auto_freeze: bool) -> S:
    """The problem sampled while its setting has no plan: the online plan (--tree auto) with block
    verification (under --verifier auto), and online_draft (--freeze auto). Its runs learn."""
    tree = online_plan(problem) if auto_tree else problem.tree
    verifier = problem.verifier or get_verifier("block")
    return settled(
        problem,
        tree=tree,
        draft=online_draft(problem, auto_freeze),
        verifier=verifier,
        plan_source="online" if auto_tree else "default",
    )


def planned_options(
    problem: S, options: list[tuple[DeltaStats, Draft]], cancel: Cancel | None = None, report: Report = quiet
) -> list[S]:
    """The problem planned (--tree auto) with each draft option and each verifier (the configured one, or
    under --verifier auto each of PLANNED_VERIFIERS: block verification accepts more a round, RMC costs
    the driver less a level, so which is faster depends on the device and the batch): under the time
    objective each with the cost model of its own draft and verifier (the target's calls measured once),
    under the calls objective with the first draft option alone (it accepts at least as much at every
    step). cancel stops it between measurements and plans; `report` hears the share of the measurements done
    (the call sizes count as one, each option as one more) and what is measured next."""
    check = cancel.check if cancel is not None else lambda: None
    verifiers = [problem.verifier] if problem.verifier else [get_verifier(name) for name in PLANNED_VERIFIERS]
    budget = problem.config.budget
    assert budget is not None  # --tree auto plans within a budget
    if problem.config.objective != "time":
        stats, draft = options[0]
        return [
            settled(planned, tree=plan_tree(planned, budget))
            for planned in (settled(problem, draft=draft, stats=stats, verifier=v, cost_model=None) for v in verifiers)
        ]
    parts = 1 + len(options) * len(verifiers)
    calls = call_costs(problem, check, lambda i, n: report(i / n / parts, "timing the target's calls by their rows"))
    planned: list[S] = []
    for stats, draft in options:
        for verifier in verifiers:
            check()
            report((1 + len(planned)) / parts, f"timing the driver's rounds ({verifier.name} verification)")
            priced = settled(problem, draft=draft, stats=stats, verifier=verifier)
            model = CostModel(calls.rows, calls.seconds, **driver_costs(priced, check), batch=problem.slots)
            priced = settled(priced, cost_model=model, planning_calls=calls.calls)
            planned.append(settled(priced, tree=plan_tree(priced, budget)))
    return planned


def best_plan(planned: list[S], objective: str) -> S:
    """The planned option of fewest expected seconds (time objective) or calls; the first of equals."""

    def expected(p: S) -> float:
        plan = cast(TopologyPlan, p.tree)  # a planned option's
        if objective == "time":
            assert plan.expected_s is not None  # priced: the time objective plans with a cost model
            return plan.expected_s
        return plan.expected_calls

    return min(planned, key=expected)


def auto_draft(problem: Setup, forms: tuple[int, ...]) -> Draft:
    """--freeze auto's draft from its per-step table: the frozen draft's forms, and with a draft network
    the stepwise draft (the network corrected by the target's residual where the table says RESIDUAL; the
    frozen draft alone where it never does, which spares the network's call at every commit)."""
    network = None if problem.draft is None else problem.draft.part(NetworkDraft)
    if network is not None and RESIDUAL in forms:
        return StepwiseDraft(CorrectedNetworkDraft(network.network, network.name), forms)
    assert problem.config.start is not None  # resolve() settles it
    return FrozenPerStep(forms, start=problem.config.start)


def plan_tree(problem: Setup, budget: int) -> TopologyPlan:
    """The auto topology of the problem's verifier, method and objective for `budget` target rows
    a round, planned from the pilot's deltas (problem.stats): chains for method chain or a
    verifier of chains, trees of widths up to 8 (or the verifier's limit) otherwise."""
    if problem.stats is None:
        raise SpecdemoError(
            "planning needs the pilot's deltas: build the problem with tree auto and a budget "
            "(and replan, not a plan from the cache)"
        )
    c = problem.config
    draft = problem.draft
    assert draft is not None and problem.verifier is not None and c.prefetch is not None  # a speculative method's
    stepwise = draft.part(StepwiseDraft)
    frozen = draft.uses_frozen  # only a frozen draft evaluates leaves or knows a root's output
    return plan_topology(
        problem.stats,
        problem.verifier,
        budget,
        problem.kernel.stochastic_run_lengths(),
        max_width=1 if c.method == "chain" else 8,
        leaf_options=LEAF_OPTIONS.get(c.prefetch, (False,)) if frozen else (False,),
        exact_known_root=frozen and not c.draft_bias,
        warm_up=frozen and not draft.cold_start,
        cost=problem.cost_model if c.objective == "time" else None,
        network_steps=(stepwise.forms == RESIDUAL).numpy() if stepwise else None,
    )
