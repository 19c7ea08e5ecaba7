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

With freeze="auto" (FrozenPerStep) a per-step table chooses which form drafts at each step (planning fills it
with the fitted Gaussian at every step until the runs have priced each form along their paths, or from a
pilot run of each form with --pilot: x0-hat wins where the denoised estimate moves slowly, its extrapolation where it
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

import weakref
from functools import lru_cache
from typing import Any

import torch

from ..config import STARTS
from ..errors import SpecdemoError
from ..kernels import Kernel
from .base import AffineLevels, Draft, LevelMeans

OUT, X0, X0_LINEAR, GAUSSIAN = 0, 1, 2, 3  # FrozenPerStep: what drafts a step (its table; True/False read as x0/out)
FORMS = {"out": OUT, "x0": X0, "x0-linear": X0_LINEAR, "gaussian": GAUSSIAN}


class FrozenDraft(Draft):
    """The frozen-target draft: what every form shares (the start, the cold value, the checks against the
    kernel). A form is a subclass (FrozenOutput, FrozenX0, FrozenX0Linear, FrozenGaussian, FrozenPerStep);
    `freeze` names it as SamplerConfig.freeze does, and frozen_draft builds one by that name."""

    uses_frozen = True
    exact_at_known_root = True
    freeze = ""

    def __init__(self, start: str = "warm") -> None:
        if start not in STARTS:
            raise SpecdemoError(f"unknown start {start!r}; the frozen draft takes {', '.join(STARTS)}")
        self.start = start

    @property
    def cold_start(self) -> bool:  # type: ignore[override]  # Draft's class constant, a frozen draft's own per instance
        return self.start == "cold"

    def cold_value(
        self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, int]:
        """The value frozen from the output whose x0-hat is 0 at the root (no call): at the first step
        of a VP or flow schedule x_T holds almost nothing of x0, so E[x0 | x_T] is about the data's mean,
        which 0 stands for; a level below drafts from it with weight sqrt(abar) on x0-hat."""
        return self.frozen_value(kernel, kernel.output_from_denoised(torch.zeros_like(x), x, n), x, n), 0

    def check(self, kernel: Kernel) -> None:
        """Invariants against the kernel (specdemo.resolve refuses the same settings with their names first)."""
        if self.cold_start and not kernel.has_denoised:
            raise SpecdemoError(
                f"--start cold drafts a first round from x0-hat = 0, which the {kernel.name} kernel "
                "has not; use --start warm"
            )
        if not self.frozen_is_output and not kernel.has_denoised:
            raise SpecdemoError(
                f"--freeze {self.freeze} needs a denoised estimate, which the {kernel.name} kernel "
                "has not; use --freeze out"
            )

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """One state (out, x0); two for a form with a history (the line's intercept and slope, the
        Gaussian's mu and lambda)."""
        return (2, *shape) if self.frozen_history else tuple(shape)

    def config(self) -> dict[str, Any]:
        return {"draft": "frozen", "freeze": self.freeze, "start": self.start}


class FrozenOutput(FrozenDraft):
    """freeze out: the network output itself, m^p = A x + B f + C clip(D x + E f) (kernels/base.py's
    coefficients at the node's step)."""

    freeze = "out"
    frozen_is_output = True

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return out

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        return AffineLevels.of_output(kernel, steps, frozen)


class FrozenX0(FrozenDraft):
    """freeze x0: the denoised estimate x0-hat = f, m^p = (A - B D / E) x + (B / E) f + C clip(f)
    (out = (f - D x) / E)."""

    freeze = "x0"

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return kernel.denoised(out, x, n)

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        return _x0_levels(kernel, steps, frozen, frozen[None], frozen.dim() - 1)


class FrozenX0Linear(FrozenDraft):
    """freeze x0-linear: x0-hat extrapolated in time, the x0 form with f the line's value at the level's
    step, f_d = a + b tau(n + d) (`line`)."""

    freeze = "x0-linear"
    frozen_history = True

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return line(
            kernel,
            kernel.denoised(out, x, n),
            n,
            None if previous is None else previous[:, 1],
            _earlier_x0(kernel, earlier),
        )

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        ones = [1] * (frozen.dim() - 2)
        tau = kernel.table_on("freeze-clock", clock(kernel), steps.device, frozen.dtype)[steps]
        x0_f = torch.addcmul(frozen[:, 0][None], tau.view(*steps.shape, *ones), frozen[:, 1][None])
        return _x0_levels(kernel, steps, frozen, x0_f, frozen.dim() - 2)


class FrozenGaussian(FrozenDraft):
    """freeze gaussian: x0-hat of a Gaussian N(mu, lambda I) fitted online (`gaussian`), x0-hat = w x + c mu
    with w = lambda a / (a^2 lambda + b^2), c = b^2 / (a^2 lambda + b^2) (a, b the step's signal and noise):
    m^p = (A - B D / E + B w / E) x + (B / E) c mu + C clip(w x + c mu)."""

    freeze = "gaussian"
    frozen_history = True

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return gaussian(
            kernel,
            kernel.denoised(out, x, n),
            x,
            n,
            None if previous is None else previous[:, 1],
            _earlier_x0(kernel, earlier),
        )

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        n, ones = steps, [1] * (frozen.dim() - 2)
        lift = lambda c: c.view(*n.shape, *ones)  # (L, A) scalars against states (L, A, *shape)
        alpha_x0, b_x0, c_x0 = kernel.denoised_scalars(n, frozen.dtype)
        mu = frozen[:, 0][None]
        lam = frozen[:, 1].flatten(1)[:, 0][None]  # (1, A)
        signal = kernel.table("signal", kernel.signal, mu)[n]
        noise = kernel.table("noise", kernel.noise, mu)[n]
        den = torch.addcmul(noise * noise, signal * signal, lam)
        w, c_mu = lam * signal / den, lift(noise * noise / den) * mu
        alpha_g, beta_g = torch.addcmul(alpha_x0, b_x0, w), lift(b_x0) * c_mu
        r = kernel.clip_range
        return AffineLevels(alpha_g, beta_g, c_x0, w, c_mu, r) if r is not None else AffineLevels(alpha_g, beta_g)


class FrozenPerStep(FrozenDraft):
    """freeze auto: per step n, the form its table `forms` names (OUT, X0, X0_LINEAR or GAUSSIAN) drafts
    the level of step n; the frozen value holds (out, x0-hat), then the line's two and the Gaussian's two
    where the table uses them at some step (planning fills the table: learnt from runs, or from a pilot of
    each form with --pilot)."""

    freeze = "auto"

    def __init__(self, forms: tuple[int | bool, ...], start: str = "warm") -> None:
        super().__init__(start)
        self.forms = torch.tensor([int(v) for v in forms], dtype=torch.long)
        if self.forms.numel() and not bool(((self.forms >= OUT) & (self.forms <= GAUSSIAN)).all()):
            raise SpecdemoError(
                f"a freeze auto table holds forms {OUT}..{GAUSSIAN} (out, x0, x0-linear, gaussian) per step"
            )
        self.linear = bool((self.forms == X0_LINEAR).any())
        self.x0 = bool((self.forms == X0).any())
        self.out = bool((self.forms == OUT).any())
        self.gaussian = bool((self.forms == GAUSSIAN).any())
        self.frozen_history = self.linear or self.gaussian
        # where each form's frozen tensors sit in the trajectory's frozen value (its second dimension)
        self._line_at = 2
        self._gauss_at = 2 + 2 * self.linear

    def check(self, kernel: Kernel) -> None:
        super().check(kernel)
        if len(self.forms) != kernel.num_steps:
            raise SpecdemoError("--freeze auto needs its per-step table (one form per step, filled by planning)")

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (2 + 2 * self.linear + 2 * self.gaussian, *shape)

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x0 = kernel.denoised(out, x, n)
        earlier = _earlier_x0(kernel, earlier)
        held = lambda at: None if previous is None else previous[:, at + 1]
        kept = [out[:, None], x0[:, None]]
        if self.linear:
            kept.append(line(kernel, x0, n, held(self._line_at), earlier))
        if self.gaussian:
            kept.append(gaussian(kernel, x0, x, n, held(self._gauss_at), earlier))
        return torch.cat(kept, 1)

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        """Every level's coefficients from one gather of a per-step table (_auto_table) that holds each
        step's form's constants (zero for the terms of other forms), and the fitted Gaussian's lambda where
        the table uses it: with den = a^2 lambda + b^2, c = b^2 / den and w = lambda a / den,

            a = a0 + (B / E) w [gaussian],  g = C [out, gaussian],  h = D [out] or w [gaussian],
            b = B out [out] + (B / E) x0 + C clip(x0) [x0; the line's value f_d for x0-linear] + (B / E) c mu [gaussian],
            o = E out [out] + c mu [gaussian]."""
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        n = steps
        t = _auto_table(self, kernel, n.device, frozen.dtype)[n]  # (L, A, 17)
        r = kernel.clip_range
        ones = [1] * (frozen.dim() - 2)
        col = t.unbind(2)  # (L, A) each
        lift = t.view(*t.shape, *ones).unbind(2)  # (L, A, *ones) each, against states (L, A, *shape)
        channel = frozen[None].unbind(2)  # (1, A, *shape) each
        out_f, x0_f = channel[0], channel[1]
        a, g, h = col[A0], col[G], col[H0]
        b = lift[B_OUT] * out_f
        o = lift[O_OUT] * out_f
        if self.x0:
            b.addcmul_(lift[B_X0], x0_f)
            if r is not None:
                b.addcmul_(lift[B_CLIP], x0_f.clamp(-r, r))
        if self.linear:
            line_f = torch.addcmul(channel[self._line_at], lift[TAU], channel[self._line_at + 1])
            b.addcmul_(lift[B_LINE], line_f)
            if r is not None:
                b.addcmul_(lift[B_CLIP_LINE], line_f.clamp(-r, r))
        if self.gaussian:
            mu = channel[self._gauss_at]
            lam = frozen[:, self._gauss_at + 1].flatten(1)[:, 0]  # (A,)
            den = torch.addcmul(col[NOISE2], col[SIGNAL2], lam)
            c, w = col[NOISE2] / den, lam * col[SIGNAL] / den
            a, h = torch.addcmul(a, col[A_W], w), torch.addcmul(h, col[H_W], w)
            weight = c.view(*c.shape, *ones)
            b.addcmul_(lift[B_MU] * weight, mu)
            o.addcmul_(lift[O_MU] * weight, mu)
        if r is None or not (self.out or self.gaussian):  # no step's form clips its state
            return AffineLevels(a, b, clip=r)
        return AffineLevels(a, b, g, h, o, r)


FROZEN_FORMS = {f.freeze: f for f in (FrozenOutput, FrozenX0, FrozenX0Linear, FrozenGaussian)}


def frozen_draft(freeze: str, forms: tuple[int | bool, ...] = (), start: str = "warm") -> FrozenDraft:
    """The frozen draft of a form named as SamplerConfig.freeze names it; "auto" takes its per-step table."""
    if freeze == "auto":
        return FrozenPerStep(forms, start=start)
    if freeze not in FROZEN_FORMS:
        raise SpecdemoError(f"unknown freeze {freeze!r}; the frozen draft takes {', '.join(FROZEN_FORMS)} or auto")
    return FROZEN_FORMS[freeze](start=start)


def _x0_levels(
    kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor, x0_f: torch.Tensor, state_dims: int
) -> AffineLevels:
    """The x0 forms' levels: (A - B D / E) x + (B / E) f + C clip(f), f = x0_f (1 or L, A, *shape); the clip
    is a constant of the level, folded into b."""
    lift = lambda c: c.view(*steps.shape, *[1] * state_dims)
    r = kernel.clip_range
    alpha_x0, b_x0, c_x0 = kernel.denoised_scalars(steps, frozen.dtype)
    beta_x0 = lift(b_x0) * x0_f
    if r is not None:
        beta_x0 = beta_x0.addcmul_(lift(c_x0), x0_f.clamp(-r, r))
    return AffineLevels(alpha_x0, beta_x0, clip=r)


def _earlier_x0(
    kernel: Kernel, earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The node above's (x0-hat, state, step), read by the line and the Gaussian alike, from its (out, state, step)."""
    if earlier is None:
        return None
    out_0, x_0, n_0 = earlier
    return kernel.denoised(out_0, x_0, n_0), x_0, n_0


# the columns of _auto_table
A0, A_W, G, H0, H_W, B_OUT, B_X0, B_CLIP, B_MU, B_LINE, B_CLIP_LINE, O_OUT, O_MU, TAU, SIGNAL2, NOISE2, SIGNAL = range(
    17
)


def _auto_table(draft: FrozenPerStep, kernel: Kernel, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(N, 17) per step n, made once per draft, kernel, device and dtype: the constants of the step's form
    (FrozenPerStep.for_round; each column zero where the form has no such term), then tau, a^2, b^2, a."""
    cache = draft.__dict__.setdefault("_tables", weakref.WeakKeyDictionary()).setdefault(kernel, {})
    key = (device, dtype)
    if key not in cache:
        k = kernel.coefficient_table.T  # (5, N): A..E
        big_a, big_b, big_c, big_d, big_e = k
        beta = big_b / big_e
        form = draft.forms
        out, x0, linear, gauss = (form == f for f in (OUT, X0, X0_LINEAR, GAUSSIAN))
        on = lambda mask, v: torch.where(mask, v, torch.zeros_like(v))
        signal, noise = kernel.signal.to(torch.float64), kernel.noise.to(torch.float64)
        one = torch.ones_like(beta)
        tau = clock(kernel) if draft.linear else torch.zeros_like(beta)
        columns = (
            torch.where(out, big_a, big_a - beta * big_d),
            on(gauss, beta),
            on(out | gauss, big_c),
            on(out, big_d),
            on(gauss, one),
            on(out, big_b),
            on(x0, beta),
            on(x0, big_c),
            on(gauss, beta),
            on(linear, beta),
            on(linear, big_c),
            on(out, big_e),
            on(gauss, one),
            tau,
            signal * signal,
            noise * noise,
            signal,
        )
        cache[key] = torch.stack(columns, 1).to(device=device, dtype=dtype)
    return cache[key]


@lru_cache(maxsize=16)
def clock(kernel: Kernel) -> torch.Tensor:
    """tau_n, the time in which freeze x0-linear extrapolates x0-hat (float64, per step): a flow
    kernel's t, else the negative log signal-to-noise ratio -log(abar / (1 - abar)). (Measured on
    gm512: t and log-SNR alike, sigma = t / (1 - t) worse; on digits no clock makes the line pay.)"""
    t = getattr(kernel, "t", None)
    if t is not None:
        return t.to(torch.float64)
    signal, noise = kernel.signal.to(torch.float64), kernel.noise.to(torch.float64)
    return 2 * (noise.clamp_min(1e-12).log() - signal.clamp_min(1e-12).log())


def line(
    kernel: Kernel,
    x0: torch.Tensor,
    n: torch.Tensor,
    slope: torch.Tensor | None,
    earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """(A, 2, *shape): intercept a and slope b of x0-hat(tau) = a + b tau through x0 (A, *shape) at
    tau(n). The slope is the secant to x0-hat at `earlier` (its x0-hat, state, step) where that is another
    step, else the one held before (`slope`; none: 0, x0-hat constant)."""
    taus = kernel.table_on("freeze-clock", clock(kernel), x0.device, x0.dtype)
    view = (-1, *[1] * (x0.dim() - 1))
    tau = taus[n].view(view)
    slope = torch.zeros_like(x0) if slope is None else slope
    if earlier is not None:
        x0_0, _, n_0 = earlier
        dt = tau - taus[n_0].view(view)
        slope = torch.where(dt == 0, slope, (x0 - x0_0) / torch.where(dt == 0, 1.0, dt))
    return torch.stack((torch.addcmul(x0, tau, slope, value=-1), slope), 1)


def gaussian(
    kernel: Kernel,
    x0: torch.Tensor,
    x: torch.Tensor,
    n: torch.Tensor,
    held: torch.Tensor | None,
    earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """(A, 2, *shape): mu and lambda (repeated over the state) of the Gaussian N(mu, lambda I) whose
    x0-hat at x (step n) is x0 and which best predicts x0-hat at `earlier` (out, x, step), the node one
    step above; where that is the same step, the lambda held before (`held`; none: 0, freeze x0)."""
    view = (-1, *[1] * (x0.dim() - 1))
    lam = x0.new_zeros(x0.shape[0], dtype=torch.float64) if held is None else held.flatten(1)[:, 0].double()
    if earlier is not None:
        x0_0, x_0, n_0 = earlier
        lam = torch.where(n_0 == n, lam, fit_lambda(kernel, x0, x, n, x0_0, x_0))
    lam = lam.view(view)
    # x0 = (b^2 mu + lambda a x) / (a^2 lambda + b^2) solved for mu, mu = x0 + lambda (a^2 x0 - a x) / b^2, in
    # float64 (b^2 is small at the last steps: |mu| may exceed a half-precision state's range)
    kappa, iota = (
        kernel.table_on("gaussian mu", _mu_table(kernel), x0.device, torch.float64)[n]
        .view(-1, 2, *[1] * (x0.dim() - 1))
        .unbind(1)
    )
    mu = torch.addcmul(x0.double(), lam, torch.addcmul(kappa * x0, iota, x, value=-1))
    return torch.stack((mu, lam.expand_as(mu)), 1).to(x0.dtype)


def fit_lambda(
    kernel: Kernel, f1: torch.Tensor, x1: torch.Tensor, n1: torch.Tensor, f0: torch.Tensor, x0: torch.Tensor
) -> torch.Tensor:
    """(A,) float64: the lambda on LAMBDA_GRID whose Gaussian, made exact at (x1, n1) where x0-hat is f1,
    predicts x0-hat f0 at (x0, n1 - 1), the step above, best in squared error. mu = (d1 f1 - lambda a1 x1) / b1^2
    and the prediction c0 mu + w0 x0 are linear in (f1, x1, x0), so the error is a quadratic form in their
    Gram matrix G with f0 (float64): times d0^2 = (p lambda + q)^2 (p = a0^2, q = b0^2) the coefficient
    vector is v0 + lambda v1, so

        error(lambda) = (alpha + 2 beta lambda + gamma lambda^2) / (p lambda + q)^2,
        alpha, beta, gamma = v0' G v0, v0' G v1, v1' G v1:

    two products with the grid's powers give it at every grid point at once."""
    t = kernel.table_on("gaussian fit", _fit_table(kernel), f1.device, torch.float64)[n1]
    v = t[:, :8].view(-1, 2, 4)  # (v0, v1) at the step pair (n1 - 1, n1)
    vectors = torch.stack((f1, x1, x0, f0), 1).flatten(2).double()
    gram = torch.bmm(vectors, vectors.transpose(1, 2))
    m = torch.bmm(torch.bmm(v, gram), v.transpose(1, 2)).view(-1, 4)  # alpha, beta, beta, gamma
    grid, powers, den_powers = _grid_powers(f1.device)
    error = (m @ powers) / (t[:, 8:] @ den_powers)  # (A, G)
    return grid[error.argmin(1)]


LAMBDA_GRID = torch.cat(
    [torch.zeros(1, dtype=torch.float64), torch.logspace(-4, 4, 2049, dtype=torch.float64)]
)  # 256 a decade


@lru_cache(maxsize=8)
def _grid_powers(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LAMBDA_GRID (G,), (1, l, l, l^2) (4, G) against (alpha, beta, beta, gamma), (l^2, l, 1) (3, G) against
    (p^2, 2 p q, q^2), on `device`."""
    lam = LAMBDA_GRID
    one = torch.ones_like(lam)
    return (
        lam.to(device),
        torch.stack((one, lam, lam, lam * lam)).to(device),
        torch.stack((lam * lam, lam, one)).to(device),
    )


@lru_cache(maxsize=16)
def _fit_table(kernel: Kernel) -> torch.Tensor:
    """fit_lambda's coefficients per fitted step n (a, b the signal and noise of n, a0, b0 of n - 1; step 0
    takes itself), float64: v0 = b0^2 (1, 0, 0, -1), v1 = (b0^2 a^2 / b^2, -b0^2 a / b^2, a0, -a0^2), then
    (p^2, 2 p q, q^2) with p = a0^2, q = b0^2."""
    a, b = kernel.signal.to(torch.float64), kernel.noise.to(torch.float64)
    a0, b0 = torch.cat([a[:1], a[:-1]]), torch.cat([b[:1], b[:-1]])
    p, q, zero = a0 * a0, b0 * b0, torch.zeros_like(a)
    r = q / (b * b)
    return torch.stack((q, zero, zero, -q, r * a * a, -r * a, a0, -p, p * p, 2 * p * q, q * q), 1)


@lru_cache(maxsize=16)
def _mu_table(kernel: Kernel) -> torch.Tensor:
    """(a^2 / b^2, a / b^2) per step (a, b the signal and noise), float64: gaussian's mu from x0 and x."""
    a, b = kernel.signal.to(torch.float64), kernel.noise.to(torch.float64)
    return torch.stack((a * a / (b * b), a / (b * b)), 1)
