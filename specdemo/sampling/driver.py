"""The one batched driver: plain target sampling, chains and trees (algorithms.md section 4).

A batch of B slots moves in rounds; each slot holds one trajectory at a time. In a round each
trajectory at step n with r stochastic steps ahead speculates to depth L_b = min(L, r) with its own
tree T (its plan's tree at n, cut at the horizon); L = 0 is plain sampling, and a deterministic step
is a round of depth 0. Every round is one pass over every slot, whatever each one does:

  1. draft (round.py): the trees that speculate are grouped into parts of trees cut from one another
     (union.py); each part drafts its deepest tree for every slot, each trajectory drawing the noise of
     its own tree only, so its draws and arithmetic do not depend on the batch;
  2. one batched target call over each trajectory's evaluated nodes (the root unless its output is
     known; leaves where its plan evaluates them) and the roots of plain or deterministic steps;
  3. reduce (round.py): the target's mean at every parent and the inner products of each parent's
     children, read by the host in the round's one host synchronisation, with the call's finiteness;
  4. walk, on the host: each trajectory's verifier decides its own tree (Verifier.walk) from delta, u
     and uniforms drawn for the round, and the prefetch policy picks the output frozen next;
  5. commit: new states (the kept leaf, or a child moved along e to the corrected draw), frozen values and
     known root outputs, as the host wrote them into each part's mailbox (a few gathers and one update).

A trajectory without a frozen output (before its first speculative round, or every round under
prefetch "none") spends a round on a warm-up: its root alone is evaluated, in the round's batched
call, and it speculates from that exact output the round after. This is the draft-tree authors'
warm-up call (started warm, a deterministic step's output is not reused as a frozen output either),
placed so that trajectories starting at different times (continuous batching) add no sequential call.
A draft that can draft without a target output (Draft.cold_start: a draft network, or the frozen draft
started cold) drafts a trajectory's first round from its cold value instead, and saves the call; the
frozen draft started cold also keeps the output of every plain or deterministic step, and a trajectory
that took one before its first speculative round drafts that round from it.

A frozen value is always kept from the output of the node that starts the next round when that
output is known (a kept, evaluated leaf; a warm-up), so a draft that is exact at a known root
(Draft.exact_at_known_root) has delta = 0 there by construction: the host takes it so, computes nothing.

The batch's bookkeeping (each slot's step, root state, calls and rows) lives on the host, so that
choosing the next round's trees needs no device round trip.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from ..drafts import Draft
from ..drafts.base import FrozenHistory
from ..errors import SpecdemoError
from ..kernels import Kernel
from ..limits import Cancel
from ..trees import Topology, TopologyPlan
from ..trees.tables import tables
from ..verifiers import Verifier, Walk
from . import round as device
from .cost import Cost, PhaseClock
from .layout import Mailbox, Workspace, layout_for
from .padding import call_size
from .prefetch import PREFETCH, NearestSibling, Prefetch
from .record import RoundTrace, round_trace
from .rng import TrajectoryRandom
from .union import parts_of

MEMORY_LIMIT_BYTES = 8 * 2**30
WORKSPACES = 32  # round buffers a run keeps, the least recently used dropped (a plan can use many layouts)
POOL_BYTES = 64 * 2**20  # round buffers the process keeps for later runs (WorkspacePool)
TINY = np.finfo(np.float64).tiny


@dataclass
class SampleResult:
    """samples (B, *shape) on the run's device; states: {step: (B, *shape)} for the steps asked for
    in keep_steps; trace: one RoundTrace per round and topology when asked for."""

    samples: torch.Tensor
    cost: Cost
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    trace: list[RoundTrace] | None = None


def method_name(tree: Topology | TopologyPlan) -> str:
    if not tree.max_depth:
        return "target"
    return "chain" if all(t.is_chain for t in tree.topologies) else "tree"


def check_run(
    kernel: Kernel,
    tree: Topology | TopologyPlan,
    draft: Draft | None,
    verifier: Verifier | None,
    shape: Sequence[int],
    num_samples: int,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Refuse a run that cannot work, with the reason and what is accepted."""
    if num_samples < 1:
        raise SpecdemoError(f"the number of samples must be >= 1, got {num_samples}")
    if tree.max_depth:
        if draft is None or verifier is None:
            raise SpecdemoError("speculative sampling needs a draft and a verifier")
        draft.check(kernel)
        widest = max(max(t.widths, default=1) for t in tree.topologies)
        if verifier.max_children is not None and widest > verifier.max_children:
            raise SpecdemoError(
                f"the {verifier.name} verifier takes one child per node (chains only); tree {tree} has up to "
                f"{widest}: use a chain such as 1x{tree.max_depth}, or the dgrs, rank or block verifier"
            )
    size = int(np.prod(shape))
    nodes = max(t.num_nodes for t in tree.topologies)
    need = 8 * dtype.itemsize * size * num_samples * nodes  # a few buffers of every node, one of them float64
    if need > MEMORY_LIMIT_BYTES:
        raise SpecdemoError(
            f"{num_samples} samples with tree {tree} ({nodes} nodes of {size} values) need about "
            f"{need / 2**30:.1f} GiB, over the {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB limit; use fewer samples or a smaller tree"
        )


