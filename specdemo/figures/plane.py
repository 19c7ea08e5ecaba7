"""Views in data space: the round's tree over a 2-D target density, and an image model's committed path."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..images import to_uint8
from ..sampling import RoundTrace
from .density import LogDensity, density_trace, plot_limits
from .style import STATUS_COLORS, STATUS_LABELS, STATUS_SYMBOLS, base_layout, legend_below, message_figure
from .tree import FOUR_STATUSES, hover_texts, round_nodes, trajectory_rounds


def _tree_traces(nodes, pts: np.ndarray, legend: bool) -> list[go.Scatter]:
    """Edges and nodes of one round at their data-plane positions (nodes never drawn are skipped)."""
    ok = np.isfinite(pts).all(1)
    index = {slot: i for i, slot in enumerate(nodes.node)}
    path = set(nodes.path().tolist())
    traces = []
    groups: dict[tuple[str, bool], tuple[list, list]] = {}
    for i in range(1, len(nodes.node)):
        p = index[nodes.parent[i]]
        if not (ok[i] and ok[p]):
            continue
        key = (nodes.status[i], i in path and p in path)
        xs, ys = groups.setdefault(key, ([], []))
        xs += [pts[p, 0], pts[i, 0], None]
        ys += [pts[p, 1], pts[i, 1], None]
    for (status, on_path), (xs, ys) in sorted(groups.items(), key=lambda kv: kv[0][1]):
        color = STATUS_COLORS[status] if status != "unvisited" else "#b8c0cb"
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                line=dict(color=color, width=3.2 if on_path else 1.1, dash="dot" if status == "corrected" else "solid"),
            )
        )
    texts = np.array(hover_texts(nodes))
    for status in ("root", *FOUR_STATUSES):
        sel = np.flatnonzero((nodes.status == status) & ok)
        size = 13 if status in ("root", "corrected") else 7 if status == "unvisited" else 9
        traces.append(
            go.Scatter(
                x=pts[sel, 0],
                y=pts[sel, 1],
                mode="markers",
                name=STATUS_LABELS[status],
                legendgroup=status,
                showlegend=legend,
                hovertext=texts[sel],
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(
                    color=STATUS_COLORS[status],
                    symbol=STATUS_SYMBOLS[status],
                    size=size,
                    opacity=0.8 if status == "unvisited" else 1.0,
                    line=dict(color="white", width=0.8),
                ),
            )
        )
    return traces


def plane_figure(
    trace: list[RoundTrace],
    trajectory: int,
    k: int,
    log_density: LogDensity | None,
    *,
    path: np.ndarray | None = None,
    samples: np.ndarray | None = None,
    height: int = 440,
) -> go.Figure:
    """Left: the target density, the final samples, the trajectory's whole committed path and this
    round's tree. Right: a zoom on the round's tree. path: (N + 1, 2) states of the trajectory."""
    rounds = trajectory_rounds(trace, trajectory)
    if not rounds:
        return message_figure(f"trajectory {trajectory} has no speculative round in this run", height)
    if trace[0].states is None or trace[0].states.shape[-1] != 2 or trace[0].states.ndim != 3:
        return message_figure("the data-plane view is for 2-D targets", height)
    k = int(np.clip(k, 1, len(rounds)))
    nodes = round_nodes(trace, *rounds[k - 1])
    assert nodes.states is not None  # a trace holds every round's states or none
    pts = nodes.states.astype(float)
    xlim, ylim = plot_limits(samples, path)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.5, 0.5],
        horizontal_spacing=0.08,
        subplot_titles=("the run in the data plane", f"zoom on round {k}'s tree"),
    )
    # left panel
    if log_density is not None:
        fig.add_trace(density_trace(log_density, xlim, ylim), row=1, col=1)
    if samples is not None:
        fig.add_trace(
            go.Scatter(
                x=samples[:, 0],
                y=samples[:, 1],
                mode="markers",
                name="final samples",
                marker=dict(color="#334155", size=3.5, opacity=0.35),
                hoverinfo="skip",
            ),
            row=1,
            col=1,
        )
    if path is not None:
        steps = np.arange(len(path))
        fig.add_trace(
            go.Scatter(
                x=path[:, 0],
                y=path[:, 1],
                mode="lines+markers",
                name=f"trajectory {trajectory}'s path",
                line=dict(color="#94a3b8", width=0.8),
                marker=dict(size=3.5, color=steps, colorscale=[[0, "#e2e8f0"], [1, "#0f172a"]]),
                hovertemplate="committed state at step %{text}<extra></extra>",
                text=steps,
            ),
            row=1,
            col=1,
        )
    for tr in _tree_traces(nodes, pts, legend=False):
        fig.add_trace(tr, row=1, col=1)
    # right panel: the round's bounding box
    ok = pts[np.isfinite(pts).all(1)]
    lo, hi = ok.min(0), ok.max(0)
    centre, half = (lo + hi) / 2, max(float((hi - lo).max()) / 2, 1e-3) * 1.25
    zx, zy = (centre[0] - half, centre[0] + half), (centre[1] - half, centre[1] + half)
    if log_density is not None:
        fig.add_trace(density_trace(log_density, zx, zy, resolution=120), row=1, col=2)
    if path is not None:  # where the trajectory came from and where it went, a few steps either side
        lo_n, hi_n = max(nodes.root_step - 3, 0), min(nodes.root_step + nodes.committed + 3, len(path) - 1)
        seg = path[lo_n : hi_n + 1]
        fig.add_trace(
            go.Scatter(
                x=seg[:, 0],
                y=seg[:, 1],
                mode="lines+markers",
                showlegend=False,
                line=dict(color="#475569", width=1.0, dash="dash"),
                marker=dict(size=3),
                opacity=0.6,
                text=np.arange(lo_n, hi_n + 1),
                hovertemplate="committed state at step %{text}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    for tr in _tree_traces(nodes, pts, legend=True):
        fig.add_trace(tr, row=1, col=2)
    fig.add_shape(
        type="rect",
        x0=zx[0],
        x1=zx[1],
        y0=zy[0],
        y1=zy[1],
        line=dict(color="#0f172a", width=1, dash="dot"),
        row=1,
        col=1,
    )
    base_layout(fig, height=height)
    legend_below(fig, y=-0.1)
    fig.update_layout(margin=dict(t=40, b=40))
    fig.update_xaxes(range=list(xlim), row=1, col=1, showgrid=False, constrain="domain")
    fig.update_yaxes(range=list(ylim), row=1, col=1, scaleanchor="x", scaleratio=1, showgrid=False)
    fig.update_xaxes(range=list(zx), row=1, col=2, showgrid=False, constrain="domain")
    fig.update_yaxes(range=list(zy), row=1, col=2, scaleanchor="x2", scaleratio=1, showgrid=False)
    return fig


def _image_panels(
    images: list[np.ndarray],
    titles: list[str],
    frame_colors: list[str] | None,
    *,
    height: int,
    columns: int | None = None,
) -> go.Figure:
    n = len(images)
    cols = columns or n
    rows = int(np.ceil(n / cols))
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles,
        horizontal_spacing=0.012,
        vertical_spacing=0.18 / rows if rows > 1 else 0.1,
    )
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        rgb = np.repeat(img, 3, axis=-1) if img.shape[-1] == 1 else img
        fig.add_trace(go.Image(z=rgb, hovertemplate="pixel (%{x}, %{y})<extra></extra>"), row=r + 1, col=c + 1)
        if frame_colors:
            h, w = rgb.shape[:2]
            fig.add_shape(
                type="rect",
                x0=-0.5,
                y0=-0.5,
                x1=w - 0.5,
                y1=h - 0.5,
                line=dict(color=frame_colors[i], width=4),
                row=r + 1,
                col=c + 1,
            )
    base_layout(fig, height=height, legend=False)
    fig.update_layout(margin=dict(l=10, r=10, t=34, b=8))
    # each image as large as its cell allows, pinned under its title
    fig.update_xaxes(visible=False, showline=False, constrain="domain", constraintoward="left")
    fig.update_yaxes(visible=False, showline=False, constrain="domain", constraintoward="top")
    fig.update_annotations(font_size=11)
    return fig


PATH_COLUMNS = 9  # images per row in the committed-path view


def path_images_figure(trace: list[RoundTrace], trajectory: int, k: int, *, height: int | None = None) -> go.Figure:
    """An image model's committed path in the round: the root, each accepted node, the corrected
    sample, PATH_COLUMNS to a row; frames in status colours. height: by default, rows x 108 px."""
    rounds = trajectory_rounds(trace, trajectory)
    if not rounds:
        return message_figure(f"trajectory {trajectory} has no speculative round in this run", height)
    k = int(np.clip(k, 1, len(rounds)))
    nodes = round_nodes(trace, *rounds[k - 1])
    if nodes.states is None or nodes.states.ndim != 4:
        return message_figure("the committed-path view is for image models", height)
    idx = nodes.path()
    imgs = to_uint8(torch.from_numpy(np.nan_to_num(nodes.states[idx])))
    titles = [f"n = {nodes.steps[i]}{' corrected' if nodes.status[i] == 'corrected' else ''}" for i in idx]
    colors = [STATUS_COLORS[nodes.status[i]] for i in idx]
    columns = PATH_COLUMNS  # the same thumbnail size, however long the path
    rows = int(np.ceil(len(idx) / columns))
    fig = _image_panels(list(imgs), titles, colors, height=height or 50 + 108 * rows, columns=columns)
    fig.update_layout(
        title=dict(
            text=f"the committed path of round {k}: the round start, each accepted step, the corrected sample",
            x=0,
            xanchor="left",
            y=0.995,
            yanchor="top",
            font=dict(size=13),
        ),
        margin=dict(t=52),
    )
    return fig
