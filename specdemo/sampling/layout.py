"""Where a round's data lives: a topology's index tensors on the device (Layout), the buffers of its
rounds with their views made once (Workspace), and the host-to-device exchange (Mailbox).

A round's device work is a fixed sequence of operations on fixed buffers: every view and index it
reads is made when its workspace is made, not at every round, so that a round costs few operations
(docs/benchmarks.md, section launches, counts them) and its shapes never change. States are kept
flattened, (..., D) with D the number of values of one state, node-major: node j of slot a is row
j A + a, so that (nodes, slots) is one batch dimension of the batched products.

Buffers of a workspace for A trajectories (slots) and a topology of M nodes, L levels, Np parents (the
nodes with children; the root alone when L = 0) and K children at most per parent:

  z       (3, M, A, D)   plane 0: each node's state x; plane 1: the draft's clip input c = h x + o;
                         plane 2: the target's output there, then one spare row (a call's padding rows)
  noise   (A, M - 1, D)  xi of nodes 1..M-1, each trajectory's own draws (a tree cut from the workspace's
                         has its first nodes, in order: union.py)
  bias    (2, M - 1, A, D)  each drafted node's constant terms in the draft's recursion (round.py)
  matrices (L, A, 2, 2)  the recursion's matrix per level (per parent: (Np, A, 2, 2), a tree's)
  be      (L, A, 2, D)   the draft's b_d and o_d per level
  rows    (L', A, 6)     per level, its step's coefficients in the order A, B, D, E, C, s (L' = max(L, 1)):
                         [[A, B], [D, E]], (A, C) and (B, E) are views
  mp, mq  (Np, A, D)     draft and target means at the parents
  g       (Np, A, K + 1, D) float64: each child's z = x - mp, then mq - mp, per parent
  gram    (Np, A, K + 1, K + 1) float64: their inner products, what the host reads
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import torch

from ..trees import Topology
from ..trees.tables import TreeTables, tables

COLUMNS = 6  # per step: A, B, D, E, C (kernels/base.py) and s (Kernel.round_rows)


class LevelViews(NamedTuple):
    """One level's views of a workspace: its P parents and P w children as (P A, 2, D) batches of (x, c),
    their constant terms likewise, the level's per-parent matrices (P A, 2, 2) (a chain's level: its
    own (A, 2, 2)); a branching level's scratch for the parents' products (P A, 2, D) and its
    (2, P, 1, A, D) view, the children and their constant terms as (2, P, w, A, D); the parents' clip
    inputs (P, A, D); for an affine draft, the level's a_d (A, 1) and the parents', children's
    x-row constants and noise as (P, 1 or w, A, D) grids; the parents' states (P, A, *shape) and
    draft means (P, A, D) for a draft network."""

    width: int
    parents: torch.Tensor
    kids: torch.Tensor
    kid_bias: torch.Tensor
    matrix: torch.Tensor
    wide: torch.Tensor
    wide_grid: torch.Tensor
    kids_grid: torch.Tensor
    bias_grid: torch.Tensor
    parents_c: torch.Tensor
    a: torch.Tensor
    scale: torch.Tensor
    x_parents: torch.Tensor
    x_kids: torch.Tensor
    x_bias: torch.Tensor
    noise: torch.Tensor
    parent_states: torch.Tensor
    mp: torch.Tensor
    mp_grid: torch.Tensor


class HostCopy(NamedTuple):
    gram_tensor: torch.Tensor
    gram: np.ndarray


class Layout:
    """A topology's indices on one device. Parents are nodes 0..Np-1 (breadth first); level d's parents
    are nodes starts[d]..starts[d + 1] - 1 and its children the next level's nodes."""

    def __init__(self, tree: Topology, device: torch.device) -> None:
        self.tree, self.device = tree, device
        self.host: TreeTables = tables(tree)
        t = self.host
        self.depth, self.num_nodes, self.max_width = t.depth, t.num_nodes, t.max_width
        self.num_parents = max(t.num_parents, 1)  # the root's target mean serves a plain step
        self.starts = t.level_starts
        self.is_chain = tree.is_chain
        # children of parents 0..Np-1 are nodes 1..M-1 in order where every level has the same width
        self.uniform = len(set(tree.widths)) <= 1
        long: dict[str, Any] = dict(dtype=torch.long, device=device)
        depth_of = t.node_depth
        self.parent_level = torch.as_tensor(depth_of[: self.num_parents], **long)  # a parent's level
        self.child_level = torch.as_tensor(depth_of[1:] - 1, **long)  # the level that drafted each node
        self.kid_table = torch.as_tensor(t.kids[: t.num_parents].reshape(-1), **long) if t.num_parents else None


