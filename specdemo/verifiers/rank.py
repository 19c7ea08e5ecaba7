"""Rank-aware selection with maximal coupling (algorithms.md section 3; after arXiv 2610.02251).

Contract: the committed state is an exact draw from N(mq, s^2 I); an accepted child is returned bit
for bit. The K children are sorted by their projection u; a rank r is drawn with weights
w_r(delta, K) fixed before the children are looked at, so the selected u has density

    g(u) = sum_r w_r f_(r)(u),  f_(r)(u) = K C(K-1, r-1) Phi(u)^(r-1) Phibar(u)^(K-r) phi(u),

the r-th order statistic of K standard normals. The selected child is accepted with probability
min(1, phi(u - delta) / g(u)); otherwise u is drawn from (phi(. - delta) - g)_+ normalised and the
selected child's z_perp is kept. Acceptance is the integral of min(phi(. - delta), g), exact for any
weights; the weights maximising it come from a linear programme on a grid, solved once per
(delta bucket, K) and cached.

The residual is drawn by rejection from N(delta, 1) with acceptance (1 - g / phi(. - delta))_+:
exact with no root finding, and one proposal per verified node on average (a rejection has
probability 1 - acceptance and costs 1 / (1 - acceptance) proposals).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from scipy import optimize, sparse

from .base import DELTA_FLOOR, Decision, NodeVerifier, RankOne, std_normal_log_pdf

DELTA_BUCKET_RATIO = 1.04  # weights are solved at the geometric centre of [ratio^b, ratio^(b+1))
DELTA_MIN, DELTA_MAX = 1e-3, 64.0
GRID_POINTS = 1201
TABLE_MAX_K = 8
WEIGHT_TABLE = Path(__file__).with_name("rank_weights.npz")
PROPOSALS_PER_DRAW = 16


def log_order_stat_mixture(u: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
    """log g(u) for u (A, M) and log-weights (A, K) (float64)."""
    k = log_w.shape[-1]
    r = torch.arange(1, k + 1, dtype=torch.float64, device=u.device)
    log_binom = torch.lgamma(torch.tensor(k, dtype=torch.float64)) - torch.lgamma(r) - torch.lgamma(k - r + 1)
    log_cdf, log_sf = torch.special.log_ndtr(u)[..., None], torch.special.log_ndtr(-u)[..., None]
    log_f = math.log(k) + log_binom + (r - 1) * log_cdf + (k - r) * log_sf + std_normal_log_pdf(u)[..., None]
    return (log_w[:, None, :] + log_f).logsumexp(-1)


def delta_buckets(delta: torch.Tensor) -> torch.Tensor:
    """Bucket b holds delta in [ratio^b, ratio^(b+1)), delta clamped to [DELTA_MIN, DELTA_MAX]."""
    return (delta.clamp(DELTA_MIN, DELTA_MAX).log() / math.log(DELTA_BUCKET_RATIO)).floor().long()


def solve_rank_weights(bucket: int, k: int) -> tuple[float, ...]:
    """w(delta, K) maximising the integral of min(phi(. - delta), g) on a grid, at the bucket's centre.

    Linear programme over (w, m): maximise h sum_i m_i subject to m_i <= phi(u_i - delta),
    m_i <= sum_r w_r f_(r)(u_i), w >= 0, sum_r w_r = 1.
    """
    if k == 1:
        return (1.0,)
    delta = DELTA_BUCKET_RATIO ** (bucket + 0.5)
    u = torch.linspace(-9.0, delta + 9.0, GRID_POINTS, dtype=torch.float64)
    h = float(u[1] - u[0])
    eye = torch.eye(k, dtype=torch.float64).clamp_min(1e-300).log()
    f = log_order_stat_mixture(u.expand(k, -1), eye).exp().T.numpy()  # (M, K): f_(r)(u_i)
    target = std_normal_log_pdf(u - delta).exp().numpy()
    m = GRID_POINTS
    ident = sparse.identity(m, format="csr")
    a_ub = sparse.vstack([sparse.hstack([sparse.csr_matrix((m, k)), ident]), sparse.hstack([sparse.csr_matrix(-f), ident])])
    res = optimize.linprog(
        c=np.concatenate([np.zeros(k), -h * np.ones(m)]), A_ub=a_ub, b_ub=np.concatenate([target, np.zeros(m)]),
        A_eq=np.concatenate([np.ones(k), np.zeros(m)])[None], b_eq=[1.0], bounds=(0, None), method="highs",
    )
    if not res.success:  # any weights are exact; fall back to the parent density's (uniform ranks)
        return (1.0 / k,) * k
    w = np.clip(res.x[:k], 0.0, None)
    return tuple((w / w.sum()).tolist())


@lru_cache(maxsize=None)
def _shipped_table() -> dict:
    """(weights, acceptance at the bucket's two ends) solved ahead of time for K = 2..TABLE_MAX_K
    and every bucket (write_weight_table)."""
    try:
        with np.load(WEIGHT_TABLE) as z:
            return {(int(b), int(k)): (tuple(w[:k].tolist()), tuple(a.tolist()))
                    for b, k, w, a in zip(z["bucket"], z["k"], z["weights"], z["acceptance"])}
    except (OSError, KeyError):
        return {}


def _edges(bucket: int) -> torch.Tensor:
    return torch.tensor([DELTA_BUCKET_RATIO**bucket, DELTA_BUCKET_RATIO ** (bucket + 1)], dtype=torch.float64)


def _solve(bucket: int, k: int) -> tuple[tuple[float, ...], tuple[float, float]]:
    w = solve_rank_weights(bucket, k)
    return w, tuple(integrated_acceptance(_edges(bucket), torch.tensor([w, w], dtype=torch.float64)).tolist())


def rank_weights(bucket: int, k: int) -> tuple[float, ...]:
    """w(delta, K) for a bucket: from the shipped table, else solved now (and cached)."""
    return _bucket(bucket, k)[0]


def bucket_acceptance(bucket: int, k: int) -> tuple[float, float]:
    """Acceptance with the bucket's weights at the bucket's two ends (for interpolation)."""
    return _bucket(bucket, k)[1]


@lru_cache(maxsize=None)
def _bucket(bucket: int, k: int):
    return _shipped_table().get((bucket, k)) or _solve(bucket, k)


def write_weight_table(path: Path = WEIGHT_TABLE) -> None:
    """Solve every (bucket, K) of the shipped range and save it (about a minute). Rebuild with
    python -c "from specdemo.verifiers.rank import write_weight_table; write_weight_table()"."""
    lo, hi = delta_buckets(torch.tensor([DELTA_MIN, DELTA_MAX], dtype=torch.float64)).tolist()
    keys = [(b, k) for k in range(2, TABLE_MAX_K + 1) for b in range(lo, hi + 1)]
    solved = [_solve(b, k) for b, k in keys]
    weights = np.zeros((len(keys), TABLE_MAX_K))
    for i, ((_, k), (w, _)) in enumerate(zip(keys, solved)):
        weights[i, :k] = w
    np.savez_compressed(path, bucket=np.array([b for b, _ in keys]), k=np.array([k for _, k in keys]),
                        weights=weights, acceptance=np.array([a for _, a in solved]))


@lru_cache(maxsize=None)
def _dense_table(k: int, device: torch.device) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(first bucket, weights (B, K), acceptance at each bucket's ends (B, 2)) over every bucket of
    [DELTA_MIN, DELTA_MAX], on `device`: rows are gathered by bucket, with no host round trip."""
    lo, hi = delta_buckets(torch.tensor([DELTA_MIN, DELTA_MAX], dtype=torch.float64)).tolist()
    rows = [_bucket(b, k) for b in range(lo, hi + 1)]
    weights = torch.tensor([w for w, _ in rows], dtype=torch.float64, device=device)
    ends = torch.tensor([a for _, a in rows], dtype=torch.float64, device=device)
    return lo, weights, ends


def weights_for(delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, K) weights for each row's delta (float64), and the acceptance they give: the integral
    of min(phi(. - delta), g), interpolated in log delta between the bucket's ends."""
    buckets = delta_buckets(delta)
    if k <= TABLE_MAX_K:  # the shipped range: one gather
        first, table, ends = _dense_table(k, delta.device)
        index = (buckets - first).clamp_(0, len(table) - 1)  # a NaN delta (refused after the walk) indexes row 0
    else:  # wider nodes: solve the buckets met, once each
        uniq, index = buckets.unique(return_inverse=True)
        table = torch.tensor([rank_weights(b, k) for b in uniq.tolist()], dtype=torch.float64, device=delta.device)
        ends = torch.tensor([bucket_acceptance(b, k) for b in uniq.tolist()], dtype=torch.float64, device=delta.device)
    lo = DELTA_BUCKET_RATIO ** buckets.double()
    frac = ((delta.clamp_min(DELTA_MIN) / lo).log() / math.log(DELTA_BUCKET_RATIO)).clamp(0.0, 1.0)
    acceptance = torch.lerp(ends[index, 0], ends[index, 1], frac)
    return table[index].reshape(-1, k), acceptance


def integrated_acceptance(delta: torch.Tensor, w: torch.Tensor, points: int = 4001) -> torch.Tensor:
    """The integral of min(phi(. - delta), g) per row, by the trapezoidal rule on [-10, delta + 10]."""
    t = torch.linspace(0.0, 1.0, points, dtype=torch.float64, device=delta.device)
    u = -10.0 + t[None] * (delta[:, None] + 20.0)
    log_g = log_order_stat_mixture(u, w.clamp_min(1e-300).log())
    dens = torch.minimum(std_normal_log_pdf(u - delta[:, None]), log_g).exp()
    return torch.trapezoid(dens, u, dim=1)


class RankAwareSelection(NodeVerifier):
    name = "rank"

    def uniforms_per_node(self, k: int) -> int:
        return 2 + 2 * PROPOSALS_PER_DRAW  # the rank, the coin, then the residual's first proposals

    def _select(self, red: RankOne, uniforms):
        """The selected child, its u, and log-weights: a rank drawn with w(delta, K) before the children
        are looked at, applied to the children sorted by u."""
        a, k = red.u.shape
        w, acceptance = weights_for(red.delta, k)
        sorted_u, order = red.u.sort(dim=1)
        rank = (w.cumsum(1) <= uniforms[:, :1]).sum(1).clamp(max=k - 1)
        ar = torch.arange(a, device=red.u.device)
        return order[ar, rank], sorted_u[ar, rank], w.clamp_min(1e-300).log(), acceptance

    def _decide(self, red: RankOne, uniforms) -> Decision:
        a, k = red.u.shape
        chosen, u_sel, log_w, acceptance = self._select(red, uniforms)
        log_ratio = std_normal_log_pdf(u_sel - red.delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]
        p = log_ratio.clamp(max=0.0).exp()
        accept = uniforms[:, 1] < p
        ar = torch.arange(a, device=red.u.device)
        child_p = torch.full((a, k), float("nan"), dtype=torch.float64, device=red.u.device)
        child_p[ar, chosen] = p
        return Decision(kept=torch.where(accept, chosen, -1), child_accept_prob=child_p, accept_prob=acceptance)

    def correct(self, red: RankOne, uniforms, rng, rows):
        chosen, _, log_w, _ = self._select(red, uniforms)
        return chosen, self._residual(red.delta, log_w, uniforms[:, 2:], rng, rows)

    @staticmethod
    def _residual(delta, log_w, draws, rng, rows) -> torch.Tensor:
        """Draw u from (phi(. - delta) - g)_+ normalised, by rejection from N(delta, 1): the first
        PROPOSALS_PER_DRAW proposals from `draws`, more from the rows' streams in the rare case that
        none of them is accepted."""
        out = torch.empty_like(delta)
        todo = torch.arange(delta.numel(), device=delta.device)
        while todo.numel():
            # half a grid step keeps the uniforms inside (0, 1), where ndtri is finite
            v = delta[todo, None] + torch.special.ndtri(draws[:, :PROPOSALS_PER_DRAW] + 2.0**-54)
            g_over_target = (log_order_stat_mixture(v, log_w[todo]) - std_normal_log_pdf(v - delta[todo, None])).exp()
            ok = draws[:, PROPOSALS_PER_DRAW:] < 1 - g_over_target
            found = ok.any(1)
            first = ok.int().argmax(1)
            out[todo[found]] = v[found, first[found]]
            todo = todo[~found]
            if todo.numel():
                draws = rng.uniform(rows[todo], 2 * PROPOSALS_PER_DRAW)
        return out

    def acceptance(self, delta, k):
        delta = delta.double().clamp_min(DELTA_FLOOR)
        return integrated_acceptance(delta, weights_for(delta, k)[0])
