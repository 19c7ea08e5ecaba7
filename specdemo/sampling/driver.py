"""The one batched driver: plain target sampling, chains and trees (algorithms.md section 4).

A batch of B trajectories moves in rounds. In a round each trajectory at step n with r stochastic
steps ahead speculates to depth L_b = min(L, r) with its own tree (L = 0 is plain sampling, and a
deterministic step is a round of depth 0). The trajectories that share a (truncated) tree, leaf
evaluation and root state form one RoundState, and every RoundState goes through the phases of
specdemo.sampling.phases: draft; one batched target call for the whole batch (each row with its
own state and step); walk; then the round's one host synchronisation (the committed depths, which
the next round's trees depend on, and the check that the call returned finite values); the
corrections; commit.

A trajectory without a frozen output (before its first speculative round, or every round under
prefetch "none") spends a round on a warm-up: its root alone is evaluated, in the round's batched
call, and it speculates from that exact output the round after. This is the draft-tree authors'
warm-up call (started warm, a deterministic step's output is not reused as a frozen output either),
placed so that trajectories starting at different times (continuous batching) add no sequential call.
A draft that can draft without a target output (Draft.cold_start: a draft network, or the frozen draft
started cold) drafts a trajectory's first round from its cold value instead, and saves the call; the
frozen draft started cold also keeps the output of every plain or deterministic step, and a trajectory
that took one before its first speculative round drafts that round from it. Every
random draw of trajectory i comes from its own generator (specdemo.sampling.rng), so a
trajectory's samples do not depend on the batch it runs in.

The batch's bookkeeping (each slot's step, root state, calls and rows) lives on the host, so that
choosing the next round's trees needs no device round trip.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..drafts import Draft
from ..errors import SpecdemoError
from ..kernels import Kernel
from ..limits import Cancel
from ..trees import Topology, TopologyPlan
from ..trees.cost_model import call_size
from ..verifiers import Verifier
from . import phases
from .cost import Cost, PhaseClock
from .phases import Layout, RoundState, Workspace, cut, layout_for
from .prefetch import PREFETCH, NearestSibling, Prefetch
from .record import RoundTrace, round_trace
from .rng import TrajectoryRandom

MEMORY_LIMIT_BYTES = 8 * 2**30
WORKSPACES = 8  # round buffers a run keeps, the least recently used dropped (a plan can use many layouts)
GROUPS = 16  # groups of slots a run keeps (their slot tensors and buffer views), the least recently used dropped
POOL_BYTES = 64 * 2**20  # round buffers the process keeps for later runs (WorkspacePool)


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


def check_run(kernel: Kernel, tree: Topology | TopologyPlan, draft: Draft | None, verifier: Verifier | None,
              shape: Sequence[int], num_samples: int, dtype: torch.dtype = torch.float32) -> None:
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
    need = 4 * dtype.itemsize * size * num_samples * nodes  # a few buffers of every node
    if need > MEMORY_LIMIT_BYTES:
        raise SpecdemoError(
            f"{num_samples} samples with tree {tree} ({nodes} nodes of {size} values) need about "
            f"{need / 2**30:.1f} GiB, over the {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB limit; use fewer samples or a smaller tree"
        )


class WorkspacePool:
    """Round buffers kept between the runs of a process, so that a run of layouts seen before allocates
    none: a run takes workspaces out and puts them back when it ends (runs in other threads never
    share one), the least recently returned dropped past `limit_bytes`."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self._free: dict[tuple, list[Workspace]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, key: tuple) -> Workspace | None:
        with self._lock:
            spaces = self._free.get(key)
            if not spaces:
                return None
            space = spaces.pop()
            if not spaces:
                del self._free[key]
            self._bytes -= space.nbytes
            return space

    def put(self, key: tuple, space: Workspace) -> None:
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
    """For every step n and root state k (its output known or not): the layout a round rooted there
    uses (an index into `layouts`: its tree truncated at the stochastic horizon, whether its leaves
    are evaluated), its depth, and whether its call has a row at a stochastic step."""

    def __init__(self, tree: Topology | TopologyPlan, kernel: Kernel, leaf_table: np.ndarray,
                 verifier_type: type | None, device: torch.device):
        n_steps = kernel.num_steps
        steps = np.arange(n_steps)
        # the distinct trees, and which one each (step, root state) starts
        trees: list[Topology] = [tree] if isinstance(tree, Topology) else []
        which = np.zeros((n_steps, 2), dtype=np.int64)
        if isinstance(tree, TopologyPlan):
            distinct: dict[int, int] = {}
            for n in range(n_steps):
                for k in (0, 1):
                    t = tree.at(n, bool(k))
                    if id(t) not in distinct:
                        distinct[id(t)] = len(trees)
                        trees.append(t)
                    which[n, k] = distinct[id(t)]
        self.depth = np.minimum(np.array([t.depth for t in trees], dtype=np.int64)[which],
                                kernel.stochastic_run_lengths().numpy()[:n_steps, None])
        # a leaf at step N is the sample itself: there is no step N for the network to evaluate
        self.leaves = leaf_table & (self.depth > 0) & (steps[:, None] + self.depth < n_steps)
        # plan trees cut short at the horizon can coincide: rounds are grouped by the layout itself
        self.layouts: list[Layout] = []
        index: dict[Layout, int] = {}
        self.layout_id = np.zeros((n_steps, 2), dtype=np.int64)
        rounds = self.depth > 0
        top = int(self.depth.max(initial=0)) + 1
        code = (which * top + self.depth) * 2 + self.leaves  # (tree, depth, leaves) of each speculative round
        kinds, first, inverse = np.unique(code[rounds], return_index=True, return_inverse=True)
        ids = np.empty(kinds.size, dtype=np.int64)
        for j in np.argsort(first).tolist():  # layouts numbered in the order of the steps that first use them
            c = int(kinds[j])
            t, depth, leaves = trees[c // 2 // top], c // 2 % top, bool(c % 2)
            layout = layout_for(cut(t, depth), leaves, verifier_type, device)
            ids[j] = index.setdefault(layout, len(self.layouts))
            if ids[j] == len(self.layouts):
                self.layouts.append(layout)
        self.layout_id[rounds] = ids[inverse.reshape(-1)]
        # whether a round's call has a row at a stochastic step: its rows are at depths k (the root,
        # unless its output is known) to the last evaluated one; a call of deterministic-step rows only
        # (leaves at the last step under flow matching) serves that step as plain sampling's own call
        # does, and is counted on neither side of the speedup
        stochastic = np.cumsum(np.append(0, kernel.scales.numpy() > 0))  # stochastic steps before each step
        first = steps[:, None] + np.arange(2)[None]
        last = steps[:, None] + self.depth - (~self.leaves).astype(np.int64)  # the last evaluated row's step
        self.stochastic_rows = stochastic[np.clip(last + 1, 0, n_steps)] > stochastic[np.minimum(first, n_steps)]


class _Batch:
    """The state of the batch between rounds, and one round.

    The batch has `slots` rows; each holds one trajectory at a time. When a trajectory reaches
    step N its sample is stored and the slot takes the next trajectory (continuous batching), so
    the batch stays full until the queue runs dry. Per-slot state is indexed by slot (tensors on
    the device for states, numpy arrays on the host for steps and flags); costs, samples and kept
    states by trajectory position (0..B-1).
    """

    def __init__(self, network, kernel: Kernel, shape, num_samples, tree, draft, verifier, prefetch: Prefetch | None,
                 seed, indices, cond, device, dtype, keep_steps, trace, trace_states, max_batch):
        self.network, self.kernel, self.shape = network, kernel, tuple(shape)
        self.draft, self.verifier = draft, verifier
        self.device, self.dtype = torch.device(device), dtype
        self.indices = list(range(num_samples)) if indices is None else list(indices)
        if len(self.indices) != num_samples:
            raise SpecdemoError(f"{len(self.indices)} trajectory indices for {num_samples} samples")
        self.cond = {k: v.to(self.device) for k, v in (cond or {}).items()}
        for k, v in self.cond.items():
            if v.shape[0] != num_samples:
                raise SpecdemoError(f"conditioning {k!r} has {v.shape[0]} rows for {num_samples} samples")
        self.num_steps = kernel.num_steps
        self.scales = kernel.scales.to(self.device)
        self.scales_dtype = self.scales.to(dtype)
        self.scales_host = kernel.scales.numpy()
        self.uses_frozen = tree.max_depth > 0 and draft.uses_frozen
        self.prefetch = prefetch if self.uses_frozen else None
        leaf_table = prefetch.leaf_table(tree, self.num_steps) if self.uses_frozen else np.zeros((self.num_steps, 2), bool)
        self.schedule = Schedule(tree, kernel, leaf_table, type(verifier) if tree.max_depth else None, self.device)
        self._spaces: dict[tuple[Layout, bool], Workspace] = {}
        self._groups: dict[tuple[int, bytes], tuple] = {}  # recent rounds' groups (_Batch.group), by key and slots

        b = num_samples
        slots = min(max_batch or b, b)
        self.rng = TrajectoryRandom(seed, slots, self.device)
        self.samples = torch.empty((b, *self.shape), device=self.device, dtype=dtype)
        self.y = torch.empty((slots, *self.shape), device=self.device, dtype=dtype)
        self.frozen = torch.zeros((slots, *draft.frozen_shape(self.shape)), device=self.device, dtype=dtype) \
            if self.uses_frozen else None
        self.root_out = torch.zeros_like(self.y)  # the exact target output at y, where root_known
        # host state per slot
        self.slot_traj = np.full(slots, -1, dtype=np.int64)  # -1: empty
        self.n = np.full(slots, self.num_steps, dtype=np.int64)
        self.has_frozen = np.zeros(slots, dtype=bool)
        self.fresh = np.zeros(slots, dtype=bool)  # a trajectory that has had no speculative round yet
        self.root_known = np.zeros(slots, dtype=bool)
        self.slot_traj_device = torch.full((slots,), -1, dtype=torch.long, device=self.device)
        self.next_traj = 0
        self.calls = np.zeros(b, dtype=np.int64)
        self.counted = np.zeros(b, dtype=np.int64)
        self.rows_used = np.zeros(b, dtype=np.int64)
        top = tree.max_depth
        self.round_ends: list[int] = []  # every speculative round's committed steps, per trajectory
        self.round_kept: list[int] = []  # and its kept drafted nodes
        self.cost = Cost(method=method_name(tree), steps=self.num_steps,
                         stochastic_steps=int((kernel.scales > 0).sum()),
                         calls_per_trajectory=self.calls, counted_calls=self.counted, rows_per_trajectory=self.rows_used,
                         examined_per_depth=[0] * top, accepted_per_depth=[0] * top)
        self.clock = PhaseClock(self.device)
        self.keep = sorted(set(keep_steps))
        self.states: dict[int, torch.Tensor] = {}
        self.trace = [] if trace else None
        self.trace_states = trace_states
        self.refill(list(range(slots)))

    # ---------------------------------------------------------------- helpers the phases use
    def scale(self, step: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """s_n per row, in the run's dtype, shaped to broadcast against `like` (rows first)."""
        return self.scales_dtype[step].view(-1, *[1] * (like.dim() - 1))

    def round_means(self, state: RoundState):
        """The draft's means for a round of the trajectories in state.slots (Draft.for_round)."""
        means = self.draft.for_round(self.kernel, state.depth_steps,
                                     self.rows_of(self.frozen, state) if self.uses_frozen else None, self.cond_of(state.slots))
        self.cost.draft_calls += means.network_levels  # one call a level (a lazy last level's at the reached node)
        return means

    def cond_of(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """The conditioning of a round's trajectories, row by row."""
        return {k: v[self.slot_traj_device[slots]] for k, v in self.cond.items()} if self.cond else {}

    def frozen_value(self, state: RoundState, out: torch.Tensor, x: torch.Tensor, step: torch.Tensor,
                     **history) -> None:
        """Keep what the draft freezes from the target output `out` at (x, step), per trajectory of the round."""
        if self.draft.calls_network:  # a draft network corrected at the frozen node: one more draft call
            self.cost.draft_calls += 1
        cond = self.cond_of(state.slots) if self.draft.calls_network else None  # only a draft network reads it
        self.set_rows(self.frozen, state, self.draft.frozen_value(self.kernel, out, x, step, cond=cond, **history))

    def rows_of(self, per_slot: torch.Tensor, state: RoundState) -> torch.Tensor:
        """A per-slot tensor's rows for a round's trajectories: itself (no copy) when the round holds
        every slot in order, as a batch of one always does."""
        return per_slot if state.whole else per_slot[state.slots]

    def set_rows(self, per_slot: torch.Tensor, state: RoundState, values: torch.Tensor) -> None:
        if state.whole:
            per_slot.copy_(values)
        else:
            per_slot[state.slots] = values

    def workspace(self, layout: Layout, root_known: bool) -> Workspace:
        """The run's buffers for rounds of this layout and root state (the two root states of a
        layout can be groups of the same round), for up to every slot: the run's own, or the process's
        from an earlier run, or new."""
        key = (layout, root_known)
        space = self._spaces.pop(key, None) or POOL.take(self.pool_key(layout)) \
            or Workspace(layout, self.slot_traj.size, self.shape, self.device, self.dtype)
        self._spaces[key] = space  # the most recently used last
        if len(self._spaces) > WORKSPACES:  # dropped, with the groups that hold views of any buffers
            self._spaces.pop(next(iter(self._spaces)))
            self._groups.clear()
        return space

    def pool_key(self, layout: Layout) -> tuple:
        return layout, self.slot_traj.size, self.shape, self.device, self.dtype

    def release(self) -> None:
        """The run is over: its buffers go to the process's pool for the next run."""
        for (layout, _), space in self._spaces.items():
            POOL.put(self.pool_key(layout), space)
        self._spaces, self._groups = {}, {}

    def slot_tensor(self, values) -> torch.Tensor:
        """Host integers (slots, steps) as a long tensor on the run's device (a copy: the host arrays change)."""
        t = torch.from_numpy(np.array(values, dtype=np.int64))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

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
            self.keep_state([slot], [0], self.y[slot:slot + 1])
        self.slot_traj_device.copy_(torch.from_numpy(self.slot_traj))

    def keep_state(self, slots: list[int], steps: list[int], values: torch.Tensor) -> None:
        """values (len(slots), *shape): the states of those slots' trajectories at those steps."""
        for step in set(steps) & set(self.keep):
            rows = [j for j, s in enumerate(steps) if s == step]
            store = self.states.setdefault(step, torch.full_like(self.samples, float("nan")))
            store[self.slot_tensor(self.slot_traj[[slots[j] for j in rows]])] = values[self.slot_tensor(rows)]

    # ---------------------------------------------------------------- one round
    def round(self) -> bool:
        live = np.flatnonzero((self.slot_traj >= 0) & (self.n < self.num_steps))
        if not live.size:
            return False
        sched = self.schedule
        n, known = self.n[live], self.root_known[live]
        cell = (n, known.view(np.uint8))  # (step, root known) of each live slot
        depth = sched.depth[cell]
        speculate = depth > 0
        warm = speculate & ~(self.has_frozen[live] | known) if self.uses_frozen else None
        if warm is not None and self.draft.cold_start:
            cold = warm & self.fresh[live]
            if cold.any():
                self.start_cold(live[cold])
                warm &= ~cold
        spec, layout_ids, spec_known = live, sched.layout_id[cell], known
        direct = deterministic = warming = roots = live[:0]  # the usual round: every live slot speculates
        if not speculate.all() or (warm is not None and warm.any()):
            if warm is not None:
                speculate &= ~warm
                warming = live[warm]
            spec, layout_ids, spec_known = live[speculate], layout_ids[speculate], known[speculate]
            direct = live[depth == 0]
            # roots evaluated alone: direct steps whose output is not known, and warm-ups
            roots = np.concatenate([direct[~self.root_known[direct]], warming])
            deterministic = direct[(self.scales_host[self.n[direct]] == 0) & ~self.root_known[direct]]
        t0 = self.clock.mark()
        states = self.start_rounds(spec, layout_ids, spec_known)
        self.clock.add("draft", t0)
        out = self.call_target(states, roots, deterministic)
        if roots.size:
            self.root_out[self.slot_tensor(roots)] = out[out.shape[0] - roots.size:]
        t0 = self.clock.mark()
        for state in states:
            phases.walk(state, self)
        finite = self.synchronise(states, out)
        if not finite:
            raise SpecdemoError(f"the network returned NaN or inf at step(s) {self.bad_steps(out)}; "
                                "check the model and its inputs")
        self.root_known[live] = False
        if warming.size:
            self.root_known[warming] = True
            self.cost.warm_ups += warming.size
        if direct.size:
            self.direct_step(direct)
        for state in states:
            phases.correct(state, self)
            phases.commit(state, self)
            self.account(state)
            if self.trace is not None:
                self.trace.append(round_trace(state, self))
        self.clock.add("verify", t0)
        self.cost.rounds += 1
        finished = live[self.n[live] == self.num_steps]
        if finished.size:
            self.refill(finished.tolist())
        return True

    def start_cold(self, slots: np.ndarray) -> None:
        """Trajectories in their first speculative round take the draft's cold value (Draft.cold_value)
        instead of a warm-up call."""
        rows = self.slot_tensor(slots)
        value, calls = self.draft.cold_value(self.kernel, self.y[rows], self.slot_tensor(self.n[slots]), self.cond_of(rows))
        self.frozen[rows] = value
        self.cost.draft_calls += calls
        self.has_frozen[slots], self.fresh[slots] = True, False

    def start_rounds(self, slots: np.ndarray, layout_ids: np.ndarray, known: np.ndarray) -> list[RoundState]:
        """Phase 1 for each group of slots that share a layout and a root state. A group seen in a
        recent round (the same slots, layout and root state: every round of a lone trajectory's chain)
        keeps its slot tensor and buffers."""
        states = []
        keys = layout_ids * 2 + known
        for key in (keys[:1] if keys.size == 1 else np.unique(keys)):
            members = slots if keys.size == 1 else slots[keys == key]
            tag = (int(key), members.tobytes())
            group = self._groups.pop(tag, None) or self.group(int(key), members)
            self._groups[tag] = group  # the most recently used last
            if len(self._groups) > GROUPS:
                self._groups.pop(next(iter(self._groups)))
            layout, kn, slot_t, slot_list, space, whole = group
            state = RoundState(layout, slot_t, slot_list, members, self.slot_tensor(self.n[members]), kn, space=space,
                               whole=whole)
            if state.root_known and self.uses_frozen:  # the exact output at the root: the first level is exact
                self.frozen_value(state, self.rows_of(self.root_out, state), self.rows_of(self.y, state), state.step,
                                  **self.held(members, self.rows_of(self.frozen, state)))
            phases.draft(state, self)
            states.append(state)
        return states

    def held(self, slots: np.ndarray, frozen: torch.Tensor) -> dict:
        """A draft with frozen_history is passed the value each slot holds (`frozen`, those slots' rows),
        zeros where it holds none (after a warm-up, or a slot's earlier trajectory's)."""
        if not self.draft.frozen_history:
            return {}
        held = torch.from_numpy(self.has_frozen[slots]).to(self.device)
        return {"previous": torch.where(held.view(-1, *[1] * (frozen.dim() - 1)), frozen, 0.0)}

    def group(self, key: int, members: np.ndarray) -> tuple:
        """(layout, root known, slots on the device and on the host, the buffers' rows, whether the
        group is every slot in order) of the slots `members` (increasing) in the layout and root state of key."""
        layout, known = self.schedule.layouts[key // 2], bool(key % 2)
        space = self.workspace(layout, known).rows(members.size)
        return layout, known, self.slot_tensor(members), members.tolist(), space, members.size == self.slot_traj.size

    def call_target(self, states: list[RoundState], roots: np.ndarray, deterministic: np.ndarray):
        """Phase 2: one batched target call over every group's evaluated nodes and the lone roots
        (none when every root's output is known and no group evaluates a node)."""
        calling = [s for s in states if s.call_rows]
        parts = [phases.call_inputs(s, self) for s in calling]
        if roots.size:
            r = self.slot_tensor(roots)
            parts.append((self.y[r], self.slot_tensor(self.n[roots])))
        out = None
        if parts:
            rows = sum(p[1].numel() for p in parts)
            padding = call_size(rows) - rows  # repeats of the first row, their outputs dropped
            self.cost.padded_rows += padding
            if padding:
                first = parts[0]
                parts.append(tuple(t[:1].expand(padding, *t.shape[1:]) for t in first))
            x, steps = (torch.cat(p) for p in zip(*parts)) if len(parts) > 1 else parts[0]
            cond = {}
            if self.cond:  # each row's trajectory's conditioning (padding rows repeat the first row's)
                slots = [s.slots.repeat_interleave(s.call_rows) for s in calling] + ([r] if roots.size else [])
                slots = torch.cat(slots + [slots[0][:1].expand(padding)])
                cond = {k: v[self.slot_traj_device[slots]] for k, v in self.cond.items()}
            t0 = self.clock.mark()
            out = self.network(x, steps, **cond)
            if out.shape != x.shape:
                raise SpecdemoError(f"the network returned shape {tuple(out.shape)} for inputs of shape {tuple(x.shape)}")
            self.clock.add("target", t0)
            out = (out[:rows] if padding else out).to(self.dtype)
            self.call_steps = steps  # padded: the error path reads the first `rows`
            self.cost.target_calls += 1
        start = 0
        for s in states:
            phases.take_outputs(s, out[start:start + s.count * s.call_rows] if s.call_rows else None, self)
            start += s.count * s.call_rows
        if roots.size:  # the lone roots' share of the call (the groups' is counted in `account`)
            traj = self.slot_traj[roots]
            self.calls[traj] += 1
            self.counted[traj] += 1
            self.rows_used[traj] += 1
            # calls spent on deterministic steps are on neither side of the speedup (section 5)
            self.counted[self.slot_traj[deterministic]] -= 1
        return out

    def synchronise(self, states: list[RoundState], out) -> bool:
        """The round's one device-to-host copy: every group's committed depths and corrections, and
        whether the call's outputs were finite."""
        parts = [t for s in states for t in (s.end_depth, s.corrected)]
        if out is not None:  # one reduction, checked on the host (huge sums are refused too)
            parts.append(out.sum(dtype=torch.promote_types(out.dtype, torch.float32))[None])
        if not parts:
            return True
        host = torch.cat(parts).tolist()  # with the sum, cat makes the depths and flags floats: small integers, exact
        start = 0
        for s in states:
            a = s.count
            s.end_host, s.corrected_host = [int(e) for e in host[start:start + a]], [c != 0 for c in host[start + a:start + 2 * a]]
            start += 2 * a
        return out is None or math.isfinite(host[-1])

    def bad_steps(self, out) -> list[int]:
        """The steps of the call's rows whose outputs are not finite (the error path only)."""
        bad = ~torch.isfinite(out).flatten(1).all(1)
        return sorted(set(self.call_steps[:bad.numel()][bad].tolist()))[:5]

    def direct_step(self, direct: np.ndarray) -> None:
        """Y_{n+1} = m_n(Y_n) + s_n xi with the target: plain sampling and deterministic steps."""
        d = self.slot_tensor(direct)
        step = self.slot_tensor(self.n[direct])
        if self.uses_frozen and self.draft.cold_start and not self.draft.calls_network:
            # a cold start keeps the step's target output for the next round (one step stale, as the parent
            # prefetch), where a warm start spends a warm-up call; a draft network would spend a call on it
            self.frozen[d] = self.draft.frozen_value(self.kernel, self.root_out[d], self.y[d], step,
                                                     **self.held(direct, self.frozen[d]))
            self.has_frozen[direct], self.fresh[direct] = True, False  # a target output: no guess from here on
        y_next = self.kernel.mean(self.root_out[d], self.y[d], step)
        noisy = np.flatnonzero(self.scales_host[self.n[direct]] > 0)
        if noisy.size:
            rows = self.slot_tensor(noisy)
            xi = self.rng.normal(direct[noisy], self.shape, self.dtype)
            y_next[rows] += self.scale(step[rows], xi) * xi
        self.y[d] = y_next
        self.n[direct] += 1
        self.keep_state(direct.tolist(), self.n[direct].tolist(), y_next)

    def account(self, state: RoundState) -> None:
        """The round's call, per trajectory (a call with no row at a stochastic step is not counted:
        Schedule.stochastic_rows), its steps and committed depths, kept intermediate states."""
        slots = state.slot_array
        traj, n0 = self.slot_traj[slots], self.n[slots]
        if state.call_rows:
            self.calls[traj] += 1
            self.counted[traj] += self.schedule.stochastic_rows[n0, state.first_row]
            self.rows_used[traj] += state.call_rows
        ends = np.asarray(state.end_host)
        self.n[slots] = n0 + ends
        self.round_ends.extend(state.end_host)
        self.round_kept.extend(e - c for e, c in zip(state.end_host, state.corrected_host))
        self._keep_path(state, n0, ends)

    def _keep_path(self, state: RoundState, n0: np.ndarray, ends: np.ndarray) -> None:
        """The kept steps a round committed: inner steps are accepted nodes (ancestors of cur), the
        last is y_new."""
        if not self.keep:
            return
        for m in self.keep:
            j = m - n0
            rows = np.flatnonzero((j >= 1) & (j <= ends))
            if not rows.size:
                continue
            r = self.slot_tensor(rows)
            inner = torch.as_tensor(j[rows] < ends[rows]).to(self.device)
            nodes = state.layout.ancestors[state.cur[r], self.slot_tensor(np.minimum(j[rows], ends[rows] - 1))]
            inner_x = state.x[r, nodes.clamp_max(state.x.shape[1] - 1)]
            values = torch.where(inner.view(-1, *[1] * len(self.shape)), inner_x, state.y_new[r])
            self.keep_state([state.slot_list[i] for i in rows], [m] * rows.size, values)

    def finish(self) -> None:
        top = len(self.cost.examined_per_depth)
        # rounds that committed more than d steps examined level d; more than d kept nodes kept it
        examined, accepted = (np.bincount(np.array(v, dtype=np.int64), minlength=top + 2)[::-1].cumsum()[::-1]
                              for v in (self.round_ends, self.round_kept))
        self.cost.examined_per_depth = examined[1:top + 1].tolist()
        self.cost.accepted_per_depth = accepted[1:top + 1].tolist()
        seconds = self.clock.totals()
        self.cost.target_s = seconds.get("target", 0.0)
        self.cost.draft_s = seconds.get("draft", 0.0)
        self.cost.verify_s = seconds.get("verify", 0.0)


def sample(
    network: Callable[..., torch.Tensor],
    kernel: Kernel,
    shape: Sequence[int],
    num_samples: int,
    *,
    tree: Topology | TopologyPlan = Topology(()),
    draft: Draft | None = None,
    verifier: Verifier | None = None,
    prefetch: Prefetch | str = "nearest",
    seed: int = 0,
    indices: Sequence[int] | None = None,
    cond: dict[str, torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    keep_steps: Sequence[int] = (),
    trace: bool = False,
    trace_states: bool = True,
    callback: Callable[[dict], None] | None = None,
    max_batch: int | None = None,
    cancel: Cancel | None = None,
) -> SampleResult:
    """Draw num_samples exact samples of the target chain Y_0 -> ... -> Y_N.

    network(x [R, *shape], n [R], **cond) returns the target output at each row's state and step.
    tree () is plain target sampling; a chain or tree speculates with draft and verifier; a
    TopologyPlan gives each round the tree planned for its first step. prefetch: which target
    output a frozen draft keeps for the next round (specdemo.sampling.prefetch), a policy or its name.
    indices name the trajectories (their random streams); default range(num_samples). cond holds
    per-trajectory conditioning (B, ...) passed row by row to the networks (class labels).
    keep_steps: also return the states at these steps (the whole path is exact, not only Y_N).
    trace: record every round (RoundTrace), with node states unless trace_states is False.
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
        batch = _Batch(network, kernel, shape, num_samples, tree, draft, verifier, prefetch or NearestSibling(), seed,
                       indices, cond, device, dtype, keep_steps, trace, trace_states, max_batch)
        try:
            _run(batch, num_samples, callback, cancel)
            batch.finish()
        finally:
            if batch.device.type == "cuda":  # the last round's kernels are done with the buffers the pool gets
                torch.cuda.synchronize(batch.device)
            batch.release()
    batch.cost.wall_s = time.perf_counter() - t_start
    return SampleResult(samples=batch.samples, cost=batch.cost, states=batch.states, trace=batch.trace)


def _run(batch: _Batch, num_samples: int, callback, cancel) -> None:
    """The rounds, until every trajectory is done."""
    while True:
        if cancel is not None:
            cancel.check()
        if not batch.round():
            return
        if callback is not None:
            live = batch.slot_traj >= 0
            done = batch.next_traj - int(live.sum()) + int((batch.n[live] == batch.num_steps).sum())
            progress = (batch.next_traj - int(live.sum())) * batch.num_steps + int(batch.n[live].sum())
            callback({"round": batch.cost.rounds, "finished": done, "num_samples": num_samples,
                      "progress": progress / (num_samples * batch.num_steps),
                      "target_calls": batch.cost.target_calls})
