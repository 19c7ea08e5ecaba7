"""Trees that branch below the root, measured before they are built: whole-tree block verification
(specdemo/verifiers/block.py) weighs any tree of widths per depth, but the block planner plans fans
(K, 1, ..., 1) only. Would a tree that branches at depth j, (1, ..., 1, K, 1, ..., 1), where a chain's
block verification often stops, commit more steps a round? Each shape's law of steps committed comes from
Monte Carlo walks of the verifier on the pilot's deltas, as the planner's own law does (hardware-free)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from benchmarks.common import BY_CALLS
from benchmarks.equal_rows import DRAFTS
from specdemo.pipeline import SamplerConfig, build
from specdemo.planning.programme import BLOCK_FAN_WIDTHS, BLOCK_PLAN_CHAINS, DeltaStats
from specdemo.trees import Topology
from specdemo.trees.tables import TreeTables, tables
from specdemo.verifiers.block import select_root_child, weigh_tree

TITLE = "Trees that branch below the root, measured before they are built"
BRANCH_DEPTHS = 15  # j = 1..15: past it a 96-row tree has no rows left for a second chain worth drafting
FRESH_WALKS = 1024  # walks per step and shape for each fresh evaluation of a family's plan
# the gain over fans that would pay for planning branches: walks of every shape at every step cost far more
# than the fans' laws
WORTH = 0.02
FRESH_REPEATS = 4  # independent fresh evaluations: their spread is the figure's standard error
# a family and which shapes (K, j) it plans with; j = 0 branches at the root
FAMILIES = (
    ("chains", lambda k, j: k == 1),
    ("fans", lambda k, j: j == 0),
    ("branching below the root", lambda k, j: k == 1 or j > 0),
    ("all of them", lambda k, j: True),
)
# (steps, families): at 1,000 steps chains and fans only, for the expected margin section equal_rows measures
# with few trajectories there (walks of every branching shape cost more still at 1,000 steps)
SETTINGS = ((100, FAMILIES), (1000, FAMILIES[:2]))


def shapes(budget: int, horizon: int) -> list[tuple[int, int, int]]:
    """(K, j, L): the tree (1 x j, K, 1 x (L - j - 1)) as deep as `budget` target rows allow (the root and
    every internal node a row: 1 + j + K (L - 1 - j)), at most `horizon` levels."""
    found = [(1, 0, min(budget, horizon))]
    for k in range(2, BLOCK_FAN_WIDTHS + 1):
        for j in range(min(BRANCH_DEPTHS, horizon - 1) + 1):
            depth = min(j + 1 + (budget - 1 - j) // k, horizon)
            if depth > j and 1 + j + k * (depth - 1 - j) <= budget:
                found.append((k, j, depth))
    return found


def steps_law(
    stats: DeltaStats, n: int, shape: tuple[int, int, int], walks: int, rng: np.random.Generator
) -> np.ndarray:
    """P(the round commits s steps), s = 0..L + 1, for a round rooted at step n whose root's output is not
    known: `walks` walks of weigh_tree (a branching root's child by rank-aware selection, as the driver
    does). A node at depth d drafts its children with a delta drawn from the pilot's at (n + d, d + 1)
    (DeltaStats.pooled, as the planner reads them), shared by siblings (one parent, one P and one Q);
    each child's u ~ N(0, 1) under its draft."""
    k, j, depth = shape
    tree = _tree(shape)
    node_depth, parent = tree.node_depth, tree.parent
    internal = node_depth < depth
    delta = np.ones((walks, tree.num_nodes))  # leaves': never read
    for node in np.nonzero(internal)[0]:
        d = int(node_depth[node])
        delta[:, node] = rng.choice(stats.pooled(n + d, d + 1), walks)
    u = rng.standard_normal((walks, tree.num_nodes))
    above = delta[:, np.maximum(parent, 0)]
    log_rho = np.where(parent[None] >= 0, above * u - 0.5 * above**2, 0.0)
    coins = rng.random((walks, tree.num_nodes))
    selected = None
    if j == 0 and k > 1:
        selected = select_root_child(delta[:, 0], u[:, 1 : 1 + k], rng.random(walks))
    walk = weigh_tree(log_rho, delta, coins, tree, selected)
    steps = node_depth[walk.cur] + walk.corrected
    return np.bincount(steps, minlength=depth + 2) / walks


