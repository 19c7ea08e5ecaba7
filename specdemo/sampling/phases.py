"""One round of the trajectories that share a topology, as phases over a typed RoundState
(algorithms.md section 4): draft, the rows of the batched target call, walk, correct, commit.

Every trajectory of a RoundState has the same (truncated) tree, the same leaf evaluation and the
same root state (output known or not), so each phase is a few tensor operations over all of them.

Walk. A node verifier decides the path nodes of several levels at once (`Segment`): a run of levels
of width 1 is decided in one call, since its path below the run's first node is known before
anything is verified, and the walk stops at its first rejection; a level of width > 1 is decided
at the node the walk has reached. Deciding nodes past a rejection uses uniforms that nothing else
reads, so it changes no law. A chain verifier weighs the whole chain in one call. Corrections are
drawn once the driver knows which rows need one (after the round's one host synchronisation).

Lazy leaves. An unevaluated last level of a tree (widths > 1 above it) is drawn only at the node the
walk reaches: the K children of a node are i.i.d. given it, so forming them there from normals drawn
with the round's noise changes no law, and saves drafting the (K - 1) / K of the tree never seen.
Chains and evaluated leaves are drafted before the target call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..trees import Topology
from ..verifiers import ChainVerifier, Decision, NodeVerifier, RankOne


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


class Layout:
    """A topology's index tensors on the device, and how a walk of it is laid out."""

    def __init__(self, tree: Topology, evaluate_leaves: bool, verifier, device: torch.device):
        self.tree, self.evaluate_leaves = tree, evaluate_leaves
        depth = tree.depth
        self.lazy = not evaluate_leaves and not tree.is_chain
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
        widths = torch.tensor((*tree.widths, 0), dtype=torch.long)
        self.num_children = widths[tree.node_depth].to(device)
        self.max_width = max(tree.widths)
        self.ancestors = _ancestors(tree).to(device)
        self.node_steps = tree.node_depth[:self.num_evaluated].to(device)  # each evaluated node's step offset
        if isinstance(verifier, ChainVerifier):
            self.segments = ()
            self.uniform_count = verifier.uniforms_per_chain(depth)
        else:
            self.segments = _segments(tree, self.lazy, verifier)
            self.uniform_count = sum(s.levels * s.per_node for s in self.segments)
        self.noise_count = self.num_drafted_nodes - 1 + self.lazy_width
        self._run_nodes = {s: torch.tensor(starts[s.first:s.last + 1], device=device) - starts[s.first]
                           for s in self.segments if s.levels > 1}

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
class RoundState:
    """A round of A trajectories sharing a layout (slots: their batch slots; step: n at the root)."""

    layout: Layout
    slots: torch.Tensor
    slot_list: list[int]
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
    eta: torch.Tensor | None = None  # chain verifiers: the verdict, for the correction
    log_p: torch.Tensor | None = None
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

    @cached_property
    def rows(self) -> torch.Tensor:
        return torch.arange(self.count, device=self.slots.device)

    @property
    def first_row(self) -> int:
        """The first node evaluated by the call: the root unless its output is known."""
        return int(self.root_known)

    @property
    def call_rows(self) -> int:
        """Target rows per trajectory in the round's call."""
        return self.layout.num_evaluated - self.first_row

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
    """Phase 1: the round's noise and uniforms (one draw each per trajectory), then every drafted
    level, level by level: children of node v are m^p(X_v) + s xi."""
    lay, tree, shape = state.layout, state.tree, run.shape
    a = state.count
    state.noise = run.rng.normal(state.slot_list, (lay.noise_count, *shape), run.dtype)
    state.uniforms = run.rng.uniform(state.slot_list, lay.uniform_count)
    state.x = x = torch.empty((a, lay.num_drafted_nodes, *shape), device=run.device, dtype=run.dtype)
    x[:, 0] = run.y[state.slots]
    state.mp = torch.empty((a, max(lay.num_parents, 1), *shape), device=run.device, dtype=run.dtype)
    drafted_levels = tree.depth - 1 if lay.lazy else tree.depth
    starts = tree.level_starts
    for level in range(1, drafted_levels + 1):
        lo, hi, width = starts[level - 1], starts[level], tree.widths[level - 1]
        step = state.step + (level - 1)
        means = run.draft_means(x[:, lo:hi], step, state.slots)
        state.mp[:, lo:hi] = means
        kids = x[:, starts[level]:starts[level + 1]].unflatten(1, (hi - lo, width))
        noise = state.noise[:, starts[level] - 1:starts[level + 1] - 1].unflatten(1, (hi - lo, width))
        torch.addcmul(means[:, :, None], run.scale(step, kids), noise, out=kids)


