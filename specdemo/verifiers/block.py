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
`acceptance` gives; the auto planner models whole blocks (trees/auto.py). The residual is drawn only
for the rows whose round it ends (`residual`), once the driver knows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import DELTA_FLOOR, RankOne, TreeVerifier, normal_sf, std_normal_log_pdf
from .dgrs import sample_residual
from .rank import PROPOSALS_PER_DRAW, RankAwareSelection, log_order_stat_mixture
from .rmc import ReflectionMaximalCoupling

# p_eta below exp(-LOG_WEIGHT_FLOOR) gives r_eta = 0 in float64, so such an eta is never chosen; the
# floor only keeps lambda = 1 / p_eta finite
LOG_WEIGHT_FLOOR = 600.0


@dataclass
class BlockVerdict:
    """The outcome of weighing one chain per row.

    eta: (A,) the number of drafted nodes committed as they are.
    log_p: (A, L + 1) float64, log p_i for i = 0..L (the residual where eta < L_b uses log p_eta).
    h: (A, L + 1) float64, the coins' thresholds h_i.
    depth: (A,) each row's L_b, or None where every chain has the full length L.
    """

    eta: torch.Tensor
    log_p: torch.Tensor
    h: torch.Tensor
    depth: torch.Tensor | None

    @property
    def accept_prob(self) -> torch.Tensor:
        """(A, L) P(eta >= i | the drafted chain) for i = 1..L: the probability that node i was
        committed, given everything drafted (NaN past a row's depth). The coins are independent
        given the chain: P(eta >= i) = 1 - prod_{j >= i} (1 - h_j)."""
        top = self.h.shape[1] - 1
        committed = commit_probabilities(self.h)
        if self.depth is None:
            return committed
        inside = torch.arange(1, top + 1, device=self.h.device)[None] <= self.depth[:, None]
        return torch.where(inside, committed, float("nan"))


def commit_probabilities(h: torch.Tensor) -> torch.Tensor:
    """(A, L) P(eta >= i | the weighed chain) for i = 1..L from the coins' thresholds h (A, L + 1):
    the coins are independent given the chain, so P(eta >= i) = 1 - prod_{j >= i} (1 - h_j)."""
    return 1 - torch.flip(torch.cumprod(torch.flip(1 - h, [1]), 1), [1])[:, 1:]


