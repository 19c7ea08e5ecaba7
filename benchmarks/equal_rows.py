"""Planned block-verified trees (fans) against planned block-verified chains at equal target rows per round
on the digits model: the planner's expected margin by budget, and the measured one at the largest budget."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from specdemo.pipeline import SamplerConfig, build
from specdemo.planning import plan_tree
from specdemo.planning.programme import DeltaStats

from .common import BY_CALLS, NETWORK, plot

TITLE = "Trees against chains at equal target rows"
# per step the frozen draft's best form, and with the draft network per step that network corrected by the
# target's residual or a frozen form (the best settings of docs/benchmarks.md, section "drafts")
DRAFTS = (
    ("frozen, freeze auto", {"freeze": "auto"}),
    ("digits-draft network, freeze auto", {**NETWORK, "freeze": "auto"}),
)


def _mean_and_error(calls: np.ndarray) -> tuple[float, float]:
    return float(calls.mean()), float(calls.std(ddof=1) / len(calls) ** 0.5)


def first_level_kept(stats: DeltaStats) -> DeltaStats:
    """The pilot's deltas with every round's first level exact (delta 0): planned with these, a chain never
    loses its first node. A fan gains on a chain at its first level only (rank-aware selection keeps more of it,
    docs/algorithms.md section 3) and takes its rows from the chain's depth, so such a chain's margin over the
    planned chain bounds every fan's margin from above (block verification's weights only grow with p_1)."""
    return DeltaStats(
        {key: [0.0] * len(vals) if key[1] == 1 else vals for key, vals in stats.deltas.items()}, stats.num_steps
    )


def run_pair(chain, tree) -> dict:
    """Both planned problems run (same seed): calls per trajectory and their standard errors, as
    measured_margin reads them."""
    (c, c_err), (t, t_err) = (_mean_and_error(p.run().cost.calls_per_trajectory) for p in (chain, tree))
    return {"chain_calls": c, "chain_error": c_err, "tree_calls": t, "tree_error": t_err}


def measured_margin(row: dict) -> tuple[float, float]:
    """The chain's measured calls per trajectory over the tree's, minus one, and its standard error."""
    c, t = row["chain_calls"], row["tree_calls"]
    return c / t - 1, c / t * math.hypot(row["chain_error"] / c, row["tree_error"] / t)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import plotly.graph_objects as go

    samples = {100: 8} if quick else {100: 128, 1000: 64}
    budgets = (8, 16) if quick else (8, 16, 32, 48, 64, 96)
    top = budgets[-1]
    lines = [
        "The embedded digits UNet, class 3, block verification. Per rows budget R: the planner's expected margin "
        "of the best fan (K, 1, ..., 1), K <= 4, over the best chain (expected calls per trajectory, minus one; "
        "one pilot of 32 trajectories); *ceiling*: the same for a chain whose first level is never lost, the most "
        "a fan can gain. At the largest budget both plans also run (same pilot, same seed; "
        + ", ".join(f"{n} trajectories at {st:,} steps" for st, n in samples.items())
        + "): measured margin with its standard error.",
        "",
        "| steps | draft | "
        + " | ".join(f"{b} rows" for b in budgets)
        + f" | ceiling at {top} rows | measured at {top} rows |",
        "|---|---|" + "---|" * (len(budgets) + 2),
    ]
    fig = go.Figure()
    rows = []
    for steps, count in samples.items():
        for name, extra in DRAFTS:
            cfg = SamplerConfig(
                pilot=True,
                model="digits",
                steps=steps,
                num_samples=count,
                device="cpu",
                seed=0,
                class_label=3,
                method="tree",
                tree="auto",
                budget=top,
                verifier="block",
                **BY_CALLS,
                **extra,
            )
            tree = build(cfg)
            # the chain's pilot would be the same run (pilots are chains with their own seed); method chain plans chains
            chain = replace(tree, config=replace(cfg, method="chain"))
            plans = [(plan_tree(chain, b), tree.tree if b == top else plan_tree(tree, b)) for b in budgets]
            margins = [c.expected_calls / t.expected_calls - 1 for c, t in plans]
            kept = plan_tree(replace(chain, stats=first_level_kept(chain.stats)), top)
            ceiling = plans[-1][0].expected_calls / kept.expected_calls - 1
            chain = replace(chain, tree=plans[-1][0])
            row = {
                "steps": steps,
                "samples": count,
                "draft": name,
                "config": cfg.to_dict(),
                "planned_margins": margins,
                "ceiling": ceiling,
                **run_pair(chain, tree),
            }
            rows.append(row)
            margin, error = measured_margin(row)
            lines.append(
                f"| {steps} | {name} | "
                + " | ".join(f"{100 * m:+.0f}%" for m in margins)
                + f" | {100 * ceiling:+.0f}% | {100 * margin:+.0f}% ± {100 * error:.0f}% "
                f"({row['chain_calls']:.1f} against {row['tree_calls']:.1f} calls) |"
            )
            fig.add_scatter(
                x=budgets, y=[100 * m for m in margins], mode="lines+markers", name=f"{steps} steps, {name}"
            )
    fig.add_hline(y=5, line_dash="dot", annotation_text="5%")
    fig.update_layout(
        title="digits: planned block-verified tree over block-verified chain, margin at equal rows",
        template="plotly_white",
        xaxis=dict(title="target rows per round"),
        yaxis=dict(title="chain calls / tree calls - 1 (%)"),
    )
    lines += ["", plot(fig, "digits_equal_rows", report)]
    return "\n".join(lines), {"budgets": list(budgets), "rows": rows}
