"""Analytic targets (Gaussian mixtures, 2-D densities) as models: every kernel is exact for them."""

from __future__ import annotations

from diffusers import DDIMScheduler

from ..errors import SettingError
from ..kernels import DDIMKernel, DDPMKernel, FlowChurnKernel, LangevinKernel, default_ddpm_scheduler
from ..targets import Density, GaussianMixture
from ..targets.presets import PRESETS
from .base import Target

MAX_STEPS = 100_000


def check_steps(steps: int, low: int, high: int, kernel: str) -> None:
    if not low <= steps <= high:
        raise SettingError(
            "steps",
            steps,
            f"{low}..{high}",
            f"--steps {steps} is out of range for the {kernel} kernel: accepted {low}..{high}",
        )


class AnalyticTarget(Target):
    def __init__(self, name: str, target: GaussianMixture | Density, defaults: dict | None = None):
        self.name, self.target = name, target
        self.shape = target.shape
        self.kernels = ("langevin",) if isinstance(target, Density) else ("ddpm", "ddim", "flow-churn", "langevin")
        self.defaults = defaults or {"kernel": "ddpm", "steps": 100}

    def kernel(self, name, steps, *, eta=1.0, churn=0.06, gamma=0.01, prediction="epsilon"):
        self.check_kernel(name)
        if name == "ddpm":
            check_steps(steps, 1, 1000, name)
            return DDPMKernel(default_ddpm_scheduler(prediction_type=prediction), steps)
        if name == "ddim":
            check_steps(steps, 1, 1000, name)
            scheduler = DDIMScheduler(
                num_train_timesteps=1000, beta_schedule="linear", clip_sample=False, prediction_type=prediction
            )
            return DDIMKernel(scheduler, steps, eta)
        if name == "flow-churn":
            check_steps(steps, 2, 1000, name)
            return FlowChurnKernel(steps, churn)
        check_steps(steps, 1, MAX_STEPS, name)
        return LangevinKernel(steps, gamma)

    def network(self, kernel, device=None, dtype=None):
        return self.target.network(kernel)


def analytic_target(spec: str) -> AnalyticTarget | None:
    """A preset name or a mixture JSON path; None if spec is neither."""
    if spec in PRESETS:
        preset = PRESETS[spec]
        return AnalyticTarget(spec, preset.build(), dict(preset.defaults))
    if spec.endswith(".json"):
        return AnalyticTarget(spec, GaussianMixture.from_json(spec))
    return None
