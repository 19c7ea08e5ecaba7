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

import torch

from .base import DELTA_FLOOR, Decision, NodeVerifier, RankOne, normal_sf, std_normal_pdf

MAX_ITERATIONS = 100  # safeguarded Newton needs under 20; the bracket alone halves every step


def grs_levels(delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lambda (A, K + 1) for k = 0..K and G (A, K + 1) for k = 1..K+1 (float64)."""
    lam = [torch.zeros_like(delta)]
    reach = [torch.ones_like(delta)]
    for _ in range(k):
        lam.append(lam[-1] + reach[-1])
        tau = lam[-1].log() / delta
        reach.append((normal_sf(tau - delta / 2) - lam[-1] * normal_sf(tau + delta / 2)).clamp_min(0.0))
    return torch.stack(lam, 1), torch.stack(reach, 1)


def residual_survival(x, delta, lam):
    """Unnormalised P(u > x) under the residual, for x >= tau_K + delta/2."""
    return normal_sf(x - delta) - lam * normal_sf(x)


def sample_residual(delta: torch.Tensor, lam: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Invert the residual's survival function at v * (total mass), v uniform.

    Newton steps on the closed-form survival function S, kept inside a bracket that shrinks every
    iteration (a bisection step replaces any Newton step that leaves it), until S is within
    float64 resolution of its target. They start where N(delta, 1) alone has the target's mass
    left, which the residual's lambda Phibar(x) term only moves down: about 4 iterations (7.5 from
    N(delta, 1)'s v-quantile, 60 for bisection alone).
    """
    lo = lam.log() / delta + delta / 2
    total = residual_survival(lo, delta, lam)
    target = v * total
    tolerance = 1e-14 * total + 1e-15  # S is a difference of two O(1) survival values
    hi = torch.maximum(lo, delta) + 40.0
    x = (delta - torch.special.ndtri(target.clamp(1e-300, 1.0))).clamp(lo, hi)
    for _ in range(MAX_ITERATIONS):
        f = residual_survival(x, delta, lam) - target  # decreasing in x
        done = f.abs() <= tolerance
        if bool(done.all()):
            break
        right = f > 0
        lo, hi = torch.where(right, x, lo), torch.where(right, hi, x)
        newton = x + f / (std_normal_pdf(x - delta) - lam * std_normal_pdf(x))
        step = torch.where((newton > lo) & (newton < hi), newton, 0.5 * (lo + hi))
        x = torch.where(done, x, step)
    return x


class GreedyRejectionSampling(NodeVerifier):
    name = "dgrs"

    def uniforms_per_node(self, k: int) -> int:
        return k + 1  # one per child, and the residual's

    def _decide(self, red: RankOne, uniforms) -> Decision:
        k = red.u.shape[1]
        delta = red.delta
        lam, reach = grs_levels(delta, k)
        excess = torch.exp((delta[:, None] * red.u - 0.5 * delta[:, None] ** 2).clamp(max=700.0)) - lam[:, :k]
        p = (excess.clamp_min(0.0) / reach[:, :k]).nan_to_num(0.0).clamp(max=1.0)
        accepted = uniforms[:, :k] < p
        any_accepted = accepted.any(1)
        kept = torch.where(any_accepted, accepted.int().argmax(1), -1)
        examined = torch.arange(k, device=p.device)[None] <= torch.where(any_accepted, kept, k - 1)[:, None]
        return Decision(kept=kept, child_accept_prob=torch.where(examined, p, float("nan")),
                        accept_prob=1 - reach[:, k])

    def correct(self, red: RankOne, uniforms, rng, rows):
        k = red.u.shape[1]
        lam = grs_levels(red.delta, k)[0][:, k]
        return torch.zeros_like(red.u[:, 0], dtype=torch.long), sample_residual(red.delta, lam, uniforms[:, k])

    def acceptance(self, delta, k):
        return 1 - grs_levels(delta.double().clamp_min(DELTA_FLOOR), k)[1][:, k]
