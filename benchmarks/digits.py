"""The embedded digits model on CPU: fixed chains and trees, and planned ones, against plain sampling.

The embedded class-conditional digits UNet (1x16x16, class 3), all samples in one batch on this CPU, each step
count measured in one process, every row against the plain sampler of the same run. Speedup counts target calls
(the deterministic last DDPM step on neither side); rows/call is the mean number of states per target call; auto
rows exclude their pilot runs (16 trajectories). The frozen draft's delta is taken at the root's children, by
step (100 DDPM steps, median of 8 trajectories).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling.cost import time_speedup

from .common import BY_CALLS, find, image_rows, percent_gain, plot, shown

TITLE = "The embedded digits model on CPU"
BUDGETS = (16, 48)  # target rows per round of the planned rows
CONFIGS = [
    ("plain target", {"method": "target"}),
    ("chain 1x5, frozen draft", {"method": "chain", "tree": "1x5", "verifier": "rmc"}),
    ("chain 1x5, digits-draft network", {"method": "chain", "tree": "1x5", "verifier": "rmc", "draft": "digits-draft"}),
    ("chain 1x9, frozen x0-hat", {"method": "chain", "tree": "1x9", "verifier": "rmc", "freeze": "x0"}),
    ("tree 2,2,1 rank, frozen", {"method": "tree", "tree": "2,2,1", "verifier": "rank"}),
    ("tree 3,2,2 dgrs, frozen", {"method": "tree", "tree": "3,2,2", "verifier": "dgrs"}),
] + [
    (
        f"auto {method} ({budget} rows), freeze auto",
        {
            "method": method,
            "tree": "auto",
            "budget": budget,
            **BY_CALLS,
            "verifier": "rank" if method == "tree" else "rmc",
            "freeze": "auto",
            "pilot_samples": 16,
        },
    )
    for budget in BUDGETS
    for method in ("chain", "tree")
]


def delta_by_step(config: SamplerConfig, samples: int = 8) -> list[tuple[int, float]]:
    """Median delta of the frozen draft at the root's children (depth 1), by step, from a chain run."""
    result = build(
        SamplerConfig(
            pilot=True,
            **{
                **config.to_dict(),
                "num_samples": samples,
                "method": "chain",
                "tree": "1x4",
                "verifier": "rmc",
                "draft": "frozen",
            },
        )
    ).run(trace=True, trace_states=False)
    by_step: dict[int, list[float]] = {}
    for rnd in result.trace:
        for r in range(len(rnd.step)):
            for node in np.nonzero(~np.isnan(rnd.delta[r]))[0]:
                by_step.setdefault(int(rnd.step[r] + rnd.node_depth[node]), []).append(float(rnd.delta[r, node]))
    return sorted((s, float(np.median(v))) for s, v in by_step.items())


PLOT = "digits_speedup"


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import plotly.graph_objects as go

    samples = {100: 8, 1000: 8} if quick else {100: 64, 1000: 16}  # fewer rounds per trajectory: more of them
    step_counts = (100,) if quick else (100, 1000)
    runs = []
    for steps in step_counts:
        rows = image_rows("digits", steps, samples[steps], "cpu", CONFIGS)
        runs += [{"name": name, **summary} for (name, _), (_, summary) in zip(CONFIGS, rows, strict=True)]
    fig = go.Figure()
    for steps in step_counts:
        speculative = [r for r in runs if r["config"]["steps"] == steps and r["config"]["method"] != "target"]
        fig.add_bar(
            x=[r["name"] for r in speculative],
            y=[shown(r) for r in speculative],
            name=f"{steps} steps",
            text=[f"{shown(r):.1f}x" for r in speculative],
            textposition="outside",
        )
    deltas = delta_by_step(SamplerConfig(pilot=True, model="digits", steps=100, class_label=3, device="cpu"))
    fig.update_layout(
        title="digits: speedup in target calls",
        template="plotly_white",
        barmode="group",
        yaxis=dict(title="plain target calls / calls"),
        xaxis=dict(tickangle=-30),
    )
    results = {"runs": runs, "delta_by_step": deltas}
    return render(results, plot(fig, PLOT, report)), results


def render(results: dict, figure: str = f"![{PLOT}](plots/{PLOT}.png)") -> str:
    """The section's body from its saved results alone; figure: the plot's line (measure's, where it was not
    drawn)."""
    runs = results["runs"]
    lines = [
        "The embedded digits UNet (1x16x16, class 3), one batch per step count; speedup counts target calls "
        "(benchmarks/digits.py).",
        "On a CPU a call's cost grows with its rows, so fewer calls need not mean less wall-clock (GPU: section "
        "below).",
        "",
        "| steps | samples | method | speedup | target calls | rows/call | acceptance | wall-clock s | vs plain | "
        "not in target call | planned calls / trajectory |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = None
    for r in runs:
        c = r["config"]
        plain = r if c["method"] == "target" else plain
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        planned_calls = "" if r["planned_calls"] is None else f"{r['planned_calls']:.1f}"
        lines.append(
            f"| {c['steps']} | {c['num_samples']} | {r['name']} | {r['speedup']:.2f} | {r['target_calls']} | "
            f"{r['rows_per_call']:.1f} | {acceptance} | {r['wall_s']:.2f} | "
            f"{time_speedup(r['wall_s'], plain['wall_s']):.2f}x | {r['non_target_fraction']:.0%} | {planned_calls} |"
        )
    lines += [
        "",
        "| steps | rows per round | speedup, auto tree against auto chain | planned |",
        "|---|---|---|---|",
    ]
    for steps in sorted({r["config"]["steps"] for r in runs}):
        at = [r for r in runs if r["config"]["steps"] == steps]
        for budget in BUDGETS:
            chain, tree = (find(at, method=m, tree="auto", budget=budget) for m in ("chain", "tree"))
            lines.append(
                f"| {steps} | {budget} | {percent_gain(shown(tree), shown(chain))} | "
                f"{percent_gain(chain['planned_calls'], tree['planned_calls'])} |"
            )
    deltas = results["delta_by_step"]
    shown_deltas = deltas[:: max(1, len(deltas) // 12)]
    lines += [
        "",
        "| step (100 DDPM steps) | " + " | ".join(str(s) for s, _ in shown_deltas) + " |",
        "|---|" + "---|" * len(shown_deltas),
        "| delta of the frozen draft (freeze out), root's children | "
        + " | ".join(f"{d:.2f}" for _, d in shown_deltas)
        + " |",
        "",
        figure,
    ]
    return "\n".join(lines)