def block_weights(delta: torch.Tensor, u: torch.Tensor, depth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_i and h_i for i = 0..L, both (A, L + 1) float64, from delta_i, u_i (A, L), i = 1..L.

    Entries past a row's depth L_b (NaN inputs there) get h = 0, and h_{L_b} = p_{L_b}; depth None:
    every row's chain has the full length L.
    """
    same = ~(delta >= DELTA_FLOOR)  # P_i = Q_i to float64 precision (NaN past the depth too): rho_i = 1
    return path_weights(torch.where(same, 0.0, delta * u - 0.5 * delta**2), delta, depth)


def path_weights(log_rho: torch.Tensor, delta: torch.Tensor,
                 depth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """block_weights from log rho_i (A, L) instead of u_i: the first node's ratio may be taken
    against a residual (TreeWalk); deeper ones are Gaussian, so r_i needs only delta_{i+1}."""
    a, top = delta.shape
    same = ~(delta >= DELTA_FLOOR)
    # log p_j = min(0, log p_{j-1} + log rho_j) = c_j - max(c_0..c_j), c the running sum of log rho (c_0 = 0)
    c = torch.cat([torch.zeros_like(log_rho[:, :1]), log_rho.cumsum(1)], 1)
    log_p = (c - c.cummax(1).values).clamp_max(0.0)
    p = log_p.exp()
    d_next = torch.where(same, 1.0, delta)  # delta_{i+1} for i = 0..L-1, a placeholder where it is 0
    t = d_next / 2 - log_p[:, :top] / d_next
    r = torch.where(same, 0.0, (p[:, :top] * normal_sf(t - d_next) - normal_sf(t)).clamp_min(0.0))
    h = torch.where(log_p[:, :top] == 0, 1.0, r / (r - torch.expm1(log_p[:, :top])))
    if depth is None:
        return log_p, torch.cat([h, p[:, top:]], 1)
    i = torch.arange(top + 1, device=delta.device)
    h = torch.cat([h, torch.zeros_like(h[:, :1])], 1)
    last = depth[:, None] == i[None]
    h = torch.where(last, p, torch.where(i[None] < depth[:, None], h, 0.0))
    return log_p, h


def residual_mass(log_lam: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """G(lambda) = integral of (P - lambda Q)_+ = Phibar(tau - delta/2) - lambda Phibar(tau + delta/2),
    tau = ln(lambda) / delta (float64; G(0) = 1; 1 - lambda where P = Q)."""
    same = ~(delta >= DELTA_FLOOR)
    d = torch.where(same, 1.0, delta)
    tau = log_lam / d
    mass = normal_sf(tau - d / 2) - log_lam.exp() * normal_sf(tau + d / 2)
    return torch.where(same, -torch.expm1(log_lam), mass).clamp_min(0.0)


def residual_log_ratio(log_rho: torch.Tensor, log_lam: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """log of R_lambda(x) / Q(x) = (rho - lambda)_+ / G(lambda), R_lambda = (P - lambda Q)_+ / G(lambda)
    the residual after rejections up to level lambda; -inf where rho <= lambda (or G = 0). At
    lambda = 0 it is log rho."""
    excess = log_rho + torch.log(-torch.expm1((log_lam - log_rho).clamp_max(0.0)))  # log(rho - lambda)
    out = torch.where(log_lam < log_rho, excess, -math.inf) - residual_mass(log_lam, delta).log()
    return torch.where(torch.isneginf(log_lam), log_rho, out.nan_to_num(-math.inf))


@dataclass(frozen=True)
class TreeTables:
    """A topology's indices for the tree walk (on one device): node n's leftmost descent
    leftmost[n, j] (n itself at j = 0, the leaf repeated past it) and its length to the leaf
    (nodes, n included), first_child, num_children, and max_attempts = 1 + sum_d (w_d - 1), the
    most paths one walk can weigh (each path after the first takes a child other than the first
    of a node on the committed path)."""

    leftmost: torch.Tensor
    length: torch.Tensor
    first_child: torch.Tensor
    num_children: torch.Tensor
    max_attempts: int

    @classmethod
    def of(cls, tree, device: torch.device) -> "TreeTables":
        depth, node_depth = tree.depth, tree.node_depth
        first = tree.first_child.clamp_max(tree.num_nodes - 1)
        leftmost = torch.arange(tree.num_nodes)[:, None].repeat(1, depth)
        for j in range(1, depth):
            deeper = node_depth + j <= depth
            leftmost[:, j] = torch.where(deeper, first[leftmost[:, j - 1]], leftmost[:, j - 1])
        widths = torch.tensor((*tree.widths, 0), dtype=torch.long)
        return cls(leftmost.to(device), (depth - node_depth + 1).to(device), tree.first_child.to(device),
                   widths[node_depth].to(device), 1 + sum(w - 1 for w in tree.widths))


@dataclass
class TreeWalk:
    """The outcome of weighing a whole tree per row.

    cur: (A,) the committed leaf, or the node whose residual the corrected draw comes from;
    corrected: (A,) bool; log_lam: (A,) float64, that residual's level lambda (R_lambda at cur);
    paths: for each weighed path (one per attempt), (nodes (A, L), length (A,), eta (A,),
    P(eta >= i | the path) (A, L), live (A,): the rows that weighed it).
    """

    cur: torch.Tensor
    corrected: torch.Tensor
    log_lam: torch.Tensor
    paths: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    selected: "RootSelection | None" = None


@dataclass
class RootSelection:
    """Rank-aware selection among the root's K children (verifiers/rank.py): the selected child
    (A,) in 0..K-1, its log ratio log phi(u - delta) - log g(u) against the selection's density g,
    and the log-weights (A, K) of g, which the residual (phi(. - delta) - g)_+ needs."""

    child: torch.Tensor
    log_ratio: torch.Tensor
    log_w: torch.Tensor


def select_root_child(delta: torch.Tensor, u: torch.Tensor, uniform: torch.Tensor) -> RootSelection:
    """A rank drawn with w(delta, K) before the children are looked at (uniform (A,)), applied to
    the root's children sorted by u (A, K); P = Q (delta below DELTA_FLOOR): child 1, ratio 1."""
    chosen, u_sel, log_w, _ = RankAwareSelection()._select(RankOne(delta, u, None, None), uniform[:, None])
    log_ratio = std_normal_log_pdf(u_sel - delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]
    same = ~(delta >= DELTA_FLOOR)
    return RootSelection(torch.where(same, 0, chosen), torch.where(same, 0.0, log_ratio), log_w)


def weigh_tree(log_rho: torch.Tensor, delta: torch.Tensor, coins: torch.Tensor, tables: TreeTables,
               selected: RootSelection | None = None) -> TreeWalk:
    """Block verification of a whole tree (algorithms.md section 3, "whole trees"). log_rho (A, M):
    log rho_n of each node n against its parent's kernels (column 0 unused); delta (A, M) at the
    nodes with children (ignored elsewhere); coins (A, M) uniforms, node n's in column n.

    selected: rank-aware selection among a branching root's children, whose path is weighed first
    (its ratio against the selection's density); its eta = 0 ends the round with the selection's
    residual at the root. Without it, from the root (lambda = 0: the target itself), and after it
    below the root, each attempt weighs the leftmost path below the
    next untried child c of the current node v as a chain (path_weights), c's ratio taken against
    the residual R_lambda there. eta = 0: c is rejected, lambda <- lambda + G(lambda) (D-GRS's
    stairs) and the next child is tried. 0 < eta < its length: the path is committed down to its
    eta-th node w, whose residual is (p_eta P - Q)_+, i.e. lambda = 1 / p_eta, and w's next child
    is tried. The leaf reached: committed. A node whose children are all tried ends the round with
    a draw from R_lambda there. No host synchronisation: max_attempts masked iterations."""
    a = log_rho.shape[0]
    device = log_rho.device
    ar = torch.arange(a, device=device)
    v = torch.zeros(a, dtype=torch.long, device=device)
    k = torch.zeros_like(v)
    cur = torch.zeros_like(v)
    log_lam = torch.full((a,), -math.inf, dtype=torch.float64, device=device)
    done = torch.zeros(a, dtype=torch.bool, device=device)
    corrected = torch.zeros_like(done)
    paths = []
    for attempt in range(tables.max_attempts):
        live = ~done
        root_pick = attempt == 0 and selected is not None  # the root's one selected child
        c = 1 + selected.child if root_pick else torch.where(live, tables.first_child[v] + k, 1)
        path, length = tables.leftmost[c], tables.length[c]
        top = path.shape[1]
        inside = torch.arange(top, device=device)[None] < length[:, None]
        above = torch.cat([v[:, None], path[:, :-1]], 1)
        d = torch.where(inside, delta.gather(1, above), math.nan)
        lr = log_rho.gather(1, path)
        first = selected.log_ratio[:, None] if root_pick else residual_log_ratio(lr[:, :1], log_lam[:, None], d[:, :1])
        lr = torch.cat([first, lr[:, 1:]], 1)
        log_p, h = path_weights(torch.where(inside, lr, 0.0), d, length)
        hits = coins.gather(1, path) < h[:, 1:]
        eta = top - torch.cat([torch.ones_like(hits[:, :1]), hits], 1).flip(1).int().argmax(1)
        paths.append((path, length, eta, torch.where(inside, commit_probabilities(h), math.nan), live))
        leaf, rejected = eta == length, eta == 0
        w = path.gather(1, (eta - 1).clamp_min(0)[:, None])[:, 0]
        stepped = torch.logaddexp(log_lam, residual_mass(log_lam, d[:, 0]).log())
        weighted = -log_p.gather(1, eta[:, None])[:, 0].clamp_min(-LOG_WEIGHT_FLOOR)
        v_next = torch.where(rejected, v, w)
        k_next = torch.where(rejected, k + 1, 1)
        exhausted = (k_next >= tables.num_children[v_next]) | (rejected if root_pick else False)
        ends = live & (leaf | exhausted)
        cur = torch.where(live & leaf, path[ar, length - 1], torch.where(ends, v_next, cur))
        corrected |= ends & ~leaf
        v, k = torch.where(live, v_next, v), torch.where(live, k_next, k)
        log_lam = torch.where(live, torch.where(rejected, stepped, weighted), log_lam)
        done |= ends
    return TreeWalk(cur, corrected, log_lam, paths, selected)


class BlockVerification(TreeVerifier):
    name = "block"

    def uniforms_per_tree(self, tree) -> int:
        # a coin per node (a chain's U_0..U_L; the root's draws the rank of a branching root), the
        # residual's, and the proposals of a branching root's residual
        return tree.num_nodes + 1 + (2 * PROPOSALS_PER_DRAW if tree.widths[0] > 1 else 0)

    def verify_chain(self, delta: torch.Tensor, u: torch.Tensor, depth: torch.Tensor | None,
                     uniforms: torch.Tensor) -> BlockVerdict:
        """delta, u: (A, L) float64, delta_i and u_i of each row's chain (NaN past its depth L_b;
        depth None: every chain is full); uniforms (A, M), M >= L + 2, on [0, 1): columns 0..L are
        the coins U_i, the last one is the residual's (so that a row's draws do not depend on the
        longest chain of its batch)."""
        top = delta.shape[1]
        log_p, h = block_weights(delta, u, depth)
        coins = uniforms[:, :top + 1] < h
        eta = top - coins.flip(1).int().argmax(1)  # the last i with U_i < h_i (h_0 = 1: always one)
        return BlockVerdict(eta=eta, log_p=log_p, h=h, depth=depth)

    def weigh_tree(self, log_rho: torch.Tensor, delta: torch.Tensor, uniforms: torch.Tensor,
                   tables: TreeTables, root_u: torch.Tensor) -> TreeWalk:
        """A tree that is not a chain (weigh_tree); uniforms (A, uniforms_per_tree), node n's coin in
        column n; root_u (A, K) the projections of the root's children."""
        m = log_rho.shape[1]
        selected = select_root_child(delta[:, 0], root_u, uniforms[:, 0]) if root_u.shape[1] > 1 else None
        return weigh_tree(log_rho, delta, uniforms[:, :m], tables, selected)

    def root_residual(self, delta, log_w, uniforms, rng, rows) -> torch.Tensor:
        """u_new from (phi(. - delta) - g)_+ where the selected child's path gave eta = 0 (rank-aware
        selection's residual; uniforms (A, 2 PROPOSALS_PER_DRAW))."""
        return RankAwareSelection._residual(delta, log_w, uniforms, rng, rows)

    def residual(self, delta: torch.Tensor, log_lam: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """u_new from the residual R_lambda = (P - lambda Q)_+ / G(lambda) where a round stops: delta
        and log lambda (A,) of those rows (a chain's first node not committed: lambda = 1 / p_eta),
        and each row's residual uniform."""
        return sample_residual(delta, log_lam.clamp_max(LOG_WEIGHT_FLOOR).exp(), uniform)

    def acceptance(self, delta, k=1):
        return ReflectionMaximalCoupling().acceptance(delta, k)
