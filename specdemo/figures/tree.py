"""The draft tree of one round of one trajectory, and every round of a run, from RoundTrace records.

A round's nodes are stored breadth-first (specdemo.trees.Topology); the corrected sample sits in
the last slot with its parent in `corrected_parent`. Nodes deeper than the row's own depth do not
exist for it (the tree is truncated near the end of the trajectory). Leaves below nodes that were
never examined are never drafted (NaN states): the abstract view shows them, the data plane cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..sampling import CORRECTED, ROOT, STATUS_NAMES, RoundTrace
from ..trees import Topology
from .style import STATUS_COLORS, STATUS_LABELS, STATUS_SYMBOLS, base_layout, message_figure

CORRECTED_X_OFFSET = 0.28  # the corrected sample sits just right of the children it replaces
FOUR_STATUSES = ("accepted", "rejected", "corrected", "unvisited")


@dataclass
class RoundNodes:
    """The nodes of one trajectory in one round, as flat arrays (one entry per existing node)."""

    round_index: int  # position in the run's trace
    trajectory: int
    root_step: int
    depth: int  # speculated depth of this round
    committed: int  # steps committed
    node: np.ndarray  # slot in the round's arrays
    parent: np.ndarray  # parent slot (-1 for the root)
    node_depth: np.ndarray
    status: np.ndarray  # names
    evaluated: np.ndarray
    delta: np.ndarray  # at verified nodes: delta of the verification of their children
    node_accept_prob: np.ndarray  # at verified nodes
    parent_delta: np.ndarray  # the delta under which this node was examined (NaN if never)
    child_accept_prob: np.ndarray  # probability this node was accepted with, when examined
    states: np.ndarray | None  # (nodes, *shape), NaN where never drawn

    @property
    def corrected(self) -> bool:
        return bool((self.status == "corrected").any())

    @property
    def steps(self) -> np.ndarray:
        return self.root_step + self.node_depth

    def statuses(self) -> set[str]:
        return set(self.status.tolist()) - {"root"}

    def path(self) -> np.ndarray:
        """Indices (into these arrays) of the committed path: the root, accepted nodes, the corrected sample."""
        order = [0]
        for d in range(1, self.depth + 1):
            hit = np.flatnonzero((self.node_depth == d) & (self.status == "accepted"))
            if not hit.size:
                break
            order.append(int(hit[0]))
        corr = np.flatnonzero(self.status == "corrected")
        return np.array(order + corr.tolist(), dtype=int)


def round_widths(rt: RoundTrace) -> tuple[int, ...]:
    """The widths per depth of the tree a round record was drafted with (one record, one tree)."""
    sizes = np.bincount(rt.node_depth[rt.node_depth >= 0])
    return tuple(int(sizes[d] // max(sizes[d - 1], 1)) for d in range(1, len(sizes)))


def round_leaves_evaluated(rt: RoundTrace, row: int) -> bool:
    """Whether the round's leaves (its deepest drafted level) went into the target call."""
    leaves = rt.node_depth == rt.node_depth.max()
    return bool(rt.evaluated[row, leaves].all())


def trajectory_rounds(trace: list[RoundTrace], trajectory: int) -> list[tuple[int, int]]:
    """(round index, row) of every round in which `trajectory` speculated, in order."""
    out = []
    for r, rt in enumerate(trace or []):
        rows = np.flatnonzero(rt.trajectories == trajectory)
        if rows.size:
            out.append((r, int(rows[0])))
    return out


def round_nodes(trace: list[RoundTrace], round_index: int, row: int) -> RoundNodes:
    rt = trace[round_index]
    depth = int(rt.depth[row])
    slots = rt.parent.shape[0]
    last = slots - 1  # the corrected slot
    exists = (rt.node_depth >= 0) & (rt.node_depth <= depth)
    exists[last] = bool(rt.corrected_parent[row] >= 0)
    node = np.flatnonzero(exists)
    parent = rt.parent[node].copy()
    node_depth = rt.node_depth[node].copy()
    if exists[last]:
        parent[-1] = rt.corrected_parent[row]
        node_depth[-1] = rt.node_depth[rt.corrected_parent[row]] + 1
    delta = rt.delta[row]
    parent_delta = np.where(parent >= 0, delta[np.maximum(parent, 0)], np.nan)
    child_acc = rt.child_accept_prob[row, node].astype(float)
    if exists[last]:  # the corrected draw was not "accepted with" a probability: show its parent's
        child_acc[-1] = np.nan
    return RoundNodes(
        round_index=round_index,
        trajectory=int(rt.trajectories[row]),
        root_step=int(rt.step[row]),
        depth=depth,
        committed=int(rt.committed_steps[row]),
        node=node,
        parent=parent,
        node_depth=node_depth,
        status=np.array([STATUS_NAMES[s] for s in rt.status[row, node]]),
        evaluated=rt.evaluated[row, node].copy(),
        delta=delta[node].astype(float),
        node_accept_prob=rt.node_accept_prob[row, node].astype(float),
        parent_delta=parent_delta.astype(float),
        child_accept_prob=child_acc,
        states=None if rt.states is None else rt.states[row, node],
    )


