"""Reflection maximal coupling for chains (algorithms.md section 3, "RMC"; De Bortoli et al. 2025).

Contract: the committed state is an exact draw from N(mq, s^2 I); an accepted child is returned bit
for bit. Accept x_1 if U < min(1, exp(delta u - delta^2 / 2)); otherwise return
mq + s (z - 2 u e), the reflection of x_1 (projection delta - u, z_perp kept). Acceptance
2 Phi(-delta / 2) = 1 - TV(P, Q), the best any single-candidate coupling achieves. One child only.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from .base import Decision, NodeVerifier, Uniforms


class ReflectionMaximalCoupling(NodeVerifier):
    name = "rmc"
    max_children = 1

    def uniforms_per_node(self, k: int) -> int:
        return 1

    def decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        """As delta -> 0 the acceptance min(1, exp(delta u - delta^2 / 2)) -> 1, and the reflection is
        exact at any delta: RMC needs no floor below which child 1 is kept."""
        return self._decide(delta, u, uniforms)

    def _decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        p = np.exp(np.minimum(delta * (u[:, 0] - 0.5 * delta), 0.0))
        accept = uniforms[:, 0] < p
        return Decision(kept=np.where(accept, 0, -1), child_accept_prob=p[:, None], accept_prob=None)

    def correct(
        self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, rng: Uniforms, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # the reflection of x_1 through the hyperplane halfway between mp and mq: u -> delta - u
        return np.zeros(len(delta), dtype=np.int64), delta - u[:, 0]

    def acceptance(self, delta: np.ndarray, k: int = 1) -> np.ndarray:
        return 2 * special.ndtr(-np.asarray(delta, dtype=np.float64) / 2)
