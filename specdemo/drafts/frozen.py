"""The training-free frozen-target draft (algorithms.md section 2; De Bortoli et al. 2025).

The most recent network output computed by the target at an already evaluated node is plugged
into the step formula at the drafted state: m^p_n(y) = formula(y, n, out_frozen). With
freeze="x0" the denoised estimate x0-hat implied by that output is frozen instead, and the
network-output equivalent is recomputed at each drafted state (for flow matching
v = (y - x0-hat) / t, for DDPM eps = (y - sqrt(abar_t) x0-hat) / sqrt(1 - abar_t)).

With freeze="auto" both are kept and a per-step table chooses which one drafts at each step
(the pipeline fills it from pilot runs: x0-hat wins where the denoised estimate moves slowly,
the raw output near the end of a flow-matching schedule, where x0-hat tracks the state).

Which target output is frozen after a round is the sampling driver's prefetch policy
(specdemo.sampling.prefetch).
"""

from __future__ import annotations

import torch

from ..errors import SpecdemoError
from .base import Draft

FREEZE = ("out", "x0", "auto")


class FrozenDraft(Draft):
    uses_frozen = True

    def __init__(self, freeze: str = "out", x0_steps: tuple[bool, ...] = ()):
        if freeze not in FREEZE:
            raise SpecdemoError(f"unknown freeze {freeze!r}; accepted: {', '.join(FREEZE)}")
        self.freeze = freeze
        self.x0_steps = torch.tensor(x0_steps, dtype=torch.bool)  # freeze="auto": x0-hat drafts step n

    def check(self, kernel) -> None:
        if self.freeze != "out" and not kernel.has_denoised:
            raise SpecdemoError(f"--freeze {self.freeze} needs a denoised estimate, which the {kernel.name} kernel "
                                "has not; use --freeze out")
        if self.freeze == "auto" and len(self.x0_steps) != kernel.num_steps:
            raise SpecdemoError("--freeze auto needs its per-step table (built by the pipeline from pilot runs)")

    def frozen_shape(self, shape):
        return (2, *shape) if self.freeze == "auto" else tuple(shape)

    def frozen_value(self, kernel, out, x, n):
        """What is kept from a target evaluation: the output itself, x0-hat, or both (auto)."""
        if self.freeze == "out":
            return out
        x0 = kernel.denoised(out, x, n)
        return x0 if self.freeze == "x0" else torch.stack((out, x0), 1)

    def means(self, kernel, x, n, frozen, cond):
        n, frozen = n[:, None], frozen[:, None]  # one frozen value per trajectory, for all its nodes
        if self.freeze == "out":
            out = frozen
        elif self.freeze == "x0":
            out = kernel.output_from_denoised(frozen, x, n)
        else:
            use_x0 = self.x0_steps.to(n.device)[n].view(*n.shape, *[1] * (x.dim() - n.dim()))
            out = torch.where(use_x0, kernel.output_from_denoised(frozen[:, :, 1], x, n), frozen[:, :, 0])
        return kernel.mean(out, x, n)

    def config(self):
        return {"draft": "frozen", "freeze": self.freeze}