def pick_round(trace: list[RoundTrace], max_trajectories: int = 64) -> tuple[int, int]:
    """A (trajectory, k) worth showing first (k counts the trajectory's own rounds from 1): the round
    with the most distinct statuses (all four if any round has them), then one whose tree branches
    (a plan mixes chains and trees), then one that committed at least 3 steps (a path worth showing),
    then the latest start (an image model's states show the picture only late in the schedule),
    then the first trajectory."""
    best, best_key = (0, 1), (-1, -1, -1, -1)
    if not trace:
        return best
    ids = sorted(set(np.concatenate([rt.trajectories for rt in trace]).tolist()))[:max_trajectories]
    branching = [any(w > 1 for w in round_widths(rt)) for rt in trace]
    for t in ids:
        for k, (r, row) in enumerate(trajectory_rounds(trace, t), start=1):
            rt = trace[r]
            depth = int(rt.depth[row])
            codes = set(rt.status[row, (rt.node_depth >= 0) & (rt.node_depth <= depth)].tolist())
            if rt.corrected_parent[row] >= 0:
                codes.add(CORRECTED)
            codes.discard(ROOT)
            key = (len(codes), int(branching[r]), min(int(rt.committed_steps[row]), 3), int(rt.step[row]))
            if key > best_key:
                best, best_key = (t, k), key
    return best


def statuses_in_run(trace: list[RoundTrace]) -> set[str]:
    """Every node status that occurs somewhere in the run (the root excepted)."""
    seen: set[str] = set()
    for rt in trace or []:
        exists = rt.node_depth >= 0
        seen.update(STATUS_NAMES[s] for s in np.unique(rt.status[:, exists]))
        if (rt.corrected_parent >= 0).any():
            seen.add("corrected")
    return seen - {"root"}


def _fmt(v, spec=".3f") -> str:
    return "n/a" if v is None or not np.isfinite(v) else format(float(v), spec)


def hover_texts(nodes: RoundNodes) -> list[str]:
    texts = []
    for i in range(len(nodes.node)):
        st = nodes.status[i]
        lines = [f"<b>{STATUS_LABELS[st]}</b>", f"step n = {nodes.steps[i]} (depth {nodes.node_depth[i]})"]
        if nodes.parent[i] >= 0:
            lines.append(f"δ at parent: {_fmt(nodes.parent_delta[i])}")
        if np.isfinite(nodes.child_accept_prob[i]):
            lines.append(f"P(accept this child): {_fmt(nodes.child_accept_prob[i])}")
        if np.isfinite(nodes.delta[i]):
            lines.append(f"δ verifying its children: {_fmt(nodes.delta[i])}")
            lines.append(f"node acceptance (any child): {_fmt(nodes.node_accept_prob[i])}")
        lines.append("target evaluated here" if nodes.evaluated[i] else "target not evaluated")
        texts.append("<br>".join(lines))
    return texts


def tree_layout(trace: list[RoundTrace], nodes: RoundNodes) -> tuple[np.ndarray, np.ndarray]:
    """x = diffusion step, y = position within the level (children contiguous, parents centred)."""
    rt = trace[nodes.round_index]
    full_depth = rt.node_depth.max()
    sizes = np.bincount(rt.node_depth[rt.node_depth >= 0], minlength=full_depth + 1)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    x = nodes.steps.astype(float)
    y = np.zeros(len(nodes.node))
    for i, (slot, d) in enumerate(zip(nodes.node, nodes.node_depth, strict=True)):
        if nodes.status[i] == "corrected":
            continue
        j = slot - starts[d]
        y[i] = (j + 0.5) / sizes[d] - 0.5
    corr = np.flatnonzero(nodes.status == "corrected")
    for i in corr.tolist():
        p = int(np.flatnonzero(nodes.node == nodes.parent[i])[0])
        y[i] = y[p]
        x[i] += CORRECTED_X_OFFSET
    return x, y


