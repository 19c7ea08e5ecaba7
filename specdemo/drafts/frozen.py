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

With freeze="gaussian" (a draft fitted online, ours) the data law near the trajectory is taken to be a
Gaussian N(mu, lambda I): its x0-hat at a state x of step n (signal a_n, noise b_n) is
x0-hat_n(x) = (b_n^2 mu + lambda a_n x) / (a_n^2 lambda + b_n^2), affine in x. lambda is fitted to the last
two target outputs (the frozen node's and the one one step above it, as for x0-linear), mu then makes
the model exact at the frozen node; lambda = 0 is freeze x0. Where the data law is locally Gaussian
(a well-separated Gaussian mixture) the draft follows x0-hat exactly down the drafted path.

With freeze="auto" a per-step table chooses which form drafts at each step (the pipeline fills it
from pilot runs: x0-hat wins where the denoised estimate moves slowly, its extrapolation where it
drifts, the fitted Gaussian where x0-hat moves with the state, the raw output near the end of a
flow-matching schedule, where x0-hat tracks the state).

Which target output is frozen after a round is the sampling driver's prefetch policy
(specdemo.sampling.prefetch).

A trajectory's first frozen output (`start`, ours): warm, as the draft-tree authors do, spends a
warm-up call that evaluates the root alone; cold spends none. A cold trajectory freezes the output
of a plain or deterministic step it took (gm512's first step), and one that speculates from its
first step drafts that round from x0-hat = 0 (cold_value): the data's centre, to which E[x0 | x_T]
is close where the signal is all but gone (algorithms.md section 2, "The frozen draft starts cold").
"""

from __future__ import annotations

import math

import torch

from ..config import FREEZE, STARTS
from ..errors import SpecdemoError
from .base import Draft, LevelMeans

OUT, X0, X0_LINEAR, GAUSSIAN = 0, 1, 2, 3  # freeze="auto": what drafts a step (its table; True/False read as x0/out)
FORMS = {"out": OUT, "x0": X0, "x0-linear": X0_LINEAR, "gaussian": GAUSSIAN}
# lambda's candidates (the data's variance, in the units of x0): 0 (freeze x0), then a geometric grid
# refined once around the best; the fit's error is a quadratic form, so a candidate costs a few flops
LAMBDA_GRID = torch.cat([torch.zeros(1, dtype=torch.float64), torch.logspace(-4, 4, 65, dtype=torch.float64)])
LAMBDA_REFINE = torch.logspace(-0.0625, 0.0625, 17, dtype=torch.float64)


class FrozenDraft(Draft):
    uses_frozen = True

    def __init__(self, freeze: str = "out", forms: tuple[int | bool, ...] = (), start: str = "warm"):
        if start not in STARTS:
            raise SpecdemoError(f"unknown start {start!r}; the frozen draft takes {', '.join(STARTS)}")
        self.start = start
        if freeze == "residual":
            raise SpecdemoError("--freeze residual corrects a draft network by the target's residual: use it with "
                                "--draft NETWORK; the frozen draft takes " + ", ".join(f for f in FREEZE if f != "residual"))
        if freeze not in FREEZE:
            raise SpecdemoError(f"unknown freeze {freeze!r}; the frozen draft takes "
                                + ", ".join(f for f in FREEZE if f != "residual"))
        self.freeze = freeze
        # freeze="auto": per step n, what drafts it: OUT, X0 (True), X0_LINEAR or GAUSSIAN
        self.forms = torch.tensor([int(v) for v in forms], dtype=torch.long)
        if self.forms.numel() and not bool(((self.forms >= OUT) & (self.forms <= GAUSSIAN)).all()):
            raise SpecdemoError(f"a freeze auto table holds forms {OUT}..{GAUSSIAN} (out, x0, x0-linear, gaussian) per step")
        self.linear = freeze == "x0-linear" or (freeze == "auto" and bool((self.forms == X0_LINEAR).any()))
        self.gaussian = freeze == "gaussian" or (freeze == "auto" and bool((self.forms == GAUSSIAN).any()))
        # where each form's frozen tensors sit in the trajectory's frozen value (its second dimension)
        self._line_at = 2 if freeze == "auto" else 0
        self._gauss_at = 2 + 2 * self.linear if freeze == "auto" else 0

    @property
    def frozen_history(self) -> bool:
        return self.linear or self.gaussian

    @property
    def cold_start(self) -> bool:
        return self.start == "cold"

    def cold_value(self, kernel, x, n, cond):
        """The value frozen from the output whose x0-hat is 0 at the root (no call): at the first step
        of a VP or flow schedule x_T holds almost nothing of x0, so E[x0 | x_T] is about the data's mean,
        which 0 stands for; a level below drafts from it with weight sqrt(abar) on x0-hat."""
        return self.frozen_value(kernel, kernel.output_from_denoised(torch.zeros_like(x), x, n), x, n), 0

    def check(self, kernel) -> None:
        if self.cold_start and not kernel.has_denoised:
            raise SpecdemoError(f"--start cold drafts a first round from x0-hat = 0, which the {kernel.name} kernel "
                                "has not; use --start warm")
        if self.freeze != "out" and not kernel.has_denoised:
            raise SpecdemoError(f"--freeze {self.freeze} needs a denoised estimate, which the {kernel.name} kernel "
                                "has not; use --freeze out")
        if self.freeze == "auto" and len(self.forms) != kernel.num_steps:
            raise SpecdemoError("--freeze auto needs its per-step table (built by the pipeline from pilot runs)")

    def frozen_shape(self, shape):
        """out or x0: one state; x0-linear: the line's (intercept, slope); gaussian: (mu, lambda
        repeated); auto: (out, x0-hat), then the line's two and the Gaussian's two where the table
        uses them at some step."""
        if self.freeze == "auto":
            return (2 + 2 * self.linear + 2 * self.gaussian, *shape)
        return (2, *shape) if self.frozen_history else tuple(shape)

    def frozen_value(self, kernel, out, x, n, previous=None, earlier=None, cond=None):
        """What is kept from a target evaluation: the output itself, x0-hat, the line through x0-hat
        (x0-linear), the fitted Gaussian's (mu, lambda) (gaussian), or the output and x0-hat and, where
        the table uses them, the line and the Gaussian (auto)."""
        if self.freeze == "out":
            return out
        x0 = kernel.denoised(out, x, n)
        if self.freeze == "x0":
            return x0
        if self.freeze == "x0-linear":
            return line(kernel, x0, n, None if previous is None else previous[:, self._line_at + 1], earlier)
        if self.freeze == "gaussian":
            return gaussian(kernel, x0, x, n, None if previous is None else previous[:, self._gauss_at + 1], earlier)
        kept = (out, x0)
        if self.linear:
            at = self._line_at + 1
            kept += tuple(line(kernel, x0, n, None if previous is None else previous[:, at], earlier).unbind(1))
        if self.gaussian:
            at = self._gauss_at + 1
            kept += tuple(gaussian(kernel, x0, x, n, None if previous is None else previous[:, at], earlier).unbind(1))
        return torch.stack(kept, 1)

    def for_round(self, kernel, steps, frozen, cond):
        """With the frozen value f plugged in, m^p at depth d is, in the node's state x,

            freeze out:       A x + B f + C clip(D x + E f)
            freeze x0:        (A - B D / E) x + (B / E) f + C clip(f)   (out = (f - D x) / E, so x0-hat = f)
            freeze gaussian:  the x0 form with x0-hat = w x + c mu, w = lambda a / (a^2 lambda + b^2),
                              c = b^2 / (a^2 lambda + b^2): (A - B D / E + B w / E) x + (B / E) c mu + C clip(w x + c mu)

        (kernels/base.py's coefficients at the node's step, a and b its signal and noise); freeze
        x0-linear is the x0 form with f the line's value at the level's step, f_d = a + b tau(n + d).
        Every form is alpha x + beta + gain clip(slope x + offset) (gain 0 for the x0 forms, whose clip
        is a constant). The coefficients of every level are gathered once; a level then costs one fused
        operation, two more and a clamp where a kernel that clips keeps x inside the clip. freeze auto
        takes each step's form from its table. Without such a clamp m^p is affine in x (LevelMeans.affine)."""
        n, (a, depth) = steps, steps.shape
        state_dims = frozen.dim() - 1 - (len(self.frozen_shape(())) == 1)  # frozen (A, *shape) or (A, C, *shape)
        per_level = (a, depth, 1, *[1] * state_dims)  # (A, L, 1, *ones): one coefficient a level
        auto = self.freeze == "auto"
        form = self.forms.to(n.device)[n].view(per_level) if auto else None
        r = kernel.clip_range
        alpha = beta = gain = slope = offset = None
        if self.freeze in ("out", "auto"):
            out_f = (frozen[:, 0] if auto else frozen)[:, None, None]  # (A, 1, 1, *shape): every level, every node
            k = kernel.coefficients(n, out_f)
            alpha, beta = k.A, k.B * out_f
            if r is not None:
                gain, slope, offset = k.C, k.D, k.E * out_f
        if self.freeze == "out":
            return _level_means(alpha, beta, gain, slope, offset, r)
        # (A, 1, 1, *shape) as out_f: x0-hat, except under x0-linear and gaussian, whose branches replace it
        x0_f = (frozen if frozen.dim() == state_dims + 1 else frozen[:, int(auto)])[:, None, None]
        alpha_x0, b_x0, c_x0 = kernel.denoised_coefficients(n, x0_f)
        if self.freeze in ("x0", "x0-linear", "auto"):
            if self.linear:  # x0-hat extrapolated to each level's step: a + b tau(n + d), (A, L, 1, *shape)
                intercept, slope_t = frozen[:, self._line_at, None, None], frozen[:, self._line_at + 1, None, None]
                tau = kernel.table("freeze-clock", clock(kernel), intercept)[n].view(per_level)
                line_f = torch.addcmul(intercept, tau, slope_t)
                x0_f = line_f if not auto else torch.where(form == X0_LINEAR, line_f, x0_f)
            beta_x0 = b_x0 * x0_f
            if r is not None:
                beta_x0 = beta_x0.addcmul_(c_x0, x0_f.clamp(-r, r))
            if not auto:
                return _level_means(alpha_x0, beta_x0, None, None, None, r)
            use_x0 = (form == X0) | (form == X0_LINEAR)
            alpha, beta = torch.where(use_x0, alpha_x0, alpha), torch.where(use_x0, beta_x0, beta)
            gain = None if gain is None else torch.where(use_x0, 0.0, gain)
        if self.gaussian:
            mu = frozen[:, self._gauss_at, None, None]
            lam = frozen[:, self._gauss_at + 1].flatten(1)[:, :1].view(a, 1, *per_level[2:])
            signal = kernel.table("signal", kernel.signal, mu)[n].view(per_level)
            noise = kernel.table("noise", kernel.noise, mu)[n].view(per_level)
            den = torch.addcmul(noise * noise, signal * signal, lam)
            w, c_mu = lam * signal / den, (noise * noise / den) * mu
            alpha_g, beta_g = torch.addcmul(alpha_x0, b_x0, w), b_x0 * c_mu
            if not auto:
                clip = (c_x0, w, c_mu) if r is not None else (None, None, None)
                return _level_means(alpha_g, beta_g, *clip, r)
            on = form == GAUSSIAN
            alpha, beta = torch.where(on, alpha_g, alpha), torch.where(on, beta_g, beta)
            if gain is not None:
                gain, slope, offset = torch.where(on, c_x0, gain), torch.where(on, w, slope), torch.where(on, c_mu, offset)
        return _level_means(alpha, beta, gain, slope, offset, r)

    def config(self):
        return {"draft": "frozen", "freeze": self.freeze, "start": self.start}


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


def _level_means(alpha, beta, gain, slope, offset, r) -> LevelMeans:
    """m^p = alpha x + beta + gain clip(slope x + offset) by level, from coefficients (A, L, 1, ...)
    (gain None: affine)."""
    depth = alpha.shape[1]
    if beta.shape[1] != depth:  # a coefficient of the frozen value alone: the same at every level
        beta = beta.expand(-1, depth, *beta.shape[2:])
    affine = None if gain is not None else (alpha.reshape(alpha.shape[0], depth), beta[:, :, 0])
    by_depth = []  # one view per depth, taken at the first level asked for

    def level(d, x, out=None):
        if not by_depth:
            by_depth.extend((alpha.expand(-1, depth, *alpha.shape[2:]).unbind(1), beta.unbind(1)))
            if gain is not None:
                by_depth.extend((gain.unbind(1), offset.expand(-1, depth, *offset.shape[2:]).unbind(1),
                                 slope.expand(-1, depth, *slope.shape[2:]).unbind(1)))
        m = torch.addcmul(by_depth[1][d], by_depth[0][d], x, out=out)
        if gain is not None:
            m.addcmul_(by_depth[2][d], torch.addcmul(by_depth[3][d], by_depth[4][d], x).clamp_(-r, r))
        return m
    return LevelMeans(level, affine)


def gaussian(kernel, x0: torch.Tensor, x: torch.Tensor, n: torch.Tensor, held: torch.Tensor | None,
             earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """(A, 2, *shape): mu and lambda (repeated over the state) of the Gaussian N(mu, lambda I) whose
    x0-hat at x (step n) is x0 and which best predicts x0-hat at `earlier` (out, x, step), the node one
    step above; where that is the same step, the lambda held before (`held`; none: 0, freeze x0)."""
    view = (-1, *[1] * (x0.dim() - 1))
    lam = x0.new_zeros(x0.shape[0], dtype=torch.float64) if held is None else held.flatten(1)[:, 0].double()
    if earlier is not None:
        out_0, x_0, n_0 = earlier
        lam = torch.where(n_0 == n, lam, fit_lambda(kernel, x0, x, n, kernel.denoised(out_0, x_0, n_0), x_0, n_0))
    lam = lam.view(view)
    signal, noise = (t.to(x0.device)[n].view(view) for t in (kernel.signal, kernel.noise))
    # x0 = (b^2 mu + lambda a x) / (a^2 lambda + b^2), solved for mu in float64 (b > 0 at every step a node is
    # evaluated, but b^2 is small at the last steps: |mu| may exceed a half-precision state's range)
    mu = (x0.double() * torch.addcmul(noise * noise, signal * signal, lam) - lam * signal * x.double()) / (noise * noise)
    return torch.stack((mu, lam.expand_as(mu)), 1).to(x0.dtype)


def fit_lambda(kernel, f1: torch.Tensor, x1: torch.Tensor, n1: torch.Tensor, f0: torch.Tensor, x0: torch.Tensor,
               n0: torch.Tensor) -> torch.Tensor:
    """(A,) float64: the lambda >= 0 whose Gaussian, made exact at (x1, n1) where x0-hat is f1,
    predicts x0-hat f0 at (x0, n0) best in squared error: mu = (d1 f1 - lambda a1 x1) / b1^2 and the
    prediction c0 mu + w0 x0 are linear in (f1, x1, x0), so each candidate's error is a quadratic form
    in their Gram matrix with f0 (float64). LAMBDA_GRID, then LAMBDA_REFINE around its best."""
    signal, noise = kernel.signal.to(f1.device), kernel.noise.to(f1.device)
    vectors = torch.stack((f1, x1, x0, f0), 1).flatten(2).double()
    gram = vectors @ vectors.transpose(1, 2)  # (A, 4, 4)
    a1, b1, a0, b0 = (t[:, None] for t in (signal[n1], noise[n1], signal[n0], noise[n0]))

    def error(lam: torch.Tensor) -> torch.Tensor:  # lam (A, G) -> (A, G)
        d1, d0 = a1 * a1 * lam + b1 * b1, a0 * a0 * lam + b0 * b0
        c0 = b0 * b0 / d0
        coef = torch.stack((c0 * d1 / (b1 * b1), -c0 * lam * a1 / (b1 * b1), lam * a0 / d0, -torch.ones_like(lam)), 2)
        return torch.einsum("agi,aij,agj->ag", coef, gram, coef).nan_to_num(nan=math.inf)

    grid = LAMBDA_GRID.to(f1.device).expand(f1.shape[0], -1)
    best = grid.gather(1, error(grid).argmin(1, keepdim=True))
    fine = best * LAMBDA_REFINE.to(f1.device)
    return fine.gather(1, error(fine).argmin(1, keepdim=True))[:, 0]
