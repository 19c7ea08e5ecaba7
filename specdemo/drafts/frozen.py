"""The training-free frozen-target draft (algorithms.md section 2; De Bortoli et al. 2025).

The most recent network output computed by the target at an already evaluated node is plugged
into the step formula at the drafted state: m^p_n(y) = formula(y, n, out_frozen). With
freeze="x0" the denoised estimate x0-hat implied by that output is frozen instead, and the
network-output equivalent is recomputed at each drafted state (for flow matching
v = (y - x0-hat) / t, for DDPM eps = (y - sqrt(abar_t) x0-hat) / sqrt(1 - abar_t)).

With freeze="x0-linear" (second-order freezing, ours) x0-hat is extrapolated in time from the last
two target outputs: x0-hat(tau) = x0_1 + (tau - tau_1) (x0_1 - x0_0) / (tau_1 - tau_0), x0_1 at the
frozen node, x0_0 at the node one step above it (the same call), tau the kernel's time (`clock`).
A drafted level at step n uses x0-hat(tau_n). It pays where x0-hat drifts smoothly along the path
(flow matching with little churn), not where the chain is an ancestral SDE (DDPM), along which
E[x0 | x_t] is close to a martingale: there its one-step differences are noise.

With freeze="auto" a per-step table chooses which form drafts at each step (the pipeline fills it
from pilot runs: x0-hat wins where the denoised estimate moves slowly, its extrapolation where it
drifts, the raw output near the end of a flow-matching schedule, where x0-hat tracks the state).

Which target output is frozen after a round is the sampling driver's prefetch policy
(specdemo.sampling.prefetch).
"""

from __future__ import annotations

import torch

from ..config import FREEZE
from ..errors import SpecdemoError
from .base import Draft, LevelMeans

OUT, X0, X0_LINEAR = 0, 1, 2  # freeze="auto": what drafts a step (its table; True/False read as x0/out)
FORMS = {"out": OUT, "x0": X0, "x0-linear": X0_LINEAR}


