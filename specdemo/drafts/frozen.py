"""The training-free frozen-target draft (algorithms.md section 2; De Bortoli et al. 2025).

The most recent network output computed by the target at an already evaluated node is plugged
into the step formula at the drafted state: m^p_n(y) = formula(y, n, out_frozen). With
freeze="x0" the denoised estimate x0-hat implied by that output is frozen instead, and the
network-output equivalent is recomputed at each drafted state (for flow matching
v = (y - x0-hat) / t, for DDPM eps = (y - sqrt(abar_t) x0-hat) / sqrt(1 - abar_t)).

prefetch chooses which output starts the next round:
  nearest  the evaluated sibling nearest to the committed state (same step), else the parent's;
  parent   the parent's output (one step stale);
  none     none: the target re-evaluates every root (one extra call a round);
  leaves   as nearest, and the leaves are evaluated too, so that a round that commits a leaf
           knows the exact target output there.
"""

from __future__ import annotations

from ..errors import SpecdemoError
from .base import Draft

FREEZE = ("out", "x0")
PREFETCH = ("nearest", "parent", "none", "leaves")


class FrozenDraft(Draft):
    uses_frozen = True

    def __init__(self, freeze: str = "out", prefetch: str = "nearest"):
        if freeze not in FREEZE:
            raise SpecdemoError(f"unknown freeze {freeze!r}; accepted: {', '.join(FREEZE)}")
        if prefetch not in PREFETCH:
            raise SpecdemoError(f"unknown prefetch {prefetch!r}; accepted: {', '.join(PREFETCH)}")
        self.freeze, self.prefetch = freeze, prefetch

    def check(self, kernel) -> None:
        if self.freeze == "x0" and not kernel.has_denoised:
            raise SpecdemoError(f"--freeze x0 needs a denoised estimate, which the {kernel.name} kernel has not; use --freeze out")

    def frozen_value(self, kernel, out, x, n):
        """What is kept from a target evaluation: the output itself, or x0-hat."""
        return out if self.freeze == "out" else kernel.denoised(out, x, n)

    def means(self, kernel, x, n, frozen, cond):
        n, frozen = n[:, None], frozen[:, None]  # one frozen value per trajectory, for all its nodes
        out = frozen if self.freeze == "out" else kernel.output_from_denoised(frozen, x, n)
        return kernel.mean(out, x, n)

    def config(self):
        return {"draft": "frozen", "freeze": self.freeze, "prefetch": self.prefetch}
