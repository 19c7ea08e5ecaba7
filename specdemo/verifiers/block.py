"""Block verification of a chain (Sun et al. 2024, "Block verification accelerates speculative
decoding", arXiv 2403.10444, Algorithm 2), for Gaussian kernels by the rank-one reduction of
algorithms.md section 3; and of a whole tree, path by path (weigh_tree, ours: algorithms.md section 3,
"whole trees", has the derivation).

A chain X_0 -> X_1 -> ... -> X_L was drafted from Q_i = N(m^p(X_{i-1}), s_i^2 I); the target call
gave P_i = N(m^q(X_{i-1}), s_i^2 I) at its internal nodes. With delta_i and u_i the reduction at
X_{i-1} and its child X_i, the density ratio is rho_i = P_i(X_i) / Q_i(X_i) = exp(delta_i u_i - delta_i^2/2).
Instead of stopping at the first child that a node-by-node coupling rejects, the chain is weighed
as a whole:

    p_0 = 1,   p_i = min(1, p_{i-1} rho_i)
    r_i = integral of (p_i P_{i+1} - Q_{i+1})_+ = p_i Phibar(t_i - delta_{i+1}) - Phibar(t_i),
          t_i = delta_{i+1} / 2 - ln(p_i) / delta_{i+1}                                 (i < L)
    h_0 = 1,   h_i = r_i / (r_i + 1 - p_i)  (1 where p_i = 1),   h_L = p_L
    eta = the largest i in 0..L with U_i < h_i

X_1..X_eta are committed bit for bit; when eta < L, so is a draw from the weighted residual
(p_eta P_{eta+1} - Q_{eta+1})_+ / r_eta. Along e its density is proportional to
(phi(u - delta) - lambda phi(u))_+ with lambda = 1 / p_eta, the D-GRS residual (dgrs.py), and it
keeps the orthogonal part z_perp of X_{eta+1}, as RMC's reflection does, so that it stays next to
that evaluated node (whose output nearest-sibling prefetch freezes for the next round). That is
exact although eta looks at the whole chain: since E[p_{i+1} | X_1..X_i] = p_i - r_i, backward
induction from h_L = p_L gives E[prod_{j > i} (1 - h_j) | X_1..X_{i+1}] = 1 - p_{i+1}, so
P(eta = i | X_1..X_{i+1}) = h_i (1 - p_{i+1}) depends on X_{i+1} through u_{i+1} alone, and given
eta = i the z_perp of X_{i+1} is still N(0, I) and independent of u. When eta = L the round ends at
the leaf: Sun et al.'s extra draw from P_{L+1} needs the leaf's target output, which starts the next
round instead (section 4, "a known root").

Contract: the committed path has the law of the target chain given the past, whatever the draft;
the accepted nodes are returned bit for bit. Sun et al. show that no valid verifier of a drafted
block accepts more of it in expectation, node-by-node maximal coupling (RMC) included.
A block of one node is a node coupling with RMC's acceptance 2 Phi(-delta/2), which is what
`acceptance` gives; the auto planner models whole blocks (planning/programme.py). The residual is drawn only
for the rows whose round it ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..trees.tables import TreeTables
from .base import DELTA_FLOOR, Uniforms, Verifier, Walk, WalkTrace, normal_sf, std_normal_log_pdf
from .dgrs import sample_residual
from .rank import PROPOSALS_PER_DRAW, log_order_stat_mixture, rank_residual, select_rank
from .rmc import ReflectionMaximalCoupling

# p_eta below exp(-LOG_WEIGHT_FLOOR) gives r_eta = 0 in float64, so such an eta is never chosen; the
# floor only keeps lambda = 1 / p_eta finite
LOG_WEIGHT_FLOOR = 600.0


def commit_probabilities(h: np.ndarray) -> np.ndarray:
    """(R, L) P(eta >= i | the weighed chain) for i = 1..L from the coins' thresholds h (R, L + 1):
    the coins are independent given the chain, so P(eta >= i) = 1 - prod_{j >= i} (1 - h_j)."""
    return 1 - np.flip(np.cumprod(np.flip(1 - h, 1), 1), 1)[:, 1:]


def log_ratios(delta: np.ndarray, u: np.ndarray) -> np.ndarray:
    """log rho = delta u - delta^2 / 2 of children drawn from P against Q; 0 where P = Q to float64
    precision (delta below DELTA_FLOOR, or NaN)."""
    with np.errstate(invalid="ignore"):
        same = ~(delta >= DELTA_FLOOR)
        return np.where(same, 0.0, delta * u - 0.5 * delta**2)


def block_weights(delta: np.ndarray, u: np.ndarray, depth: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """log p_i and h_i for i = 0..L, both (R, L + 1) float64, from delta_i, u_i (R, L), i = 1..L.

    Entries past a row's depth L_b (NaN inputs there) get h = 0, and h_{L_b} = p_{L_b}; depth None:
    every row's chain has the full length L.
    """
    return path_weights(log_ratios(delta, u), delta, depth)


def path_weights(log_rho: np.ndarray, delta: np.ndarray, depth: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """block_weights from log rho_i (R, L) instead of u_i: the first node's ratio may be taken
    against a residual (weigh_tree); deeper ones are Gaussian, so r_i needs only delta_{i+1}."""
    r, top = delta.shape
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        same = ~(delta >= DELTA_FLOOR)
        # log p_j = min(0, log p_{j-1} + log rho_j) = c_j - max(c_0..c_j), c the running sum of log rho (c_0 = 0)
        c = np.concatenate([np.zeros((r, 1)), np.cumsum(log_rho, 1)], 1)
        log_p = np.minimum(c - np.maximum.accumulate(c, 1), 0.0)
        p = np.exp(log_p)
        d_next = np.where(same, 1.0, delta)  # delta_{i+1} for i = 0..L-1, a placeholder where it is 0
        t = d_next / 2 - log_p[:, :top] / d_next
        rest = np.where(same, 0.0, np.maximum(p[:, :top] * normal_sf(t - d_next) - normal_sf(t), 0.0))
        h = np.where(log_p[:, :top] == 0, 1.0, rest / (rest - np.expm1(log_p[:, :top])))
    if depth is None:
        return log_p, np.concatenate([h, p[:, top:]], 1)
    i = np.arange(top + 1)
    h = np.concatenate([h, np.zeros((r, 1))], 1)
    h = np.where(depth[:, None] == i[None], p, np.where(i[None] < depth[:, None], h, 0.0))
    return log_p, h


def residual_mass(log_lam: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """G(lambda) = integral of (P - lambda Q)_+ = Phibar(tau - delta/2) - lambda Phibar(tau + delta/2),
    tau = ln(lambda) / delta (float64; G(0) = 1; 1 - lambda where P = Q)."""
    with np.errstate(invalid="ignore", over="ignore"):
        same = ~(delta >= DELTA_FLOOR)
        d = np.where(same, 1.0, delta)
        tau = log_lam / d
        mass = normal_sf(tau - d / 2) - np.exp(log_lam) * normal_sf(tau + d / 2)
        return np.maximum(np.where(same, -np.expm1(log_lam), mass), 0.0)


def residual_log_ratio(log_rho: np.ndarray, log_lam: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """log of R_lambda(x) / Q(x) = (rho - lambda)_+ / G(lambda), R_lambda = (P - lambda Q)_+ / G(lambda)
    the residual after rejections up to level lambda; -inf where rho <= lambda (or G = 0). At
    lambda = 0 it is log rho."""
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = log_rho + np.log(-np.expm1(np.minimum(log_lam - log_rho, 0.0)))  # log(rho - lambda)
        out = np.where(log_lam < log_rho, excess, -math.inf) - np.log(residual_mass(log_lam, delta))
    return np.where(np.isneginf(log_lam), log_rho, np.nan_to_num(out, nan=-math.inf))


@dataclass
class RootSelection:
    """Rank-aware selection among the root's K children (verifiers/rank.py): the selected child (R,) in
    0..K-1, its log ratio log phi(u - delta) - log g(u) against the selection's density g, and the
    log-weights (R, K) of g, which the residual (phi(. - delta) - g)_+ needs."""

    child: np.ndarray
    log_ratio: np.ndarray
    log_w: np.ndarray


def select_root_child(delta: np.ndarray, u: np.ndarray, uniform: np.ndarray) -> RootSelection:
    """A rank drawn with w(delta, K) before the children are looked at (uniform (R,)), applied to the
    root's children sorted by u (R, K); P = Q (delta below DELTA_FLOOR): child 1, ratio 1."""
    chosen, u_sel, log_w, _ = select_rank(np.nan_to_num(delta), u, uniform)
    log_ratio = std_normal_log_pdf(u_sel - delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]
    same = ~(delta >= DELTA_FLOOR)
    return RootSelection(np.where(same, 0, chosen), np.where(same, 0.0, log_ratio), log_w)