class WorkspacePool:
    """Round buffers kept between the runs of a process, so that a run of layouts seen before allocates
    none: a run takes workspaces out and puts them back when it ends (runs in other threads never
    share one), the least recently returned dropped past `limit_bytes`."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._free: dict[tuple, list[Workspace | CallBox]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, key: tuple) -> Workspace | CallBox | None:
        with self._lock:
            spaces = self._free.get(key)
            if not spaces:
                return None
            space = spaces.pop()
            if not spaces:
                del self._free[key]
            self._bytes -= space.nbytes
            return space

    def put(self, key: tuple, space: Workspace | CallBox) -> None:
        with self._lock:
            if space.nbytes > self.limit_bytes:
                return
            self._free.setdefault(key, []).append(space)
            self._free[key] = self._free.pop(key)  # the most recently returned last
            self._bytes += space.nbytes
            while self._bytes > self.limit_bytes:
                oldest = next(iter(self._free))
                self._bytes -= self._free[oldest].pop(0).nbytes
                if not self._free[oldest]:
                    del self._free[oldest]


POOL = WorkspacePool(POOL_BYTES)


class Schedule:
    """For every step n, root state k (its output known or not) and cut c: the tree a round rooted there
    uses (an index into `trees`: its plan's tree cut at the stochastic horizon, and under a plan's reach
    rule at c + 1 target rows) with whether its leaves are evaluated, its depth, and whether its call has
    a row at a stochastic step. A plan without a rule has one cut, c = 0, that cuts nothing."""

    def __init__(self, tree: Topology | TopologyPlan, kernel: Kernel, leaf_table: np.ndarray) -> None:
        n_steps = kernel.num_steps
        steps = np.arange(n_steps)
        self.rule = tree.rule if isinstance(tree, TopologyPlan) else None
        planned = np.empty((n_steps, 2), dtype=object)
        for n in range(n_steps):
            for k in (0, 1):
                planned[n, k] = tree.at(n, bool(k))
        full_depth = np.vectorize(lambda t: t.depth, otypes=[np.int64])(planned)
        horizon = np.minimum(full_depth, kernel.stochastic_run_lengths().numpy()[:n_steps, None])
        # a chain of r target rows has r levels, r + 1 where the root's output is known (it costs no row)
        if self.rule is not None:
            assert isinstance(tree, TopologyPlan)  # a rule is a plan's
            rows = np.arange(1, max(t.depth for t in tree.trees) + 1)  # the chains of a root not known
        else:
            rows = np.array([tree.max_depth])
        self.depth = np.minimum(horizon[..., None], rows[None, None, :] + np.arange(2)[None, :, None])
        ends = steps[:, None, None] + self.depth
        # a leaf at step N is the sample itself: there is no step N for the network to evaluate
        self.leaves = leaf_table[..., None] & (self.depth > 0) & (ends < n_steps)
        # the trees, one per (planned tree, depth, leaves)
        distinct = list(dict.fromkeys(planned.ravel().tolist()))
        planned_id = np.vectorize({t: i for i, t in enumerate(distinct)}.__getitem__, otypes=[np.int64])(planned)
        levels = int(self.depth.max()) + 1
        keys = (planned_id[..., None] * levels + self.depth) * 2 + self.leaves
        speculating = self.depth > 0
        cells, first = np.unique(keys[speculating], return_inverse=True)
        self.trees: list[tuple[Topology, bool]] = []  # (tree cut at the horizon, leaves evaluated)
        index: dict[tuple[Topology, bool], int] = {}
        ids = np.empty(len(cells), dtype=np.int64)
        for i, cell in enumerate(cells.tolist()):
            (p, depth), leaves = divmod(cell // 2, levels), cell % 2
            key = (cut(distinct[p], depth), bool(leaves))
            ids[i] = index.setdefault(key, len(self.trees))
            if ids[i] == len(self.trees):
                self.trees.append(key)
        self.tree_id = np.full(self.depth.shape, -1, dtype=np.int64)
        self.tree_id[speculating] = ids[first.ravel()]
        # whether a round's call has a row at a stochastic step: its rows are at depths k (the root,
        # unless its output is known) to the last evaluated one; a call of deterministic-step rows only
        # (leaves at the last step under flow matching) serves that step as plain sampling's own call
        # does, and is counted on neither side of the speedup
        stochastic = np.cumsum(np.append(0, kernel.scales.numpy() > 0))  # stochastic steps before each step
        start = np.broadcast_to(steps[:, None, None] + np.arange(2)[None, :, None], self.depth.shape)
        last = ends - (~self.leaves).astype(np.int64)  # the last evaluated row's step
        self.stochastic_rows = stochastic[np.clip(last + 1, 0, n_steps)] > stochastic[np.minimum(start, n_steps)]

    def cuts(self, accepted: np.ndarray, examined: np.ndarray) -> np.ndarray:
        """Each trajectory's cut c, from the levels it accepted and examined in its rounds so far."""
        if self.rule is None:
            return np.zeros(accepted.shape, dtype=np.int64)
        return self.rule.rows(accepted, examined, self.depth.shape[2]) - 1


def cut(tree: Topology, depth: int) -> Topology:
    """The topology of its first `depth` levels."""
    return tree if depth == tree.depth else Topology(tree.widths[:depth])


