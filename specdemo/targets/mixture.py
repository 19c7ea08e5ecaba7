"""Isotropic Gaussian mixtures: analytic targets whose every kernel is exact.

For x_t = alpha x0 + sigma xi and x0 ~ sum_k pi_k N(mu_k, tau_k^2 I), the posterior mean is

    E[x0 | x_t] = sum_k r_k(x_t) (mu_k + alpha tau_k^2 / v_k (x_t - alpha mu_k)),  v_k = alpha^2 tau_k^2 + sigma^2,

with responsibilities r_k proportional to pi_k N(x_t; alpha mu_k, v_k I). From it come eps, v and x0
predictions (VP and flow kernels) and, at alpha = 1, sigma = 0, the score for Langevin.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SpecdemoError
from ..kernels import FlowChurnKernel, Kernel, LangevinKernel, VPKernel

MIXTURE_JSON_HELP = 'a JSON file {"weights": [...], "means": [[...], ...], "stds": [...]}'


@dataclass(frozen=True)
class GaussianMixture:
    """weights (K,), means (K, d), stds (K,): the mixture sum_k weights_k N(means_k, stds_k^2 I)."""

    weights: tuple[float, ...]
    means: tuple[tuple[float, ...], ...]
    stds: tuple[float, ...]

    def __post_init__(self):
        k = len(self.weights)
        if k == 0 or len(self.means) != k or len(self.stds) != k:
            raise SpecdemoError(
                f"a mixture needs as many weights, means and stds (got {len(self.weights)}, "
                f"{len(self.means)}, {len(self.stds)}); expected {MIXTURE_JSON_HELP}"
            )
        dims = {len(m) for m in self.means}
        if len(dims) != 1 or 0 in dims:
            raise SpecdemoError(
                f"every mixture mean must have the same, non-zero dimension; got dimensions {sorted(dims)}"
            )
        values = [*self.weights, *self.stds, *(v for m in self.means for v in m)]
        if not all(math.isfinite(v) for v in values):
            raise SpecdemoError("mixture weights, means and stds must be finite numbers (no NaN or inf)")
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise SpecdemoError("mixture weights must be >= 0 with a positive sum")
        if min(self.stds) <= 0:
            raise SpecdemoError("mixture stds must be > 0")

    @classmethod
    def from_arrays(cls, weights, means, stds) -> GaussianMixture:
        as_floats = lambda a: tuple(float(v) for v in np.asarray(a, dtype=np.float64).ravel())
        try:
            means = np.asarray(means, dtype=np.float64)
        except ValueError:  # ragged: numpy cannot make it an array
            raise SpecdemoError("every mixture mean must be a list of numbers of the same dimension") from None
        if means.ndim != 2:
            raise SpecdemoError(f"mixture means must be a list of vectors (K x d); got an array of shape {means.shape}")
        return cls(as_floats(weights), tuple(tuple(float(v) for v in m) for m in means), as_floats(stds))

    @classmethod
    def from_json(cls, path: str | Path) -> GaussianMixture:
        try:
            spec = json.loads(Path(path).read_text())
            return cls.from_arrays(spec["weights"], spec["means"], spec["stds"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            if isinstance(err, SpecdemoError):
                raise
            raise SpecdemoError(f"cannot read mixture {path}: {err}; expected {MIXTURE_JSON_HELP}") from None

    def to_json(self) -> dict:
        return {"weights": list(self.weights), "means": [list(m) for m in self.means], "stds": list(self.stds)}

    @property
    def dim(self) -> int:
        return len(self.means[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dim,)

    def sample(self, num: int, generator: torch.Generator) -> torch.Tensor:
        """Exact draws of x0 (float64), for tests and figures."""
        w = torch.tensor(self.weights, dtype=torch.float64)
        comp = torch.multinomial(w / w.sum(), num, replacement=True, generator=generator)
        mu = torch.tensor(self.means, dtype=torch.float64)[comp]
        tau = torch.tensor(self.stds, dtype=torch.float64)[comp, None]
        return mu + tau * torch.randn(num, self.dim, generator=generator, dtype=torch.float64)

    def log_density(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) of the clean mixture, for figures."""
        return MixtureNetwork(self, None)._log_joint(x, 1.0, 0.0).logsumexp(-1)

    def network(self, kernel: Kernel) -> MixtureNetwork:
        """The exact network for `kernel`: its output is in kernel.prediction_type."""
        return MixtureNetwork(self, kernel)


