"""Greedy rejection sampling over K drafted children, "D-GRS" (algorithms.md section 3; Bullo et al.).

Contract: the committed state is an exact draw from N(mq, s^2 I); an accepted child is returned bit
for bit. Levels lambda_0 = 0, reach-mass G_1 = 1; for k = 1..K in drafting order

    accept x_k if U_k < min(1, max(exp(delta u_k - delta^2/2) - lambda_{k-1}, 0) / G_k)
    lambda_k = lambda_{k-1} + G_k ;  tau_k = ln(lambda_k) / delta
    G_{k+1}  = Phibar(tau_k - delta/2) - lambda_k Phibar(tau_k + delta/2)

After K rejections, u is drawn from the residual density (phi(u - delta) - lambda_K phi(u))_+ / G_{K+1},
supported on u >= tau_K + delta/2, by inverting its closed-form survival function, and the
corrected point keeps z_perp of child 1. Acceptance 1 - G_{K+1}; at K = 1 it equals RMC's. The
children are examined in drafting order only: another order would not be exact.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from .base import DELTA_FLOOR, Decision, NodeVerifier, Uniforms, normal_sf, std_normal_pdf

MAX_ITERATIONS = 100  # safeguarded Newton needs under 20; the bracket alone halves every step


def grs_levels(delta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """lambda (R, K + 1) for k = 0..K and G (R, K + 1) for k = 1..K+1 (float64)."""
    delta = np.asarray(delta, dtype=np.float64)
    lam, reach = [np.zeros_like(delta)], [np.ones_like(delta)]
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(k):
            lam.append(lam[-1] + reach[-1])
            tau = np.log(lam[-1]) / delta
            reach.append(np.maximum(normal_sf(tau - delta / 2) - lam[-1] * normal_sf(tau + delta / 2), 0.0))
    return np.stack(lam, -1), np.stack(reach, -1)


def residual_survival(x: np.ndarray, delta: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Unnormalised P(u > x) under the residual, for x >= tau_K + delta/2."""
    return normal_sf(x - delta) - lam * normal_sf(x)


def sample_residual(delta: np.ndarray, lam: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Invert the residual's survival function at v * (total mass), v uniform.

    Newton steps on the closed-form survival function S, kept inside a bracket that shrinks every
    iteration (a bisection step replaces any Newton step that leaves it), until S is within
    float64 resolution of its target. They start where N(delta, 1) alone has the target's mass
    left, which the residual's lambda Phibar(x) term only moves down: about 4 iterations (7.5 from
    N(delta, 1)'s v-quantile, 60 for bisection alone).
    """
    delta, lam, v = (np.asarray(a, dtype=np.float64) for a in (delta, lam, v))
    with np.errstate(divide="ignore"):
        lo = np.log(lam) / delta + delta / 2
    total = residual_survival(lo, delta, lam)
    target = v * total
    tolerance = 1e-14 * total + 1e-15  # S is a difference of two O(1) survival values
    hi = np.maximum(lo, delta) + 40.0
    x = np.clip(delta - special.ndtri(np.clip(target, 1e-300, 1.0)), lo, hi)
    for _ in range(MAX_ITERATIONS):
        f = residual_survival(x, delta, lam) - target  # decreasing in x
        done = np.abs(f) <= tolerance
        if done.all():
            break
        right = f > 0
        lo, hi = np.where(right, x, lo), np.where(right, hi, x)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            newton = x + f / (std_normal_pdf(x - delta) - lam * std_normal_pdf(x))
        step = np.where((newton > lo) & (newton < hi), newton, 0.5 * (lo + hi))
        x = np.where(done, x, step)
    return x


class GreedyRejectionSampling(NodeVerifier):
    name = "dgrs"

    def uniforms_per_node(self, k: int) -> int:
        return k + 1  # one per child, and the residual's

    def _decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        k = u.shape[1]
        lam, reach = grs_levels(delta, k)
        excess = np.exp(np.minimum(delta[:, None] * u - 0.5 * delta[:, None] ** 2, 700.0)) - lam[:, :k]
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.minimum(np.nan_to_num(np.maximum(excess, 0.0) / reach[:, :k], nan=0.0), 1.0)
        accepted = uniforms[:, :k] < p
        any_accepted = accepted.any(1)
        kept = np.where(any_accepted, accepted.argmax(1), -1)
        examined = np.arange(k)[None] <= np.where(any_accepted, kept, k - 1)[:, None]
        return Decision(kept=kept, child_accept_prob=np.where(examined, p, np.nan), accept_prob=1 - reach[:, k])

    def correct(
        self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, rng: Uniforms, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        k = u.shape[1]
        lam = grs_levels(delta, k)[0][:, k]
        return np.zeros(len(delta), dtype=np.int64), sample_residual(delta, lam, uniforms[:, k])

    def acceptance(self, delta: np.ndarray, k: int = 1) -> np.ndarray:
        return 1 - grs_levels(np.maximum(np.asarray(delta, dtype=np.float64), DELTA_FLOOR), k)[1][..., k]
