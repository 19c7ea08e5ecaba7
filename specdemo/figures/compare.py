"""The comparison of the plain target sampler, the budget-matched chain and the chosen tree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..images import grid
from .density import LogDensity, density_trace, plot_limits
from .style import METHOD_COLORS, base_layout, message_figure

if TYPE_CHECKING:  # named only: the table's headers are read without the sampling stack (the app's page)
    from ..config import SamplerConfig
    from ..sampling import Cost


class MethodRun(Protocol):
    """What these figures read of a run: the records of a comparison (the app's runner makes them),
    the plain target sampler's first."""

    key: str  # target, chain or tree: picks the colour
    label: str
    config: SamplerConfig
    cost: Cost
    samples: torch.Tensor
    tree: str  # the topology as Topology prints it
    verifier: str | None  # the verifier the run used (the planner's choice under --verifier auto)
    rows_per_round: float


def short_label(run: MethodRun, sep: str = "<br>") -> str:
    if run.key == "target":
        return f"plain{sep}target"
    block = " block" if run.verifier == "block" else ""  # next to the same chains under RMC
    if run.tree.startswith("auto"):  # a planned topology: auto(16 rows)
        return f"auto{sep}{run.tree[5:-1]}{block}" if run.tree.endswith(")") else f"tree{sep}{run.tree}"
    return f"{run.key}{sep}{run.tree}{block}"


def rows_cell(run: MethodRun) -> str | int:
    """Rows per round for the table: whole for a fixed topology, a plan's mean to one decimal."""
    rows = run.rows_per_round
    return int(rows) if float(rows).is_integer() else f"{rows:.1f} (mean)"


def cost_figure(runs: list[MethodRun], *, height: int = 360) -> go.Figure:
    """Bars per method: latency and its speedup, target calls and rows per sample, speedup in calls."""
    base = runs[0]
    panels = (
        ("latency (s)", lambda r: r.cost.wall_s, "{:.2f}"),
        ("speedup in wall-clock", lambda r: r.cost.time_speedup_over(base.cost), "{:.2f}×"),
        ("target calls per sample", lambda r: float(np.mean(r.cost.calls_per_trajectory)), "{:.1f}"),
        ("target rows per sample", lambda r: float(np.mean(r.cost.rows_per_trajectory)), "{:.0f}"),
        ("speedup in target calls", lambda r: r.cost.speedup_over(base.cost), "{:.2f}×"),
    )
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.07)
    for c, (_, value, fmt) in enumerate(panels, start=1):
        vals = [value(r) for r in runs]
        fig.add_trace(
            go.Bar(
                x=[short_label(r) for r in runs],
                y=vals,
                marker_color=[METHOD_COLORS[r.key] for r in runs],
                text=[fmt.format(v) for v in vals],
                textposition="outside",
                cliponaxis=False,
                showlegend=False,
                hovertext=[r.label for r in runs],
                hovertemplate="%{hovertext}<br>%{y:.3g}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.update_yaxes(range=[0, max(vals) * 1.22 if max(vals) > 0 else 1], row=1, col=c)
    base_layout(fig, height=height, legend=False)
    fig.update_layout(margin=dict(t=56, b=40), bargap=0.3)
    fig.update_xaxes(tickangle=0, tickfont=dict(size=11))
    fig.update_annotations(font_size=13)
    return fig


def acceptance_figure(runs: list[MethodRun], *, height: int = 320) -> go.Figure:
    """Acceptance rate at each depth of the drafted chain or tree (examined nodes only)."""
    fig = go.Figure()
    spec = [r for r in runs if r.cost.examined_per_depth]
    if not spec:
        return message_figure("no speculative run to show", height)
    for r in spec:
        acc = np.array([np.nan if a is None else a for a in r.cost.acceptance_per_depth], dtype=float)
        depth = np.arange(1, len(acc) + 1)
        examined = np.asarray(r.cost.examined_per_depth, dtype=float)
        # marker size grows with the nodes examined: a rate from two nodes is drawn small
        size = np.clip(4 + 1.6 * np.sqrt(examined), 4, 14)
        fig.add_trace(
            go.Scatter(
                x=depth,
                y=acc,
                mode="lines+markers",
                name=r.label,
                line=dict(color=METHOD_COLORS[r.key], width=2.5),
                marker=dict(size=size),
                customdata=np.stack([r.cost.examined_per_depth, r.cost.accepted_per_depth], -1),
                hovertemplate="depth %{x}: %{y:.1%} accepted<br>(%{customdata[1]} of %{customdata[0]} examined)<extra>"
                + r.label
                + "</extra>",
            )
        )
    base_layout(
        fig,
        height=height,
        title="acceptance by depth <span style='font-size:12px;color:#64748b'>(marker size: nodes examined)</span>",
    )
    fig.update_layout(margin=dict(t=86))
    fig.update_xaxes(title_text="depth in the draft (levels below the committed state)", dtick=1)
    fig.update_yaxes(title_text="accepted / examined", range=[0, 1.04], tickformat=".0%")
    return fig


TABLE_HEADERS = [
    "method",
    "rows / round",
    "target calls",
    "calls / sample",
    "rows / sample",
    "acceptance",
    "speedup (calls)",
    "latency (s)",
    "speedup (time)",
]


def comparison_table(runs: list[MethodRun]) -> list[list]:
    """One row per method, columns TABLE_HEADERS. target calls: sequential batched calls of the run;
    speedup (calls): plain calls per sample / this method's; speedup (time): plain wall-clock / this one's."""
    base = runs[0]
    rows = []
    for r in runs:
        c = r.cost
        rows.append(
            [
                r.label,
                rows_cell(r),
                c.target_calls,
                round(float(np.mean(c.calls_per_trajectory)), 2),
                round(float(np.mean(c.rows_per_trajectory)), 1),
                "-" if c.acceptance is None else f"{c.acceptance:.1%}",
                f"{c.speedup_over(base.cost):.2f}×",
                round(c.wall_s, 3),
                f"{c.time_speedup_over(base.cost):.2f}×",
            ]
        )
    return rows


def samples_figure(
    runs: list[MethodRun], *, log_density: LogDensity | None = None, height: int | None = None
) -> go.Figure:
    """The samples of each method side by side: scatter over the density (2-D), image grids, or the
    first two coordinates of higher-dimensional vectors. height: by default 380 px, or what an image
    grid's shape needs."""
    base = runs[0]
    titles = [
        f"{short_label(r, ' ')} · {np.mean(r.cost.calls_per_trajectory):.1f} calls"
        + ("" if r is base else f" ({r.cost.speedup_over(base.cost):.2f}×)")
        for r in runs
    ]
    first = runs[0].samples
    if first.dim() == 4:  # images
        cols = int(np.ceil(np.sqrt(min(len(first), 64))))
        grid_rows = int(np.ceil(min(len(first), 64) / cols))
        if height is None:  # each panel about 270 px wide on a desktop page: as tall as the grid's shape asks
            height = int(np.clip(64 + 270 * grid_rows / cols, 220, 420))
        fig = make_subplots(rows=1, cols=len(runs), subplot_titles=titles, horizontal_spacing=0.03)
        for i, r in enumerate(runs, start=1):
            g = grid(r.samples[:64], cols, background=255)
            g = np.repeat(g, 3, axis=-1) if g.shape[-1] == 1 else g
            fig.add_trace(go.Image(z=g, hoverinfo="skip"), row=1, col=i)
        base_layout(fig, height=height, legend=False)
        fig.update_xaxes(visible=False, showline=False, constrain="domain")
        fig.update_yaxes(visible=False, showline=False, constrain="domain", constraintoward="top")
        fig.update_layout(margin=dict(l=10, r=10, t=40, b=6))
        fig.update_annotations(font_size=12)
        return fig
    height = height or 380
    if first.dim() != 2:
        return message_figure("no side-by-side view for samples of this shape", height)
    pts = [r.samples[:, :2].double().numpy() for r in runs]
    if pts[0].shape[1] < 2:
        pts = [np.concatenate([p, np.zeros_like(p)], 1) for p in pts]
    xlim, ylim = plot_limits(*pts, pad=0.08)
    fig = make_subplots(rows=1, cols=len(runs), subplot_titles=titles, horizontal_spacing=0.04)
    two_d = first.shape[1] == 2
    for i, (r, p) in enumerate(zip(runs, pts, strict=True), start=1):
        if log_density is not None and two_d:
            fig.add_trace(density_trace(log_density, xlim, ylim, resolution=100), row=1, col=i)
        fig.add_trace(
            go.Scatter(
                x=p[:, 0],
                y=p[:, 1],
                mode="markers",
                name=r.label,
                showlegend=False,
                marker=dict(color=METHOD_COLORS[r.key], size=4.5, opacity=0.75, line=dict(color="white", width=0.3)),
                hovertemplate="(%{x:.2f}, %{y:.2f})<extra>" + r.label + "</extra>",
            ),
            row=1,
            col=i,
        )
        fig.update_xaxes(range=list(xlim), row=1, col=i, showgrid=False)
        fig.update_yaxes(
            range=list(ylim),
            row=1,
            col=i,
            showgrid=False,
            scaleanchor=f"x{i if i > 1 else ''}",
            scaleratio=1,
            showticklabels=i == 1,
        )
    base_layout(fig, height=height, legend=False)
    fig.update_layout(margin=dict(t=50))
    fig.update_annotations(font_size=12)
    if not two_d:
        fig.update_xaxes(title_text="coordinate 1")
        fig.update_yaxes(title_text="coordinate 2", col=1)
    return fig