@cache
def _tree(shape: tuple[int, int, int]) -> TreeTables:
    """The shape's walk tables, built once for every step that walks it."""
    k, j, depth = shape
    return tables(Topology((1,) * j + (k,) + (1,) * (depth - j - 1)))


def expected_calls(laws: dict[int, np.ndarray], num_steps: int) -> float:
    """V(0) of V(n) = 1 + sum_s P(s) V(n + s), V(N) = 0, one law per step (a step without one, where the
    kernel is deterministic, takes one call): plan_family with one shape a step."""
    return plan_family({n: {(1, 0, 0): law} for n, law in laws.items()}, lambda k, j: True, num_steps)[1]


def plan_family(laws: dict[int, dict], keep, num_steps: int) -> tuple[dict[int, tuple], float]:
    """The shape per step that minimises V within a family (keep(K, j)), and V(0) from the same laws."""
    value, picks = np.zeros(num_steps + 1), {}
    for n in reversed(range(num_steps)):
        if n not in laws:
            value[n] = 1 + value[n + 1]
            continue
        options = {
            shape: 1 + sum(p * value[min(n + s, num_steps)] for s, p in enumerate(law) if s)
            for shape, law in laws[n].items()
            if keep(shape[0], shape[1])
        }
        picks[n] = min(options, key=options.get)
        value[n] = options[picks[n]]
    return picks, float(value[0])


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    budget = 16 if quick else 96
    walks, fresh_walks = (64, 64) if quick else (BLOCK_PLAN_CHAINS, FRESH_WALKS)
    rows = []
    for steps, families in ((10, FAMILIES), (12, FAMILIES[:2])) if quick else SETTINGS:
        for name, extra in DRAFTS:
            cfg = SamplerConfig(
                pilot=True,
                model="digits",
                steps=steps,
                num_samples=4 if quick else 32,
                device="cpu",
                seed=0,
                class_label=3,
                method="tree",
                tree="auto",
                budget=budget,
                verifier="block",
                **BY_CALLS,
                **extra,
            )
            problem = build(cfg)
            run_lengths = problem.kernel.stochastic_run_lengths().tolist()
            rng = np.random.default_rng(0)
            wanted = lambda shape: any(keep(shape[0], shape[1]) for _, keep in families)  # noqa: B023  (used in this iteration)
            laws = {
                n: {
                    shape: steps_law(problem.stats, n, shape, walks, rng)
                    for shape in shapes(budget, run_lengths[n])
                    if wanted(shape)
                }
                for n in range(steps)
                if run_lengths[n]
            }
            for family, keep in families:
                picks, in_sample = plan_family(laws, keep, steps)
                fresh = [
                    expected_calls(
                        {
                            n: steps_law(problem.stats, n, shape, fresh_walks, np.random.default_rng(seed))
                            for n, shape in picks.items()
                        },
                        steps,
                    )
                    for seed in range(1, FRESH_REPEATS + 1)
                ]
                rows.append(
                    {
                        "steps": steps,
                        "rows": budget,
                        "draft": name,
                        "family": family,
                        "in_sample": in_sample,
                        "fresh": float(np.mean(fresh)),
                        "fresh_error": float(np.std(fresh, ddof=1) / len(fresh) ** 0.5),
                        "branching_steps": sum(shape[1] > 0 for shape in picks.values()),
                    }
                )
    results = {"rows": rows, "walks": walks, "fresh_walks": fresh_walks}
    return render(results), results