def call_inputs(state: RoundState, run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phase 2's rows: (states, steps, slots) of every evaluated node, the root unless known."""
    lay = state.layout
    first, count = state.first_row, lay.num_evaluated
    x = state.x[:, first:count].flatten(0, 1)
    steps = (state.step[:, None] + lay.node_steps[first:count]).flatten()
    return x, steps, state.slots.repeat_interleave(count - first)


def take_outputs(state: RoundState, out: torch.Tensor | None, run) -> None:
    """The call's outputs for this group's rows (None: the group evaluated no node)."""
    state.out = run.y.new_empty((state.count, 0, *run.shape)) if out is None else \
        out.view(state.count, state.call_rows, *run.shape)
    if state.root_known:
        state.root_out = run.root_out[state.slots]


def walk(state: RoundState, run) -> None:
    """Phase 3: decide from the root down; leaves cur, corrected, end_depth and the committed leaf."""
    if isinstance(run.verifier, ChainVerifier):
        _walk_chain(state, run)
    else:
        _walk_nodes(state, run)


def _decide_segment(state: RoundState, run, segment: Segment, nodes: torch.Tensor, kid_index, kids, mp):
    """Reduce and decide the A * S nodes of a segment (nodes (A, S), their children (A, S, K, *shape))."""
    a, s_len = nodes.shape
    ar = state.rows[:, None]
    steps = state.step[:, None] + torch.arange(segment.first, segment.last + 1, device=nodes.device)
    mq = run.kernel.mean(state.outputs_at(nodes), state.x[ar, nodes], steps)
    scales = run.scales[steps]
    red = RankOne.reduce(mq.flatten(0, 1), mp.flatten(0, 1), scales.flatten(), kids.flatten(0, 1))
    lo = segment.uniform_offset
    uniforms = state.uniforms[:, lo:lo + s_len * segment.per_node].reshape(a * s_len, segment.per_node)
    decision = run.verifier.decide(red, uniforms)
    return SegmentRecord(segment, nodes, kid_index, kids, scales, red, uniforms, decision)


def _walk_nodes(state: RoundState, run) -> None:
    lay, a = state.layout, state.count
    ar = state.rows
    cur = torch.zeros(a, dtype=torch.long, device=run.device)
    alive = torch.ones(a, dtype=torch.bool, device=run.device)
    end_depth = torch.full((a,), state.tree.depth, dtype=torch.long, device=run.device)
    state.records = []
    for segment in lay.segments:
        # rows that stopped above walk on from the segment's first node (valid indices, results unused)
        start = torch.where(alive, cur, lay.level_starts[segment.first])
        nodes = lay.segment_nodes(segment, start)
        width = segment.width
        kid_index = lay.first_child[nodes][..., None] + torch.arange(width, device=run.device)
        if segment.lazy:  # the children of the reached node, formed now from the round's noise
            mp = run.draft_means(state.x[ar, start][:, None], state.step + segment.first, state.slots)
            xi = state.noise[:, lay.num_drafted_nodes - 1:].unflatten(1, (1, width))
            kids = torch.addcmul(mp[:, :, None], run.scale(state.step + segment.first, xi), xi)
        else:
            mp = state.mp[ar[:, None], nodes]
            kids = state.x[ar[:, None, None], kid_index]
        record = _decide_segment(state, run, segment, nodes, kid_index, kids, mp)
        state.records.append(record)
        kept = record.decision.kept.view(a, segment.levels)
        rejected = kept < 0
        stops = alive & rejected.any(1)
        first_rejection = rejected.int().argmax(1)
        passed = kid_index[ar, -1, kept[:, -1].clamp_min(0)]
        cur = torch.where(stops, nodes[ar, first_rejection], torch.where(alive, passed, cur))
        end_depth = torch.where(stops, segment.first + first_rejection + 1, end_depth)
        alive &= ~stops
    last = state.records[-1]
    state.cur, state.corrected, state.end_depth = cur, ~alive, end_depth
    # the committed leaf where every level kept a child (corrected rows get their draw later)
    state.y_new = last.kids[ar, -1, last.decision.kept.view(a, -1)[:, -1].clamp_min(0)]


def _walk_chain(state: RoundState, run) -> None:
    """A chain verifier: delta_i, u_i of every level, weighed at once."""
    depth, a = state.tree.depth, state.count
    nodes = torch.arange(depth, device=run.device).expand(a, depth)
    kids = state.x[:, 1:depth + 1, None]
    segment = Segment(0, depth - 1, 1, False, 0, 0)
    mq = run.kernel.mean(state.outputs_at(nodes), state.x[:, :depth], state.step[:, None] + nodes)
    scales = run.scales[state.step[:, None] + nodes]
    red = RankOne.reduce(mq.flatten(0, 1), state.mp[:, :depth].flatten(0, 1), scales.flatten(), kids.flatten(0, 1))
    full = torch.full((a,), depth, dtype=torch.long, device=run.device)
    verdict = run.verifier.verify_chain(red.delta.view(a, depth), red.u.view(a, depth), full, state.uniforms)
    eta = verdict.eta
    kept = torch.where(nodes < eta[:, None], 0, -1)
    prob = verdict.accept_prob.flatten()
    decision = Decision(kept=kept.flatten(), child_accept_prob=prob[:, None], accept_prob=prob)
    state.records = [SegmentRecord(segment, nodes, nodes[..., None] + 1, kids, scales, red, state.uniforms, decision)]
    state.eta, state.log_p = eta, verdict.log_p
    state.cur, state.corrected = eta, eta < depth
    state.end_depth = torch.where(state.corrected, eta + 1, depth)
    state.y_new = state.x[state.rows, eta]  # the leaf where eta = L


def correct(state: RoundState, run) -> None:
    """The corrected draws of the rows whose round a rejection ended (known on the host by now)."""
    ends, corrected = state.end_host, state.corrected_host
    if isinstance(run.verifier, ChainVerifier):
        rows = [i for i, c in enumerate(corrected) if c]
        if rows:
            _correct_chain(state, run, rows)
        return
    for record in state.records:
        seg = record.segment
        hit = [(i, e - 1 - seg.first) for i, (e, c) in enumerate(zip(ends, corrected))
               if c and seg.first <= e - 1 <= seg.last]
        if hit:
            _correct_segment(state, run, record, hit)


def _correct_segment(state: RoundState, run, record: SegmentRecord, hit: list[tuple[int, int]]) -> None:
    device = state.slots.device
    rows = torch.tensor([i for i, _ in hit], device=device)
    flat = rows * record.segment.levels + torch.tensor([j for _, j in hit], device=device)
    red = record.red.select(flat)
    child, u_new = run.verifier.correct(red, record.uniforms[flat], run.rng, state.slots[rows])
    sel = torch.arange(len(hit), device=device)
    kids = record.kids.flatten(0, 1)[flat]
    state.y_new[rows] = red.move(kids[sel, child], red.u[sel, child], u_new, record.scales.flatten()[flat])


def _correct_chain(state: RoundState, run, rows: list[int]) -> None:
    device = state.slots.device
    r = torch.tensor(rows, device=device)
    eta = state.eta[r]
    record = state.records[0]
    depth = state.tree.depth
    flat = r * depth + eta
    red = record.red.select(flat)
    u_new = run.verifier.residual(red.delta, state.log_p[r, eta], state.uniforms[r, -1])
    state.y_new[r] = red.move(record.kids.flatten(0, 1)[flat, 0], red.u[:, 0], u_new, record.scales.flatten()[flat])


def commit(state: RoundState, run) -> None:
    """Phase 4: the new states, the frozen output that starts each trajectory's next round, and
    the target output at a committed leaf whose row was evaluated (the next root's, known)."""
    run.y[state.slots] = state.y_new
    if run.prefetch is None:  # a draft that keeps no target output
        return
    source = run.prefetch.source(state)
    if source is None:
        run.has_frozen[state.slot_list] = False
    else:
        out = state.outputs_at(source[:, None])[:, 0]
        x = state.x[state.rows, source]
        run.frozen[state.slots] = run.draft.frozen_value(run.kernel, out, x, state.step + state.layout.node_depth[source])
        run.has_frozen[state.slot_list] = True
    if state.evaluate_leaves:
        kept = [i for i, c in enumerate(state.corrected_host) if not c]
        if kept:
            rows = torch.tensor(kept, device=state.slots.device)
            run.root_out[state.slots[rows]] = state.outputs_at(state.cur[rows, None], rows)[:, 0]
            run.root_known[[state.slot_list[i] for i in kept]] = True
