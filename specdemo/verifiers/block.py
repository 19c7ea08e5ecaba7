"""Block verification of a chain (Sun et al. 2024, "Block verification accelerates speculative
decoding", arXiv 2403.10444, Algorithm 2), for Gaussian kernels by the rank-one reduction of
algorithms.md section 3.

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

from dataclasses import dataclass

import torch

from .base import DELTA_FLOOR, ChainVerifier, normal_sf
from .dgrs import sample_residual
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
        survive = torch.flip(torch.cumprod(torch.flip(1 - self.h, [1]), 1), [1])
        if self.depth is None:
            return 1 - survive[:, 1:]
        inside = torch.arange(1, top + 1, device=self.h.device)[None] <= self.depth[:, None]
        return torch.where(inside, 1 - survive[:, 1:], float("nan"))


def block_weights(delta: torch.Tensor, u: torch.Tensor, depth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_i and h_i for i = 0..L, both (A, L + 1) float64, from delta_i, u_i (A, L), i = 1..L.

    Entries past a row's depth L_b (NaN inputs there) get h = 0, and h_{L_b} = p_{L_b}; depth None:
    every row's chain has the full length L.
    """
    a, top = delta.shape
    same = ~(delta >= DELTA_FLOOR)  # P_i = Q_i to float64 precision (NaN past the depth too): rho_i = 1
    log_rho = torch.where(same, 0.0, delta * u - 0.5 * delta**2)
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


class BlockVerification(ChainVerifier):
    name = "block"

    def uniforms_per_chain(self, length: int) -> int:
        return length + 2  # the coins U_0..U_L, and the residual's

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

    def residual(self, delta: torch.Tensor, log_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """u_new from the weighted residual (p_eta P - Q)_+ at the first node not committed: delta
        and log_p = log p_eta (A,) of those rows, and each row's residual uniform."""
        lam = torch.exp(-log_p.clamp_min(-LOG_WEIGHT_FLOOR))
        return sample_residual(delta, lam, uniform)

    def acceptance(self, delta, k=1):
        return ReflectionMaximalCoupling().acceptance(delta, k)
