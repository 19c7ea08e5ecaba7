"""Block verification of chains against node-by-node RMC on the same chains, on the digits model and gm512.

Block verification (`--verifier block`, Sun et al. 2024) weighs a drafted chain as a whole and commits its
longest prefix that an exact coupling of the whole block allows; node-by-node RMC stops at the first rejected
node. Same chains, same drafts, each pair in one process: the embedded digits UNet, class 3, as in the digits
section. Auto rows are planned per verifier: node by node with each verifier's per-node acceptance,
block-verified chains with the distribution of eta that the pilot's deltas give (specdemo/planning/programme.py);
planned calls are the planner's expected target calls per trajectory. On gm512 the corrected draw keeps the
orthogonal part of the next drafted node, as RMC's reflection does, so nearest-sibling prefetch keeps working.
"""

from __future__ import annotations

import os
from pathlib import Path

from specdemo.pipeline import SamplerConfig
from specdemo.sampling.cost import time_speedup

from .common import BY_CALLS, NETWORK, find, image_rows, percent_gain, run_cell, shown

TITLE = "Beyond the papers: block verification of chains"
BUDGETS = (16, 48)
# (what is verified, its settings); each chain twice, verified by RMC and as a block
LABELLED = (
    [("plain target", {"method": "target"})]
    + [
        (f"{draft}, chain 1x{length}", {"method": "chain", "tree": f"1x{length}", "verifier": verifier, **extra})
        for draft, extra, lengths in (
            ("digits-draft network", NETWORK, (5, 16)),
            ("frozen x0-hat", {"freeze": "x0"}, (9,)),
        )
        for length in lengths
        for verifier in ("rmc", "block")
    ]
    + [
        (
            f"digits-draft network, auto {method} ({budget} rows)",
            {
                "method": method,
                "tree": "auto",
                "budget": budget,
                "verifier": verifier,
                "pilot_samples": 16,
                **NETWORK,
                **BY_CALLS,
            },
        )
        for budget in BUDGETS
        for method, verifier in (("chain", "rmc"), ("chain", "block"), ("tree", "rank"))
    ]
)
CONFIGS = [
    (label if "verifier" not in settings else f"{label}, {settings['verifier']}", settings)
    for label, settings in LABELLED
]


def block_pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """(RMC, block) runs of the same chain: the same configuration but for the verifier."""
    return [(r, find(runs, **{**r["config"], "verifier": "block"})) for r in runs if r["config"]["verifier"] == "rmc"]


def planned(runs: list[dict], budget: int) -> tuple[dict, dict, dict]:
    """The auto tree (rank-aware), the auto chain verified node by node (RMC) and the block-verified
    auto chain within `budget` rows, with the draft network."""
    return tuple(
        find(runs, method=m, tree="auto", budget=budget, verifier=v)
        for m, v in (("tree", "rank"), ("chain", "rmc"), ("chain", "block"))
    )


# the 2026-12-02 run's results predate the load in the machine line: the note its report carried
UNSAVED_LOAD = (
    "This run shared the 2 cores with another section and tests (load 3 to 4): its wall-clock columns are "
    "distorted, its calls are not."
)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    samples = {100: 8} if quick else {100: 64, 1000: 16}
    runs = []
    for steps, count in samples.items():
        rows = image_rows("digits", steps, count, "cpu", CONFIGS)
        runs += [{"label": label, **summary} for (label, _), (_, summary) in zip(LABELLED, rows, strict=True)]
    gm = {
        v: run_cell(
            SamplerConfig(
                pilot=True,
                model="gm512",
                method="chain",
                tree="1x5",
                verifier=v,
                num_samples=trajectories,
                device="cpu",
            )
        )
        for v in ("rmc", "block")
    }
    results = {"runs": runs, "gm512": gm, "load": os.getloadavg()[2]}
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone."""
    runs = results["runs"]
    lines = [
        "Block verification (Sun et al. 2024) commits a chain's longest prefix that an exact coupling of the "
        "block allows; RMC stops at the first rejection.",
        "",
    ]
    if "load" not in results:
        lines += [UNSAVED_LOAD, ""]
    lines += [
        "| steps | samples | method | speedup | target calls | rows/call | acceptance | wall-clock s | vs plain | "
        "not in target call | calls / trajectory | planned calls / trajectory |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = None
    for r in runs:
        c = r["config"]
        plain = r if c["method"] == "target" else plain
        name = r["label"] if c["verifier"] is None else f"{r['label']}, {c['verifier']}"
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        planned_calls = "" if r["planned_calls"] is None else f"{r['planned_calls']:.1f}"
        lines.append(
            f"| {c['steps']} | {c['num_samples']} | {name} | {r['speedup']:.2f} | {r['target_calls']} | "
            f"{r['rows_per_call']:.1f} | {acceptance} | {r['wall_s']:.2f} | "
            f"{time_speedup(r['wall_s'], plain['wall_s']):.2f}x | {r['non_target_fraction']:.0%} | "
            f"{r['target_calls_per_sample']:.1f} | {planned_calls} |"
        )
    steps_run = sorted({r["config"]["steps"] for r in runs})
    lines += ["", "| steps | chain | speedup, block against RMC |", "|---|---|---|"]
    for steps in steps_run:
        at = [r for r in runs if r["config"]["steps"] == steps]
        lines += [
            f"| {steps} | {rmc['label']} | {percent_gain(shown(block), shown(rmc))} |" for rmc, block in block_pairs(at)
        ]
    lines += [
        "",
        "| steps | rows per round | auto tree against the auto chain, RMC | planned | "
        "auto tree against the auto chain, block |",
        "|---|---|---|---|---|",
    ]
    for steps in steps_run:
        at = [r for r in runs if r["config"]["steps"] == steps]
        for budget in BUDGETS:
            tree, rmc, block = planned(at, budget)
            lines.append(
                f"| {steps} | {budget} | {percent_gain(shown(tree), shown(rmc))} | "
                f"{percent_gain(rmc['planned_calls'], tree['planned_calls'])} | "
                f"{percent_gain(shown(tree), shown(block))} |"
            )
    gm = results["gm512"]
    lines += [
        "",
        "| gm512, chain 1x5, freeze out, frozen draft | RMC | block |",
        "|---|---|---|",
        f"| speedup | {gm['rmc']['speedup']:.2f} | {gm['block']['speedup']:.2f} |",
        "",
        "On gm512 the frozen draft's delta grows with depth (section 2): a block gains little where the nodes past "
        "the first rejection are far off.",
    ]
    return "\n".join(lines)