def _marker_size(count: int) -> float:
    return float(np.clip(26 - 3.2 * np.log2(max(count, 1)), 6, 20))


def tree_figure(trace: list[RoundTrace], trajectory: int, k: int, *, height: int = 440) -> go.Figure:
    """The draft tree of the k-th speculative round (from 1) of `trajectory`: every drafted node
    coloured by status, edges from parent to child, x the diffusion step; hover: step, delta,
    acceptance probability."""
    rounds = trajectory_rounds(trace, trajectory)
    if not rounds:
        return message_figure(f"trajectory {trajectory} has no speculative round in this run", height)
    k = int(np.clip(k, 1, len(rounds)))
    r, row = rounds[k - 1]
    nodes = round_nodes(trace, r, row)
    x, y = tree_layout(trace, nodes)
    fig = go.Figure()
    path = set(nodes.path().tolist())
    index = {slot: i for i, slot in enumerate(nodes.node)}

    # edges, grouped by the child's status; the committed path drawn thick on top
    groups: dict[tuple[str, bool], tuple[list[float | None], list[float | None]]] = {}
    for i in range(1, len(nodes.node)):
        p = index[nodes.parent[i]]
        on_path = i in path and p in path
        key = (nodes.status[i], on_path)
        xs, ys = groups.setdefault(key, ([], []))
        xs += [x[p], x[i], None]
        ys += [y[p], y[i], None]
    for (status, on_path), (xs, ys) in sorted(groups.items(), key=lambda kv: kv[0][1]):
        color = STATUS_COLORS[status] if status != "unvisited" else "#cfd5dd"
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                line=dict(color=color, width=4 if on_path else 1.4, dash="dot" if status == "corrected" else "solid"),
            )
        )

    size = _marker_size(len(nodes.node))
    texts = np.array(hover_texts(nodes))
    for status in ("root", *FOUR_STATUSES):
        sel = np.flatnonzero(nodes.status == status)
        base = size * (1.35 if status in ("root", "corrected") else 0.75 if status == "unvisited" else 1.0)
        fig.add_trace(
            go.Scatter(
                x=x[sel],
                y=y[sel],
                mode="markers",
                name=f"{STATUS_LABELS[status]} ({sel.size})",
                legendgroup=status,
                customdata=np.stack([nodes.node[sel], nodes.steps[sel]], -1) if sel.size else None,
                hovertext=texts[sel],
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(
                    color=STATUS_COLORS[status],
                    symbol=STATUS_SYMBOLS[status],
                    size=base,
                    opacity=0.75 if status == "unvisited" else 1.0,
                    line=dict(
                        color=np.where(nodes.evaluated[sel], "#0f172a", "white").tolist() if sel.size else "white",
                        width=np.where(nodes.evaluated[sel], 2.2, 1.0).tolist() if sel.size else 1.0,
                    ),
                ),
            )
        )
    # legend key for the outline
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name="target evaluated (dark ring)",
            marker=dict(color="white", size=11, line=dict(color="#0f172a", width=2.2)),
        )
    )

    end = nodes.root_step + nodes.committed
    how = "ended by a corrected sample" if nodes.corrected else "every level accepted"
    widths = round_widths(trace[r])
    shape = Topology(widths).text(round_leaves_evaluated(trace[r], row))
    if nodes.depth < len(widths):
        shape += f", cut to depth {nodes.depth}"
    if trace[r].root_known[row]:  # a plan drafts these from its trees for a known root: say why it differs
        shape += ", root output known"
    title = f"Round {k} of {len(rounds)}, trajectory {trajectory}: tree {shape}"
    detail = f"steps {nodes.root_step} → {end} committed: {nodes.committed} of {nodes.depth} drafted levels, {how}"
    base_layout(fig, height=height, title=title)
    fig.update_layout(margin=dict(t=120), legend=dict(y=1.0), title=dict(xref="paper"))
    # the detail line sits between the title and the legend (a <br> in the title would be clipped)
    fig.add_annotation(
        text=detail,
        xref="paper",
        yref="paper",
        x=0,
        y=1,
        xanchor="left",
        yanchor="bottom",
        yshift=56,
        showarrow=False,
        font=dict(size=13, color="#475569"),
    )
    fig.update_xaxes(
        title_text="diffusion step n", dtick=1, range=[nodes.root_step - 0.4, nodes.root_step + nodes.depth + 0.6]
    )
    fig.update_yaxes(visible=False, range=[-0.56, 0.56])
    return fig


