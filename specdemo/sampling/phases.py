"""One round of the trajectories that share a topology, as phases over a typed RoundState
(algorithms.md section 4): draft, the rows of the batched target call, walk, correct, commit.

Every trajectory of a RoundState has the same (truncated) tree, the same leaf evaluation and the
same root state (output known or not), so each phase is a few tensor operations over all of them.

Walk. A node verifier decides the path nodes of several levels at once (`Segment`): a run of levels
of width 1 is decided in one call, since its path below the run's first node is known before
anything is verified, and the walk stops at its first rejection; a level of width > 1 is decided
at the node the walk has reached. Deciding nodes past a rejection uses uniforms that nothing else
reads, so it changes no law. A tree verifier weighs a chain in one call, any other tree path by path
(_walk_tree). Corrections are
drawn once the driver knows which rows need one (after the round's one host synchronisation).

Lazy leaves. An unevaluated last level of a tree (widths > 1 above it) is drawn only at the node the
walk reaches: the K children of a node are i.i.d. given it, so forming them there from normals drawn
with the round's noise changes no law, and saves drafting the (K - 1) / K of the tree never seen.
Chains and evaluated leaves are drafted before the target call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch

from ..drafts import LevelMeans
from ..kernels.base import StepCoefficients
from ..trees import Topology
from ..verifiers import DELTA_FLOOR, Decision, NodeVerifier, RankOne, TreeVerifier
from ..verifiers.block import BlockVerdict, TreeTables, TreeWalk


@dataclass(frozen=True)
class Segment:
    """Levels first..last (depths of the verified nodes) decided together."""

    first: int
    last: int
    width: int  # children per node
    lazy: bool  # the lazily drawn last level
    uniform_offset: int  # the first uniform column of level `first`
    per_node: int  # uniforms per decided node

    @property
    def levels(self) -> int:
        return self.last - self.first + 1


@lru_cache(maxsize=256)
def layout_for(tree: Topology, evaluate_leaves: bool, verifier_type: type, device: torch.device) -> "Layout":
    """A topology's Layout, built once per process (the verifier's type sets its uniforms)."""
    return Layout(tree, evaluate_leaves, verifier_type(), device)


@lru_cache(maxsize=256)
def cut(tree: Topology, depth: int) -> Topology:
    """The topology of its first `depth` levels (made once: trees that cut to the same widths are equal)."""
    return tree if depth == tree.depth else Topology(tree.widths[:depth])


class Layout:
    """A topology's index tensors on the device, and how a walk of it is laid out."""

    def __init__(self, tree: Topology, evaluate_leaves: bool, verifier, device: torch.device):
        self.tree, self.evaluate_leaves = tree, evaluate_leaves
        depth = tree.depth
        whole = isinstance(verifier, TreeVerifier)  # weighs every drafted node: none drawn lazily
        self.lazy = not evaluate_leaves and not tree.is_chain and not whole
        starts = tree.level_starts
        # materialised nodes (drafted before the call), evaluated nodes (rows of the call), nodes
        # whose children are drafted before the call (their draft means are kept)
        self.num_drafted_nodes = starts[depth] if self.lazy else starts[depth + 1]
        self.evaluated_depth = depth if evaluate_leaves else depth - 1
        self.num_evaluated = starts[self.evaluated_depth + 1]
        self.num_parents = starts[depth - 1] if self.lazy else starts[depth]
        self.lazy_width = tree.widths[-1] if self.lazy else 0
        self.level_starts = starts
        self.first_child = tree.first_child.to(device)
        self.parent = tree.parent.clamp_min(0).to(device)
        self.node_depth = tree.node_depth.to(device)
        self.node_depth_host = tree.node_depth.tolist()
        widths = torch.tensor((*tree.widths, 0), dtype=torch.long)
        self.num_children = widths[tree.node_depth].to(device)
        self.max_width = max(tree.widths)
        self.ancestors = _ancestors(tree).to(device)
        self.node_steps = tree.node_depth[:self.num_evaluated].to(device)  # each evaluated node's step offset
        self.depths = torch.arange(depth, device=device)
        self.tables = None
        if whole:
            self.segments = ()
            self.uniform_count = verifier.uniforms_per_tree(tree)
            if not tree.is_chain:
                self.tables = TreeTables.of(tree, device)
                # each node with children: its children (padded with its last), and each node's column
                # in that table's flattened (node, child) grid
                j = torch.arange(self.max_width)
                first = tree.first_child[:self.num_parents]
                last = first + widths[tree.node_depth[:self.num_parents]] - 1
                self.kid_table = torch.minimum(first[:, None] + j[None], last[:, None]).to(device)
                parent = tree.parent.clamp_min(0)
                self.child_column = (parent * self.max_width + torch.arange(tree.num_nodes)
                                     - tree.first_child[parent]).clamp_min(0).to(device)
        else:
            self.segments = _segments(tree, self.lazy, verifier)
            self.uniform_count = sum(s.levels * s.per_node for s in self.segments)
        self.noise_count = self.num_drafted_nodes - 1 + self.lazy_width
        self._run_nodes = {s: torch.tensor(starts[s.first:s.last + 1], device=device) - starts[s.first]
                           for s in self.segments if s.levels > 1}
        self._root_segments: dict[Segment, tuple[torch.Tensor, torch.Tensor]] = {}

    def root_segment(self, segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
        """(nodes (1, S), their children (1, S, K)) of a segment that starts at the root: nodes 0..S-1
        (one per level of a width-1 run, or the root alone), children 1..S K."""
        if segment not in self._root_segments:
            nodes = torch.arange(segment.levels, device=self.first_child.device)
            kids = 1 + torch.arange(segment.levels * segment.width, device=nodes.device).view(segment.levels,
                                                                                              segment.width)
            self._root_segments[segment] = nodes[None], kids[None]
        return self._root_segments[segment]

    def segment_nodes(self, segment: Segment, start: torch.Tensor) -> torch.Tensor:
        """(A, levels): the path nodes of a segment below its first node `start` (A,)."""
        if segment.levels == 1:
            return start[:, None]
        return self._run_nodes[segment][None] + start[:, None]


def _ancestors(tree: Topology) -> torch.Tensor:
    """(M, L + 1): the ancestor of each node at each depth (the node itself at and below its depth)."""
    parent = tree.parent.clamp_min(0)
    table = torch.arange(tree.num_nodes)[:, None].repeat(1, tree.depth + 1)
    for d in range(tree.depth - 1, -1, -1):
        deeper = tree.node_depth > d
        table[deeper, d] = parent[table[deeper, d + 1]]
    return table


def _segments(tree: Topology, lazy: bool, verifier: NodeVerifier) -> tuple[Segment, ...]:
    """Runs of width-1 levels, single levels of width > 1, and the lazy last level."""
    segments, offset, d = [], 0, 0
    depth = tree.depth
    while d < depth:
        width = tree.widths[d]
        last = d
        if width == 1 and not (lazy and d == depth - 1):
            while last + 1 < depth and tree.widths[last + 1] == 1 and not (lazy and last + 1 == depth - 1):
                last += 1
        per = verifier.uniforms_per_node(width)
        segments.append(Segment(d, last, width, lazy and d == depth - 1, offset, per))
        offset += (last - d + 1) * per
        d = last + 1
    return tuple(segments)


class Workspace:
    """The buffers of a layout's rounds, for up to `capacity` trajectories, reused from round to round
    of a run, and their views level by level: the drafting loop then costs two fused operations a
    level. A round of fewer trajectories uses the first rows (`rows`)."""

    def __init__(self, layout: Layout, capacity: int, shape: tuple[int, ...], device: torch.device,
                 dtype: torch.dtype):
        self.layout, self.capacity, self.shape = layout, capacity, tuple(shape)
        self.x = torch.empty((capacity, layout.num_drafted_nodes, *shape), device=device, dtype=dtype)
        self.mp = torch.empty((capacity, max(layout.num_parents, 1), *shape), device=device, dtype=dtype)
        self.noise = torch.empty((capacity, layout.noise_count, *shape), device=device, dtype=dtype)
        self.uniforms = torch.empty((capacity, layout.uniform_count), device=device, dtype=torch.float64)
        self.child_scales = torch.empty((capacity, layout.tree.depth), device=device, dtype=dtype)  # s by depth
        self.depth_steps = torch.empty((capacity, layout.tree.depth), device=device, dtype=torch.long)  # n + d
        # the kernel's A..E at every depth step, for the walk's target means
        self.coefficients = torch.empty((capacity * layout.tree.depth, 5), device=device, dtype=dtype)
        self.alpha = torch.empty((capacity, layout.tree.depth), device=device, dtype=dtype)  # an affine draft's
        self._full = self._views(capacity)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.x, self.mp, self.noise, self.uniforms, self.child_scales, self.alpha,
                                      self.depth_steps, self.coefficients))

    def segment(self, segment: Segment) -> "SegmentViews":
        """A segment's views of the buffers, made at the first round that asks."""
        views = self._segment_views.get(segment)
        if views is None:
            a, s_len, width = self.x.shape[0], segment.levels, segment.width
            levels, lo = slice(segment.first, segment.last + 1), segment.uniform_offset
            root = None
            if segment.first == 0 and not segment.lazy:
                nodes, kid_index = self.layout.root_segment(segment)
                root = (nodes.expand(a, -1), kid_index.expand(a, -1, -1),
                        self.x[:, 1:1 + s_len * width].unflatten(1, (s_len, width)), self.mp[:, :s_len], self.x[:, :s_len])
            views = self._segment_views[segment] = SegmentViews(
                self.child_scales[:, levels], self.uniforms[:, lo:lo + s_len * segment.per_node],
                StepCoefficients(*(c[:, levels] for c in self.depth_coefficients)), root)
        return views

    def rows(self, count: int) -> "Workspace":
        """The buffers and level views of the first `count` rows (all of them: no new view)."""
        if count == self.capacity:
            return self._full
        return self._views(count)

    def _views(self, count: int) -> "Workspace":
        tree, starts = self.layout.tree, self.layout.tree.level_starts
        depth, ones = tree.depth, [1] * len(self.shape)
        v = object.__new__(Workspace)
        v.layout, v._segment_views = self.layout, {}
        v.x, v.mp, v.noise = self.x[:count], self.mp[:count], self.noise[:count]
        v.uniforms, v.child_scales, v.alpha = self.uniforms[:count], self.child_scales[:count], self.alpha[:count]
        v.depth_steps = self.depth_steps[:count]
        v.flat_depth_steps, v.flat_child_scales = v.depth_steps.view(-1), v.child_scales.view(-1)
        v.coefficients = self.coefficients[:count * depth]
        v.depth_coefficients = StepCoefficients(*(v.coefficients[:, j].view(count, depth, *ones) for j in range(5)))
        v.rows = torch.arange(count, device=self.x.device)
        # per drafted level: parents (A, P, *shape), their means, the means by child, the children
        # (A, P, K, *shape), their noise, and s shaped to broadcast against the children
        if tree.is_chain:  # P = K = 1: every level's views in one call each
            x, mp, noise = v.x.split(1, 1), v.mp.split(1, 1), v.noise.split(1, 1)
            scales = v.child_scales.view(count, depth, *ones).split(1, 1)
            v.levels = [(x[d], mp[d], mp[d], x[d + 1], noise[d], scales[d]) for d in range(depth)]
            v.alpha_levels = v.alpha.view(count, depth, *ones).split(1, 1)
            return v
        scales = v.child_scales.view(count, depth, 1, 1, *ones).unbind(1)
        v.levels = []
        for level in range(1, (depth - 1 if self.layout.lazy else depth) + 1):
            lo, hi, width = starts[level - 1], starts[level], tree.widths[level - 1]
            kids = slice(starts[level], starts[level + 1])
            v.levels.append((v.x[:, lo:hi], v.mp[:, lo:hi], v.mp[:, lo:hi, None],
                             v.x[:, kids].unflatten(1, (hi - lo, width)),
                             v.noise[:, kids.start - 1:kids.stop - 1].unflatten(1, (hi - lo, width)),
                             scales[level - 1]))
        return v