class _Batch:
    """The state of the batch between rounds, and one round.

    When a trajectory reaches step N its sample is stored and the slot takes the next trajectory
    (continuous batching), so the batch stays full until the queue runs dry. Per-slot state is indexed
    by slot (tensors on the device for states, numpy arrays on the host for steps and flags); costs,
    samples and kept states by trajectory position (0..B-1).
    """

    def __init__(  # noqa: PLR0915 (issue 56 splits it)
        self,
        network: Callable[..., torch.Tensor],
        kernel: Kernel,
        shape: Sequence[int],
        num_samples: int,
        tree: Topology | TopologyPlan,
        draft: Draft | None,
        verifier: Verifier | None,
        prefetch: Prefetch,
        seed: int,
        indices: Sequence[int] | None,
        cond: dict[str, torch.Tensor] | None,
        device: torch.device | str,
        dtype: torch.dtype,
        keep_steps: Sequence[int],
        trace: bool,
        trace_states: bool,
        trace_outputs: bool,
        trace_only: Sequence[int] | None,
        max_batch: int | None,
    ) -> None:
        self.network, self.kernel, self.shape = network, kernel, tuple(shape)
        self.draft, self.verifier = draft, verifier  # None in a plain run alone (check_run), which reads neither
        self.device, self.dtype = torch.device(device), dtype
        self.indices = list(range(num_samples)) if indices is None else list(indices)
        if len(self.indices) != num_samples:
            raise SpecdemoError(f"{len(self.indices)} trajectory indices for {num_samples} samples")
        self.cond = {k: v.to(self.device) for k, v in (cond or {}).items()}
        for k, v in self.cond.items():
            if v.shape[0] != num_samples:
                raise SpecdemoError(f"conditioning {k!r} has {v.shape[0]} rows for {num_samples} samples")
        self.num_steps = kernel.num_steps
        self.scales_host = kernel.scales.numpy()
        self.values = int(np.prod(self.shape))
        self.uses_frozen = tree.max_depth > 0 and draft is not None and draft.uses_frozen
        self.prefetch = prefetch if self.uses_frozen else None
        leaf_table = (
            prefetch.leaf_table(tree, self.num_steps) if self.uses_frozen else np.zeros((self.num_steps, 2), bool)
        )
        self.schedule = Schedule(tree, kernel, leaf_table)
        self.exact_known = tree.max_depth > 0 and draft is not None and draft.exact_at_known_root
        self._spaces: dict[Topology, Workspace] = {}
        self._calls: dict[int, CallBox] = {}

        b = num_samples
        slots = min(max_batch or b, b)
        self.slots = slots
        self.rng = TrajectoryRandom(seed, slots, self.device)
        self.samples = torch.empty((b, *self.shape), device=self.device, dtype=dtype)
        self.y = torch.zeros((slots, *self.shape), device=self.device, dtype=dtype)
        self.y_flat = self.y.view(slots, self.values)
        self.frozen = (
            torch.zeros((slots, *draft.frozen_shape(self.shape)), device=self.device, dtype=dtype)
            if self.uses_frozen and draft is not None
            else None
        )
        # an output form's frozen output against the levels' (B, E): (1, A, 1, D); and as rows (A, D)
        self.frozen_levels = (
            self.frozen.view(1, slots, 1, -1)
            if self.frozen is not None and draft is not None and draft.frozen_is_output
            else None
        )
        self.frozen_rows = (
            self.frozen.view(slots, -1) if self.frozen is not None and self.frozen_levels is not None else None
        )
        self.root_out = torch.zeros_like(self.y_flat)  # the exact target output at y, where root_known
        # host state per slot
        self.slot_traj = np.full(slots, -1, dtype=np.int64)  # -1: empty
        self.n = np.full(slots, self.num_steps, dtype=np.int64)
        self.has_frozen = np.zeros(slots, dtype=bool)
        self.fresh = np.zeros(slots, dtype=bool)  # a trajectory that has had no speculative round yet
        self.root_known = np.zeros(slots, dtype=bool)
        # the levels each trajectory's rounds examined and accepted (a reach rule cuts its chains by them),
        # and the cut of its round (Schedule.cuts)
        self.examined = np.zeros(slots, dtype=np.int64)
        self.accepted = np.zeros(slots, dtype=np.int64)
        self.cut = np.zeros(slots, dtype=np.int64)
        self.slot_traj_device = torch.full((slots,), -1, dtype=torch.long, device=self.device)
        self.next_traj = 0
        self.calls = np.zeros(b, dtype=np.int64)
        self.counted = np.zeros(b, dtype=np.int64)
        self.rows_used = np.zeros(b, dtype=np.int64)
        top = tree.max_depth
        self.round_ends: list[np.ndarray] = []  # every speculative round's committed steps, per trajectory
        self.round_kept: list[np.ndarray] = []  # and its kept drafted nodes
        self.cost = Cost(
            method=method_name(tree),
            steps=self.num_steps,
            stochastic_steps=int((kernel.scales > 0).sum()),
            calls_per_trajectory=self.calls,
            counted_calls=self.counted,
            rows_per_trajectory=self.rows_used,
            examined_per_depth=[0] * top,
            accepted_per_depth=[0] * top,
        )
        self.clock = PhaseClock(self.device)
        self.keep = np.unique(np.asarray(list(keep_steps), dtype=np.int64))  # sorted, once: read every round
        self.states: dict[int, torch.Tensor] = {}
        self.trace: list[RoundTrace] | None = [] if trace else None
        self.trace_states, self.trace_outputs = trace_states, trace_outputs
        self.trace_only = None if trace_only is None else np.asarray(trace_only, dtype=np.int64)
        self.refill(list(range(slots)))

    # ---------------------------------------------------------------- buffers
    def workspace(self, tree: Topology) -> Workspace:
        """The run's buffers for rounds of this (union) tree: the run's own, or the process's from an
        earlier run, or new."""
        space = (
            self._spaces.pop(tree, None)
            or cast("Workspace | None", POOL.take(self.pool_key(tree)))
            or Workspace(layout_for(tree, self.device), self.slots, self.shape, self.device, self.dtype)
        )
        self._spaces[tree] = space  # the most recently used last
        if len(self._spaces) > WORKSPACES:
            oldest = next(iter(self._spaces))
            POOL.put(self.pool_key(oldest), self._spaces.pop(oldest))
        return space

    def pool_key(self, tree: Topology) -> tuple:
        return tree, self.slots, self.shape, self.device, self.dtype

    def release(self) -> None:
        """The run is over: its buffers go to the process's pool for the next run."""
        for tree, space in self._spaces.items():
            POOL.put(self.pool_key(tree), space)
        for size, box in self._calls.items():
            POOL.put(self.call_key(size), box)
        self._spaces, self._calls = {}, {}

    def slot_tensor(self, values: Sequence[int] | np.ndarray) -> torch.Tensor:
        """Host integers as a long tensor on the run's device (a copy: the host arrays change)."""
        t = torch.from_numpy(np.array(values, dtype=np.int64))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def cond_of(self, slots: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The conditioning of the trajectories in `slots` (default: every slot), row by row."""
        rows = self.slot_traj_device if slots is None else self.slot_traj_device[slots]
        return {k: v[rows.clamp_min(0)] for k, v in self.cond.items()} if self.cond else {}

    # ---------------------------------------------------------------- the batch's slots
    def refill(self, slots: list[int]) -> None:
        """Finished slots hand their sample over and take the next trajectories of the queue."""
        done = [s for s in slots if self.slot_traj[s] >= 0]
        if done:
            self.samples[self.slot_tensor(self.slot_traj[done])] = self.y[self.slot_tensor(done)]
        for slot in slots:
            self.slot_traj[slot] = -1
            if self.next_traj == len(self.indices):
                continue
            g = self.rng.assign(slot, self.indices[self.next_traj])
            self.y[slot] = self.kernel.prior(self.shape, g, self.device, self.dtype)
            self.slot_traj[slot] = self.next_traj
            self.next_traj += 1
            self.n[slot], self.has_frozen[slot], self.root_known[slot], self.fresh[slot] = 0, False, False, True
            self.examined[slot] = self.accepted[slot] = 0
            self.keep_state([slot], [0], self.y[slot : slot + 1])
        self.slot_traj_device.copy_(torch.from_numpy(self.slot_traj))

    def keep_state(
        self, slots: Sequence[int] | np.ndarray, steps: Sequence[int] | np.ndarray, values: torch.Tensor
    ) -> None:
        """values (len(slots), *shape): the states of those slots' trajectories at those steps (one write per
        kept step among them)."""
        steps_of = np.asarray(steps)
        trajectories = self.slot_traj[np.asarray(slots, dtype=np.int64)]
        for step in np.intersect1d(steps_of, self.keep).tolist():
            rows = np.flatnonzero(steps_of == step)
            store = self.states.setdefault(step, torch.full_like(self.samples, float("nan")))
            store[self.slot_tensor(trajectories[rows])] = values[self.slot_tensor(rows)]

    def start_cold(self, slots: np.ndarray) -> None:
        """Trajectories in their first speculative round take the draft's cold value (Draft.cold_value)
        instead of a warm-up call."""
        assert self.draft is not None  # cold starts are of drafts that use frozen values
        rows = self.slot_tensor(slots)
        value, calls = self.draft.cold_value(
            self.kernel, self.y[rows], self.slot_tensor(self.n[slots]), self.cond_of(rows)
        )
        assert self.frozen is not None  # cold starts are of drafts that use frozen values
        self.frozen[rows] = value
        self.cost.draft_calls += calls
        self.has_frozen[slots], self.fresh[slots] = True, False

    # ---------------------------------------------------------------- one round
    def round(self, check: Callable[[], None] | None = None) -> bool:  # noqa: C901 (issue 56 splits it)
        """One round of every live trajectory; False when none is left. `check` (a cancel's) is called between
        its phases too: a round of a large batch can take a second."""
        live = np.flatnonzero((self.slot_traj >= 0) & (self.n < self.num_steps))
        if not live.size:
            return False
        sched = self.schedule
        n, known = self.n[live], self.root_known[live]
        if self.trace is not None:
            self.root_known_before = self.root_known.copy()
        self.cut[live] = sched.cuts(self.accepted[live], self.examined[live])
        cell = (n, known.view(np.uint8), self.cut[live])
        depth = sched.depth[cell]
        speculate = depth > 0
        warm = np.zeros_like(speculate)
        if self.uses_frozen:
            warm = speculate & ~(self.has_frozen[live] | known)
            assert self.draft is not None  # a run that uses frozen values has a draft
            if self.draft.cold_start:
                cold = warm & self.fresh[live]
                if cold.any():
                    self.start_cold(live[cold])
                    warm &= ~cold
        speculate &= ~warm
        plan = RoundPlan(live, speculate, warm, depth == 0, sched.tree_id[cell], known, self)
        t0 = self.clock.mark()
        for part in plan.parts:
            part.ws = self.workspace(part.tree)
            self.prepare(plan, part)
            if part.tree.depth:
                self.draft_round(part)
        self.clock.add("draft", t0)
        if check is not None:
            check()
        out = self.call_target(plan)
        t0 = self.clock.mark()
        finite = self.synchronise(plan, out)
        if check is not None:
            check()
        if not finite:
            assert out is not None  # a round without a call is finite
            raise SpecdemoError(
                f"the network returned NaN or inf at step(s) {self.bad_steps(out)}; check the model and its inputs"
            )
        decided = Decided.empty(self.slots)
        for part in plan.parts:
            self.walk(part, decided)
        self.commit(plan, decided)
        self.clock.add("verify", t0)
        self.cost.rounds += 1
        finished = live[self.n[live] == self.num_steps]
        if finished.size:
            self.refill(finished.tolist())
        return True

    def prepare(self, plan: RoundPlan, part: Part) -> None:
        """A part's inputs: every slot's level steps into the mailbox, its coefficient rows gathered on the
        device, the roots copied in, and each member's own noise (part 0: a plain stochastic step's too)."""
        ws = part.ws
        depth = max(part.tree.depth, 1)
        ws.before.host["steps"][:] = np.minimum(np.arange(depth)[:, None] + self.n[None], self.num_steps - 1)
        ws.before.send()
        ws.x_root.copy_(self.y_flat)
        self.kernel.round_rows(ws.steps_flat, ws.rows_flat)
        if ws.parent_rows is not ws.rows:
            torch.index_select(ws.rows, 0, ws.layout.parent_level, out=ws.parent_rows)
        draws = list(zip(part.slots.tolist(), part.drafted.tolist(), strict=True))
        if part is plan.parts[0]:
            draws += [(slot, 1) for slot in plan.direct[self.scales_host[self.n[plan.direct]] > 0].tolist()]
        for slot, count in draws:
            self.rng.normal_(slot, ws.noise_rows(slot, count))

    def draft_round(self, part: Part) -> None:
        """Phase 1: the draft's means set up for the round, then every node drafted."""
        ws = part.ws
        assert self.draft is not None  # a part that drafts is a speculative run's, which has a draft (check_run)
        cond = self.cond_of() if self.draft.calls_network else {}
        means = self.draft.for_round(self.kernel, ws.before.device["steps"], self.frozen, cond)
        self.cost.draft_calls += means.network_levels
        device.draft(ws, means, self.y_flat, self.frozen_levels)

    def call_target(self, plan: RoundPlan) -> torch.Tensor | None:  # noqa: PLR0912 (issue 56 splits it)
        """Phase 2: one batched target call over the round's rows: each speculating trajectory's evaluated
        nodes (its root unless its output is known), and the roots of plain steps whose output is not known
        and of warm-ups (part 0's), padded to the call's size; its outputs put at their nodes' rows of each
        part's output plane; then the target's mean at every parent and the reduction."""
        for part in plan.parts:
            if part.any_known:
                part.ws.out_root.copy_(self.root_out)
        layout = self.call_layout(plan)
        out = None
        if layout is not None:
            count, size, bounds = layout
            box = self.call_box(size)
            buf, states, rows_in, rows_out, steps, traj, finite = box.views
            box.mailbox.send()
            if len(plan.parts) == 1:
                torch.index_select(plan.parts[0].ws.x_flat, 0, rows_in, out=buf)
            else:
                for part, (lo, hi) in zip(plan.parts, bounds, strict=True):
                    torch.index_select(part.ws.x_flat, 0, rows_in[lo:hi], out=buf[lo:hi])
            cond = {k: v.index_select(0, traj) for k, v in self.cond.items()} if self.cond else {}
            t0 = self.clock.mark()
            out = self.network(states, steps, **cond)
            if out.shape != states.shape:
                raise SpecdemoError(
                    f"the network returned shape {tuple(out.shape)} for inputs of shape {tuple(states.shape)}"
                )
            self.clock.add("target", t0)
            if out.dtype != self.dtype:
                out = out.to(self.dtype)
            torch.sum(out, dim=tuple(range(out.dim())), dtype=torch.float64, out=finite)
            if len(plan.parts) == 1:
                plan.parts[0].ws.out_states.index_copy_(0, rows_out, out)
            else:
                for part, (lo, hi) in zip(plan.parts, bounds, strict=True):
                    part.ws.out_states.index_copy_(0, rows_out[lo:hi], out[lo:hi])
            self.cost.target_calls += 1
            self.cost.padded_rows += size - count
            self.account_call(plan)
        for part in plan.parts:
            device.target_means(part.ws, self.kernel)
            if part.tree.depth:
                device.reduce(part.ws)
        return out

    def call_layout(self, plan: RoundPlan) -> tuple[int, int, list[tuple[int, int]]] | None:
        """Write the call's rows into the call's mailbox, part after part (node rows of each part's
        workspace, node-major: node j of slot a is row j A + a), padding after part 0's rows: (rows,
        padded size, each part's span), or None where nothing is evaluated."""
        a = self.slots
        parts_rows, parts_steps, parts_slots = [], [], []
        for index, part in enumerate(plan.parts):
            rows, steps, slots = [], [], []
            for tree_id, members in part.groups.items():
                tree, leaves = self.schedule.trees[tree_id]
                t = tables(tree)
                evaluated = t.num_nodes if leaves else t.num_parents
                for known in (False, True):
                    who = members[self.root_known[members] == known]
                    if not who.size or evaluated <= known:  # a known root of a tree without another evaluated node
                        continue
                    nodes = np.arange(int(known), evaluated)
                    rows.append((nodes[None] * a + who[:, None]).reshape(-1))
                    steps.append((self.n[who][:, None] + t.node_depth[nodes][None]).reshape(-1))
                    slots.append(np.repeat(who, nodes.size))
            if index == 0:  # the roots of plain steps whose output is not known, and of warm-ups: node 0
                roots = np.concatenate([plan.direct[~self.root_known[plan.direct]], plan.warm])
                rows.append(roots)
                steps.append(self.n[roots])
                slots.append(roots)
            parts_rows.append(np.concatenate(rows) if rows else np.zeros(0, np.int64))
            parts_steps.append(np.concatenate(steps) if steps else np.zeros(0, np.int64))
            parts_slots.append(np.concatenate(slots) if slots else np.zeros(0, np.int64))
        count = sum(r.size for r in parts_rows)
        if not count:
            return None
        size = call_size(count)
        first = next(i for i, r in enumerate(parts_rows) if r.size)
        pad = size - count  # repeats of the call's first row, their outputs put in part 0's spare row
        spare = plan.parts[0].tree.num_nodes * a
        parts_rows[0] = np.concatenate([parts_rows[0], np.full(pad, parts_rows[first][0] if first == 0 else 0)])
        parts_steps[0] = np.concatenate([parts_steps[0], np.full(pad, parts_steps[first][0])])
        parts_slots[0] = np.concatenate([parts_slots[0], np.full(pad, parts_slots[first][0])])
        box = self.call_box(size).mailbox.host
        at, bounds = 0, []
        for part_rows, part_steps, part_slots in zip(parts_rows, parts_steps, parts_slots, strict=True):
            hi = at + part_rows.size
            box["rows_in"][at:hi] = part_rows
            box["rows_out"][at:hi] = part_rows
            box["steps"][at:hi] = part_steps
            box["traj"][at:hi] = self.slot_traj[part_slots]
            bounds.append((at, hi))
            at = hi
        box["rows_out"][bounds[0][1] - pad : bounds[0][1]] = spare
        plan.call_slots = np.concatenate(parts_slots)[: count + pad]
        plan.call_real = np.ones(size, dtype=bool)
        plan.call_real[bounds[0][1] - pad : bounds[0][1]] = False
        return count, size, bounds

    def call_box(self, size: int) -> CallBox:
        """The buffers and mailbox of a call of `size` rows: the run's own, or the process's, or new."""
        box = self._calls.get(size)
        if box is None:
            box = self._calls[size] = cast("CallBox | None", POOL.take(self.call_key(size))) or CallBox(
                size, self.shape, self.device, self.dtype
            )
        return box

    def call_key(self, size: int) -> tuple:
        return "call", size, self.shape, self.device, self.dtype

    def account_call(self, plan: RoundPlan) -> None:
        """The call, per trajectory: a call with no row at a stochastic step is not counted
        (Schedule.stochastic_rows), nor a plain step's at a deterministic step (section 5)."""
        rows_of = np.bincount(plan.call_slots[plan.call_real], minlength=self.slots)
        slots = np.flatnonzero(rows_of)
        traj = self.slot_traj[slots]
        self.calls[traj] += 1
        self.rows_used[traj] += rows_of[slots]
        counted = np.ones(slots.size, dtype=np.int64)
        n, known = self.n[slots], self.root_known[slots]
        role = np.zeros(self.slots, dtype=np.int8)  # by slot: 1 speculates, 2 takes a plain step
        role[plan.spec], role[plan.direct] = 1, 2
        speculating, direct = role[slots] == 1, role[slots] == 2
        cell = (n[speculating], known[speculating].view(np.uint8), self.cut[slots[speculating]])
        counted[speculating] = self.schedule.stochastic_rows[cell]
        counted[direct & (self.scales_host[n] == 0)] = 0
        self.counted[traj] += counted

    def synchronise(self, plan: RoundPlan, out: torch.Tensor | None) -> bool:
        """The round's one device-to-host copy and synchronisation: each part's inner products, and the
        call's sum (not finite: the call returned NaN or inf)."""
        for part in plan.parts:
            part.ws.fetch(part.tree.depth > 0)
        if out is not None:
            box = self.call_box(out.shape[0])
            box.fetch()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return out is None or math.isfinite(float(self.call_box(out.shape[0]).finite_host[0]))

    def bad_steps(self, out: torch.Tensor) -> list[int]:
        """The steps of the call's rows whose outputs are not finite (the error path only)."""
        bad = ~torch.isfinite(out).flatten(1).all(1)
        steps = self.call_box(out.shape[0]).mailbox.host["steps"]
        return sorted(set(steps[bad.cpu().numpy()].tolist()))[:5]

    # ---------------------------------------------------------------- the host's walk
    def walk(self, part: Part, decided: Decided) -> None:
        """Phase 4: every speculating trajectory's verifier walk in a part, the prefetch's choice, and what
        the commit writes (Decided), group by group of trajectories that share a tree (whose nodes are the
        part's first nodes, in order)."""
        if not part.tree.depth:
            return
        assert self.verifier is not None  # a part that drafts is a speculative run's, which has a verifier (check_run)
        ws, gram = part.ws, part.ws.host_view().gram
        k_u, a = ws.layout.max_width, self.slots
        scales = self.scales_host
        for tree_id, slots in part.groups.items():
            tree, leaves = self.schedule.trees[tree_id]
            t = tables(tree)
            n0 = self.n[slots]
            g = gram[np.arange(t.num_parents)[None], slots[:, None]]  # (R, Np_T, K_U + 1, K_U + 1)
            s = scales[np.minimum(n0[:, None] + t.node_depth[None, : t.num_parents], self.num_steps - 1)]
            norm = np.sqrt(np.maximum(g[..., k_u, k_u], 0.0))
            delta = norm / s
            if self.exact_known:  # the first level's mean is the target's there: delta 0 by construction
                delta[self.root_known[slots], 0] = 0.0
            kids = np.arange(1, t.num_nodes)
            par = t.parent[kids]
            u = np.zeros((slots.size, t.num_nodes))
            u[:, 1:] = g[:, par, t.position[kids], k_u] / np.maximum(norm[:, par] * s[:, par], TINY)
            uniforms = self.rng.uniform(slots, self.verifier.uniforms_per_round(t))
            walk = self.verifier.walk(t, delta, u, uniforms, _SlotRandom(self.rng, slots), trace=self.trace is not None)
            rows = np.arange(slots.size)
            corrected = walk.corrected
            p = np.minimum(walk.node, t.num_parents - 1)  # the parent of the corrected draw (kept rows: any)
            factor = np.where(
                corrected,
                s[rows, p] * (np.nan_to_num(walk.u_new) - u[rows, walk.child]) / np.maximum(norm[rows, p], TINY),
                0.0,
            )
            decided.commit[slots] = walk.child * a + slots
            decided.diff_row[slots] = p * a + slots
            decided.factor[slots] = factor
            decided.corrected[slots] = corrected
            decided.part[slots] = part.index
            # the output frozen for the next round (prefetch), and a kept leaf's output, known
            if self.prefetch is not None:
                source = self.prefetch.source(t, walk, leaves, g[rows, p], factor, k_u)
                if source is None:
                    decided.unfreeze[slots] = True
                else:
                    decided.set_source(
                        slots,
                        a,
                        source,
                        np.maximum(t.parent[source], 0),
                        n0 + t.node_depth[source],
                        n0 + np.maximum(t.node_depth[source] - 1, 0),
                        part.index,
                    )
            if leaves:
                kept = slots[~corrected]
                decided.known_rows(kept, walk.node[~corrected] * a + kept, part.index)
            self.n[slots] = n0 + walk.end_depth
            # a level is examined where the walk reached it; at a known root the exact draft's first level
            # is accepted by construction, and tells nothing
            given = (self.root_known[slots] & self.exact_known).astype(np.int64)
            self.examined[slots] += walk.end_depth - given
            self.accepted[slots] += walk.end_depth - corrected - given
            self.round_ends.append(walk.end_depth)
            self.round_kept.append(walk.end_depth - corrected)
            if self.keep.size:
                decided.paths.append((slots, n0, walk, tree, part))
            if self.trace is not None:
                decided.traces.append((slots, tree, leaves, walk, part))

    # ---------------------------------------------------------------- commit
    def commit(self, plan: RoundPlan, decided: Decided) -> None:  # noqa: C901, PLR0912, PLR0915 (issue 56 splits it)
        """Phase 5: the new states, frozen values and known root outputs, with the host's choices, part by
        part."""
        a = self.slots
        direct = plan.direct
        # plain or deterministic steps under a cold start keep their output for the next round; warm-ups too
        refresh_roots = plan.warm
        if self.uses_frozen and self.draft is not None and self.draft.cold_start and not self.draft.calls_network:
            refresh_roots = np.concatenate([refresh_roots, direct])
        if refresh_roots.size:
            n_r = self.n[refresh_roots]
            zero = np.zeros_like(n_r)
            decided.set_source(refresh_roots, a, zero, zero, n_r, n_r, 0)
        if plan.warm.size:
            decided.known_rows(plan.warm, plan.warm, 0)
        refresh = decided.source_set & ~decided.unfreeze
        for part in plan.parts:
            mine = decided.part == part.index
            box = part.ws.after.host
            own = np.arange(a)  # elsewhere: each slot's own root, y itself
            box["commit"][:] = np.where(mine, decided.commit, own)
            box["diff_row"][:] = np.where(mine, decided.diff_row, own)
            box["factor"][:, 0] = np.where(mine, decided.factor, 0.0)
            box["source"][:] = np.where(mine, decided.source, own)
            box["above"][:] = np.where(mine, decided.above, own)
            box["source_step"][:], box["above_step"][:] = decided.source_step, decided.above_step
            box["leaf"][:] = np.where(mine, decided.leaf, own)
            box["mine"][:, 0] = mine
            box["direct"][:, 0] = False
            box["direct"][direct, 0] = True
            box["refresh"][:, 0] = refresh
            box["known"][:, 0] = decided.known
            box["held"][:, 0] = self.has_frozen
            part.ws.after.send()
        first = plan.parts[0]
        for part in plan.parts:
            ws, dev, mine = part.ws, part.ws.after.device, decided.part == part.index
            if not mine.any():
                continue
            if part is first:
                torch.index_select(ws.x_flat, 0, dev["commit"], out=self.y_flat)
            else:
                torch.where(dev["mine"], torch.index_select(ws.x_flat, 0, dev["commit"]), self.y_flat, out=self.y_flat)
            if (decided.corrected & mine).any():
                self.y_flat.addcmul_(dev["factor"], torch.index_select(ws.diff_flat, 0, dev["diff_row"]))
        if direct.size:
            moved = torch.addcmul(first.ws.mq_root, first.ws.root_scale, first.ws.root_noise)
            if direct.size == self.slots:
                self.y_flat.copy_(moved)
            else:
                torch.where(first.ws.after.device["direct"], moved, self.y_flat, out=self.y_flat)
        if refresh.any():
            self.freeze(plan, decided, refresh)
        if decided.known.any():
            leaf_out = self.gathered(
                plan, decided, "leaf", lambda ws: ws.out_flat, self.root_out.new_empty(self.root_out.shape)
            )
            if decided.known.all():
                self.root_out.copy_(leaf_out)
            else:
                torch.where(first.ws.after.device["known"], leaf_out, self.root_out, out=self.root_out)
        # the host's state
        self.has_frozen[refresh] = True
        self.has_frozen[decided.unfreeze] = False
        self.fresh[plan.spec] = False  # a round drafted: no guess from here on (a plain step's output is frozen)
        self.root_known[plan.live] = False
        self.root_known[decided.known] = True
        if direct.size:
            self.n[direct] += 1
            self.keep_state(direct, self.n[direct], self.y[self.slot_tensor(direct)])
        if plan.warm.size:
            self.cost.warm_ups += plan.warm.size
        for slots, n0, walk, tree, part in decided.paths:
            self._keep_path(part.ws, slots, n0, walk, tree)
        if decided.traces:
            if self.device.type == "cuda" and (self.trace_states or self.trace_outputs):
                # records that read the device wait for the work queued before them: not theirs to count
                torch.cuda.current_stream(self.device).synchronize()
            start = time.perf_counter()
            for slots, tree, leaves, walk, part in decided.traces:
                assert self.trace is not None  # rounds are recorded only into a trace
                record = round_trace(self, part.ws, slots, tree, leaves, walk)
                if record.trajectories.size:  # none where trace_only names none of the round's
                    self.trace.append(record)
            self.cost.trace_s += time.perf_counter() - start

    def gathered(
        self,
        plan: RoundPlan,
        decided: Decided,
        field: str,
        buffer: Callable[[Workspace], torch.Tensor],
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Rows (A, D) gathered from each slot's part, at the mailboxes' `field` rows of buffer(ws)."""
        for i, part in enumerate(plan.parts):
            dev = part.ws.after.device
            if i == 0:
                torch.index_select(buffer(part.ws), 0, dev[field], out=out)
            elif (decided.part == part.index).any():
                torch.where(dev["mine"], torch.index_select(buffer(part.ws), 0, dev[field]), out, out=out)
        return out

    def freeze(self, plan: RoundPlan, decided: Decided, refresh: np.ndarray) -> None:
        """Keep what the draft freezes from the target output at each refreshed slot's source node."""
        ws = plan.parts[0].ws
        dev = ws.after.device
        whole = refresh.all()
        assert self.frozen is not None and self.draft is not None  # only drafts that use frozen values freeze
        if self.draft.frozen_is_output and whole and len(plan.parts) == 1:  # gathered straight into the frozen values
            torch.index_select(ws.out_flat, 0, dev["source"], out=self.frozen_rows)
            return
        self.gathered(plan, decided, "source", lambda w: w.out_flat, ws.frozen_out_flat)
        self.gathered(plan, decided, "source", lambda w: w.x_flat, ws.frozen_x_flat)
        history: FrozenHistory = {}
        if self.draft.frozen_history:  # the output one node above (the root's own at the root), the value held
            held = dev["held"].view(-1, *[1] * (self.frozen.dim() - 1))
            above_out, above_x = ws.frozen_above_flat
            self.gathered(plan, decided, "above", lambda w: w.out_flat, above_out)
            self.gathered(plan, decided, "above", lambda w: w.x_flat, above_x)
            history = {
                "previous": torch.where(held, self.frozen, 0.0),
                "earlier": (*ws.frozen_above, dev["above_step"]),
            }
        if self.draft.calls_network:  # a draft network corrected at the frozen node: one more draft call
            self.cost.draft_calls += 1
        cond = self.cond_of() if self.draft.calls_network else None
        value = self.draft.frozen_value(
            self.kernel, ws.frozen_out, ws.frozen_x, dev["source_step"], cond=cond, **history
        )
        if whole:
            self.frozen.copy_(value)
        else:
            torch.where(dev["refresh"].view(-1, *[1] * (self.frozen.dim() - 1)), value, self.frozen, out=self.frozen)

    def _keep_path(self, ws: Workspace, slots: np.ndarray, n0: np.ndarray, walk: Walk, tree: Topology) -> None:
        """The kept steps a round committed: inner steps are accepted nodes (ancestors of the walk's node),
        the last is the new state. Every committed step n0 + j (j = 1..end depth) of every row at once: the
        round's work grows with the steps it commits, not with the number of kept steps."""
        t = tables(tree)
        ends = walk.end_depth
        rows = np.repeat(np.arange(slots.size), ends)
        j = np.arange(rows.size) - np.repeat(np.cumsum(ends) - ends, ends) + 1
        wanted = np.isin(n0[rows] + j, self.keep)
        rows, j = rows[wanted], j[wanted]
        if not rows.size:
            return
        node = walk.node[rows]
        for _ in range(int(t.depth)):  # climb to the ancestor at depth j
            node = np.where(t.node_depth[node] > j, t.parent[node], node)
        x_rows = self.slot_tensor(node * ws.capacity + slots[rows])
        values = torch.where(
            torch.from_numpy(j < ends[rows]).to(self.device).view(-1, *[1] * len(self.shape)),
            ws.x_flat[x_rows].view(-1, *self.shape),
            self.y[self.slot_tensor(slots[rows])],
        )
        self.keep_state(slots[rows], n0[rows] + j, values)

    def finish(self) -> None:
        top = len(self.cost.examined_per_depth)
        # rounds that committed more than d steps examined level d; more than d kept nodes kept it
        ends = np.concatenate(self.round_ends) if self.round_ends else np.zeros(0, np.int64)
        kept = np.concatenate(self.round_kept) if self.round_kept else np.zeros(0, np.int64)
        examined, accepted = (
            np.bincount(v.astype(np.int64), minlength=top + 2)[::-1].cumsum()[::-1] for v in (ends, kept)
        )
        self.cost.examined_per_depth = examined[1 : top + 1].tolist()
        self.cost.accepted_per_depth = accepted[1 : top + 1].tolist()
        seconds = self.clock.totals()
        self.cost.target_s = seconds.get("target", 0.0)
        self.cost.draft_s = seconds.get("draft", 0.0)
        self.cost.verify_s = seconds.get("verify", 0.0)


class _SlotRandom:
    """The uniform streams of a walk's rows (0..R-1: slots[rows]), for draws beyond a round's uniforms."""

    def __init__(self, rng: TrajectoryRandom, slots: np.ndarray) -> None:
        self.rng, self.slots = rng, slots

    def uniform(self, rows: np.ndarray, count: int) -> np.ndarray:
        return self.rng.uniform(self.slots[np.asarray(rows)], count)


class Part:
    """The trajectories of a round that draft one tree (union.py): the tree, its members grouped by their
    own tree (an index into the schedule's trees), the slots and the drafted nodes of each, and its
    workspace."""

    def __init__(
        self, index: int, tree: Topology, groups: dict[int, np.ndarray], drafted: dict[int, int], any_known: bool
    ) -> None:
        self.index, self.tree, self.groups = index, tree, groups
        self.slots = np.concatenate(list(groups.values())) if groups else np.zeros(0, np.int64)
        self.drafted = (
            np.concatenate([np.full(s.size, drafted[i]) for i, s in groups.items()]) if groups else self.slots
        )
        self.any_known = any_known
        self.ws: Workspace  # the round's buffers: set by _Batch.round before the part is used


class RoundPlan:
    """Who does what in a round: the live slots, those that speculate (in parts: union.py), warm up or
    take a plain step."""

    def __init__(
        self,
        live: np.ndarray,
        speculate: np.ndarray,
        warm: np.ndarray,
        direct: np.ndarray,
        tree_id: np.ndarray,
        known: np.ndarray,
        batch: _Batch,
    ) -> None:
        self.live = live
        self.spec, self.warm, self.direct = live[speculate], live[warm], live[direct]
        ids = tree_id[speculate]
        groups = {int(i): self.spec[ids == i] for i in np.unique(ids)}
        trees = batch.schedule.trees
        order = list(groups)
        known_slots = batch.root_known
        self.parts = []
        for index, (tree, members) in enumerate(parts_of(tuple(trees[i][0] for i in order))):
            mine = {order[m]: groups[order[m]] for m in members}
            drafted = {i: trees[i][0].num_nodes - 1 for i in mine}
            any_known = any(known_slots[s].any() for s in mine.values())
            if index == 0:
                any_known = any_known or bool(known_slots[self.direct].any())
            self.parts.append(Part(index, tree, mine, drafted, any_known))
        self.call_slots = live[:0]
        self.call_real = np.zeros(0, dtype=bool)


class CallBox:
    """A call of `size` rows: its input buffer (size, D), the states' view, the mailbox of its rows (in the
    parts' workspaces, and where the outputs go), their steps and trajectories, and its sum (the host's
    finiteness check)."""

    def __init__(self, size: int, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> None:
        d = int(np.prod(shape))
        buf = torch.zeros((size, d), device=device, dtype=dtype)
        self.nbytes = buf.nbytes + 4 * 8 * size
        self.mailbox = Mailbox(
            {
                "rows_in": ((size,), torch.long),
                "rows_out": ((size,), torch.long),
                "steps": ((size,), torch.long),
                "traj": ((size,), torch.long),
            },
            device,
        )
        self.finite = torch.zeros((), device=device, dtype=torch.float64)
        cuda = device.type == "cuda"
        self._finite_host = torch.zeros(1, dtype=torch.float64, pin_memory=True) if cuda else self.finite.view(1)
        self.finite_host = self._finite_host.numpy()
        dev = self.mailbox.device
        self.views = (
            buf,
            buf.view(size, *shape),
            dev["rows_in"],
            dev["rows_out"],
            dev["steps"],
            dev["traj"],
            self.finite,
        )

    def fetch(self) -> None:
        if self.finite.device.type == "cuda":
            self._finite_host.copy_(self.finite.view(1), non_blocking=True)


@dataclass
class Decided:
    """What the commit writes, per slot: the part it is in (-1: none), the node whose state y takes (a
    row of the part's states), the row of mq - mp and the factor a corrected draw moves by along it, the
    node whose output is frozen next (with the node above it and their steps), whether the next root's
    output is known (and its row), and the walks' paths and traces the host reads after the commit."""

    part: np.ndarray
    commit: np.ndarray
    diff_row: np.ndarray
    factor: np.ndarray
    corrected: np.ndarray
    source: np.ndarray
    above: np.ndarray
    source_step: np.ndarray
    above_step: np.ndarray
    source_set: np.ndarray
    unfreeze: np.ndarray
    known: np.ndarray
    leaf: np.ndarray
    paths: list = field(default_factory=list)
    traces: list = field(default_factory=list)

    @classmethod
    def empty(cls, slots: int) -> Decided:
        """Every slot's rows at its own root (row j A + a with j = 0: a): y stays, nothing is frozen."""
        z = lambda dtype=np.int64: np.zeros(slots, dtype=dtype)
        root = lambda: np.arange(slots)
        return cls(
            np.full(slots, -1),
            root(),
            root(),
            z(np.float64),
            z(bool),
            root(),
            root(),
            z(),
            z(),
            z(bool),
            z(bool),
            z(bool),
            root(),
        )

    def set_source(
        self,
        slots: np.ndarray,
        a: int,
        source: np.ndarray,
        above: np.ndarray,
        source_step: np.ndarray,
        above_step: np.ndarray,
        part: int,
    ) -> None:
        """Node rows (node-major: node j of slot s is row j A + s) of the source and the node above it."""
        self.source[slots], self.above[slots] = source * a + slots, above * a + slots
        self.source_step[slots], self.above_step[slots] = source_step, above_step
        self.source_set[slots] = True
        self.part[slots] = np.where(self.part[slots] < 0, part, self.part[slots])

    def known_rows(self, slots: np.ndarray, rows: np.ndarray, part: int) -> None:
        self.known[slots] = True
        self.leaf[slots] = rows
        self.part[slots] = np.where(self.part[slots] < 0, part, self.part[slots])


def sample(
    network: Callable[..., torch.Tensor],
    kernel: Kernel,
    shape: Sequence[int],
    num_samples: int,
    *,
    tree: Topology | TopologyPlan = Topology(()),
    draft: Draft | None = None,
    verifier: Verifier | None = None,
    prefetch: Prefetch | str | None = "nearest",
    seed: int = 0,
    indices: Sequence[int] | None = None,
    cond: dict[str, torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    keep_steps: Sequence[int] = (),
    trace: bool = False,
    trace_states: bool = True,
    trace_outputs: bool = False,
    trace_only: Sequence[int] | None = None,
    callback: Callable[[dict], None] | None = None,
    max_batch: int | None = None,
    cancel: Cancel | None = None,
) -> SampleResult:
    """Draw num_samples exact samples of the target chain Y_0 -> ... -> Y_N.

    network(x [R, *shape], n [R], **cond) returns the target output at each row's state and step.
    tree () is plain target sampling; a chain or tree speculates with draft and verifier; a
    TopologyPlan gives each round the tree planned for its first step. prefetch: which target
    output a frozen draft keeps for the next round (specdemo.sampling.prefetch), a policy or its name (None: nearest).
    indices name the trajectories (their random streams); default range(num_samples). cond holds
    per-trajectory conditioning (B, ...) passed row by row to the networks (class labels).
    keep_steps: also return the states at these steps (the whole path is exact, not only Y_N).
    trace: record every round (RoundTrace), with node states unless trace_states is False, and with the
    target's outputs at the nodes where trace_outputs (what planning.forms learns a freeze table from);
    trace_only: record these trajectories alone (a learning run's node values are read back for those it
    learns from, not the whole batch).
    callback receives a dict after every round (for progress bars: "progress" in [0, 1]).
    max_batch: at most this many trajectories in flight; a finished one frees its slot for the
    next (continuous batching). Default: all at once.
    cancel: checked before every round; the run raises specdemo.limits.Cancelled once it is set or
    past its time limit.
    """
    if max_batch is not None and max_batch < 1:
        raise SpecdemoError(f"max_batch must be >= 1, got {max_batch}")
    if isinstance(prefetch, str):
        if prefetch not in PREFETCH:
            raise SpecdemoError(f"unknown prefetch {prefetch!r}; accepted: {', '.join(PREFETCH)}")
        prefetch = PREFETCH[prefetch]()
    check_run(kernel, tree, draft, verifier, shape, min(num_samples, max_batch or num_samples), dtype)
    t_start = time.perf_counter()
    with torch.inference_mode():
        batch = _Batch(
            network,
            kernel,
            shape,
            num_samples,
            tree,
            draft,
            verifier,
            prefetch or NearestSibling(),
            seed,
            indices,
            cond,
            device,
            dtype,
            keep_steps,
            trace,
            trace_states,
            trace_outputs,
            trace_only,
            max_batch,
        )
        try:
            _run(batch, num_samples, callback, cancel)
            batch.finish()
        finally:
            if batch.device.type == "cuda":  # the last round's kernels are done with the buffers the pool gets
                torch.cuda.synchronize(batch.device)
            batch.release()
    batch.cost.wall_s = time.perf_counter() - t_start
    return SampleResult(samples=batch.samples, cost=batch.cost, states=batch.states, trace=batch.trace)


def _run(batch: _Batch, num_samples: int, callback: Callable[[dict], None] | None, cancel: Cancel | None) -> None:
    """The rounds, until every trajectory is done."""
    check = None if cancel is None else cancel.check
    while True:
        if check is not None:
            check()
        if not batch.round(check):
            return
        if callback is not None:
            live = batch.slot_traj >= 0
            done = batch.next_traj - int(live.sum()) + int((batch.n[live] == batch.num_steps).sum())
            progress = (batch.next_traj - int(live.sum())) * batch.num_steps + int(batch.n[live].sum())
            callback(
                {
                    "round": batch.cost.rounds,
                    "finished": done,
                    "num_samples": num_samples,
                    "progress": progress / (num_samples * batch.num_steps),
                    "target_calls": batch.cost.target_calls,
                }
            )