@dataclass
class TreeWalk:
    """The outcome of weighing a whole tree per row.

    cur: (R,) the committed leaf, or the node whose residual the corrected draw comes from;
    corrected: (R,) bool; log_lam: (R,) float64, that residual's level lambda (R_lambda at cur);
    paths: for each weighed path (one per attempt), (nodes (R, L), length (R,), eta (R,),
    P(eta >= i | the path) (R, L), live (R,): the rows that weighed it).
    """

    cur: np.ndarray
    corrected: np.ndarray
    log_lam: np.ndarray
    paths: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    selected: RootSelection | None = None


def weigh_tree(
    log_rho: np.ndarray, delta: np.ndarray, coins: np.ndarray, tree: TreeTables, selected: RootSelection | None = None
) -> TreeWalk:
    """Block verification of a whole tree (algorithms.md section 3, "whole trees"). log_rho (R, M):
    log rho_n of each node n against its parent's kernels (column 0 unused); delta (R, M) at the
    nodes with children (ignored elsewhere); coins (R, M) uniforms, node n's in column n; tree: the
    topology's TreeTables.

    selected: rank-aware selection among a branching root's children, whose path is weighed first
    (its ratio against the selection's density); its eta = 0 ends the round with the selection's
    residual at the root. Without it, from the root (lambda = 0: the target itself), and after it
    below the root, each attempt weighs the leftmost path below the
    next untried child c of the current node v as a chain (path_weights), c's ratio taken against
    the residual R_lambda there. eta = 0: c is rejected, lambda <- lambda + G(lambda) (D-GRS's
    stairs) and the next child is tried. 0 < eta < its length: the path is committed down to its
    eta-th node w, whose residual is (p_eta P - Q)_+, i.e. lambda = 1 / p_eta, and w's next child
    is tried. The leaf reached: committed. A node whose children are all tried ends the round with
    a draw from R_lambda there. max_attempts masked iterations."""
    r = log_rho.shape[0]
    ar = np.arange(r)
    v = np.zeros(r, dtype=np.int64)
    k = np.zeros_like(v)
    cur = np.zeros_like(v)
    log_lam = np.full(r, -math.inf)
    done = np.zeros(r, dtype=bool)
    corrected = np.zeros_like(done)
    paths = []
    top = tree.depth
    for attempt in range(tree.max_attempts):
        live = ~done
        root_pick = attempt == 0 and selected is not None  # the root's one selected child
        c = 1 + selected.child if root_pick and selected is not None else np.where(live, tree.first_child[v] + k, 1)
        path, length = tree.leftmost[c, :top], tree.length[c]
        inside = np.arange(top)[None] < length[:, None]
        above = np.concatenate([v[:, None], path[:, :-1]], 1)
        d = np.where(inside, np.take_along_axis(delta, above, 1), np.nan)
        lr = np.take_along_axis(log_rho, path, 1)
        first = (
            selected.log_ratio[:, None]
            if root_pick and selected is not None
            else residual_log_ratio(lr[:, :1], log_lam[:, None], d[:, :1])
        )
        lr = np.concatenate([first, lr[:, 1:]], 1)
        log_p, h = path_weights(np.where(inside, lr, 0.0), d, length)
        hits = np.take_along_axis(coins, path, 1) < h[:, 1:]
        eta = top - np.concatenate([np.ones((r, 1), bool), hits], 1)[:, ::-1].argmax(1)
        paths.append((path, length, eta, np.where(inside, commit_probabilities(h), np.nan), live))
        leaf, rejected = eta == length, eta == 0
        w = path[ar, np.maximum(eta - 1, 0)]
        with np.errstate(divide="ignore"):
            stepped = np.logaddexp(log_lam, np.log(residual_mass(log_lam, d[:, 0])))
        weighted = -np.maximum(log_p[ar, eta], -LOG_WEIGHT_FLOOR)
        v_next = np.where(rejected, v, w)
        k_next = np.where(rejected, k + 1, 1)
        exhausted = (k_next >= tree.num_children[v_next]) | (rejected if root_pick else False)
        ends = live & (leaf | exhausted)
        cur = np.where(live & leaf, path[ar, length - 1], np.where(ends, v_next, cur))
        corrected |= ends & ~leaf
        v, k = np.where(live, v_next, v), np.where(live, k_next, k)
        log_lam = np.where(live, np.where(rejected, stepped, weighted), log_lam)
        done |= ends
    return TreeWalk(cur, corrected, log_lam, paths, selected)