class SegmentViews(NamedTuple):
    """A segment's views of a workspace: the scales the decided nodes' children were drawn with
    (A, S), their uniforms (A, S * per node), the kernel's coefficients at their steps; for a segment
    from the root, also (nodes (A, S), kid_index (A, S, K), kids (A, S, K, *shape), mp, xv (A, S,
    *shape)), the same nodes in every row."""

    scales: torch.Tensor
    uniforms: torch.Tensor
    coefficients: StepCoefficients  # A..E at the nodes' steps (A, S, *ones), gathered by the draft phase
    root: tuple[torch.Tensor, ...] | None


@dataclass
class SegmentRecord:
    """What a walk decided in one segment, for the corrections and the trace: the path nodes
    (A, S), their children's indices (A, S, K) and states (A, S, K, *shape), the scales (A, S), the
    reduction and uniforms of the A * S decided nodes, and the decision."""

    segment: Segment
    nodes: torch.Tensor
    kid_index: torch.Tensor
    kids: torch.Tensor
    scales: torch.Tensor
    red: RankOne
    uniforms: torch.Tensor
    decision: Decision


@dataclass
class TreeRecord:
    """What weighing a whole tree decided, for the corrections and the trace: the reduction at the
    N nodes with children (A * N rows, children padded to the widest level), their children's states
    (A, N, K, *shape) and scales (A, N), and the walk."""

    red: RankOne
    kids: torch.Tensor
    scales: torch.Tensor
    walk: TreeWalk