class FrozenDraft(Draft):
    uses_frozen = True

    def __init__(self, freeze: str = "out", x0_steps: tuple[int | bool, ...] = ()):
        if freeze not in FREEZE:
            raise SpecdemoError(f"unknown freeze {freeze!r}; accepted: {', '.join(FREEZE)}")
        self.freeze = freeze
        # freeze="auto": per step n, what drafts it: OUT, X0 (True) or X0_LINEAR
        self.x0_steps = torch.tensor([int(v) for v in x0_steps], dtype=torch.long)
        self.linear = freeze == "x0-linear" or (freeze == "auto" and bool((self.x0_steps == X0_LINEAR).any()))

    @property
    def frozen_history(self) -> bool:
        return self.linear

    def check(self, kernel) -> None:
        if self.freeze != "out" and not kernel.has_denoised:
            raise SpecdemoError(f"--freeze {self.freeze} needs a denoised estimate, which the {kernel.name} kernel "
                                "has not; use --freeze out")
        if self.freeze == "auto" and len(self.x0_steps) != kernel.num_steps:
            raise SpecdemoError("--freeze auto needs its per-step table (built by the pipeline from pilot runs)")

    def frozen_shape(self, shape):
        """out or x0: one state; x0-linear: the line's (intercept, slope); auto: (out, x0-hat), and the
        line's two where the table extrapolates at some step."""
        if self.freeze == "auto":
            return (4 if self.linear else 2, *shape)
        return (2, *shape) if self.linear else tuple(shape)

    def frozen_value(self, kernel, out, x, n, previous=None, earlier=None):
        """What is kept from a target evaluation: the output itself, x0-hat, the line through x0-hat
        (x0-linear), or both and the line (auto)."""
        if self.freeze == "out":
            return out
        x0 = kernel.denoised(out, x, n)
        if self.freeze == "x0":
            return x0
        if self.freeze == "x0-linear":
            return line(kernel, x0, n, None if previous is None else previous[:, 1], earlier)
        kept = (out, x0)
        if self.linear:
            kept += tuple(line(kernel, x0, n, None if previous is None else previous[:, 3], earlier).unbind(1))
        return torch.stack(kept, 1)

    def for_round(self, kernel, steps, frozen, cond):
        """With the frozen value f plugged in, m^p at depth d is linear in the node's state x:

            freeze out:  A x + B f + C clip(D x + E f)
            freeze x0:   (A - B D / E) x + (B / E) f + C clip(f)   (out = (f - D x) / E, so x0-hat = f)

        (kernels/base.py's coefficients at the node's step); freeze x0-linear is the x0 form with f
        the line's value at the level's step, f_d = a + b tau(n + d). The coefficients of every level
        are gathered once; a level then costs one fused operation, two more and a clamp where the
        kernel clips and the output is frozen. freeze auto takes, per step, the x0 form (of x0-hat or
        of its line) or the out form. Without that clamp m^p is affine in x (LevelMeans.affine)."""
        n, (a, depth) = steps, steps.shape
        out_f, x0_f = (frozen[:, 0], frozen[:, 1]) if self.freeze == "auto" else (frozen, frozen)
        out_f, x0_f = out_f[:, None, None], x0_f[:, None, None]  # (A, 1, 1, *shape): every level, every node
        if self.linear:  # x0-hat extrapolated to each level's step: a + b tau(n + d), (A, L, 1, *shape)
            at = 2 if self.freeze == "auto" else 0
            intercept, slope = frozen[:, at, None, None], frozen[:, at + 1, None, None]
            tau = kernel.table("freeze-clock", clock(kernel), intercept)[n].view(a, depth, 1, *[1] * (frozen.dim() - 2))
            line_f = torch.addcmul(intercept, tau, slope)
            if self.freeze == "x0-linear":
                x0_f = line_f
            else:
                on_line = (self.x0_steps.to(n.device)[n] == X0_LINEAR).view(tau.shape)
                x0_f = torch.where(on_line, line_f, x0_f)
        r = kernel.clip_range
        if self.freeze not in ("x0", "x0-linear"):
            k = kernel.coefficients(n, out_f)
            alpha, beta = k.A, k.B * out_f  # the out form's linear part
            gain = k.C if r is not None else None  # its clipped part's weight
        if self.freeze != "out":
            alpha_x0, b_x0, c_x0 = kernel.denoised_coefficients(n, x0_f)
            beta_x0 = b_x0 * x0_f
            if r is not None:
                beta_x0 = beta_x0.addcmul_(c_x0, x0_f.clamp(-r, r))
            if self.freeze in ("x0", "x0-linear"):
                alpha, beta, gain = alpha_x0, beta_x0, None
            else:
                use_x0 = (self.x0_steps.to(n.device)[n] != OUT).view(alpha.shape)
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


def clock(kernel) -> torch.Tensor:
    """tau_n, the time in which freeze x0-linear extrapolates x0-hat (float64, per step): a flow
    kernel's t, else the negative log signal-to-noise ratio -log(abar / (1 - abar)). (Measured on
    gm512: t and log-SNR alike, sigma = t / (1 - t) worse; on digits no clock makes the line pay.)"""
    t = getattr(kernel, "t", None)
    if t is not None:
        return t.to(torch.float64)
    signal, noise = kernel.signal.to(torch.float64), kernel.noise.to(torch.float64)
    return 2 * (noise.clamp_min(1e-12).log() - signal.clamp_min(1e-12).log())


def line(kernel, x0: torch.Tensor, n: torch.Tensor, slope: torch.Tensor | None,
         earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """(A, 2, *shape): intercept a and slope b of x0-hat(tau) = a + b tau through x0 (A, *shape) at
    tau(n). The slope is the secant to x0-hat at `earlier` (out, x, step) where that is another step,
    else the one held before (`slope`; none: 0, x0-hat constant)."""
    taus = kernel.table("freeze-clock", clock(kernel), x0)
    view = (-1, *[1] * (x0.dim() - 1))
    tau = taus[n].view(view)
    slope = torch.zeros_like(x0) if slope is None else slope
    if earlier is not None:
        out_0, x_0, n_0 = earlier
        dt = tau - taus[n_0].view(view)
        secant = (x0 - kernel.denoised(out_0, x_0, n_0)) / torch.where(dt == 0, 1.0, dt)
        slope = torch.where(dt == 0, slope, secant)
    return torch.stack((torch.addcmul(x0, tau, slope, value=-1), slope), 1)
