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
from functools import cache
from pathlib import Path

import numpy as np
from scipy import optimize, sparse, special

from .base import DELTA_FLOOR, Decision, NodeVerifier, Uniforms, std_normal_log_pdf

DELTA_BUCKET_RATIO = 1.04  # weights are solved at the geometric centre of [ratio^b, ratio^(b+1))
DELTA_MIN, DELTA_MAX = 1e-3, 64.0
GRID_POINTS = 1201
TABLE_MAX_K = 8
WEIGHT_TABLE = Path(__file__).with_name("rank_weights.npz")
PROPOSALS_PER_DRAW = 16


def log_order_stat_mixture(u: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """log g(u) for u (R, M) and log-weights (R, K) (float64)."""
    k = log_w.shape[-1]
    r = np.arange(1, k + 1, dtype=np.float64)
    log_binom = special.gammaln(k) - special.gammaln(r) - special.gammaln(k - r + 1)
    log_cdf, log_sf = special.log_ndtr(u)[..., None], special.log_ndtr(-u)[..., None]
    log_f = np.log(k) + log_binom + (r - 1) * log_cdf + (k - r) * log_sf + std_normal_log_pdf(u)[..., None]
    return special.logsumexp(log_w[:, None, :] + log_f, axis=-1)


def delta_buckets(delta: np.ndarray) -> np.ndarray:
    """Bucket b holds delta in [ratio^b, ratio^(b+1)), delta clamped to [DELTA_MIN, DELTA_MAX]."""
    return np.floor(np.log(np.clip(delta, DELTA_MIN, DELTA_MAX)) / math.log(DELTA_BUCKET_RATIO)).astype(np.int64)


def solve_rank_weights(bucket: int, k: int) -> tuple[float, ...]:
    """w(delta, K) maximising the integral of min(phi(. - delta), g) on a grid, at the bucket's centre.

    Linear programme over (w, m): maximise h sum_i m_i subject to m_i <= phi(u_i - delta),
    m_i <= sum_r w_r f_(r)(u_i), w >= 0, sum_r w_r = 1.
    """
    if k == 1:
        return (1.0,)
    delta = DELTA_BUCKET_RATIO ** (bucket + 0.5)
    u = np.linspace(-9.0, delta + 9.0, GRID_POINTS)
    h = float(u[1] - u[0])
    eye = np.log(np.maximum(np.eye(k), 1e-300))
    f = np.exp(log_order_stat_mixture(np.broadcast_to(u, (k, GRID_POINTS)), eye)).T  # (M, K): f_(r)(u_i)
    target = np.exp(std_normal_log_pdf(u - delta))
    m = GRID_POINTS
    ident = sparse.identity(m, format="csr")
    a_ub = sparse.vstack(
        [sparse.hstack([sparse.csr_matrix((m, k)), ident]), sparse.hstack([sparse.csr_matrix(-f), ident])]
    )
    res = optimize.linprog(
        c=np.concatenate([np.zeros(k), -h * np.ones(m)]),
        A_ub=a_ub,
        b_ub=np.concatenate([target, np.zeros(m)]),
        A_eq=np.concatenate([np.ones(k), np.zeros(m)])[None],
        b_eq=[1.0],
        bounds=(0, None),
        method="highs",
    )
    if not res.success:  # any weights are exact; fall back to the parent density's (uniform ranks)
        return (1.0 / k,) * k
    w = np.clip(res.x[:k], 0.0, None)
    return tuple((w / w.sum()).tolist())


@cache
def _shipped_table() -> dict:
    """(weights, acceptance at the bucket's two ends) solved ahead of time for K = 2..TABLE_MAX_K
    and every bucket (write_weight_table)."""
    try:
        with np.load(WEIGHT_TABLE) as z:
            return {
                (int(b), int(k)): (tuple(w[:k].tolist()), tuple(a.tolist()))
                for b, k, w, a in zip(z["bucket"], z["k"], z["weights"], z["acceptance"], strict=True)
            }
    except (OSError, KeyError):
        return {}


def _edges(bucket: int) -> np.ndarray:
    return np.array([DELTA_BUCKET_RATIO**bucket, DELTA_BUCKET_RATIO ** (bucket + 1)])


def _solve(bucket: int, k: int) -> tuple[tuple[float, ...], tuple[float, float]]:
    w = solve_rank_weights(bucket, k)
    return w, tuple(integrated_acceptance(_edges(bucket), np.array([w, w])).tolist())


def rank_weights(bucket: int, k: int) -> tuple[float, ...]:
    """w(delta, K) for a bucket: from the shipped table, else solved now (and cached)."""
    return _bucket(bucket, k)[0]


def bucket_acceptance(bucket: int, k: int) -> tuple[float, float]:
    """Acceptance with the bucket's weights at the bucket's two ends (for interpolation)."""
    return _bucket(bucket, k)[1]


@cache
def _bucket(bucket: int, k: int) -> tuple[tuple[float, ...], tuple[float, float]]:
    return _shipped_table().get((bucket, k)) or _solve(bucket, k)


def write_weight_table(path: Path = WEIGHT_TABLE) -> None:
    """Solve every (bucket, K) of the shipped range and save it (about a minute). Rebuild with
    python -c "from specdemo.verifiers.rank import write_weight_table; write_weight_table()"."""
    lo, hi = delta_buckets(np.array([DELTA_MIN, DELTA_MAX])).tolist()
    keys = [(b, k) for k in range(2, TABLE_MAX_K + 1) for b in range(lo, hi + 1)]
    solved = [_solve(b, k) for b, k in keys]
    weights = np.zeros((len(keys), TABLE_MAX_K))
    for i, ((_, k), (w, _)) in enumerate(zip(keys, solved, strict=True)):
        weights[i, :k] = w
    np.savez_compressed(
        path,
        bucket=np.array([b for b, _ in keys]),
        k=np.array([k for _, k in keys]),
        weights=weights,
        acceptance=np.array([a for _, a in solved]),
    )


@cache
def _dense_table(k: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(first bucket, weights (B, K), acceptance at each bucket's ends (B, 2)) over every bucket of
    [DELTA_MIN, DELTA_MAX]: rows are gathered by bucket."""
    lo, hi = delta_buckets(np.array([DELTA_MIN, DELTA_MAX])).tolist()
    rows = [_bucket(b, k) for b in range(lo, hi + 1)]
    return lo, np.array([w for w, _ in rows]), np.array([a for _, a in rows])


def weights_for(delta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(R, K) weights for each row's delta (float64), and the acceptance they give: the integral
    of min(phi(. - delta), g), interpolated in log delta between the bucket's ends."""
    delta = np.asarray(delta, dtype=np.float64)
    buckets = delta_buckets(np.nan_to_num(delta, nan=DELTA_MIN))
    if k <= TABLE_MAX_K:  # the shipped range: one gather
        first, table, ends = _dense_table(k)
        index = np.clip(buckets - first, 0, len(table) - 1)
    else:  # wider nodes: solve the buckets met, once each
        uniq, index = np.unique(buckets, return_inverse=True)
        table = np.array([rank_weights(b, k) for b in uniq.tolist()])
        ends = np.array([bucket_acceptance(b, k) for b in uniq.tolist()])
    lo = DELTA_BUCKET_RATIO ** buckets.astype(np.float64)
    frac = np.clip(np.log(np.maximum(delta, DELTA_MIN) / lo) / math.log(DELTA_BUCKET_RATIO), 0.0, 1.0)
    acceptance = ends[index, 0] + frac * (ends[index, 1] - ends[index, 0])
    return table[index].reshape(-1, k), acceptance


def integrated_acceptance(delta: np.ndarray, w: np.ndarray, points: int = 4001) -> np.ndarray:
    """The integral of min(phi(. - delta), g) per row, by the trapezoidal rule on [-10, delta + 10]."""
    t = np.linspace(0.0, 1.0, points)
    u = -10.0 + t[None] * (delta[:, None] + 20.0)
    log_g = log_order_stat_mixture(u, np.log(np.maximum(w, 1e-300)))
    dens = np.exp(np.minimum(std_normal_log_pdf(u - delta[:, None]), log_g))
    return np.trapezoid(dens, u, axis=1)


def select_rank(
    delta: np.ndarray, u: np.ndarray, uniform: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The selected child (R,), its u, the log-weights (R, K) of g and their acceptance: a rank drawn
    with w(delta, K) before the children are looked at (uniform (R,)), applied to the children sorted
    by u (R, K)."""
    r, k = u.shape
    w, acceptance = weights_for(delta, k)
    order = np.argsort(u, axis=1, kind="stable")
    rank = np.minimum((np.cumsum(w, 1) <= uniform[:, None]).sum(1), k - 1)
    ar = np.arange(r)
    chosen = order[ar, rank]
    return chosen, u[ar, chosen], np.log(np.maximum(w, 1e-300)), acceptance


def rank_residual(
    delta: np.ndarray, log_w: np.ndarray, draws: np.ndarray, rng: Uniforms, rows: np.ndarray
) -> np.ndarray:
    """Draw u from (phi(. - delta) - g)_+ normalised, by rejection from N(delta, 1): the first
    PROPOSALS_PER_DRAW proposals from `draws`, more from the rows' streams (rng.uniform(rows, count)) in
    the rare case that none of them is accepted."""
    out = np.empty_like(delta)
    todo = np.arange(delta.size)
    while todo.size:
        # half a grid step keeps the uniforms inside (0, 1), where ndtri is finite
        v = delta[todo, None] + special.ndtri(draws[:, :PROPOSALS_PER_DRAW] + 2.0**-54)
        g_over_target = np.exp(log_order_stat_mixture(v, log_w[todo]) - std_normal_log_pdf(v - delta[todo, None]))
        ok = draws[:, PROPOSALS_PER_DRAW:] < 1 - g_over_target
        found = ok.any(1)
        out[todo[found]] = v[found, ok.argmax(1)[found]]
        todo = todo[~found]
        if todo.size:
            draws = np.asarray(rng.uniform(rows[todo], 2 * PROPOSALS_PER_DRAW))
    return out


class RankAwareSelection(NodeVerifier):
    name = "rank"

    def uniforms_per_node(self, k: int) -> int:
        return 2 + 2 * PROPOSALS_PER_DRAW  # the rank, the coin, then the residual's first proposals

    def _decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        r, k = u.shape
        chosen, u_sel, log_w, acceptance = select_rank(delta, u, uniforms[:, 0])
        log_ratio = std_normal_log_pdf(u_sel - delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]
        p = np.exp(np.minimum(log_ratio, 0.0))
        accept = uniforms[:, 1] < p
        child_p = np.full((r, k), np.nan)
        child_p[np.arange(r), chosen] = p
        return Decision(kept=np.where(accept, chosen, -1), child_accept_prob=child_p, accept_prob=acceptance)

    def correct(
        self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, rng: Uniforms, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        chosen, _, log_w, _ = select_rank(delta, u, uniforms[:, 0])
        return chosen, rank_residual(delta, log_w, uniforms[:, 2:], rng, rows)

    def acceptance(self, delta: np.ndarray, k: int = 1) -> np.ndarray:
        delta = np.maximum(np.asarray(delta, dtype=np.float64), DELTA_FLOOR)
        shape = delta.shape
        delta = delta.reshape(-1)
        return integrated_acceptance(delta, weights_for(delta, k)[0]).reshape(shape)