def _dot_means(x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """x_r . mu_k per row r and component k, (R, K), each row reduced on its own."""
    return (x[:, None, :] * mu).sum(-1)


def _mix_means(r: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """sum_k r_rk mu_k per row r, (R, d), each row reduced on its own."""
    return (r[:, :, None] * mu).sum(1)


class MixtureNetwork:
    """Exact network output of a Gaussian mixture at (x, step n), per row. Follows the Network
    protocol of specdemo.models: called as net(x [R, d], n [R]).

    Each row is computed on its own: products with the means are elementwise products summed over one
    axis, not matrix products, whose blocking (and so rounding) depends on the number of rows. A
    row's output is then the same bit for bit in any batch on a CPU (tests/test_reproducible.py)."""

    def __init__(self, mixture: GaussianMixture, kernel: Kernel | None):
        self.mixture, self.kernel = mixture, kernel
        self._params: dict = {}
        if kernel is not None and not isinstance(kernel, (VPKernel, FlowChurnKernel, LangevinKernel)):
            raise SpecdemoError(f"no analytic mixture network for the {kernel.name} kernel")

    def _on(self, like: torch.Tensor):
        key = (like.device, like.dtype)
        if key not in self._params:
            m = self.mixture
            w = torch.tensor(m.weights, dtype=torch.float64)
            mu = torch.tensor(m.means, dtype=torch.float64)
            self._params[key] = [
                t.to(device=like.device, dtype=like.dtype)
                for t in (mu, (mu**2).sum(-1), torch.tensor(m.stds, dtype=torch.float64) ** 2, (w / w.sum()).log())
            ]
        return self._params[key]

    def _log_joint(self, x, alpha, sigma):
        """log pi_k + log N(x; alpha mu_k, v_k I) per row and component; alpha, sigma broadcast (R, 1)."""
        mu, mu_sq, tau2, log_w = self._on(x)
        v = alpha**2 * tau2 + sigma**2  # (R, K)
        sq = (x * x).sum(-1, keepdim=True) - 2 * alpha * _dot_means(x, mu) + alpha**2 * mu_sq
        return log_w - 0.5 * sq.clamp_min(0) / v - 0.5 * x.shape[-1] * torch.log(2 * math.pi * v)

    def posterior_mean(self, x, alpha, sigma):
        """E[x0 | x_t = x] for x_t = alpha x0 + sigma xi; alpha, sigma are (R, 1) tensors."""
        mu, _, tau2, _ = self._on(x)
        r = self._log_joint(x, alpha, sigma).softmax(-1)  # (R, K)
        gain = alpha * tau2 / (alpha**2 * tau2 + sigma**2)  # (R, K)
        # sum_k r_k (mu_k (1 - alpha gain_k) + gain_k x)
        return (r * gain).sum(-1, keepdim=True) * x + _mix_means(r * (1 - alpha * gain), mu)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """grad log p(x) of the clean mixture: sum_k r_k(x) (mu_k - x) / tau_k^2."""
        mu, _, tau2, _ = self._on(x)
        one = torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)
        r = self._log_joint(x, one, 0 * one).softmax(-1) / tau2
        return _mix_means(r, mu) - r.sum(-1, keepdim=True) * x

    def __call__(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = self.kernel
        if isinstance(k, LangevinKernel):
            return self.score(x)
        assert isinstance(k, (VPKernel, FlowChurnKernel))  # the kernels __init__ accepts
        alpha = k.table("signal", k.signal, x)[n, None]
        sigma = k.table("noise", k.noise, x)[n, None]
        return k.output_from_denoised(self.posterior_mean(x, alpha, sigma), x, n)
