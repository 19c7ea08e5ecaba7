"""Whole-tree block verification (`--verifier block` on trees): planned fans against planned
block-verified chains and rank-aware trees verified node by node, in target calls (hardware-free).

Whole-tree block verification is docs/algorithms.md, section 3, "whole trees"; the block planner
(specdemo/planning/programme.py) plans fans (K, 1, ..., 1), K <= 4. Planned settings pilot afresh (pilot calls not in the
speedup); *planned* is the plan's expected calls per trajectory. Fixed topologies have equal target rows a round.
"""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig

from .common import BY_CALLS, find, percent_gain, run_cell, shown

TITLE = "Beyond the papers: block verification of whole trees"
GM512_TRAJECTORIES = 300  # the count
# (label, settings): the planner's best within the rows, per verifier; block on a chain method plans chains only
PLANNED = [
    ("block-verified chains", {"method": "chain", "verifier": "block"}),
    ("block-verified trees (fans)", {"method": "tree", "verifier": "block"}),
    ("rank-aware trees, node by node", {"method": "tree", "verifier": "rank"}),
]
# fixed topologies at equal rows on gm512 (rows a round with an unknown root: 1 + internal nodes below it)
FIXED = [("1x9", "block"), ("2,1,1,1,1", "block"), ("1x10", "block"), ("3,1,1,1", "block"), ("3,1,1,1", "dgrs")]


def gm512_config(trajectories: int, **settings) -> SamplerConfig:
    return SamplerConfig(pilot=True, model="gm512", num_samples=trajectories, device="cpu", seed=0, **settings)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    gm_count = 40 if quick else GM512_TRAJECTORIES
    digits = {"steps": 100, "samples": 8 if quick else 32, "budgets": (16,) if quick else (16, 48)}
    runs = []
    for label, settings in PLANNED:
        s = run_cell(gm512_config(gm_count, tree="auto", budget=85, objective="calls", **settings), with_pilot=True)
        runs.append({"label": label, **s})
    for tree, verifier in FIXED:
        s = run_cell(
            gm512_config(
                gm_count,
                method="chain" if "," not in tree else "tree",
                tree=tree,
                verifier=verifier,
                freeze="x0",
                prefetch="nearest",
            )
        )
        runs.append({"label": f"gm512 {tree} {verifier}", **s})
    for budget in digits["budgets"]:
        for label, settings in PLANNED:
            s = run_cell(
                SamplerConfig(
                    pilot=True,
                    model="digits",
                    steps=digits["steps"],
                    num_samples=digits["samples"],
                    device="cpu",
                    seed=0,
                    class_label=3,
                    tree="auto",
                    budget=budget,
                    freeze="auto",
                    **BY_CALLS,
                    **settings,
                ),
                with_pilot=True,
            )
            runs.append({"label": f"digits {label} {budget}", **s})
    results = {"runs": runs}
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone."""
    runs = results["runs"]
    gm = [r for r in runs if r["config"]["model"] == "gm512"]
    planned, fixed = [r for r in gm if r["config"]["tree"] == "auto"], [r for r in gm if r["config"]["tree"] != "auto"]
    digits = [r for r in runs if r["config"]["model"] == "digits"]
    fans = find(gm, tree="auto", method="tree", verifier="block")
    gm_count = gm[0]["config"]["num_samples"]
    lines = [
        'Whole-tree block verification (docs/algorithms.md, section 3, "whole trees") planned as fans (K, 1, ..., 1), '
        "K <= 4; pilot calls are not in the speedup.",
        "",
        f"### `gm512`, {gm_count} trajectories, at most 85 rows a round, the defaults (freeze auto, prefetch "
        "auto), calls objective",
        "",
        "| plan | speedup | calls / trajectory | planned | rows / call | pilot calls | fans' speedup against this |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in planned:
        against = "" if s is fans else percent_gain(shown(fans), shown(s))
        lines.append(
            f"| {s['label']} | {s['speedup']:.3f} | {s['target_calls_per_sample']:.2f} | {s['planned_calls']:.2f} | "
            f"{s['rows_per_call']:.1f} | {s['pilot_calls']} | {against} |"
        )
    lines += [
        "",
        f"### Fixed topologies on `gm512` ({gm_count} trajectories, freeze x0, nearest prefetch)",
        "",
        "| tree | verifier | rows a round | speedup |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['config']['tree']} | {s['config']['verifier']} | {s['rows_per_round']} | {s['speedup']:.3f} |"
        for s in fixed
    ]
    first = digits[0]["config"]
    lines += [
        "",
        f"### The digits model, {first['steps']} steps, {first['num_samples']} samples (class 3), calls "
        "objective, nearest prefetch, the frozen draft (freeze auto)",
        "",
        "| rows | plan | speedup | calls / sample | planned | rows / call | pilot calls |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in digits:
        budget = s["config"]["budget"]
        label = s["label"].removeprefix("digits ").removesuffix(f" {budget}")
        lines.append(
            f"| {budget} | {label} | {s['speedup']:.2f} | {s['target_calls_per_sample']:.1f} | "
            f"{s['planned_calls']:.1f} | {s['rows_per_call']:.1f} | {s['pilot_calls']} |"
        )
    return "\n".join(lines)
