"""The page's words about a run: its label, the headline, the plan line, the exactness verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runner's records, named here; the runner imports these labels
    from specdemo.pipeline import Problem
    from specdemo.trees import TopologyPlan

    from .exactness import ExactnessReport
    from .runner import Comparison

VERIFIER_LABELS = {"rmc": "RMC", "dgrs": "D-GRS", "rank": "rank-aware", "block": "block", None: ""}


def describe(problem: Problem) -> str:
    """A run's label: plain target, or its method, topology and verifier (tree 3,2,1 · D-GRS)."""
    c = problem.config
    if c.method == "target":
        return "plain target"
    if problem.declined is not None:
        return "plain target (auto's choice)"
    assert problem.verifier is not None  # resolve(): every speculative run has its verifier
    return f"{c.method} {problem.tree} · {VERIFIER_LABELS.get(problem.verifier.name, problem.verifier.name)}"


def plan_segments(plan: TopologyPlan) -> list[tuple[int, int, str]]:
    """(first step, last step, topology) for each run of steps that share a planned tree (for a
    root whose output is not known, worded as Topology.text); steps with no speculation
    (deterministic ones, the last step) are left out."""
    out: list[tuple[int, int, str]] = []
    for n, (tree, leaves) in enumerate(zip(plan.trees, plan.leaves, strict=True)):
        if not tree.widths:
            continue
        text = tree.text(leaves)
        if out and out[-1][2] == text and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n, text)
        else:
            out.append((n, n, text))
    return out


TIE = 0.03  # speedups within 3% of each other are "about the same" (a few samples, one seed)


def rows_text(rows: float) -> str:
    return f"{rows:.0f}" if float(rows).is_integer() else f"{rows:.1f}"


def headline(comp: Comparison) -> str:  # noqa: C901, PLR0912 (issue 56 splits it)
    """The result in words, in wall-clock first where the chosen run saved time, else in target
    calls: against plain sampling and, for a tree or plan, against the chain at the same target rows
    per round (for a block-verified chain, against the same chains verified node by node), saying
    which won (whichever it is); then what the plan expected, and what planning cost."""
    h = comp.headline()
    if comp.declined is not None:
        return declined_headline(comp, h)
    chosen = comp.chosen
    acceptance = chosen.cost.acceptance
    by_time = h["speedup_time"] > 1 + TIE
    calls = f"{h['calls_chosen']:.1f} target calls per sample instead of {h['calls_plain']:.0f}"
    accepted = "" if acceptance is None else f", {acceptance:.0%} of the verified nodes kept a drafted child"
    if by_time:
        text = (
            f"### {chosen.label}: **{h['speedup_time']:.2f}× faster** than plain sampling\n"
            f"{h['time_chosen']:.2f} s{planning_words(chosen)} against {h['time_plain']:.2f} s of sampling, with "
            f"{h['speedup']:.2f}× fewer "
            f"target calls ({calls}){accepted}."
        )
    else:
        text = f"### {chosen.label}: **{h['speedup']:.2f}×** fewer target calls than plain sampling\n{calls}{accepted}."
    # the baseline in the headline's unit
    unit = "speedup_time" if by_time else "speedup"
    ours, theirs = h[unit], h.get(unit + "_chain")
    shown = (lambda v: f"**{v:.2f}× faster** than plain") if by_time else (lambda v: f"**{v:.2f}×**")
    if theirs is not None and comp.config.verifier == "block" and comp.plan is None:
        chain = f"The same chains verified node by node ({h['chain']})"
        if theirs > ours * (1 + TIE):
            text += (
                f" {chain} do better: {shown(theirs)}. *Block verification commits at least as many steps "
                "per round on average; with few samples, try another seed, or longer chains (it gains most "
                "where many nodes follow a rejection).*"
            )
        elif theirs < ours * (1 - TIE):
            text += f" {chain} do less well: {shown(theirs)}; weighing the whole chain pays."
        else:
            text += f" {chain} do about the same: {shown(theirs)}."
    elif theirs is not None:
        rows = rows_text(round(chosen.rows_per_round, 1))
        chain = (
            f"The {h['chain']} at the same {rows} target rows per round"
            if comp.plan is None
            else f"The {h['chain']}, at the plan's mean of {rows} target rows per round,"
        )
        if theirs > ours * (1 + TIE):
            text += f" {chain} does better: {shown(theirs)}."
            text += (
                f" *The plan is fitted on the deltas of {comp.config.pilot_samples} trajectories and does not always "
                "find the best topology; with few samples, try another seed too.*"
                if comp.plan is not None
                else " *Drafts are mostly accepted here, so depth pays more than width: try the topology auto "
                "(widths planned per step), or a draft bias of 2 or more to see width pay.*"
            )
        elif theirs < ours * (1 - TIE):
            text += f" {chain} does less well: {shown(theirs)}; " + (
                "the plan pays." if comp.plan is not None else "the width pays."
            )
        else:
            text += f" {chain} does about the same: {shown(theirs)}."
    if h.get("planned_s") is not None:
        text += (
            f" The plan expected {h['planned_s']:.2f} s and {h['planned_calls']:.1f} target calls per sample "
            f"(measured {chosen.cost.wall_s:.2f} s and {h['calls_chosen']:.1f})."
        )
    text += (
        f"  \nEvery sample is an exact draw of the target sampler, whatever the draft. "
        f"{'Three' if len(comp.runs) == 3 else 'Two'} runs, seed {comp.config.seed}, {h['wall_s']:.2f} s of sampling"
        + timing_words(comp)
    )
    pilot = chosen.pilot
    if pilot is not None:
        text += (
            f"; the pilot that planned the run ({comp.config.pilot_samples} trajectories, {pilot.target_calls} "
            f"calls, {pilot.wall_s:.2f} s) is not counted above: the plan is kept, and the next run of these "
            "settings pays none"
        )
    elif chosen.plan_source == "cache":
        text += "; the plan came from the plan cache (no pilot)"
    elif chosen.plan_source == "shipped":
        text += "; planned on this machine from the statistics shipped with the package (no pilot)"
    elif chosen.plan_source == "runs":
        text += f"; planned from the deltas of the first {comp.config.pilot_samples} trajectories of these settings (no pilot)"
    elif chosen.plan_source == "online":
        text += "; these settings have no plan yet (see the plan below)"
    if not by_time and h["time_chosen"] > h["time_plain"]:
        text += (
            f". Wall-clock {h['time_chosen']:.2f} s against {h['time_plain']:.2f} s plain: here the extra rows, "
            "the drafts and the verification cost more than the calls saved; the saving shows in time when a "
            "target call is expensive and its rows run in parallel (a large network on a GPU), or with the "
            "topology auto, which plans for wall-clock"
        )
    return text + "."


