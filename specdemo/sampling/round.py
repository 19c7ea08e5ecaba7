"""The fused round's device work (algorithms.md section 4, "The fused round"), on a Workspace's buffers
(layout.py):

  draft          every node of every trajectory's tree: children of node v are m^p(X_v) + s xi;
  target_means   the target's mean at every parent;
  reduce         the inner products the verifiers need.

The target call sits between draft and target_means; the round's one host synchronisation then reads
`gram`, and the host's walk and the commit follow (driver.py).

Drafting a piecewise-affine draft (AffineLevels, every frozen form) as one recursion. With
m^p_d(x) = a_d x + b_d + g_d clip(h_d x + o_d), carry each node's pair (x, c), c = h x + o its clip
input; a child of a node at depth d is

    x' = a_d x + g_d clip(c) + (b_d + s_d xi)
    c' = h_{d+1} x' + o_{d+1} = h_{d+1} (a_d x + g_d clip(c)) + (h_{d+1} (b_d + s_d xi) + o_{d+1}),

so a level is one batched 2x2 matrix product over every parent, clip(c) taken in place before it:
two operations a level for a chain, three where a level branches (the product, then one broadcast
add over the children). The constant terms of every node (the brackets) are formed for all levels at
once. An affine draft (g = 0) needs no c: one operation a level. A draft network (LevelFunction) is
called level by level.

The reduction. At a parent with draft mean mp and target mean mq, each child's z = x - mp and the
difference mq - mp are stacked, and one batched product gives their inner products: <z_k, mq - mp>,
||mq - mp||^2 and the children's <z_j, z_k> (the nearest-sibling prefetch's distances). The host
forms delta = ||mq - mp|| / s and u_k = <z_k, mq - mp> / (||mq - mp|| s) from them (float64).
"""

from __future__ import annotations

import torch

from ..drafts import AffineLevels, LevelFunction
from ..kernels import Kernel
from .layout import Workspace


def draft(ws: Workspace, means: AffineLevels | LevelFunction, y: torch.Tensor, frozen: torch.Tensor | None) -> None:
    """Draft every node of the workspace's tree for every slot from the roots, already in ws.x_root, with
    each slot's noise in ws.noise. y (A, D): the roots; frozen (1, A, 1, D): an output form's output."""
    if isinstance(means, AffineLevels):
        _draft_affine(ws, means, y, frozen)
    else:
        _draft_levels(ws, means)


def _draft_affine(ws: Workspace, lv: AffineLevels, y: torch.Tensor, frozen: torch.Tensor | None) -> None:  # noqa: C901, PLR0912, PLR0915 (issue 56 splits it)
    lay = ws.layout
    # a clip term only where the draft has one: an output form's where the kernel clips, else a gain g
    depth, chain, clipped = lay.depth, lay.is_chain, lv.g is not None or (lv.output is not None and lv.clip is not None)
    # the levels' coefficients in the workspace: (a_d, g_d) in the matrices' first rows, (b_d, o_d) in be
    if lv.output is not None:  # the target's own mean with the frozen output: A, C, D and B, E over it
        assert frozen is not None  # the output an output form's means are taken at
        ws.first_row.copy_(ws.a_c)
        torch.mul(ws.b_e, frozen, out=ws.be)
        h_next, h_root = ws.d_next, ws.d_root
    else:
        assert lv.a is not None and lv.b is not None  # an explicit draft's coefficients
        ws.a_levels.copy_(lv.a)
        ws.b_states.copy_(lv.b)
        if clipped:
            assert lv.g is not None and lv.o is not None and lv.h is not None  # g, and with it h and o
            ws.g_levels.copy_(lv.g)
            ws.o_states.copy_(lv.o)
            ws.h.copy_(lv.h)
            h_next, h_root = ws.h_next, ws.h_root
        else:
            ws.g_levels.zero_()
    # x-row constants of every drafted node: b + s xi at the level that drafted it
    noise = ws.noise_nodes
    if not chain:
        torch.index_select(ws.rows, 0, lay.child_level, out=ws.node_rows)
        torch.index_select(ws.be, 0, lay.child_level, out=ws.node_be)
        torch.index_select(ws.be, 0, lay.parent_level, out=ws.parent_be)
    torch.addcmul(ws.b_nodes, ws.scale_nodes, noise, out=ws.x_bias)
    if not clipped:
        for level in ws.levels:
            torch.addcmul(level.x_bias, level.a, level.x_parents, out=level.x_kids)
    else:
        r = lv.clip
        assert r is not None  # a clip term has its range
        if depth > 1:  # h_{d+1} times the first row; the c-row constants of the parents below the root
            torch.mul(h_next, ws.first_row_inner, out=ws.second_row)
            if chain:
                torch.addcmul(ws.o_next, h_next, ws.x_bias_inner, out=ws.c_bias)
            else:
                if lv.output is None:
                    torch.index_select(ws.h, 0, lay.parent_level[1:], out=ws.h_inner)
                h_inner = ws.d_inner if lv.output is not None else ws.h_inner_column
                assert h_inner is not None  # a tree's (not a chain's) buffers
                torch.addcmul(ws.o_inner, h_inner, ws.x_bias_inner, out=ws.c_bias)
        torch.addcmul(ws.o_root, h_root, y, out=ws.c_root)
        if not chain:
            torch.index_select(ws.matrices, 0, lay.parent_level, out=ws.parent_matrices)
        for level in ws.levels:
            level.parents_c.clamp_(-r, r)
            if level.width == 1:
                torch.baddbmm(level.kid_bias, level.matrix, level.parents, out=level.kids)
            else:
                torch.bmm(level.matrix, level.parents, out=level.wide)
                torch.add(level.wide_grid, level.bias_grid, out=level.kids_grid)
    if not chain and not clipped:
        torch.index_select(ws.matrices, 0, lay.parent_level, out=ws.parent_matrices)
    # the draft means at the parents, from the same coefficients: mp = a x + g clip(c) + b
    torch.baddbmm(ws.b_parents, ws.first_parents, ws.x_c_parents, out=ws.mp_rows)


def _draft_levels(ws: Workspace, means: LevelFunction) -> None:
    """A draft network, level by level: the means at a level's parents, then their children."""
    for depth, level in enumerate(ws.levels):
        level.mp.copy_(means(depth, level.parent_states).reshape(level.mp.shape))
        torch.addcmul(level.mp_grid, level.scale, level.noise, out=level.x_kids)


def target_means(ws: Workspace, kernel: Kernel) -> None:
    """mq at every parent: A x + B out, plus C clip(D x + E out) for a kernel that clips, as one
    batched product over every parent and slot."""
    if kernel.clip_range is None:
        torch.bmm(ws.target_first, ws.x_out_parents, out=ws.mq_rows)
        return
    r = kernel.clip_range
    torch.bmm(ws.target_matrix, ws.x_out_parents, out=ws.linear_rows)
    ws.linear_clip.clamp_(-r, r)
    torch.addcmul(ws.linear_mean, ws.target_clip, ws.linear_clip, out=ws.mq_flat)


def reduce(ws: Workspace) -> None:
    """The inner products of each parent's children's z = x - mp and mq - mp (module docstring)."""
    torch.sub(ws.mq, ws.mp, out=ws.diff)
    if ws.kid_buffer is not None:
        assert ws.layout.kid_table is not None  # a tree with parents
        torch.index_select(ws.x, 0, ws.layout.kid_table, out=ws.kid_buffer)
    torch.sub(ws.kids, ws.mp_kids, out=ws.z_kids)
    torch.bmm(ws.g_rows, ws.g_cols, out=ws.gram_rows)