def render(results: dict) -> str:
    """The section's text from its results."""
    rows = results["rows"]
    lines = [
        "The embedded digits UNet, class 3, block verification, one pilot's deltas (32 trajectories, seed 0, "
        "as in section equal_rows). For each step n and each shape that fits the rows budget, as deep as the "
        "rows allow: chains, fans (K, 1, ..., 1) and trees that branch once, at depth j = 1.."
        f"{BRANCH_DEPTHS}, into K <= {BLOCK_FAN_WIDTHS} chains (at 1,000 steps chains and fans only). The law of the steps a round commits comes "
        f"from {results['walks']} walks of the whole-tree verifier (weigh_tree) on deltas drawn as the planner "
        "draws them (DeltaStats.pooled; siblings share their parent's delta), the root's output not known. A "
        "family's plan minimises the expected target calls V(n) = 1 + sum_s P(s) V(n + s) by dynamic "
        "programming over the steps. The minimum over many shapes, each law estimated with noise, is biased "
        f"low (*in-sample*); each plan is therefore evaluated again on fresh walks ({results['fresh_walks']} per "
        f"step, {FRESH_REPEATS} independent evaluations: mean and standard error). Like the planner's, these "
        "expectations are low against measured runs (the pilot's sparse tail cells are pooled over easier "
        "steps); they rank the families.",
        "",
        "| steps | rows | draft | family | expected calls, in-sample | expected calls, fresh walks | "
        "over chains (fresh) | steps planned with a branch below the root |",
        "|---|---|---|---|---|---|---|---|",
    ]
    chains = {(r["steps"], r["draft"]): r["fresh"] for r in rows if r["family"] == FAMILIES[0][0]}
    for r in rows:
        gain = chains[(r["steps"], r["draft"])] / r["fresh"] - 1
        lines.append(
            f"| {r['steps']} | {r['rows']} | {r['draft']} | {r['family']} | {r['in_sample']:.3f} | "
            f"{r['fresh']:.3f} ± {r['fresh_error']:.3f} | {100 * gain:+.1f}% | {r['branching_steps']} |"
        )
    by = {(r["steps"], r["draft"], r["family"]): r for r in rows}
    margins, notes, worth = [], [], []
    for steps, draft in dict.fromkeys((r["steps"], r["draft"]) for r in rows):
        chain, fans = by[(steps, draft, FAMILIES[0][0])], by[(steps, draft, FAMILIES[1][0])]
        margins.append(f"{steps} steps, {draft}: {_gain(chain, fans)}")
        best = by.get((steps, draft, FAMILIES[3][0]))
        if best is None:
            continue
        gain = fans["fresh"] / best["fresh"] - 1
        error = float(np.hypot(fans["fresh_error"], best["fresh_error"]) / best["fresh"])
        notes.append(
            f"{steps} steps, {draft}: {_gain(fans, best)} (in-sample "
            f"{100 * (fans['in_sample'] / best['in_sample'] - 1):+.1f}%)"
        )
        if gain - 2 * error > WORTH:
            worth.append(f"{steps} steps, {draft}")
    lines += [
        "",
        "- Fans against chains, on fresh walks (the margin section equal_rows measures at the same rows): "
        + "; ".join(margins)
        + ".",
        "- Every shape against fans alone, on fresh walks: " + "; ".join(notes) + ".",
    ]
    if worth:
        lines.append(
            f"- A branch below the root adds more than {100 * WORTH:.0f}% (two standard errors clear) with: "
            + "; ".join(worth)
            + ". Worth planning there."
        )
    else:
        lines.append(
            f"- Nowhere does a branch below the root add {100 * WORTH:.0f}% (two standard errors clear): the "
            "planner keeps fans."
        )
    return "\n".join(lines)


def _gain(worse: dict, better: dict) -> str:
    """better's margin over worse on fresh walks, worse's calls over better's minus one, with its standard error."""
    error = float(np.hypot(worse["fresh_error"], better["fresh_error"]) / better["fresh"])
    return f"{100 * (worse['fresh'] / better['fresh'] - 1):+.1f}% ± {100 * error:.1f}%"
