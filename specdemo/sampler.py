"""The one batched driver: plain target sampling, chains and trees (algorithms.md section 4).

A batch of B trajectories moves in rounds. In a round each trajectory at step n with r stochastic
steps ahead speculates to depth L_b = min(L, r) with its own tree (L = 0 is plain sampling, and a
deterministic step is a round of depth 0):

1. draft level by level: children of node u are m^p(X_u) + s xi, xi i.i.d. standard normal;
2. one batched target call over every trajectory's internal nodes (also its leaves under prefetch
   "leaves", or where a TopologyPlan says so), each row with its own state and step;
3. walk from the root: verify the node's children, commit the kept child and descend, or commit
   the corrected draw and stop;
4. keep the frozen target output that starts the next round (prefetch, section 2).

Leaves that the target does not evaluate are drawn only when the walk reaches their parent: the K
children of a node are i.i.d. given it, so drawing them when they are examined rather than before
the target call changes no law, and saves drafting the (K - 1) / K of the tree that is never seen.

A trajectory without a frozen output (before its first speculative round, or every round under
prefetch "none") spends a round on a warm-up: its root alone is evaluated, in the round's batched
call, and it speculates from that exact output the round after. This is the draft-tree authors'
warm-up call (a deterministic step's output is not reused as a frozen output either), placed so
that trajectories starting at different times (continuous batching) add no sequential call. Every
random draw of trajectory i comes from its own generator
(specdemo.rng), so a trajectory's samples do not depend on the batch it runs in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .drafts import Draft
from .errors import SpecdemoError
from .kernels import Kernel
from .rng import TrajectoryRandom
from .trace import ACCEPTED, CORRECTED, REJECTED, ROOT, Cost, RoundTrace
from .trees import Topology, TopologyPlan
from .verifiers import RankOne, Verifier

MEMORY_LIMIT_BYTES = 8 * 2**30


@dataclass
class SampleResult:
    """samples (B, *shape) on the run's device; states: {step: (B, *shape)} for the steps asked for
    in keep_steps; trace: one RoundTrace a round when asked for."""

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
                f"{widest}: use a chain such as 1x{tree.max_depth}, or the dgrs or rank verifier"
            )
    size = int(np.prod(shape))
    nodes = max(t.num_nodes for t in tree.topologies)
    need = 4 * dtype.itemsize * size * num_samples * nodes  # a few buffers of every node
    if need > MEMORY_LIMIT_BYTES:
        raise SpecdemoError(
            f"{num_samples} samples with tree {tree} ({nodes} nodes of {size} values) need about "
            f"{need / 2**30:.1f} GiB, over the {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB limit; use fewer samples or a smaller tree"
        )


def _rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row values (rows,) viewed to broadcast against like (rows, ...)."""
    return t.view(-1, *([1] * (like.dim() - 1)))


def _pick(t: torch.Tensor, idx: torch.Tensor, full: bool) -> torch.Tensor:
    """t[idx], or t itself when idx is every row (a view instead of a copy)."""
    return t if full else t[idx]