@dataclass(slots=True)
class RoundState:
    """A round of A trajectories sharing a layout (slots: their batch slots; step: n at the root)."""

    layout: Layout
    slots: torch.Tensor
    slot_list: list[int]
    slot_array: np.ndarray  # the slots again, on the host, for indexing the driver's host arrays
    step: torch.Tensor
    root_known: bool
    x: torch.Tensor | None = None  # (A, drafted nodes, *shape) breadth-first, the root first
    mp: torch.Tensor | None = None  # (A, parents, *shape): draft means at the nodes whose children are drafted
    noise: torch.Tensor | None = None  # (A, noise_count, *shape): xi of drafted nodes, then of lazy leaves
    uniforms: torch.Tensor | None = None  # (A, uniform_count) float64
    out: torch.Tensor | None = None  # (A, evaluated nodes - root_known, *shape): the call's outputs
    root_out: torch.Tensor | None = None  # (A, *shape): the known output at the root, when root_known
    cur: torch.Tensor | None = None  # after the walk: the stop node, or the committed leaf
    corrected: torch.Tensor | None = None  # (A,) bool
    end_depth: torch.Tensor | None = None  # (A,) committed steps
    y_new: torch.Tensor | None = None  # (A, *shape): the committed state
    records: list[SegmentRecord] | None = None
    means: LevelMeans | None = None  # the draft's m^p by depth, set up for this round
    depth_steps: torch.Tensor | None = None  # (A, L): the step of each depth's nodes, n + d
    child_scales: torch.Tensor | None = None  # (A, L): s at each depth's nodes' step
    space: Workspace | None = None  # the buffers this round uses
    whole: bool = False  # the round holds every slot of the batch, in order
    chain_verdict: BlockVerdict | None = None  # a tree verifier's on a chain, for the correction and the record
    tree_record: TreeRecord | None = None  # a tree verifier's on any other tree
    end_host: list[int] | None = None  # end_depth and corrected on the host, after the synchronisation
    corrected_host: list[bool] | None = None

    @property
    def count(self) -> int:
        return len(self.slot_list)

    @property
    def tree(self) -> Topology:
        return self.layout.tree

    @property
    def evaluate_leaves(self) -> bool:
        return self.layout.evaluate_leaves

    @property
    def evaluated_depth(self) -> int:
        return self.layout.evaluated_depth

    @property
    def rows(self) -> torch.Tensor:
        """0..A-1 on the device (the workspace's, made once per round size)."""
        return self.space.rows

    @property
    def first_row(self) -> int:
        """The first node evaluated by the call: the root unless its output is known."""
        return int(self.root_known)

    @property
    def call_rows(self) -> int:
        """Target rows per trajectory in the round's call."""
        return self.layout.num_evaluated - self.first_row

    def first_outputs(self, count: int) -> torch.Tensor:
        """Target outputs (A, count, *shape) at nodes 0..count-1 of every row (a view of the call's
        outputs unless the root's output was known before it)."""
        if not self.root_known:
            return self.out[:, :count]
        return torch.cat([self.root_out[:, None], self.out[:, :count - 1]], 1)

    def output_at(self, node: torch.Tensor) -> torch.Tensor:
        """Target outputs (A, *shape) at one node (A,) of every row."""
        if not self.root_known:
            return self.out[self.rows, node]
        return self.outputs_at(node[:, None])[:, 0]

    def at_nodes(self, nodes: torch.Tensor | list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target outputs and states (A, *shape) and steps (A,) at one node of every row, the nodes
        (A,) on the device or a host list. A lone row's are views of the round's buffers, no gather:
        read them before the next round drafts."""
        if isinstance(nodes, list):
            if self.count == 1:
                (v,) = nodes
                out = self.root_out if v == 0 and self.root_known else self.out[:, v - self.first_row]
                return out, self.x[:, v], self.step + self.layout.node_depth_host[v]
            nodes = torch.tensor(nodes).to(self.slots.device, non_blocking=True)
        return self.output_at(nodes), self.x[self.rows, nodes], self.step + self.layout.node_depth[nodes]

    def outputs_at(self, nodes: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Target outputs (R, S, *shape) at nodes (R, S) of rows `rows` (R,) (default: every row)."""
        rows = self.rows if rows is None else rows
        if not self.root_known:
            return self.out[rows[:, None], nodes]
        if not self.call_rows:  # a round that evaluated nothing reads its root's output only
            return self.root_out[rows, None].expand(-1, nodes.shape[1], *self.root_out.shape[1:])
        got = self.out[rows[:, None], (nodes - 1).clamp_min(0)]
        at_root = (nodes == 0).view(*nodes.shape, *[1] * (got.dim() - 2))
        return torch.where(at_root, self.root_out[rows, None], got)


# ---------------------------------------------------------------------------------------------- phases
def draft(state: RoundState, run) -> None:
    """Phase 1: the round's noise and uniforms (one draw each per trajectory), the draft's means set
    up for the round, then every drafted level, level by level: children of node v are m^p(X_v) + s xi."""
    lay, space = state.layout, state.space
    state.noise = run.rng.normal(state.slot_list, space.noise.shape[1:], run.dtype, out=space.noise)
    state.uniforms = run.rng.uniform(state.slot_list, lay.uniform_count, out=space.uniforms)
    state.x, state.mp = space.x, space.mp
    space.x[:, 0] = run.rows_of(run.y, state)
    state.depth_steps = torch.add(state.step[:, None], lay.depths, out=space.depth_steps)
    torch.index_select(run.scales_dtype, 0, space.flat_depth_steps, out=space.flat_child_scales)
    run.kernel.coefficients_into(space.flat_depth_steps, space.coefficients)
    state.child_scales = space.child_scales
    state.means = run.round_means(state)
    if lay.tree.is_chain and state.means.affine is not None:
        _draft_affine_chain(state)
        return
    for d, (parents, means, means_by_child, kids, noise, scale) in enumerate(space.levels):
        state.means(d, parents, out=means)
        torch.addcmul(means_by_child, scale, noise, out=kids)


def _draft_affine_chain(state: RoundState) -> None:
    """A chain whose draft means are affine, m^p_d(x) = alpha_d x + beta_d: the noise folded in first,
    c_d = beta_d + s_d xi_d, then one operation a level, x_{d+1} = alpha_d x_d + c_d, and the means
    m^p at every drafted node in one more (the same law as drafting level by level; the states
    differ by float rounding only). Measured: a third fewer operations for a chain of 9."""
    space = state.space
    alpha, beta = state.means.affine
    a, depth = alpha.shape
    space.alpha.copy_(alpha)
    torch.addcmul(beta, space.child_scales.view(a, depth, *[1] * (beta.dim() - 2)), state.noise, out=space.mp)
    for (parents, c, _, kids, _, _), alpha_d in zip(space.levels, space.alpha_levels):
        torch.addcmul(c, alpha_d, parents, out=kids)
    torch.addcmul(beta, space.alpha.view(a, depth, *[1] * (beta.dim() - 2)), space.x[:, :depth], out=space.mp)


def call_inputs(state: RoundState, run) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 2's rows: (states, steps) of every evaluated node, the root unless known."""
    lay = state.layout
    first, count = state.first_row, lay.num_evaluated
    x = state.x[:, first:count].flatten(0, 1)
    steps = (state.step[:, None] + lay.node_steps[first:count]).flatten()
    return x, steps


def take_outputs(state: RoundState, out: torch.Tensor | None, run) -> None:
    """The call's outputs for this group's rows (None: the group evaluated no node)."""
    state.out = run.y.new_empty((state.count, 0, *run.shape)) if out is None else \
        out.view(state.count, state.call_rows, *run.shape)
    if state.root_known:
        state.root_out = run.rows_of(run.root_out, state)


def walk(state: RoundState, run) -> None:
    """Phase 3: decide from the root down; leaves cur, corrected, end_depth and the committed leaf."""
    if not isinstance(run.verifier, TreeVerifier):
        _walk_nodes(state, run)
    elif state.tree.is_chain:
        _walk_chain(state, run)
    else:
        _walk_tree(state, run)


def _reduce(mq: torch.Tensor, mp: torch.Tensor, scales: torch.Tensor, kids: torch.Tensor) -> RankOne:
    """RankOne.reduce at A * S nodes: mq, mp (A, S, *shape), scales (A, S), kids (A, S, K, *shape),
    flattened once each (views where the buffers allow)."""
    rows = scales.numel()
    return RankOne.reduce(mq.reshape(rows, -1), mp.reshape(rows, -1), scales.reshape(rows),
                          kids.reshape(rows, kids.shape[2], -1))


def _decide_segment(state: RoundState, run, segment: Segment, nodes, kid_index, kids, mp, xv, outv) -> SegmentRecord:
    """Reduce and decide the A * S nodes of a segment: nodes (A, S), their states xv, target outputs
    outv and draft means mp (A, S, *shape), their children kids (A, S, K, *shape)."""
    views = state.space.segment(segment)
    mq = run.kernel.mean_with(views.coefficients, outv, xv)
    red = _reduce(mq, mp, views.scales, kids)  # scales: the s the children were drawn with
    uniforms = views.uniforms.reshape(red.delta.numel(), segment.per_node)  # a copy where other segments' columns sit between rows
    decision = run.verifier.decide(red, uniforms)
    return SegmentRecord(segment, nodes, kid_index, kids, views.scales, red, uniforms, decision)


def _segment_inputs(state: RoundState, run, segment: Segment, start: torch.Tensor):
    """(nodes, kid_index, kids, mp, xv, outv) of a segment below each row's node `start`. A segment
    that starts at the root has the same nodes in every row, contiguous in breadth-first order: views."""
    lay, a, ar = state.layout, state.count, state.rows
    width, s_len = segment.width, segment.levels
    if segment.lazy:  # the children of the reached node, formed now from the round's noise
        nodes = start[:, None]
        kid_index = lay.first_child[nodes][..., None] + torch.arange(width, device=run.device)
        xv = state.x[ar, start][:, None]
        mp = state.means(segment.first, xv)
        xi = state.noise[:, lay.num_drafted_nodes - 1:].unflatten(1, (1, width))
        scale = state.child_scales[:, segment.first].view(-1, 1, 1, *[1] * (xi.dim() - 3))
        kids = torch.addcmul(mp[:, :, None], scale, xi)
        return nodes, kid_index, kids, mp, xv, state.outputs_at(nodes)
    if segment.first == 0:
        return (*state.space.segment(segment).root, state.first_outputs(s_len))
    nodes = lay.segment_nodes(segment, start)
    kid_index = lay.first_child[nodes][..., None] + torch.arange(width, device=run.device)
    return (nodes, kid_index, state.x[ar[:, None, None], kid_index], state.mp[ar[:, None], nodes],
            state.x[ar[:, None], nodes], state.outputs_at(nodes))


def _walk_nodes(state: RoundState, run) -> None:
    lay, a = state.layout, state.count
    ar = state.rows
    state.records = []
    for segment in lay.segments:
        if segment.first == 0:  # every row starts at the root
            start = torch.zeros(a, dtype=torch.long, device=run.device) if segment.lazy else None
        else:  # rows that stopped above walk on from the segment's first node (valid indices, results unused)
            start = torch.where(alive, cur, lay.level_starts[segment.first])
        nodes, kid_index, kids, mp, xv, outv = _segment_inputs(state, run, segment, start)
        record = _decide_segment(state, run, segment, nodes, kid_index, kids, mp, xv, outv)
        state.records.append(record)
        kept = record.decision.kept.view(a, segment.levels)
        lead = (kept >= 0).cumprod(1).sum(1)  # levels kept before the first rejection (S: none rejected)
        held = lead == segment.levels
        stop_depth = lead + (segment.first + 1)
        if segment.first == 0:  # nodes 0..S-1, the last one's children 1 + (S - 1) K onwards
            alive = held
            # one child a node: the walk's node is node `lead`, the last child (node S) where all were kept
            cur = lead if segment.width == 1 else \
                torch.where(alive, kept[:, -1] + (1 + (segment.levels - 1) * segment.width), lead)
            end_depth = torch.where(alive, state.tree.depth, stop_depth)
            continue
        stops = alive & ~held
        stop_node = nodes[ar, lead.clamp_max(segment.levels - 1)]
        passed = kid_index[ar, -1, kept[:, -1].clamp_min(0)]
        cur = torch.where(stops, stop_node, torch.where(alive, passed, cur))
        end_depth = torch.where(stops, stop_depth, end_depth)
        alive &= held
    last = state.records[-1]
    state.cur, state.corrected, state.end_depth = cur, ~alive, end_depth
    # the committed leaf where every level kept a child (corrected rows get their draw later: a copy,
    # not a view of the drafted states, which the commit still reads)
    if last.segment.width == 1:
        state.y_new = last.kids[:, -1, 0].clone()
    else:
        state.y_new = last.kids[ar, -1, last.decision.kept.view(a, -1)[:, -1].clamp_min(0)]


def _walk_chain(state: RoundState, run) -> None:
    """A tree verifier on a chain: delta_i, u_i of every level, weighed at once."""
    depth, a = state.tree.depth, state.count
    segment = Segment(0, depth - 1, 1, False, 0, 0)
    nodes, kid_index = state.layout.root_segment(segment)
    nodes, kid_index = nodes.expand(a, -1), kid_index.expand(a, -1, -1)
    kids = state.x[:, 1:depth + 1, None]
    mq = run.kernel.mean_with(state.space.depth_coefficients, state.first_outputs(depth), state.x[:, :depth])
    scales = state.child_scales  # the s the children were drawn with
    red = _reduce(mq, state.mp[:, :depth], scales, kids)
    verdict = run.verifier.verify_chain(red.delta.view(a, depth), red.u.view(a, depth), None, state.uniforms)
    eta = verdict.eta
    kept = torch.where(nodes < eta[:, None], 0, -1)
    state.chain_verdict = verdict
    decision = Decision(kept=kept.flatten(), child_accept_prob=None, accept_prob=None)  # the record reads the verdict
    state.records = [SegmentRecord(segment, nodes, kid_index, kids, scales, red, state.uniforms, decision)]
    state.cur, state.corrected = eta, eta < depth
    state.end_depth = torch.where(state.corrected, eta + 1, depth)
    state.y_new = state.x[state.rows, eta]  # the leaf where eta = L


def _walk_tree(state: RoundState, run) -> None:
    """A tree verifier on a tree: every node with children reduced against its children at once,
    each node's log rho against its parent gathered, then the whole tree weighed."""
    lay, a = state.layout, state.count
    inner = lay.num_parents
    kids = state.x[:, lay.kid_table]
    depths = lay.node_depth[:inner]
    mq = run.kernel.mean(state.first_outputs(inner), state.x[:, :inner], state.depth_steps[:, depths])
    scales = state.child_scales[:, depths]
    red = _reduce(mq, state.mp[:, :inner], scales, kids)
    delta = red.delta.view(a, inner, 1)
    log_rho = torch.where(delta >= DELTA_FLOOR, delta * red.u.view(a, inner, -1) - 0.5 * delta**2, 0.0)
    log_rho = log_rho.flatten(1)[:, lay.child_column]
    delta = torch.cat([delta[..., 0], delta.new_full((a, lay.tree.num_nodes - inner), float("nan"))], 1)
    root_u = red.u.view(a, inner, -1)[:, 0, :lay.tree.widths[0]]  # the root's children's projections
    walk = run.verifier.weigh_tree(log_rho, delta, state.uniforms, lay.tables, root_u)
    state.tree_record, state.records = TreeRecord(red, kids, scales, walk), []
    state.cur, state.corrected = walk.cur, walk.corrected
    state.end_depth = torch.where(walk.corrected, lay.node_depth[walk.cur] + 1, state.tree.depth)
    state.y_new = state.x[state.rows, walk.cur]  # the committed leaf (corrected rows get their draw later)


def correct(state: RoundState, run) -> None:
    """The corrected draws of the rows whose round a rejection ended (known on the host by now)."""
    ends, corrected = state.end_host, state.corrected_host
    if isinstance(run.verifier, TreeVerifier):
        rows = [i for i, c in enumerate(corrected) if c]
        if rows:
            (_correct_chain if state.tree_record is None else _correct_tree)(state, run, rows)
        return
    for record in state.records:
        seg = record.segment
        hit = [(i, e - 1 - seg.first) for i, (e, c) in enumerate(zip(ends, corrected))
               if c and seg.first <= e - 1 <= seg.last]
        if hit:
            _correct_segment(state, run, record, hit)


def _pick(index: list[int], device: torch.device) -> slice | torch.Tensor:
    """Host indices as a selector of rows: a slice (a view, no gather) for one index, else a tensor."""
    return slice(index[0], index[0] + 1) if len(index) == 1 else torch.tensor(index, device=device)


def _correct_segment(state: RoundState, run, record: SegmentRecord, hit: list[tuple[int, int]]) -> None:
    device = state.slots.device
    rows = _pick([i for i, _ in hit], device)
    flat = _pick([i * record.segment.levels + j for i, j in hit], device)  # the decided node of each row
    red = record.red.select(flat)
    child, u_new = run.verifier.correct(red, record.uniforms[flat], run.rng, state.slots[rows])
    kids = record.kids.flatten(0, 1)[flat]
    if record.segment.width == 1:  # the one child: views, no gather
        kid, u_old = kids[:, 0], red.u[:, 0]
    else:
        sel = torch.arange(len(hit), device=device)
        kid, u_old = kids[sel, child], red.u[sel, child]
    state.y_new[rows] = red.move(kid, u_old, u_new, record.scales.flatten()[flat])


def _correct_chain(state: RoundState, run, rows: list[int]) -> None:
    device = state.slots.device
    depth, verdict, record = state.tree.depth, state.chain_verdict, state.records[0]
    r = _pick(rows, device)
    eta = [state.end_host[i] - 1 for i in rows]  # the first rejection
    flat = _pick([i * depth + e for i, e in zip(rows, eta)], device)
    red = record.red.select(flat)
    log_p = verdict.log_p.flatten()[_pick([i * (depth + 1) + e for i, e in zip(rows, eta)], device)]
    u_new = run.verifier.residual(red.delta, -log_p, state.uniforms[r, -1])  # lambda = 1 / p_eta
    state.y_new[r] = red.move(record.kids.flatten(0, 1)[flat, 0], red.u[:, 0], u_new, record.scales.flatten()[flat])


def _correct_tree(state: RoundState, run, rows: list[int]) -> None:
    """The draw from R_lambda at the node each row stopped at, keeping z_perp of its first child; at
    a root whose child was selected by rank, the draw from (phi - g)_+ keeping the selected child's."""
    record, inner = state.tree_record, state.layout.num_parents
    if record.walk.selected is not None:
        at_root = [i for i in rows if state.end_host[i] == 1]
        if at_root:
            _correct_root(state, run, at_root)
        rows = [i for i in rows if state.end_host[i] != 1]
        if not rows:
            return
    r = torch.tensor(rows, device=state.slots.device)
    flat = r * inner + record.walk.cur[r]
    red = record.red.select(flat)
    u_new = run.verifier.residual(red.delta, record.walk.log_lam[r], state.uniforms[r, state.tree.num_nodes])
    state.y_new[r] = red.move(record.kids.flatten(0, 1)[flat, 0], red.u[:, 0], u_new, record.scales.flatten()[flat])


def _correct_root(state: RoundState, run, rows: list[int]) -> None:
    record, inner = state.tree_record, state.layout.num_parents
    r = torch.tensor(rows, device=state.slots.device)
    flat = r * inner
    red, chosen = record.red.select(flat), record.walk.selected.child[r]
    proposals = state.uniforms[r, state.tree.num_nodes + 1:]
    u_new = run.verifier.root_residual(red.delta, record.walk.selected.log_w[r], proposals, run.rng, state.slots[r])
    sel = torch.arange(len(rows), device=r.device)
    state.y_new[r] = red.move(record.kids.flatten(0, 1)[flat, chosen], red.u[sel, chosen], u_new,
                              record.scales.flatten()[flat])


def commit(state: RoundState, run) -> None:
    """Phase 4: the new states, the frozen output that starts each trajectory's next round, and
    the target output at a committed leaf whose row was evaluated (the next root's, known)."""
    run.set_rows(run.y, state, state.y_new)
    if run.prefetch is None:  # a draft that keeps no target output
        return
    source = run.prefetch.source(state)
    if source is None:
        run.has_frozen[state.slot_array] = False
    else:
        history = {}
        if run.draft.frozen_history:  # the output one node above (the root's own at the root), the value held
            above = state.layout.parent[source if isinstance(source, torch.Tensor) else
                                        torch.tensor(source).to(state.slots.device, non_blocking=True)]
            history = {"previous": run.rows_of(run.frozen, state), "earlier": state.at_nodes(above)}
        run.frozen_value(state, *state.at_nodes(source), **history)
        run.has_frozen[state.slot_array] = True
    if state.evaluate_leaves:
        kept = [i for i, c in enumerate(state.corrected_host) if not c]
        if kept:  # the committed leaf was evaluated: its output is the next root's, known
            leaf_out = state.output_at(state.cur)
            rows = _pick(kept, state.slots.device) if len(kept) < state.count else slice(None)
            run.root_out[state.slots[rows]] = leaf_out[rows]
            run.root_known[[state.slot_list[i] for i in kept]] = True