def planning_words(run) -> str:
    """The planning a run's wall-clock counts, in words ("" where it paid none)."""
    return f" (planning included: {run.cost.planning_s:.2f} s)" if run.cost.planning_s >= 0.005 else ""


def timing_words(comp: Comparison) -> str:
    """How the wall-clock figures were taken: the median of several timings, and whether another visitor's
    run computed beside them."""
    repeats = comp.chosen.timings
    text = f" (each wall-clock the least of {repeats} timings)" if repeats > 1 else ""
    if comp.shared:
        text += "; timed while another visitor's run was computing too, so the seconds are noisier than usual"
    if comp.gpu is not None:
        text += f"; ZeroGPU time: {comp.gpu.asked:g} s asked for, {comp.gpu.used:.1f} s used"
    return text


def declined_headline(comp: Comparison, h: dict) -> str:
    """The headline of an auto topology that sampled plainly: why, and what the chain and plain sampling took."""
    plan, c = comp.declined, comp.config
    assert plan is not None
    text = (
        f"### auto chose plain sampling: no plan of ≤ {c.budget} target rows a round was expected to beat it "
        f"here\nThe best plan expected {plan.expected_s:.2f} s ({plan.expected_calls:.1f} target calls per sample) "
        f"against {comp.plain_s:.2f} s for plain sampling on this machine; measured {h['time_chosen']:.2f} s."
    )
    if "speedup_time_chain" in h:
        text += (
            f" The {h['chain']} made {h['speedup_chain']:.2f}× fewer target calls than plain sampling and ran "
            f"at {h['speedup_time_chain']:.2f}× its speed."
        )
    return text + (
        "  \nA round's work outside the target call costs more here than the calls it saves: pick a "
        "fixed topology such as 3,2,1 to see a tree anyway. Every sample is an exact draw of the target "
        f"sampler. Seed {c.seed}, {h['wall_s']:.2f} s of sampling{timing_words(comp)}."
    )


