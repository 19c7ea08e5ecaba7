"""Auto topology and per-step freezing on gm512, against every fixed tree of the gm512 section and the
authors' best within the same rows."""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig, build

from . import gm512, peer
from .common import plot

TITLE = "Beyond the papers: auto topology and per-step freezing on gm512"
BUDGET = 85  # target rows per round: the authors' (4, 4) tree
TARGET = 2.6  # x: what the best exact configuration within BUDGET rows should reach


def _key(record: dict, *fields: str) -> tuple:
    return tuple(record[f] for f in fields)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import plotly.graph_objects as go

    base = dict(model="gm512", num_samples=trajectories, seed=0, device="cpu", verifier="rank")
    within = peer.best(peer.side_by_side().values(), BUDGET)
    widest = peer.best(peer.their_table().values())
    lines = [
        f"`gm512`, {trajectories} trajectories, budget {BUDGET} target rows per round (the authors' code reaches "
        f"{within.speedup:.2f}x there side by side, and {widest.speedup:.2f}x at {widest.rows_per_round:,} rows in "
        "its table). `auto` plans each step's widths from a pilot of 32 trajectories (its calls not in the "
        "speedup); `freeze auto` picks each step's draft form, `prefetch auto` where to evaluate the leaves "
        "(docs/algorithms.md, section 2). Planned calls: the planner's expected target calls per trajectory.",
        "",
        "| topology | freeze | prefetch | speedup | calls per trajectory | planned calls | rows per call | "
        "acceptance | pilot target calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
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
            a = auto[(method, verifier, freeze, prefetch)]
            lines.append(
                f"| auto {method} ({verifier}) | {freeze} | {prefetch} | {a['speedup']:.2f} | "
                f"{a['calls_per_trajectory']:.2f} | {a['planned_calls']:.2f} | "
                f"{a['rows_per_call']:.1f} | {a['acceptance']:.3f} | {a['pilot_target_calls']} |"
            )
    best_prefetch = max(("nearest", "auto"), key=lambda p: auto[("tree", "rank", "auto", p)]["speedup"])
    best_auto = auto[("tree", "rank", "auto", best_prefetch)]["speedup"]
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
    lines.append("")
    if fixed:
        key, best = max(fixed.items(), key=lambda kv: kv[1]["speedup"])
        same_freeze = {f: max((s["speedup"] for k, s in fixed.items() if k[0] == f), default=0) for f in ("out", "x0")}
        lines += [
            f"- Best exact configuration within {BUDGET} rows: auto tree (rank-aware), freeze auto, prefetch {best_prefetch}, "
            f"**{best_auto:.2f}x** "
            f"({'at least' if best_auto >= TARGET else 'BELOW'} {TARGET}x).",
            f"- Every fixed tree of the gm512 section within {BUDGET} rows, at its best: {best['speedup']:.2f}x "
            f"({key[1]} ({key[2]}, {key[3]}), freeze {key[0]}, {'leaves' if key[4] else 'no leaves'}). At the "
            f"same freeze, auto against the best fixed tree: out {auto[('tree', 'rank', 'out', 'nearest')]['speedup']:.2f}x "
            f"vs {same_freeze['out']:.2f}x, x0 {auto[('tree', 'rank', 'x0', 'nearest')]['speedup']:.2f}x vs "
            f"{same_freeze['x0']:.2f}x.",
            "- Leaves evaluated where the plan finds it pays (prefetch auto) against never (nearest), freeze auto: "
            + ", ".join(
                f"{m} ({v}) {auto[(m, v, 'auto', 'auto')]['calls_per_trajectory']:.2f} against "
                f"{auto[(m, v, 'auto', 'nearest')]['calls_per_trajectory']:.2f} calls per trajectory"
                for m, v in (("tree", "rank"), ("tree", "dgrs"), ("chain", "rmc"))
            )
            + ". A committed evaluated leaf also makes a deterministic step free, which the speedup column (stochastic "
            "steps only, as the authors count) does not see; on the stochastic steps alone evaluating leaves "
            + (
                "pays"
                if auto[("tree", "rank", "auto", "auto")]["speedup"]
                > auto[("tree", "rank", "auto", "nearest")]["speedup"]
                else "does not pay"
            )
            + " here (rank-aware tree).",
        ]
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
        lines += ["", plot(fig, "gm512_speedup_vs_rows", report)]
    return "\n".join(lines), results
