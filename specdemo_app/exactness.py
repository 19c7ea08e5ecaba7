"""The page's exactness test: speculative samples against plain ones, by an energy two-sample test.

For the analytic targets, whose law the page can also draw (the mixtures' marginals).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdemo import PRESETS, GaussianMixture, SamplerConfig, SpecdemoError, Target, build
from specdemo.limits import Cancel, Limits
from specdemo.resolve import method_of

from .labels import describe
from .loading import cached_target
from .progress import Progress, TimeLeft, stage_callback
from .runner import check_click, log_density_of, plain_calls, plan_expects

MAX_TEST_SAMPLES = 2000  # per group: the test's pooled distance matrix grows as the square


def energy_test(x: torch.Tensor, y: torch.Tensor, permutations: int = 500, seed: int = 0) -> tuple[float, float]:
    """Energy-distance two-sample test (Szekely and Rizzo) with a permutation p-value.

    x (n, d), y (m, d). Returns (statistic, p-value); the statistic is the V-statistic
    2 E|X - Y| - E|X - X'| - E|Y - Y'|. Every permutation is one column of a single matrix product.
    """
    x, y = x.reshape(len(x), -1).double(), y.reshape(len(y), -1).double()
    n, m = len(x), len(y)
    z = torch.cat([x, y])
    d = torch.cdist(z, z)
    r = d.sum(1)
    total = r.sum()

    def stat(a: torch.Tensor) -> torch.Tensor:  # a: (N, P) indicators of the x group
        sxx = (a * (d @ a)).sum(0)
        ra = r @ a
        sxy = ra - sxx
        syy = total - 2 * ra + sxx
        return 2 * sxy / (n * m) - sxx / n**2 - syy / m**2

    g = torch.Generator().manual_seed(seed)
    observed = stat(torch.cat([torch.ones(n), torch.zeros(m)]).double()[:, None])[0]
    perms = torch.argsort(torch.rand(permutations, n + m, generator=g), dim=1)
    a = torch.zeros(n + m, permutations, dtype=torch.float64)
    a[perms[:, :n].T, torch.arange(permutations)] = 1.0
    null = stat(a)
    p = (1 + int((null >= observed).sum())) / (1 + permutations)
    return float(observed), float(p)


@dataclass
class ExactnessReport:
    statistic: float
    p_value: float
    plain: torch.Tensor
    speculative: torch.Tensor
    label: str
    mixture: GaussianMixture | None

    @property
    def verdict(self) -> str:
        return (
            "no evidence of a difference at the 5% level"
            if self.p_value >= 0.05
            else "the samples differ at the 5% level (expected about once in twenty runs)"
        )


def check_test(target: Target, num_samples: int) -> None:
    """Refuse a test of a model without a closed-form law, or of a number of samples out of range."""
    if not 20 <= num_samples <= MAX_TEST_SAMPLES:
        raise SpecdemoError(f"the exactness test takes 20..{MAX_TEST_SAMPLES} samples per group, got {num_samples}")
    if log_density_of(target) is None:
        raise SpecdemoError(
            f"the exactness test is offered for the analytic targets ({', '.join(PRESETS)}); "
            f"{target.name} is an image model"
        )


def exactness_check(
    config: SamplerConfig,
    num_samples: int,
    *,
    permutations: int = 500,
    progress: Progress | None = None,
    target: Target | None = None,
    draft_target: Target | None = None,
    limits: Limits | None = None,
    cancel: Cancel | None = None,
) -> ExactnessReport:
    """Draw num_samples with the chosen chain or tree and num_samples with the plain target sampler
    (independent seeds), then run the energy two-sample test. Analytic targets only. `limits`
    bound the two runs together, as in run_comparison."""
    target = target or cached_target(config.model)
    check_test(target, num_samples)
    if config.tree is None:
        raise SpecdemoError("no topology given; accepted: widths such as 3,2,1, KxL or 1xL")
    spec_cfg = replace(config, method=method_of(config.tree).value, num_samples=num_samples)
    check_click(spec_cfg, target, limits or Limits.from_env(), chain=False, plain=True, test=True)
    spec_problem = build(spec_cfg, target, draft_target=draft_target, limits=limits, cancel=cancel)
    plain_problem = build(replace(spec_cfg.with_method("target"), seed=config.seed + 1), target, limits=limits)
    clock = TimeLeft([plain_calls(plain_problem)], *plan_expects(spec_problem))
    spec = (
        spec_problem.run(callback=stage_callback(progress, 0, 0.5, describe(spec_problem), clock), cancel=cancel)
        .samples.float()
        .cpu()
    )
    plain = (
        plain_problem.run(callback=stage_callback(progress, 0.5, 0.95, "plain target", clock), cancel=cancel)
        .samples.float()
        .cpu()
    )
    if progress is not None:
        progress(0.97, "two-sample test")
    statistic, p = energy_test(spec, plain, permutations=permutations, seed=config.seed)
    mixture = target.target if isinstance(getattr(target, "target", None), GaussianMixture) else None
    return ExactnessReport(statistic, p, plain, spec, describe(spec_problem), mixture)
