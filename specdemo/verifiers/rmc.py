"""Reflection maximal coupling for chains (algorithms.md section 3, "RMC"; De Bortoli et al. 2025).

Contract: the committed state is an exact draw from N(mq, s^2 I); an accepted child is returned bit
for bit. Accept x_1 if U < min(1, exp(delta u - delta^2 / 2)); otherwise return
mq + s (z - 2 u e), the reflection of x_1 (projection delta - u, z_perp kept). Acceptance
2 Phi(-delta / 2) = 1 - TV(P, Q), the best any single-candidate coupling achieves. One child only.
"""

from __future__ import annotations

import torch

from .base import Decision, NodeVerifier, RankOne


class ReflectionMaximalCoupling(NodeVerifier):
    name = "rmc"
    max_children = 1

    def uniforms_per_node(self, k: int) -> int:
        return 1

    def decide(self, red: RankOne, uniforms) -> Decision:
        """As delta -> 0 the acceptance min(1, exp(delta u - delta^2 / 2)) -> 1, and the reflection is
        exact at any delta: RMC needs no floor below which child 1 is kept."""
        return self._decide(red, uniforms)

    def _decide(self, red: RankOne, uniforms) -> Decision:
        delta = red.delta
        p = torch.exp((delta * (red.u[:, 0] - 0.5 * delta)).clamp(max=0.0))
        accept = uniforms[:, 0] < p
        return Decision(kept=torch.where(accept, 0, -1), child_accept_prob=p[:, None], accept_prob=None)

    def correct(self, red: RankOne, uniforms, rng, rows):
        # the reflection of x_1 through the hyperplane halfway between mp and mq: u -> delta - u
        return torch.zeros_like(red.u[:, 0], dtype=torch.long), red.delta - red.u[:, 0]

    def acceptance(self, delta, k=1):
        return 2 * torch.special.ndtr(-delta / 2)
