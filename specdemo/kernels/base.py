"""The Gaussian kernels of algorithms.md section 1: Q_n( . | y) = N(m_n(y), s_n^2 I).

Every kernel of section 1 is linear in the state and the network output, up to the clipping of the
denoised estimate that some diffusers schedulers apply:

    x0-hat_n(x, out) = D_n x + E_n out,
    m_n(x, out)      = A_n x + B_n out + C_n clip(x0-hat_n(x, out)),

with per-step coefficients A..E (C_n = 0 without clipping, D and E undefined for a kernel without a
denoised estimate, Langevin). A kernel is its table of coefficients and scales; one gather gives a
row's five coefficients, so a mean costs one lookup and a few fused operations whatever the kernel.
Steps with s_n = 0 are deterministic: the sampler takes them with the target.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

COEFFICIENTS = ("A", "B", "C", "D", "E")
ROUND_ORDER = (0, 1, 3, 4, 2)  # A, B, D, E, C: [[A, B], [D, E]], (A, C) and (B, E) are views of a round's rows


class StepCoefficients(NamedTuple):
    """A_n..E_n for some rows, each shaped to broadcast against the rows' states."""

    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    E: torch.Tensor


class Kernel:
    """Base of every kernel: N steps, per-step scales s_n (float64), the network's time inputs and
    the coefficient table (N, 5) of the linear form above.

    Methods take a step tensor n and tensors whose leading dimensions are n's (rows, or rows and
    nodes); outputs broadcast against the state. Subclasses set `prediction_type` (what the network
    outputs) and `name`, and pass their tables to __init__.
    """

    prediction_type: str
    name: str
    # x_t = signal x0 + noise eps, per step (float64): set by the kernels with a denoised estimate (VP, flow)
    signal: torch.Tensor
    noise: torch.Tensor

    def __init__(
        self,
        scales: torch.Tensor,
        timesteps: torch.Tensor,
        coefficients: torch.Tensor,
        clip_range: float | None = None,
        has_denoised: bool = True,
    ) -> None:
        self.scales = scales.to(torch.float64)
        self.timesteps = timesteps
        self.coefficient_table = coefficients.to(torch.float64)  # (N, 5): A..E per step
        self._columns = self.coefficient_table.T.contiguous()  # (5, N): a row's coefficients in one gather
        if has_denoised:  # m_n given x0-hat: (A - B D / E) x + (B / E) x0-hat + C clip(x0-hat)
            a, b, c, d, e = self._columns
            self._denoised_columns = torch.stack((a - b * d / e, b / e, c))
            self._denoising_rows = torch.stack((d, e), 1)  # (N, 2): x0-hat = D x + E out
        self.clip_range = clip_range
        self.has_denoised = has_denoised
        self._tables: dict[tuple, torch.Tensor] = {}
        self._run_lengths: torch.Tensor | None = None

    @property
    def num_steps(self) -> int:
        return int(self.scales.numel())

    def stochastic_run_lengths(self) -> torch.Tensor:
        """r[n] = number of consecutive steps with s > 0 starting at step n (r[N] = 0).

        A round starting at step n speculates at most r[n] steps: trees are truncated there.
        """
        if self._run_lengths is None:
            runs, stochastic = [0] * (self.num_steps + 1), (self.scales > 0).tolist()
            for n in range(self.num_steps - 1, -1, -1):
                runs[n] = runs[n + 1] + 1 if stochastic[n] else 0
            self._run_lengths = torch.tensor(runs, dtype=torch.long)
        return self._run_lengths.clone()

    def table(self, name: str, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`values` (a per-step float64 table) on like's device and dtype, cached."""
        return self.table_on(name, values, like.device, like.dtype)

    def table_on(self, name: str, values: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (name, device, dtype)
        cached = self._tables.get(key)
        if cached is None:
            cached = self._tables[key] = values.to(device=device, dtype=dtype)
        return cached

    def step_scalars(self, n: torch.Tensor, dtype: torch.dtype) -> StepCoefficients:
        """A_n..E_n for steps n, each shaped as n (for per-step scalars, not broadcast against a state)."""
        columns = torch.index_select(self.table_on("coefficients", self._columns, n.device, dtype), 1, n.reshape(-1))
        return StepCoefficients(*columns.view(5, *n.shape).unbind(0))

    def denoised_scalars(self, n: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(A_n - B_n D_n / E_n, B_n / E_n, C_n) for steps n, each shaped as n: the mean as a function of x and
        the denoised estimate, m_n = (A - B D / E) x + (B / E) x0-hat + C clip(x0-hat)."""
        self._needs_denoised()
        columns = torch.index_select(
            self.table_on("denoised", self._denoised_columns, n.device, dtype), 1, n.reshape(-1)
        )
        return columns.view(3, *n.shape).unbind(0)

    def coefficients(self, n: torch.Tensor, like: torch.Tensor) -> StepCoefficients:
        """A_n..E_n for steps n, shaped to broadcast against `like`, whose leading dimensions are n's."""
        columns = torch.index_select(self.table("coefficients", self._columns, like), 1, n.reshape(-1))
        return StepCoefficients(*columns.view(5, *n.shape, *[1] * (like.dim() - n.dim())).unbind(0))

    def round_rows(self, n: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """A_n, B_n, D_n, E_n, C_n and s_n of steps n (M,), written into out (M, 6) (its dtype and device): what
        a sampling round gathers once for every level of every trajectory (specdemo.sampling.layout)."""
        key = ("round rows", out.device, out.dtype)
        table = self._tables.get(key)
        if table is None:
            rows = torch.cat([self.coefficient_table[:, ROUND_ORDER], self.scales[:, None]], 1)
            table = self._tables[key] = rows.to(device=out.device, dtype=out.dtype)
        return torch.index_select(table, 0, n, out=out)

    def scale(self, n: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """s_n shaped to broadcast against `like`."""
        return self.table("scale", self.scales, like)[n].view(*n.shape, *([1] * (like.dim() - n.dim())))

    def mean(self, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return self.mean_with(self.coefficients(n, x), out, x)

    def mean_with(self, k: StepCoefficients, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """m_n from coefficients already gathered for these rows."""
        m = torch.addcmul(k.A * x, k.B, out)
        if self.clip_range is not None:
            r = self.clip_range
            m.addcmul_(k.C, torch.addcmul(k.D * x, k.E, out).clamp_(-r, r))
        return m

    def denoised(self, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        self._needs_denoised()
        d, e = (
            self.table("denoising", self._denoising_rows, x)[n]
            .view(*n.shape, 2, *[1] * (x.dim() - n.dim()))
            .unbind(n.dim())
        )
        return torch.addcmul(d * x, e, out)

    def output_from_denoised(self, x0: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """The network output whose denoised estimate at x is x0: out = (x0 - D x) / E."""
        self._needs_denoised()
        k = self.coefficients(n, x)
        return torch.addcmul(x0, k.D, x, value=-1).div_(k.E)

    def _needs_denoised(self) -> None:
        if not self.has_denoised:
            raise NotImplementedError(f"the {self.name} kernel has no denoised estimate x0-hat")

    def prior(
        self, shape: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """One draw of the initial state Y_0."""
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    def config(self) -> dict:
        """A JSON-serialisable description (enough to rebuild the kernel)."""
        raise NotImplementedError


def scheduler_settings(scheduler: Any) -> dict[str, Any]:
    """A diffusers scheduler's config without its bookkeeping entries (names starting with "_", such
    as the set of defaulted names, whose order varies): what rebuilds it, in a stable form."""
    return {k: v for k, v in scheduler.config.items() if not k.startswith("_")}