@lru_cache(maxsize=256)
def layout_for(tree: Topology, device: torch.device) -> Layout:
    """A topology's Layout, built once per process and device."""
    return Layout(tree, device)


class Mailbox:
    """Small arrays the host writes for the device each round, by name: `host[name]` (numpy) and
    `device[name]` (torch) are views of the same values. On a CPU they share memory, so sending costs
    nothing; on CUDA the host writes a pinned buffer, copied over by `send` (one copy per dtype)."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host, self.device, self._pairs = {}, {}, []
        for dtype in sorted({d for _, d in fields.values()}, key=str):
            names = [n for n, (_, d) in fields.items() if d == dtype]
            sizes = [int(np.prod(fields[n][0])) for n in names]
            host = torch.zeros(sum(sizes), dtype=dtype, pin_memory=self.cuda)
            dev = torch.zeros(sum(sizes), dtype=dtype, device=device) if self.cuda else host
            self._pairs.append((host, dev))
            array = host.numpy()
            at = 0
            for name, size in zip(names, sizes, strict=True):
                shape = fields[name][0]
                self.host[name] = array[at : at + size].reshape(shape)
                self.device[name] = dev[at : at + size].view(shape)
                at += size

    def send(self) -> None:
        if self.cuda:
            for host, dev in self._pairs:
                dev.copy_(host, non_blocking=True)


class Workspace:
    """The buffers of a layout's rounds for `capacity` trajectories (module docstring), reused from round
    to round, with every view the round reads."""

    def __init__(
        self, layout: Layout, capacity: int, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
    ) -> None:
        self.layout, self.capacity, self.shape = layout, capacity, tuple(shape)
        self.device, self.dtype = device, dtype
        a, m, depth, np_, k = capacity, layout.num_nodes, layout.depth, layout.num_parents, layout.max_width
        d = int(np.prod(shape))
        self.values = d
        levels = max(depth, 1)
        self.levels_count = levels
        zeros = lambda *s, dt=dtype: torch.zeros(s, device=device, dtype=dt)
        self.z_storage = zeros((3 * m * a + 1) * d)  # the spare row last
        # slot by slot: a draw into a strided view would take other values than into a contiguous one (torch's
        # CPU normal_ draws contiguous runs in blocks)
        self.noise = zeros(a, max(m - 1, 1), d)
        self.bias = zeros(2, max(m - 1, 1), a, d)
        self.matrices = zeros(levels, a, 2, 2)
        self.parent_matrices = None if layout.is_chain else zeros(np_, a, 2, 2)
        self.be = zeros(levels, a, 2, d)
        self.h = zeros(levels, a)  # a draft's h_d, where it is not an output form's D
        self.h_inner = None if layout.is_chain else zeros(max(np_ - 1, 1), a)
        self.parent_be = None if layout.is_chain else zeros(np_, a, 2, d)
        self.node_be = None if layout.is_chain else zeros(max(m - 1, 1), a, 2, d)
        self.node_rows = None if layout.is_chain else zeros(max(m - 1, 1), a, COLUMNS)
        self.rows = zeros(levels, a, COLUMNS)
        self.parent_rows = self.rows if layout.is_chain or not depth else zeros(np_, a, COLUMNS)
        self.mp, self.mq = zeros(np_, a, d), zeros(np_, a, d)
        self.linear = zeros(np_, a, 2, d)  # the target's A x + B out and D x + E out at the parents
        self.g = zeros(np_, a, k + 1, d, dt=torch.float64)
        self.gram = zeros(np_, a, k + 1, k + 1, dt=torch.float64)
        widest = max((layout.starts[j + 1] - layout.starts[j] for j in range(depth)), default=1)
        self.wide = zeros(widest * a, 2, d)
        self.kid_buffer = None if layout.uniform or not depth else zeros(np_ * k, a, d)
        self.frozen_out = zeros(a, *shape)  # the outputs and states a refresh of the frozen values reads
        self.frozen_x = zeros(a, *shape)
        self.frozen_above = (zeros(a, *shape), zeros(a, *shape))
        self.before = Mailbox({"steps": ((levels, a), torch.long)}, device)
        self.after = Mailbox(
            {
                "commit": ((a,), torch.long),
                "diff_row": ((a,), torch.long),
                "factor": ((a, 1), torch.float64),
                "source": ((a,), torch.long),
                "above": ((a,), torch.long),
                "source_step": ((a,), torch.long),
                "above_step": ((a,), torch.long),
                "leaf": ((a,), torch.long),
                "mine": ((a, 1), torch.bool),
                "direct": ((a, 1), torch.bool),
                "refresh": ((a, 1), torch.bool),
                "known": ((a, 1), torch.bool),
                "held": ((a, 1), torch.bool),
            },
            device,
        )
        self._views()

    @property
    def nbytes(self) -> int:
        buffers = (
            self.z_storage,
            self.noise,
            self.bias,
            self.matrices,
            self.parent_matrices,
            self.be,
            self.h,
            self.h_inner,
            self.parent_be,
            self.node_be,
            self.node_rows,
            self.rows,
            self.mp,
            self.mq,
            self.linear,
            self.g,
            self.gram,
            self.wide,
            self.kid_buffer,
            self.frozen_out,
            self.frozen_x,
            *self.frozen_above,
        )
        return sum(t.nbytes for t in buffers if t is not None) + (
            0 if self.parent_rows is self.rows else self.parent_rows.nbytes
        )

    def _views(self) -> None:  # noqa: PLR0915 (issue 56 splits it)
        lay, a, d = self.layout, self.capacity, self.values
        m, depth, np_, k = lay.num_nodes, lay.depth, lay.num_parents, lay.max_width
        levels_ = self.levels_count
        chain = lay.is_chain
        starts = lay.starts
        self.z = self.z_storage[: 3 * m * a * d].view(3, m, a, d)
        self.x, self.c = self.z[0], self.z[1]  # (M, A, D)
        self.x_flat = self.x.view(m * a, d)
        self.out_flat = self.z_storage[2 * m * a * d :].view(m * a + 1, d)  # row M A: the spare row
        self.out_states = self.out_flat.view(m * a + 1, *self.shape)
        self.x_root, self.c_root, self.out_root = self.x[0], self.c[0], self.z[2, 0]  # (A, D)
        # per parent, (x, c) and (x, out) as (Np A, 2, D): the operands of the batched products
        pairs = lambda planes: self.z[planes, :np_].permute(1, 2, 0, 3).reshape(np_ * a, 2, d)
        self.x_c_parents, self.x_out_parents = pairs(slice(0, 2)), pairs(slice(0, 3, 2))
        self.c_parents = self.c[:np_]
        # per level: the step's rows in the order A, B, D, E, C, s
        rows = self.rows
        self.rows_flat = rows.view(-1, COLUMNS)
        self.scale = rows[:, :, 5:6]  # (L', A, 1)
        self.root_scale = rows[0, :, 5:6]  # (A, 1): s at each root's step
        self.a_c = rows[:, :, 0:5:4]  # (L', A, 2): A and C, an output form's a_d and g_d
        self.b_e = rows[:, :, 1:4:2, None]  # (L', A, 2, 1): B and E, an output form's b_d and o_d over the output
        self.d_next = rows[1:depth, :, 2:3]  # (L - 1, A, 1): h_{d+1}
        self.d_root = rows[0, :, 2:3]  # (A, 1)
        parent_flat = self.parent_rows.view(np_ * a, COLUMNS)
        self.target_matrix = parent_flat[:, :4].view(np_ * a, 2, 2)  # [[A, B], [D, E]] at each parent's step
        self.target_first = parent_flat[:, :2].view(np_ * a, 1, 2)  # [A, B]
        self.target_clip = parent_flat[:, 4:5]  # (Np A, 1): C
        lin = self.linear.view(np_ * a, 2, d)
        self.linear_rows, self.linear_mean, self.linear_clip = lin, lin[:, 0], lin[:, 1]
        self.mq_flat, self.mq_rows = self.mq.view(np_ * a, d), self.mq.view(np_ * a, 1, d)
        self.mq_root = self.mq[0]
        self.mp_rows = self.mp.view(np_ * a, 1, d)
        # the draft's recursion
        self.first_row = self.matrices[:, :, 0, :]  # (L', A, 2): a_d and g_d
        self.a_levels, self.g_levels = self.first_row[..., 0], self.first_row[..., 1]
        self.second_row = self.matrices[: max(depth - 1, 0), :, 1, :]  # h_{d+1} (a_d, g_d), d < L - 1
        self.first_row_inner = self.first_row[: max(depth - 1, 0)]
        self.b_levels, self.o_levels = self.be[:, :, 0], self.be[:, :, 1]  # (L', A, D)
        self.b_states = self.b_levels.view(levels_, a, *self.shape)  # the same, as a draft gives them
        self.o_states = self.o_levels.view(levels_, a, *self.shape)
        self.h_next, self.h_root = self.h[1:depth, :, None], self.h[0, :, None]
        self.h_inner_column = None if self.h_inner is None else self.h_inner[: max(np_ - 1, 0), :, None]
        self.o_next, self.o_root = self.be[1:depth, :, 1], self.be[0, :, 1]
        drafted, inner = max(m - 1, 0), max(np_ - 1, 0)
        self.x_bias, self.c_bias = self.bias[0, :drafted], self.bias[1, :inner]
        self.x_bias_inner = self.bias[0, :inner]
        noise = self.noise.permute(1, 0, 2)  # (M - 1, A, D), node-major as every other buffer
        self.noise_nodes = noise[:drafted]
        if chain:  # a chain's nodes 1..L are its levels' children, its parents its levels
            self.scale_nodes, self.b_nodes = self.scale[:drafted], self.b_levels[:drafted]
            self.first_parents = self.matrices.view(-1, 2, 2)[: np_ * a, :1]  # (L A, 1, 2)
            self.b_parents = self.be.view(-1, 2, d)[: np_ * a, :1]  # (L A, 1, D)
        else:
            # a tree's (not a chain's) buffers
            assert self.node_rows is not None and self.node_be is not None
            assert self.parent_matrices is not None and self.parent_be is not None
            node_rows = self.node_rows
            self.scale_nodes, self.b_nodes = node_rows[:, :, 5:6], self.node_be[:, :, 0]
            self.first_parents = self.parent_matrices.view(np_ * a, 2, 2)[:, :1]
            self.b_parents = self.parent_be.view(np_ * a, 2, d)[:, :1]
            # nodes 1..Np-1 (parents below the root): h and o at their own level, for their c
            self.d_inner = self.parent_rows[1:, :, 2:3]
            self.o_inner = self.parent_be[1:, :, 1]
        self.levels = []
        both = self.z[:2].permute(1, 2, 0, 3)  # (M, A, 2, D)
        bias = self.bias.permute(1, 2, 0, 3)  # (M - 1, A, 2, D)
        for level in range(depth):
            lo, hi, hi2 = starts[level], starts[level + 1], starts[level + 2]
            width, p = lay.tree.widths[level], hi - lo
            matrix = (
                self.matrices[level] if self.parent_matrices is None else self.parent_matrices[lo:hi].view(p * a, 2, 2)
            )
            wide = self.wide[: p * a]
            self.levels.append(
                LevelViews(
                    width=width,
                    parents=both[lo:hi].reshape(p * a, 2, d),
                    kids=both[hi:hi2].reshape((hi2 - hi) * a, 2, d),
                    kid_bias=bias[hi - 1 : hi2 - 1].reshape((hi2 - hi) * a, 2, d),
                    matrix=matrix,
                    wide=wide,
                    wide_grid=wide.view(p, a, 2, d).permute(2, 0, 1, 3)[:, :, None],
                    kids_grid=self.z[:2, hi:hi2].view(2, p, width, a, d),
                    bias_grid=self.bias[:, hi - 1 : hi2 - 1].view(2, p, width, a, d),
                    parents_c=self.c[lo:hi],
                    a=self.matrices[level, :, 0, 0:1],
                    scale=self.rows[level, :, 5:6],
                    x_parents=self.x[lo:hi, None],
                    x_kids=self.x[hi:hi2].view(p, width, a, d),
                    x_bias=self.bias[0, hi - 1 : hi2 - 1].view(p, width, a, d),
                    noise=noise[hi - 1 : hi2 - 1].view(p, width, a, d),
                    parent_states=self.x[lo:hi].view(p, a, *self.shape),
                    mp=self.mp[lo:hi],
                    mp_grid=self.mp[lo:hi, None],
                )
            )
        # the reduction, at the parents
        g = self.g
        self.diff = g[:, :, k]  # (Np, A, D): mq - mp
        self.z_kids = g[:, :, :k]  # (Np, A, K, D)
        self.g_rows = g.view(np_ * a, k + 1, d)
        self.g_cols = self.g_rows.transpose(1, 2)
        self.gram_rows = self.gram.view(np_ * a, k + 1, k + 1)
        self.diff_flat = self.g_rows[:, k]  # (Np A, D)
        self.mp_kids = self.mp[:, :, None]  # (Np, A, 1, D)
        if depth:
            kids = self.x[1:] if lay.uniform else self.kid_buffer
            assert kids is not None  # a tree of unequal levels has its kid buffer
            self.kids = kids.view(np_, k, a, d).permute(0, 2, 1, 3)  # (Np, A, K, D)
        self.root_noise = self.noise[:, 0]  # (A, D): a plain step's xi, always its own first draw
        self.frozen_out_flat = self.frozen_out.view(a, d)
        self.frozen_x_flat = self.frozen_x.view(a, d)
        self.frozen_above_flat = tuple(t.view(a, d) for t in self.frozen_above)
        self.steps_flat = self.before.device["steps"].view(-1)

    def host_view(self) -> HostCopy:
        """The host's view of the inner products the round reads back (numpy)."""
        copy = self.__dict__.get("_host")
        if copy is None:
            gram = (
                torch.zeros(self.gram.shape, dtype=torch.float64, pin_memory=True)
                if self.device.type == "cuda"
                else self.gram
            )
            copy = self.__dict__["_host"] = HostCopy(gram, gram.numpy())
        return copy

    def fetch(self, gram: bool) -> None:
        """Start the round's device-to-host copy (nothing to do on a CPU: the host reads the buffer itself);
        the driver then synchronises once."""
        if self.device.type == "cuda" and gram:
            self.host_view().gram_tensor.copy_(self.gram, non_blocking=True)

    def noise_rows(self, slot: int, count: int) -> torch.Tensor:
        """Slot's first `count` rows of its own tree's noise (a view, made once)."""
        key = (slot, count)
        views = self.__dict__.setdefault("_noise_rows", {})
        if key not in views:
            views[key] = self.noise[slot, :count]
        return views[key]
