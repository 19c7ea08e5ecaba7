"""Auto topology and per-step freezing on gm512, against every fixed tree of the gm512 section and the
authors' best within the same rows.

`auto` plans each step's widths from a pilot of 32 trajectories (its calls not in the speedup); `freeze auto` picks
each step's draft form, `prefetch auto` where to evaluate the leaves (docs/algorithms.md, section 2). Planned
calls: the planner's expected target calls per trajectory. Cells start warm, as the authors count.
"""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig, build

from . import gm512, peer
from .common import plot

TITLE = "Beyond the papers: auto topology and per-step freezing on gm512"
BUDGET = 85  # target rows per round: the authors' (4, 4) tree
PLOT = "gm512_speedup_vs_rows"
TARGET = 2.6  # x: what the best exact configuration within BUDGET rows should reach


def _key(record: dict, *fields: str) -> tuple:
    return tuple(record[f] for f in fields)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import plotly.graph_objects as go

    base = dict(model="gm512", num_samples=trajectories, seed=0, device="cpu", verifier="rank")
    auto = {}
    for method, verifier in (("tree", "rank"), ("tree", "dgrs"), ("chain", "rmc")):
        for freeze, prefetch in (("out", "nearest"), ("x0", "nearest"), ("auto", "nearest"), ("auto", "auto")):
            problem = build(
                SamplerConfig(
                    pilot=True,
                    **{
                        **base,
                        "method": method,
                        "verifier": verifier,
                        "tree": "auto",
                        "budget": BUDGET,
                        "freeze": freeze,
                        "prefetch": prefetch,
                        "objective": "calls",
                        "start": "warm",
                    },
                )
            )  # as the authors count
            cost = problem.run().cost
            auto[(method, verifier, freeze, prefetch)] = {
                "method": method,
                "verifier": verifier,
                "freeze": freeze,
                "prefetch": prefetch,
                "speedup": cost.speedup,
                "calls_per_trajectory": float(cost.calls_per_trajectory.mean()),
                "planned_calls": problem.tree.expected_calls,
                "rows_per_call": cost.rows_per_call,
                "acceptance": cost.acceptance,
                "pilot_target_calls": problem.pilot.target_calls,
            }
    best_prefetch = max(("nearest", "auto"), key=lambda p: auto[("tree", "rank", "auto", p)]["speedup"])
    cells = gm512.cells(trajectories, quick)
    fixed = {k: s for k, s in cells.items() if s["rows_per_round"] <= BUDGET}
    results = {
        "trajectories": trajectories,
        "budget": BUDGET,
        "auto": list(auto.values()),
        "fixed": [
            {
                "freeze": k[0],
                "verifier": k[1],
                "k": k[2],
                "depth": k[3],
                "leaves": k[4],
                "rows_per_round": s["rows_per_round"],
                "speedup": s["speedup"],
            }
            for k, s in fixed.items()
        ],
    }
    figure = None
    if fixed:
        fig = go.Figure()
        for (freeze, verifier), style in {
            ("out", "rmc"): "circle",
            ("out", "dgrs"): "square",
            ("out", "rank"): "diamond",
            ("x0", "rmc"): "circle-open",
            ("x0", "dgrs"): "square-open",
            ("x0", "rank"): "diamond-open",
        }.items():
            pts = sorted(
                (s["rows_per_round"], s["speedup"]) for k, s in cells.items() if k[0] == freeze and k[1] == verifier
            )
            fig.add_scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="markers",
                name=f"{verifier}, freeze {freeze}",
                marker=dict(symbol=style, size=9),
            )
        ref = list(peer.their_table().values())
        fig.add_scatter(
            x=[r.rows_per_round for r in ref],
            y=[r.speedup for r in ref],
            mode="markers",
            name="the authors' code",
            marker=dict(symbol="x", size=10, color="black"),
        )
        for (method, verifier, freeze, prefetch), a in auto.items():
            if freeze == "auto" and prefetch == best_prefetch:
                fig.add_scatter(
                    x=[a["rows_per_call"]],
                    y=[a["speedup"]],
                    mode="markers+text",
                    text=[f"auto {method} ({verifier})"],
                    textposition="top center",
                    name=f"auto {method} ({verifier}), freeze auto",
                    marker=dict(symbol="star", size=16),
                )
        fig.update_layout(
            title="gm512: speedup in target calls against target rows per round",
            template="plotly_white",
            xaxis=dict(title="target rows per round (auto: mean rows per call)", type="log"),
            yaxis=dict(title="speedup (28 / target calls)"),
        )
        figure = plot(fig, PLOT, report)
    return render(results, figure), results


def render(results: dict, figure: str | None = None) -> str:
    """The section's body from its saved results alone (and the peer table, benchmarks/peer.py); figure: the
    plot's line (default: the plot's image, where fixed trees were measured)."""
    auto = {_key(a, "method", "verifier", "freeze", "prefetch"): a for a in results["auto"]}
    budget, fixed = results["budget"], results["fixed"]
    lines = [
        f"`gm512`, {results['trajectories']} trajectories, budget {budget} target rows per round; auto's pilot "
        "calls are not in the speedup (benchmarks/auto.py).",
        "Evaluated leaves (prefetch auto) also make deterministic steps free, which the speedup (stochastic steps "
        "only) does not see.",
        "",
        "| topology | freeze | prefetch | speedup | calls per trajectory | planned calls | rows per call | "
        "acceptance | pilot target calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (method, verifier, freeze, prefetch), a in auto.items():
        lines.append(
            f"| auto {method} ({verifier}) | {freeze} | {prefetch} | {a['speedup']:.2f} | "
            f"{a['calls_per_trajectory']:.2f} | {a['planned_calls']:.2f} | "
            f"{a['rows_per_call']:.1f} | {a['acceptance']:.3f} | {a['pilot_target_calls']} |"
        )
    within = peer.best(peer.side_by_side().values(), budget)
    widest = peer.best(peer.their_table().values())
    lines += [
        "",
        f"| within {budget} rows (or as said) | speedup |",
        "|---|---|",
    ]
    if fixed:
        best_prefetch = max(("nearest", "auto"), key=lambda p: auto[("tree", "rank", "auto", p)]["speedup"])
        best_auto = auto[("tree", "rank", "auto", best_prefetch)]["speedup"]
        best = max(fixed, key=lambda f: f["speedup"])
        lines.append(
            f"| the best exact configuration: auto tree (rank-aware), freeze auto, prefetch {best_prefetch} | "
            f"**{best_auto:.2f}x** ({'at least' if best_auto >= TARGET else 'BELOW'} {TARGET}x) |"
        )
        lines.append(
            f"| every fixed tree of the gm512 section, at its best: {best['verifier']} ({best['k']}, {best['depth']}), "
            f"freeze {best['freeze']}, {'leaves' if best['leaves'] else 'no leaves'} | {best['speedup']:.2f}x |"
        )
        lines += [
            f"| the best fixed tree, freeze {f} | "
            f"{max((x['speedup'] for x in fixed if x['freeze'] == f), default=0):.2f}x |"
            for f in ("out", "x0")
        ]
    lines += [
        f"| the authors' code, side by side | {within.speedup:.2f}x |",
        f"| the authors' table, at {widest.rows_per_round:,} rows | {widest.speedup:.2f}x |",
    ]
    if fixed:
        lines += ["", figure or f"![{PLOT}](plots/{PLOT}.png)"]
    return "\n".join(lines)
