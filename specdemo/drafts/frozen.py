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

from ..config import FREEZE
from ..errors import SpecdemoError
from .base import Draft, LevelMeans



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

    def for_round(self, kernel, steps, frozen, cond):
        """With the frozen value f plugged in, m^p at depth d is linear in the node's state x:

            freeze out:  A x + B f + C clip(D x + E f)
            freeze x0:   (A - B D / E) x + (B / E) f + C clip(f)   (out = (f - D x) / E, so x0-hat = f)

        (kernels/base.py's coefficients at the node's step). The coefficients of every level are
        gathered once; a level then costs one fused operation, two more and a clamp where the
        kernel clips and the output is frozen. freeze auto takes, per step, the x0 form or the out form.
        Without that clamp m^p is affine in x (LevelMeans.affine)."""
        n, (a, depth) = steps, steps.shape
        out_f, x0_f = (frozen[:, 0], frozen[:, 1]) if self.freeze == "auto" else (frozen, frozen)
        out_f, x0_f = out_f[:, None, None], x0_f[:, None, None]  # (A, 1, 1, *shape): every level, every node
        r = kernel.clip_range
        if self.freeze != "x0":
            k = kernel.coefficients(n, out_f)
            alpha, beta = k.A, k.B * out_f  # the out form's linear part
            gain = k.C if r is not None else None  # its clipped part's weight
        if self.freeze != "out":
            alpha_x0, b_x0, c_x0 = kernel.denoised_coefficients(n, x0_f)
            beta_x0 = b_x0 * x0_f
            if r is not None:
                beta_x0 = beta_x0.addcmul_(c_x0, x0_f.clamp(-r, r))
            if self.freeze == "x0":
                alpha, beta, gain = alpha_x0, beta_x0, None
            else:
                use_x0 = self.x0_steps.to(n.device)[n].view(alpha.shape)
                alpha, beta = torch.where(use_x0, alpha_x0, alpha), torch.where(use_x0, beta_x0, beta)
                gain = None if gain is None else torch.where(use_x0, 0.0, gain)
        beta = beta.expand(-1, depth, *beta.shape[2:])
        affine = None if gain is not None else (alpha.reshape(a, depth), beta[:, :, 0])
        by_depth = []  # one view per depth, taken at the first level asked for

        def level(d, x, out=None):
            if not by_depth:
                by_depth.extend((alpha.expand(-1, depth, *alpha.shape[2:]).unbind(1), beta.unbind(1)))
                if gain is not None:
                    by_depth.extend((gain.unbind(1), (k.E * out_f).unbind(1), k.D.unbind(1)))
            m = torch.addcmul(by_depth[1][d], by_depth[0][d], x, out=out)
            if gain is not None:
                m.addcmul_(by_depth[2][d], torch.addcmul(by_depth[3][d], by_depth[4][d], x).clamp_(-r, r))
            return m
        return LevelMeans(level, affine)

    def config(self):
        return {"draft": "frozen", "freeze": self.freeze}