class _Run:
    """The state of the batch between rounds, and one round's phases.

    The batch has `slots` rows; each holds one trajectory at a time. When a trajectory reaches
    step N its sample is stored and the slot takes the next trajectory (continuous batching), so
    the batch stays full until the queue runs dry. Per-slot tensors are indexed by slot; costs,
    samples and kept states by trajectory position (0..B-1).
    """

    def __init__(self, network, kernel: Kernel, shape, num_samples, tree: Topology, draft, verifier, seed, indices,
                 cond, device, dtype, keep_steps, trace, trace_states, max_batch):
        self.network, self.kernel, self.shape, self.tree = network, kernel, tuple(shape), tree
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
        self.run_len = kernel.stochastic_run_lengths().to(self.device)
        self.uses_frozen = tree.max_depth > 0 and draft.uses_frozen
        self.leaves_always = self.uses_frozen and draft.prefetch == "leaves"
        self._layouts: dict[Topology, _Layout] = {}

        b = num_samples
        slots = min(max_batch or b, b)
        self.rng = TrajectoryRandom(seed, slots, self.device)
        self.samples = torch.empty((b, *self.shape), device=self.device, dtype=dtype)
        self.slot_traj = torch.full((slots,), -1, dtype=torch.long, device=self.device)  # -1: empty
        self.next_traj = 0
        self.y = torch.empty((slots, *self.shape), device=self.device, dtype=dtype)
        self.n = torch.full((slots,), self.num_steps, dtype=torch.long, device=self.device)
        self.frozen = torch.zeros((slots, *draft.frozen_shape(self.shape)), device=self.device, dtype=dtype) \
            if self.uses_frozen else None
        self.has_frozen = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.root_out = torch.zeros_like(self.y)  # the exact target output at y, where root_known
        self.root_known = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.calls = torch.zeros(b, dtype=torch.long)
        self.counted = torch.zeros(b, dtype=torch.long)
        self.rows_used = torch.zeros(b, dtype=torch.long)
        self.cost = Cost(method=method_name(tree), steps=self.num_steps,
                         stochastic_steps=int((kernel.scales > 0).sum()),
                         calls_per_trajectory=self.calls.numpy(), counted_calls=self.counted.numpy(),
                         rows_per_trajectory=self.rows_used.numpy(),
                         examined_per_depth=[0] * tree.max_depth, accepted_per_depth=[0] * tree.max_depth)
        self.keep = sorted(set(keep_steps))
        self.states: dict[int, torch.Tensor] = {}
        self.trace = [] if trace else None
        self.trace_states = trace_states
        self.refill(torch.arange(slots, device=self.device))

    def refill(self, slots: torch.Tensor) -> None:
        """Finished slots hand their sample over and take the next trajectories of the queue."""
        done = slots[self.slot_traj[slots] >= 0]
        self.samples[self.slot_traj[done]] = self.y[done]
        self.slot_traj[slots] = -1
        for slot in slots.tolist():
            if self.next_traj == len(self.indices):
                break
            g = self.rng.assign(slot, self.indices[self.next_traj])
            self.y[slot] = self.kernel.prior(self.shape, g, self.device, self.dtype)
            self.slot_traj[slot] = self.next_traj
            self.next_traj += 1
            self.n[slot], self.has_frozen[slot], self.root_known[slot] = 0, False, False
            self.keep_state(torch.tensor([slot], device=self.device), 0, self.y[slot:slot + 1])

    # ---------------------------------------------------------------- target calls and bookkeeping
    def call_target(self, x, steps, slots, *, deterministic=None):
        """One batched target call; row i is the trajectory in slot slots[i], at state x[i], step steps[i]."""
        t0 = time.perf_counter()
        traj = self.slot_traj[slots]
        out = self.network(x, steps, **{k: v[traj] for k, v in self.cond.items()})
        if out.shape != x.shape:
            raise SpecdemoError(f"the network returned shape {tuple(out.shape)} for inputs of shape {tuple(x.shape)}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.cost.target_s += time.perf_counter() - t0
        if not bool(torch.isfinite(out.sum())):  # one reduction, no mask (huge sums are refused too)
            bad = sorted(set(steps[~torch.isfinite(out).flatten(1).all(1)].tolist()))
            raise SpecdemoError(f"the network returned NaN or inf at step(s) {bad[:5]}; check the model and its inputs")
        self.cost.target_calls += 1
        per_traj = torch.bincount(traj, minlength=len(self.indices)).cpu()
        had = per_traj > 0
        self.rows_used += per_traj
        self.calls[had] += 1
        self.counted[had] += 1
        if deterministic is not None and deterministic.numel():
            # calls spent on deterministic steps are on neither side of the speedup (section 5)
            self.counted[self.slot_traj[deterministic].cpu()] -= 1
        return out.to(self.dtype)

    def freeze(self, rows, out, x, steps):
        self.frozen[rows] = self.draft.frozen_value(self.kernel, out, x, steps)
        self.has_frozen[rows] = True

    def clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def layout(self, tree: Topology) -> "_Layout":
        if tree not in self._layouts:
            self._layouts[tree] = _Layout(tree, self.device)
        return self._layouts[tree]

    def keep_state(self, slots, step, value):
        if step in self.keep:
            self.states.setdefault(step, torch.full_like(self.samples, float("nan")))[self.slot_traj[slots]] = value

    # ---------------------------------------------------------------- one round
    def round(self) -> bool:
        active = ((self.n < self.num_steps) & (self.slot_traj >= 0)).nonzero().squeeze(1)
        if not active.numel():
            return False
        # each trajectory's tree for this round, and whether its leaves are evaluated (a plan
        # chooses both by the step and by whether the root's output is known)
        steps, known_roots = self.n[active].tolist(), self.root_known[active].tolist()
        trees = [self.tree.at(n, k) for n, k in zip(steps, known_roots)]
        leaves = [self.uses_frozen and (self.leaves_always or self.tree.leaves_at(n, k)) for n, k in zip(steps, known_roots)]
        depth = torch.tensor([t.depth for t in trees], device=self.device).clamp(max=self.run_len[self.n[active]])
        warm = torch.zeros_like(depth, dtype=torch.bool)
        if self.uses_frozen:
            # no frozen output yet: this round only evaluates the root (its row rides in the round's
            # call); the trajectory speculates from the exact output next round
            warm = (depth > 0) & ~self.has_frozen[active] & ~self.root_known[active]
            known = active[(depth > 0) & self.root_known[active]]
            if known.numel():
                self.freeze(known, self.root_out[known], self.y[known], self.n[known])
        groups: dict[tuple[Topology, bool], list[int]] = {}
        for i, (t, ev, d, w) in enumerate(zip(trees, leaves, depth.tolist(), warm.tolist())):
            if d > 0 and not w:
                groups.setdefault((t, ev), []).append(i)
        rounds = []
        t0 = self.clock()
        for (t, ev), members in groups.items():
            idx = torch.tensor(members, device=self.device)
            rounds.append(_Round(self, self.layout(t), active[idx], depth[idx], ev))
            rounds[-1].draft()
        self.cost.draft_s += self.clock() - t0
        direct = active[depth == 0]
        # roots evaluated alone: direct steps without a known output, and warm-ups
        direct_rows = direct[~self.root_known[direct]]
        root_rows = torch.cat([direct_rows, active[warm]])
        parts = [rnd.target_rows() for rnd in rounds if rnd.eval_count]
        if root_rows.numel():
            parts.append((self.y[root_rows], self.n[root_rows], root_rows))
        if parts:  # 2. one batched target call for every trajectory of the round
            x, steps, traj = (torch.cat(p) for p in zip(*parts)) if len(parts) > 1 else parts[0]
            out = self.call_target(x, steps, traj, deterministic=direct_rows[self.scales[self.n[direct_rows]] == 0])
            self.root_out[root_rows] = out[out.shape[0] - root_rows.numel():]
            self.root_known[active[warm]] = True
            start = 0
            for rnd in rounds:
                rnd.take_target_output(out[start:start + rnd.eval_count] if rnd.eval_count else None)
                start += rnd.eval_count
        else:
            for rnd in rounds:
                rnd.take_target_output(None)
        if direct.numel():
            self.direct_step(direct)
        t0 = self.clock()
        for rnd in rounds:
            rnd.walk()
            rnd.commit()
        self.cost.verify_s += self.clock() - t0
        self.cost.rounds += 1
        finished = active[self.n[active] == self.num_steps]
        if finished.numel():
            self.refill(finished)
        return True

    def direct_step(self, direct):
        """Y_{n+1} = m_n(Y_n) + s_n xi with the target: plain sampling and deterministic steps."""
        step = self.n[direct]
        y_next = self.kernel.mean(self.root_out[direct], self.y[direct], step)
        noisy = (self.scales[step] > 0).nonzero().squeeze(1)
        if noisy.numel():
            s = self.scales[step[noisy]].to(self.dtype)
            y_next[noisy] += _rows(s, y_next[noisy]) * self.rng.normal(direct[noisy], self.shape, self.dtype)
        self.y[direct] = y_next
        self.n[direct] += 1
        self.root_known[direct] = False
        for m in self.keep:
            hit = self.n[direct] == m
            if hit.any():
                self.keep_state(direct[hit], m, y_next[hit])


class _Layout:
    """A topology's index tensors on the run's device."""

    def __init__(self, tree: Topology, device):
        self.tree = tree
        self.level_starts = torch.tensor(tree.level_starts, device=device)
        self.first_child = tree.first_child.to(device)
        self.parent = tree.parent.to(device)
        self.node_depth = tree.node_depth.to(device)


class _Round:
    """One round of the speculating trajectories `spec` (positions in the batch), tree depths `depth`.

    Buffers hold the materialised nodes in breadth-first order: every internal node, and the
    leaves too when they are evaluated (prefetch "leaves", or where a plan says so).
    """

    def __init__(self, run: _Run, layout: "_Layout", spec: torch.Tensor, depth: torch.Tensor, evaluate_leaves: bool):
        self.run, self.lay, self.spec, self.depth = run, layout, spec, depth
        self.evaluate_leaves = evaluate_leaves
        self.root_known = run.root_known[spec].clone()  # at the round's start (the trace records it)
        self.count = spec.numel()
        tree = self.tree = layout.tree
        self.all_full = bool((depth == tree.depth).all())
        self.top = int(depth.max())
        # levels materialised: internal ones, plus the last when leaves are evaluated
        self.levels = self.top if evaluate_leaves else self.top - 1
        self.m = tree.nodes_to_depth(self.levels)
        self.n0 = run.n[spec].clone()

    def draft(self):
        """Phase 1: draft every materialised level, level by level."""
        run, tree, spec = self.run, self.tree, self.spec
        shape, dev, dtype = run.shape, run.device, run.dtype
        self.x = torch.empty((self.count, self.m, *shape), device=dev, dtype=dtype)
        self.x[:, 0] = run.y[spec]
        self.mp = torch.empty((self.count, tree.nodes_to_depth(max(self.levels - 1, 0)), *shape), device=dev, dtype=dtype)
        # how many levels each trajectory materialises
        mat = self.depth if self.evaluate_leaves else self.depth - 1
        self.mat_nodes = self.lay.level_starts[mat + 1]  # nodes per trajectory, the root included
        # the noise xi of every drafted node goes straight into its slot, one draw per trajectory
        for j, (t, c) in enumerate(zip(spec.tolist(), self.mat_nodes.tolist())):
            torch.randn((c - 1, *shape), generator=run.rng.generators[t], out=self.x[j, 1:c])
        for level in range(1, self.levels + 1):
            rows = (mat >= level).nonzero().squeeze(1)
            full = rows.numel() == self.count
            lo, hi = tree.level_starts[level - 1], tree.level_starts[level]
            step = _pick(self.n0, rows, full) + level - 1
            means = self.draft_means(rows, full, self._nodes(rows, full, lo, hi), step)
            self.mp[rows, lo:hi] = means
            c_lo, c_hi = tree.level_starts[level], tree.level_starts[level + 1]
            kids = self._nodes(rows, full, c_lo, c_hi).unflatten(1, (hi - lo, tree.widths[level - 1]))
            kids = kids.mul_(_rows(run.scales[step].to(dtype), kids)).add_(means[:, :, None])
            if not full:  # kids is a copy: write it back
                self.x[rows, c_lo:c_hi] = kids.flatten(1, 2)

    def _nodes(self, rows, full, lo, hi):
        """Nodes lo..hi-1 of trajectories rows: a view when rows is every trajectory, else a copy."""
        return self.x[:, lo:hi] if full else self.x[rows, lo:hi]

    def draft_means(self, rows, full, x, step):
        """m^p at nodes x (A, P, *shape) of trajectories spec[rows], all at `step`."""
        run = self.run
        traj = _pick(self.spec, rows, full)
        if run.draft.calls_network:
            run.cost.draft_calls += 1
        return run.draft.means(run.kernel, x, step, run.frozen[traj] if run.uses_frozen else None,
                               {k: v[run.slot_traj[traj]] for k, v in run.cond.items()})

    def target_rows(self):
        """Phase 2 input: every materialised node of each trajectory's tree, the root unless known."""
        run = self.run
        node = torch.arange(self.m, device=run.device)
        root_known = self.root_known
        self.evaluated = (node[None] < self.mat_nodes[:, None]) & ((node[None] > 0) | ~root_known[:, None])
        if self.all_full and not root_known.any():
            self.e_traj = self.e_node = None  # every node: a view, no gather
            x = self.x.flatten(0, 1)
            steps = (self.n0[:, None] + self.lay.node_depth[:self.m]).flatten()
            traj = self.spec.repeat_interleave(self.m)
        else:
            self.e_traj, self.e_node = self.evaluated.nonzero(as_tuple=True)
            x = self.x[self.e_traj, self.e_node]
            steps = self.n0[self.e_traj] + self.lay.node_depth[self.e_node]
            traj = self.spec[self.e_traj]
        return x, steps, traj

    @property
    def eval_count(self) -> int:
        return int((self.mat_nodes - self.root_known.long()).sum())

    def take_target_output(self, out_rows):
        run = self.run
        if out_rows is None:
            self.evaluated = torch.zeros((self.count, self.m), dtype=torch.bool, device=run.device)
            self.out = torch.empty_like(self.x)
        elif self.e_traj is None:
            self.out = out_rows.view_as(self.x)
        else:
            self.out = torch.empty_like(self.x)
            self.out[self.e_traj, self.e_node] = out_rows
        known = self.root_known
        if known.any():
            self.out[known, 0] = run.root_out[self.spec[known]]

    def walk(self):
        """Phase 3: verify from the root down; commit the kept child or the corrected draw."""
        run = self.run
        self.start_walk()
        if run.verifier.verifies_blocks:
            self.walk_block()
            return
        rec = self.start_trace() if run.trace is not None else None
        for level in range(self.top):
            a = ((self.depth > level) & ~self.corrected).nonzero().squeeze(1)
            if not a.numel():
                break
            c, step, mq, mp, kids, kid_idx = self.examine(level, a)
            verdict = run.verifier.verify(mq, mp, run.scales[step], kids, run.rng, self.spec[a])
            ok = verdict.kept >= 0
            run.cost.examined_per_depth[level] += a.numel()
            run.cost.accepted_per_depth[level] += int(ok.sum())
            self.cur[a[ok]] = kid_idx[ok, verdict.kept[ok]]
            self.path[a[ok], level] = self.cur[a[ok]]
            bad = a[~ok]
            self.corrected[bad] = True
            self.end_depth[bad] = level + 1
            self.y_new[bad] = verdict.sample[~ok]
            done_here = a[ok & (self.depth[a] == level + 1)]  # reached its last level by acceptance
            self.y_new[done_here] = verdict.sample[ok & (self.depth[a] == level + 1)]
            if rec is not None:
                self.record(rec, level, a, c, kid_idx, verdict)
        if rec is not None:
            self.finish_trace(rec)

    def start_walk(self):
        run, dev, count = self.run, self.run.device, self.count
        self.cur = torch.zeros(count, dtype=torch.long, device=dev)
        self.end_depth = self.depth.clone()
        self.corrected = torch.zeros(count, dtype=torch.bool, device=dev)
        self.y_new = torch.empty((count, *run.shape), device=dev, dtype=run.dtype)
        self.path = torch.zeros((count, self.top), dtype=torch.long, device=dev)  # accepted node per depth
        self.lazy_kids = {}  # leaves drawn by the walk, for the trace

    def examine(self, level, a):
        """What rows a verify at `level`: the node c (self.cur), its step, the target and draft means
        there, its children and their indices. Unevaluated leaves are drawn here, when their parent
        is examined."""
        run, tree, dev = self.run, self.tree, self.run.device
        c = self.cur[a]
        step = self.n0[a] + level
        xc = self.x[a, c]
        mq = run.kernel.mean(self.out[a, c], xc, step)
        kid_idx = self.lay.first_child[c][:, None] + torch.arange(tree.widths[level], device=dev)
        lazy = (self.depth[a] == level + 1) & (not self.evaluate_leaves)
        if not lazy.any():
            return c, step, mq, self.mp[a, c], self.x[a[:, None], kid_idx], kid_idx
        mp = torch.empty_like(xc)
        kids = torch.empty((a.numel(), tree.widths[level], *run.shape), device=dev, dtype=run.dtype)
        mat = (~lazy).nonzero().squeeze(1)
        mp[mat], kids[mat] = self.mp[a[mat], c[mat]], self.x[a[mat, None], kid_idx[mat]]
        lz = lazy.nonzero().squeeze(1)
        mp[lz] = self.draft_means(a[lz], False, xc[lz, None], step[lz])[:, 0]
        noise = run.rng.normal(self.spec[a[lz]], (tree.widths[level], *run.shape), run.dtype)
        kids[lz] = mp[lz, None] + _rows(run.scales[step[lz]].to(run.dtype), noise) * noise
        self.lazy_kids[level] = (a[lz], kids[lz])
        return c, step, mq, mp, kids, kid_idx

    def walk_block(self):
        """Phase 3 under block verification (chains only): weigh every trajectory's whole chain,
        then commit its first eta nodes and, where eta < L_b, the draw from the weighted residual,
        which keeps the orthogonal part of X_{eta+1} (verifiers/block.py says why that is exact)."""
        run, dev, count, top = self.run, self.run.device, self.count, self.top
        delta = torch.full((count, top), float("nan"), dtype=torch.float64, device=dev)
        u = torch.full_like(delta, float("nan"))
        levels = []  # (rows, scale, reduction, child) per level, for the residual draw
        for level in range(top):
            a = (self.depth > level).nonzero().squeeze(1)
            self.cur[a] = level  # a chain's node at depth `level`
            self.path[a, level] = level + 1  # the drafted chain: commit() reads it up to the last kept node
            _, step, mq, mp, kids, _ = self.examine(level, a)
            s = run.scales[step]
            red = RankOne.reduce(mq, mp, s, kids)
            delta[a, level], u[a, level] = red.delta, red.u[:, 0]
            levels.append((a, s, red, kids[:, 0]))
            leaf = self.depth[a] == level + 1
            self.y_new[a[leaf]] = kids[leaf, 0]  # kept if the whole chain is (eta = L_b)
        # as many uniforms as the topology's full depth needs, whatever the depths of the batch
        uniforms = run.rng.uniform(self.spec, self.tree.depth + 2)
        verdict = run.verifier.verify_block(delta, u, self.depth, uniforms)
        eta = verdict.eta
        self.corrected = eta < self.depth
        self.end_depth = torch.where(self.corrected, eta + 1, self.depth)
        self.cur = eta.clone()
        for level, (a, s, red, child) in enumerate(levels):
            cut = ((eta[a] == level) & self.corrected[a]).nonzero().squeeze(1)
            if cut.numel():
                self.y_new[a[cut]] = red.select(cut).move(child[cut], red.u[cut, 0], verdict.u[a[cut]], s[cut])
        rec = self.start_trace() if run.trace is not None else None
        for level in range(top):
            a = ((self.depth > level) & (eta >= level)).nonzero().squeeze(1)
            ok = eta[a] > level
            run.cost.examined_per_depth[level] += a.numel()
            run.cost.accepted_per_depth[level] += int(ok.sum())
            if rec is not None:
                self.record_block(rec, level, a, ok, delta[a, level], verdict.accept_prob[a, level])
        if rec is not None:
            self.finish_trace(rec)

    def commit(self):
        """Phase 4: new states and steps; the frozen output that starts the next round."""
        run, tree, spec = self.run, self.tree, self.spec
        dev = run.device
        run.y[spec] = self.y_new
        run.n[spec] = self.n0 + self.end_depth
        run.root_known[spec] = False
        for m in run.keep:
            j = m - self.n0
            sel = ((j >= 1) & (j <= self.end_depth)).nonzero().squeeze(1)
            if sel.numel():
                # an inner step of the path is an accepted (materialised) node; the last is y_new
                js = j[sel]
                inner = js < self.end_depth[sel]
                vals = self.y_new[sel].clone()
                if inner.any():
                    vals[inner] = self.x[sel[inner], self.path[sel[inner], js[inner] - 1]]
                run.keep_state(spec[sel], m, vals)
        if not run.uses_frozen:
            return
        if run.draft.prefetch == "none":
            run.has_frozen[spec] = False
            return
        ar = torch.arange(self.count, device=dev)
        done = ~self.corrected
        # the node whose verification ended the round: the parent of the committed state
        above = self.path.gather(1, (self.end_depth - 2).clamp(min=0)[:, None])[:, 0]
        last_parent = torch.where(self.end_depth == 1, 0, torch.where(self.corrected, above, self.lay.parent[self.cur]))
        source = last_parent.clone()
        if self.evaluate_leaves:
            # a committed leaf was evaluated: its exact output starts the next round
            leaf = done & (self.cur < self.m)
            rows = spec[leaf]
            run.root_out[rows] = self.out[leaf, self.cur[leaf]]
            run.root_known[rows] = True
            source[leaf] = self.cur[leaf]
        if run.draft.prefetch != "parent":  # nearest, leaves, auto (none returned above)
            for level in range(1, self.top + 1):
                sel = (self.corrected & (self.end_depth == level)).nonzero().squeeze(1)
                if not sel.numel() or level > self.levels:
                    continue
                sib = self.lay.first_child[last_parent[sel]][:, None] + torch.arange(tree.widths[level - 1], device=dev)
                sib_eval = self.evaluated[sel[:, None], sib]
                dist = (self.x[sel[:, None], sib] - self.y_new[sel, None]).flatten(2).norm(dim=2)
                best = torch.where(sib_eval, dist, float("inf")).argmin(1)
                use = sib_eval.any(1)
                source[sel[use]] = sib[use, best[use]]
        run.freeze(spec, self.out[ar, source], self.x[ar, source], self.n0 + self.lay.node_depth[source])

    # ---------------------------------------------------------------- trace
    def start_trace(self):
        full = self.tree.nodes_to_depth(self.top)
        nan = lambda: torch.full((self.count, full + 1), float("nan"), dtype=torch.float64)
        status = torch.zeros((self.count, full + 1), dtype=torch.int8)
        status[:, 0] = ROOT
        return {"full": full, "status": status, "delta": nan(), "node_acc": nan(), "child_acc": nan(),
                "corr_parent": torch.full((self.count,), -1, dtype=torch.long)}

    def record(self, rec, level, a, c, kid_idx, verdict):
        a_c, c_c, kid_c = a.cpu(), c.cpu(), kid_idx.cpu()
        rec["delta"][a_c, c_c] = verdict.delta.cpu()
        rec["node_acc"][a_c, c_c] = verdict.accept_prob.cpu()
        examined = ~verdict.child_accept_prob.isnan().cpu()
        rows = a_c[:, None].expand_as(kid_c)[examined]
        rec["child_acc"][rows, kid_c[examined]] = verdict.child_accept_prob.cpu()[examined]
        rec["status"][rows, kid_c[examined]] = REJECTED
        ok = (verdict.kept >= 0).cpu()
        rec["status"][a_c[ok], self.cur[a[ok.to(a.device)]].cpu()] = ACCEPTED
        rec["status"][a_c[~ok], rec["full"]] = CORRECTED
        rec["corr_parent"][a_c[~ok]] = c_c[~ok]

    def record_block(self, rec, level, a, ok, delta, accept_prob):
        """A block-verified chain: rows a reached `level`; ok: its child was committed. Acceptance is
        P(eta >= level + 1 | the drafted chain). The nodes past the first one not committed were
        weighed but are not on the path: shown unvisited."""
        a_c, ok_c, node = a.cpu(), ok.cpu(), level + 1
        rec["delta"][a_c, level] = delta.cpu()
        rec["node_acc"][a_c, level] = accept_prob.cpu()
        rec["child_acc"][a_c, node] = accept_prob.cpu()
        rec["status"][a_c, node] = torch.where(ok_c, ACCEPTED, REJECTED).to(torch.int8)
        rec["status"][a_c[~ok_c], rec["full"]] = CORRECTED
        rec["corr_parent"][a_c[~ok_c]] = level

    def finish_trace(self, rec):
        run, tree, full = self.run, self.tree, rec["full"]
        states = None
        if run.trace_states:
            # leaves the walk never reached were never drawn: NaN
            states = torch.full((self.count, full + 1, *run.shape), float("nan"), dtype=torch.float32)
            states[:, :self.m] = self.x.float().cpu()
            beyond = torch.arange(full + 1)[None] >= self.mat_nodes.cpu()[:, None]  # slots never drafted
            states[beyond] = float("nan")
            for level, (a, kids) in self.lazy_kids.items():
                c = self.cur_before(level, a)
                kid_idx = self.lay.first_child[c][:, None] + torch.arange(tree.widths[level], device=run.device)
                states[a.cpu()[:, None], kid_idx.cpu()] = kids.float().cpu()
            states[:, full] = self.y_new.float().cpu()
            states[~self.corrected.cpu(), full] = float("nan")
        evaluated = torch.zeros((self.count, full + 1), dtype=torch.bool)
        evaluated[:, :self.m] = self.evaluated.cpu()
        run.trace.append(RoundTrace(
            round=run.cost.rounds, trajectories=np.asarray(run.indices)[run.slot_traj[self.spec].cpu().numpy()],
            step=self.n0.cpu().numpy(), root_known=self.root_known.cpu().numpy(),
            depth=self.depth.cpu().numpy(), parent=np.append(tree.parent[:full].numpy(), -1),
            node_depth=np.append(tree.node_depth[:full].numpy(), -1), corrected_parent=rec["corr_parent"].numpy(),
            status=rec["status"].numpy(), evaluated=evaluated.numpy(), delta=rec["delta"].numpy(),
            node_accept_prob=rec["node_acc"].numpy(), child_accept_prob=rec["child_acc"].numpy(),
            committed_steps=self.end_depth.cpu().numpy(), states=None if states is None else states.numpy(),
        ))

    def cur_before(self, level, a):
        """The node verified at `level` by rows a: the root, or the node accepted at level - 1."""
        return torch.zeros_like(a) if level == 0 else self.path[a, level - 1]


def sample(
    network: Callable[..., torch.Tensor],
    kernel: Kernel,
    shape: Sequence[int],
    num_samples: int,
    *,
    tree: Topology | TopologyPlan = Topology(()),
    draft: Draft | None = None,
    verifier: Verifier | None = None,
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
) -> SampleResult:
    """Draw num_samples exact samples of the target chain Y_0 -> ... -> Y_N.

    network(x [R, *shape], n [R], **cond) returns the target output at each row's state and step.
    tree () is plain target sampling; a chain or tree speculates with draft and verifier; a
    TopologyPlan gives each round the tree planned for its first step.
    indices name the trajectories (their random streams); default range(num_samples). cond holds
    per-trajectory conditioning (B, ...) passed row by row to the networks (class labels).
    keep_steps: also return the states at these steps (the whole path is exact, not only Y_N).
    trace: record every round (RoundTrace), with node states unless trace_states is False.
    callback receives a dict after every round (for progress bars: "progress" in [0, 1]).
    max_batch: at most this many trajectories in flight; a finished one frees its slot for the
    next (continuous batching). Default: all at once.
    """
    if max_batch is not None and max_batch < 1:
        raise SpecdemoError(f"max_batch must be >= 1, got {max_batch}")
    check_run(kernel, tree, draft, verifier, shape, min(num_samples, max_batch or num_samples), dtype)
    t_start = time.perf_counter()
    with torch.inference_mode():
        run = _Run(network, kernel, shape, num_samples, tree, draft, verifier, seed, indices, cond, device, dtype,
                   keep_steps, trace, trace_states, max_batch)
        while run.round():
            if callback is not None:
                live = run.slot_traj >= 0
                done = run.next_traj - int(live.sum()) + int((run.n[live] == run.num_steps).sum())
                progress = (run.next_traj - int(live.sum())) * run.num_steps + int(run.n[live].sum())
                callback({"round": run.cost.rounds, "finished": done, "num_samples": num_samples,
                          "progress": progress / (num_samples * run.num_steps), "target_calls": run.cost.target_calls})
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
    run.cost.wall_s = time.perf_counter() - t_start
    return SampleResult(samples=run.samples, cost=run.cost, states=run.states, trace=run.trace)