def rounds_figure(
    trace: list[RoundTrace],
    trajectory: int,
    num_steps: int,
    *,
    k: int | None = None,
    max_trajectories: int = 48,
    height: int = 470,
) -> go.Figure:
    """All rounds of a run: top, the chosen trajectory's rounds along the diffusion steps (bar width
    and height = steps committed, green if every drafted level was accepted, amber if a corrected
    sample ended it); bottom, steps committed by the round covering each step, for many trajectories."""
    if not trace:
        return message_figure("no speculative rounds in this run", height)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        row_heights=[0.42, 0.58],
        subplot_titles=(
            f"trajectory {trajectory}: steps committed per round",
            "every trajectory: steps committed by the round covering step n",
        ),
    )
    rounds = trajectory_rounds(trace, trajectory)
    xs, widths, heights, colors, texts, lines = [], [], [], [], [], []
    for j, (r, row) in enumerate(rounds, start=1):
        rt = trace[r]
        n0, c, d = int(rt.step[row]), int(rt.committed_steps[row]), int(rt.depth[row])
        corrected = rt.corrected_parent[row] >= 0
        xs.append(n0 + c / 2 - 0.5)  # covers the cells of steps n0 .. n0 + c - 1
        widths.append(c * 0.92)
        heights.append(c)
        colors.append(STATUS_COLORS["corrected" if corrected else "accepted"])
        lines.append(3 if k == j else 0)
        texts.append(
            f"<b>round {j}</b> (batch round {rt.round + 1})<br>steps {n0} → {n0 + c}<br>committed {c} of {d} drafted"
            f"<br>{'ended by a corrected sample' if corrected else 'every level accepted'}"
        )
    fig.add_trace(
        go.Bar(
            x=xs,
            y=heights,
            width=widths,
            marker=dict(color=colors, line=dict(color="#0f172a", width=lines)),
            hovertext=texts,
            hovertemplate="%{hovertext}<extra></extra>",
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    for status, label in (("accepted", "every level accepted"), ("corrected", "ended by a corrected sample")):
        fig.add_trace(go.Bar(x=[None], y=[None], name=label, marker_color=STATUS_COLORS[status]), row=1, col=1)

    ids = sorted(set(np.concatenate([rt.trajectories for rt in trace]).tolist()))
    show = (
        ids[:max_trajectories] if trajectory in ids[:max_trajectories] else ids[: max_trajectories - 1] + [trajectory]
    )
    pos = {t: i for i, t in enumerate(show)}
    z = np.full((len(show), num_steps), np.nan)
    for rt in trace:
        for row, t in enumerate(rt.trajectories.tolist()):
            if t in pos:
                n0, c = int(rt.step[row]), int(rt.committed_steps[row])
                z[pos[t], n0 : n0 + c] = c
    max_depth = max(int(rt.depth.max()) for rt in trace)
    dtick = max(1, int(np.ceil(max_depth / 8)))
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=np.arange(num_steps),
            y=[str(t) for t in show],
            zmin=1,
            zmax=max(max_depth, 2),
            colorscale=[[0, "#fde68a"], [0.5, "#86efac"], [1, "#15803d"]],
            xgap=0,
            ygap=1 if len(show) <= 24 else 0,
            colorbar=dict(
                title=dict(text="steps per round", side="right"),
                thickness=12,
                len=0.55,
                y=0.29,
                yanchor="middle",
                tickmode="linear",
                tick0=1,
                dtick=dtick,
            ),
            hovertemplate="trajectory %{y}, step %{x}<br>its round committed %{z} steps<extra></extra>",
        ),
        row=2,
        col=1,
    )
    if trajectory in pos:
        fig.add_shape(
            type="rect",
            x0=-0.5,
            x1=num_steps - 0.5,
            y0=pos[trajectory] - 0.5,
            y1=pos[trajectory] + 0.5,
            line=dict(color="#0f172a", width=1.5),
            row=2,
            col=1,
        )
    base_layout(fig, height=height)
    fig.update_layout(
        barmode="overlay", bargap=0, margin=dict(t=70), legend=dict(xanchor="right", x=1, y=1.06, yanchor="bottom")
    )
    fig.update_annotations(x=0, xanchor="left", font_size=13)
    fig.update_xaxes(title_text="diffusion step n", row=2, col=1, range=[-0.5, num_steps - 0.5])
    fig.update_yaxes(title_text="steps", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(
        title_text="trajectory", row=2, col=1, showgrid=False, autorange="reversed", showticklabels=len(show) <= 24
    )
    return fig
