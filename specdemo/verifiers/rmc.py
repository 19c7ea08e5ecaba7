"""Reflection maximal coupling for chains (algorithms.md section 3, "RMC"; De Bortoli et al. 2025).

Contract: the committed state is an exact draw from N(mq, s^2 I); an accepted child is returned bit
for bit. Accept x_1 if U < min(1, exp(delta u - delta^2 / 2)); otherwise return
mq + s (z - 2 u e), the reflection of x_1 (projection delta - u, z_perp kept). Acceptance
2 Phi(-delta / 2) = 1 - TV(P, Q), the best any single-candidate coupling achieves. One child only.
"""

from __future__ import annotations

import torch

from .base import RankOne, Verdict, Verifier


class ReflectionMaximalCoupling(Verifier):
    name = "rmc"
    max_children = 1

    def _verify(self, red: RankOne, s, children, rng, rows) -> Verdict:
        u, delta = red.u[:, 0], red.delta
        p = torch.exp((delta * u - 0.5 * delta**2).clamp(max=0.0))
        accept = rng.uniform(rows, 1)[:, 0] < p
        # torch.where copies the accepted child bit for bit
        sample = torch.where(accept.view(-1, *[1] * (children.dim() - 2)),
                             children[:, 0], red.move(children[:, 0], u, delta - u, s))
        return Verdict(kept=torch.where(accept, 0, -1), sample=sample, delta=delta,
                       child_accept_prob=p[:, None], accept_prob=self.acceptance(delta, 1))

    def acceptance(self, delta, k=1):
        return 2 * torch.special.ndtr(-delta / 2)