def plan_text(comp: Comparison, max_segments: int = 7) -> str:
    """One line on the topology: a fixed tree, or the planned trees along the steps."""
    chosen, c = comp.chosen, comp.config
    if comp.declined is not None:
        return (
            f"**Plain sampling**, auto's choice: the best plan (≤ {c.budget} target rows a round, "
            f"{comp.declined.expected_calls:.1f} target calls per sample expected) was expected slower than plain "
            "sampling on this machine, so no round drafted a tree. To see one, run the tree "
            f"`{offered_tree(comp)}` with the same seed (the button below), or pick a fixed topology."
        )
    freeze = {
        "out": "the network output",
        "x0": "x0-hat",
        "x0-linear": "x0-hat extrapolated in time",
        "gaussian": "x0-hat of a fitted Gaussian",
        "auto": "the form chosen per step (the fitted Gaussian until runs of these settings have priced each form)",
    }
    draft = (
        f"frozen draft keeping {freeze.get(c.freeze, c.freeze)}"
        if c.draft == "frozen"
        else f"draft network {c.draft}" + (" corrected by the target's residual" if c.freeze == "residual" else "")
    ) + (f", biased by {c.draft_bias:g}" if c.draft_bias else "")
    assert chosen.verifier is not None  # the chosen run speculates (a declined plan has its own headline)
    verifier = VERIFIER_LABELS.get(chosen.verifier, chosen.verifier) + (
        " (chosen by the planner)" if c.verifier == "auto" else ""
    )
    if comp.plan is None:
        return (
            f"**Topology** `{chosen.tree}` at every step: {rows_text(chosen.rows_per_round)} target rows a round "
            f"(cut short near the end) · {draft}."
        )
    if chosen.plan_source == "online":
        rows = (
            f"at most {c.budget} target rows a round, each trajectory cutting it where its own rounds so far say "
            "a level is rarely reached"
            if comp.plan.rule is not None
            else f"{c.budget} target rows a round"
        )
        return (
            f"**No plan yet** for these settings: a chain `{comp.plan.trees[0]}` at every step (cut short near the "
            f"end), {rows} · {verifier} verifier · {draft}. The deltas of the first "
            f"{c.pilot_samples} trajectories run with these settings plan the later runs (no pilot)."
        )
    segments = plan_segments(comp.plan)
    branching = sum(1 for t in comp.plan.trees if t.widths and not t.is_chain)
    speculative = sum(1 for t in comp.plan.trees if t.widths)
    parts = [f"{a}–{b} `{tree}`" if b > a else f"{a} `{tree}`" for a, b, tree in segments[:max_segments]]
    if len(segments) > max_segments:
        parts.append(f"… {len(segments) - max_segments} more")
    goal = (
        "the least expected wall-clock on this machine" if c.objective == "time" else "the fewest expected target calls"
    )
    known = ""
    if any(comp.plan.leaves):  # the round view shows these trees too: say where they come from
        deepest = max((t for t in comp.plan.known_trees if t.widths), key=lambda t: t.num_nodes, default=None)
        known = (
            " · a round that starts where an evaluated leaf was committed knows its root's output (no row for "
            f"it) and drafts from the plan's trees for a known root{f', up to `{deepest}`' if deepest else ''}; "
            'the round view marks it "root output known"'
        )
    no_tree = (
        ""
        if branching
        else f"  \n*No step branches: here a chain keeps enough drafts that no tree of "
        f"{c.budget} rows or fewer is expected to beat it. To see a tree, run `{offered_tree(comp)}` (about the "
        "same rows a round) with the same seed: the button below.*"
    )
    return (
        f"**Planned trees** for {goal} (≤ {c.budget} target rows a round, "
        f"{rows_text(round(chosen.rows_per_round, 1))} on average; branching at {branching} of {speculative} steps) "
        f"by starting step: " + " · ".join(parts) + known + f" · {verifier} verifier · {draft}." + no_tree
    )


def offered_tree(comp: Comparison) -> str | None:
    """The branching preset the page offers after a run that drafted no tree (auto's plain sampling, or a
    plan of chains): the one of about the run's target rows a round (the plan's budget where no round
    drafted); None after a run that drafted trees or a fixed topology."""
    if comp.declined is not None:
        return tree_at_rows(comp.config.budget)
    if comp.plan is not None and not any(t.widths and not t.is_chain for t in comp.plan.trees):
        return tree_at_rows(comp.chosen.rows_per_round)
    return None


def tree_button_text(tree: str) -> str:
    return f"Run the tree {tree} with the same seed"


def tree_at_rows(rows: float) -> str:
    """The page's branching preset whose target rows a round (its nodes below the root) come closest to
    `rows` (the first of equals)."""
    from specdemo.trees import Topology

    from .settings import TREE_PRESETS

    trees = [Topology.parse(value) for value, _ in TREE_PRESETS if value != "auto"]
    return str(min((t for t in trees if not t.is_chain), key=lambda t: abs(t.num_nodes - 1 - rows)))


def exactness_text(report: ExactnessReport, num_samples: int, draft_bias: float) -> str:
    """The exactness test's result in words: the p-value, its verdict, and what it means."""
    return (
        f"### p = {report.p_value:.3f}: {report.verdict}\n"
        f"Energy-distance permutation test of {num_samples} samples from **{report.label}**"
        + (f" (draft biased by {draft_bias:g})" if draft_bias else "")
        + f" against {num_samples} from the "
        f"plain target sampler (independent seeds; statistic {report.statistic:.4f}). Under exactness p is "
        f"uniform on [0, 1]: it falls under 0.05 in one run out of twenty, whatever the draft or its bias."
    )
