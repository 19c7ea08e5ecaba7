"""The Gaussian kernels of algorithms.md section 1: Q_n( . | y) = N(m_n(y), s_n^2 I).

A kernel maps (network output, state, per-row step n) to the mean m_n and a step to its scale s_n.
Steps with s_n = 0 are deterministic: the sampler takes them with the target.
"""

from __future__ import annotations

import torch


class Kernel:
    """Base of every kernel: N steps, per-step scales s_n (float64) and the network's time inputs.

    Methods take a step tensor n and tensors whose leading dimensions are n's (rows, or rows and
    nodes); outputs broadcast against the state. Subclasses set `prediction_type` (what the network outputs) and implement `mean`; those whose
    process has a clean-data estimate implement `denoised` and `output_from_denoised`, which the
    frozen draft uses to freeze x0-hat instead of the raw network output (section 2).
    """

    prediction_type: str
    name: str

    def __init__(self, scales: torch.Tensor, timesteps: torch.Tensor):
        self.scales = scales.to(torch.float64)
        self.timesteps = timesteps
        self._tables: dict[tuple, torch.Tensor] = {}

    @property
    def num_steps(self) -> int:
        return int(self.scales.numel())

    def stochastic_run_lengths(self) -> torch.Tensor:
        """r[n] = number of consecutive steps with s > 0 starting at step n (r[N] = 0).

        A round starting at step n speculates at most r[n] steps: trees are truncated there.
        """
        runs = torch.zeros(self.num_steps + 1, dtype=torch.long)
        for n in range(self.num_steps - 1, -1, -1):
            runs[n] = runs[n + 1] + 1 if self.scales[n] > 0 else 0
        return runs

    def table(self, name: str, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`values` (a per-step float64 table) on like's device and dtype, cached."""
        key = (name, like.device, like.dtype)
        cached = self._tables.get(key)
        if cached is None:
            cached = self._tables[key] = values.to(device=like.device, dtype=like.dtype)
        return cached

    def per_row(self, name: str, values: torch.Tensor, n: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """values[n] shaped to broadcast against x, whose leading dimensions are n's."""
        return self.table(name, values, x)[n].view(*n.shape, *([1] * (x.dim() - n.dim())))

    def scale(self, n: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """s_n shaped to broadcast against `like`."""
        return self.per_row("scale", self.scales, n, like)

    def mean(self, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def denoised(self, out: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"the {self.name} kernel has no denoised estimate x0-hat")

    def output_from_denoised(self, x0: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"the {self.name} kernel has no denoised estimate x0-hat")

    @property
    def has_denoised(self) -> bool:
        return type(self).denoised is not Kernel.denoised

    def prior(self, shape: tuple[int, ...], generator: torch.Generator, device, dtype) -> torch.Tensor:
        """One draw of the initial state Y_0."""
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    def config(self) -> dict:
        """A JSON-serialisable description (enough to rebuild the kernel)."""
        raise NotImplementedError


def scheduler_settings(scheduler) -> dict:
    """A diffusers scheduler's config without its bookkeeping entries (names starting with "_", such
    as the set of defaulted names, whose order varies): what rebuilds it, in a stable form."""
    return {k: v for k, v in scheduler.config.items() if not k.startswith("_")}