class BlockVerification(Verifier):
    name = "block"
    weighs_whole_tree = True

    def uniforms_per_round(self, tree: TreeTables) -> int:
        # a coin per node (a chain's U_0..U_L; the root's draws the rank of a branching root), the
        # residual's, and the proposals of a branching root's residual
        return tree.num_nodes + 1 + (2 * PROPOSALS_PER_DRAW if tree.widths[0] > 1 else 0)

    def walk(
        self,
        tree: TreeTables,
        delta: np.ndarray,
        u: np.ndarray,
        uniforms: np.ndarray,
        rng: Uniforms,
        trace: bool = False,
    ) -> Walk:
        if tree.is_chain:
            return self._walk_chain(tree, delta, u, uniforms, trace)
        return self._walk_tree(tree, delta, u, uniforms, rng, trace)

    def _walk_chain(
        self, tree: TreeTables, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, trace: bool
    ) -> Walk:
        """Weigh each row's chain at once: delta_i, u_i of nodes i = 1..L, coins U_0..U_L, the residual's
        uniform last."""
        top = tree.depth
        log_p, h = block_weights(delta, u[:, 1:])
        coins = uniforms[:, : top + 1] < h
        eta = top - coins[:, ::-1].argmax(1)  # the last i with U_i < h_i (h_0 = 1: always one)
        corrected = eta < top
        r = delta.shape[0]
        ar = np.arange(r)
        stop = np.minimum(eta, top - 1)
        u_new = np.full(r, np.nan)
        if corrected.any():  # lambda = 1 / p_eta at node eta, keeping z_perp of node eta + 1
            rows = ar[corrected]
            u_new[rows] = self.residual(delta[rows, stop[rows]], -log_p[rows, eta[rows]], uniforms[rows, top + 1])
        end = np.where(corrected, eta + 1, top)
        node = np.where(corrected, eta, top)
        record = None
        if trace:
            record = WalkTrace.empty(r, tree.num_nodes)
            accept = commit_probabilities(h)  # (R, L): P(eta >= i), at node i and its parent
            rows, j = np.nonzero(np.arange(top)[None] < end[:, None])
            record.delta[rows, j] = delta[rows, j]
            record.node_accept_prob[rows, j] = record.child_accept_prob[rows, j + 1] = accept[rows, j]
            record.accepted[rows, j + 1] = j < eta[rows]
            record.rejected[rows, j + 1] = j >= eta[rows]
        return Walk(end, corrected, node, np.where(corrected, eta + 1, top), u_new, record)

    def _walk_tree(
        self, tree: TreeTables, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, rng: Uniforms, trace: bool
    ) -> Walk:
        """A tree that is not a chain (weigh_tree): every node's log rho against its parent, node n's coin
        in column n, the residual's in column M, a branching root's proposals after it."""
        m = tree.num_nodes
        r = delta.shape[0]
        node_delta = np.full((r, m), np.nan)
        node_delta[:, : tree.num_parents] = delta
        log_rho = log_ratios(node_delta[:, np.maximum(tree.parent, 0)], u)
        root_width = tree.widths[0]
        selected = None
        if root_width > 1:
            selected = select_root_child(delta[:, 0], u[:, 1 : 1 + root_width], uniforms[:, 0])
        walk = weigh_tree(log_rho, node_delta, uniforms[:, :m], tree, selected)
        cur, corrected = walk.cur, walk.corrected
        end = np.where(corrected, tree.node_depth[cur] + 1, tree.depth)
        child = np.where(corrected, tree.first_child[np.minimum(cur, tree.num_parents - 1)], cur)
        u_new = np.full(r, np.nan)
        if corrected.any():
            rows = np.flatnonzero(corrected)
            at_root = rows[end[rows] == 1] if selected is not None else rows[:0]
            if at_root.size:  # the selection's residual (phi - g)_+, keeping the selected child's z_perp
                assert selected is not None  # at_root is empty without a selection
                child[at_root] = 1 + selected.child[at_root]
                u_new[at_root] = rank_residual(
                    delta[at_root, 0], selected.log_w[at_root], uniforms[at_root, m + 1 :], rng, at_root
                )
            rows = np.setdiff1d(rows, at_root)
            if rows.size:  # R_lambda at cur, keeping z_perp of its first child
                u_new[rows] = self.residual(delta[rows, cur[rows]], walk.log_lam[rows], uniforms[rows, m])
        record = _trace_tree_walk(walk, node_delta, tree, r) if trace else None
        return Walk(end, corrected, cur, child, u_new, record)

    def residual(self, delta: np.ndarray, log_lam: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """u_new from the residual R_lambda = (P - lambda Q)_+ / G(lambda) where a round stops: delta and
        log lambda (R,) of those rows (a chain's first node not committed: lambda = 1 / p_eta), and each
        row's residual uniform."""
        return sample_residual(delta, np.exp(np.minimum(log_lam, LOG_WEIGHT_FLOOR)), uniform)

    def acceptance(self, delta: np.ndarray, k: int = 1) -> np.ndarray:
        return ReflectionMaximalCoupling().acceptance(delta, k)


def _trace_tree_walk(walk: TreeWalk, delta: np.ndarray, tree: TreeTables, r: int) -> WalkTrace:
    """A whole tree weighed path by path: on each path, its committed nodes accepted and the first
    one not committed rejected, each with P(eta >= i | the path) (at the node and at its parent),
    and delta at their parents."""
    record = WalkTrace.empty(r, tree.num_nodes)
    for path, length, eta, accept, live in walk.paths:
        seen = np.minimum(eta + 1, length)
        rows, j = np.nonzero((np.arange(path.shape[1])[None] < seen[:, None]) & live[:, None])
        nodes = path[rows, j]
        above = tree.parent[nodes]
        record.delta[rows, above] = delta[rows, above]
        record.node_accept_prob[rows, above] = record.child_accept_prob[rows, nodes] = accept[rows, j]
        record.accepted[rows, nodes] = j < eta[rows]
        record.rejected[rows, nodes] = j >= eta[rows]
    return record
