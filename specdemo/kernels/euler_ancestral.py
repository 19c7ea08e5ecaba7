"""Euler ancestral sampling (diffusers' EulerAncestralDiscreteScheduler), written as a VP kernel.

diffusers keeps its latents in "sigma space", x_sigma = x0 + sigma eps with sigma_n^2 = (1 - abar)/abar
at the step's (possibly interpolated) timestep, starts from x_sigma ~ N(0, init_noise_sigma^2 I), feeds
the network x_sigma / sqrt(1 + sigma_n^2) (`scale_model_input`) and steps

    sigma_up   = sqrt(sigma_{n+1}^2 (sigma_n^2 - sigma_{n+1}^2) / sigma_n^2),
    sigma_down = sqrt(sigma_{n+1}^2 - sigma_up^2),
    x_sigma'   = x_sigma + (sigma_down - sigma_n) (x_sigma - x0-hat) / sigma_n + sigma_up xi.

**State parametrisation: VP space.** The kernel's state is the network's input,
y_n = x_sigma / k_n with k_n = sqrt(1 + sigma_n^2) = 1 / sqrt(abar_n), which is the VP state
y = sqrt(abar) x0 + sqrt(1 - abar) eps. In it, (x_sigma - x0-hat) / sigma_n = eps-hat, the VP noise
estimate, and the step reads

    m_n(y) = (k_n / k_{n+1}) y + ((sigma_down - sigma_n) / k_{n+1}) eps-hat(y, out),
    s_n    = sigma_up / k_{n+1},

with x0-hat, eps-hat the usual VP estimates at abar_n = 1 / (1 + sigma_n^2) (eps- and v-prediction,
exactly diffusers' own conversions). Why this and not the sigma-space state: the network adapters
(UNetNetwork, GuidedNetwork), the frozen draft (x0-hat and the output it implies), draft networks and
every sampler buffer then take the state as it is, exactly as for ddpm and ddim: no adapter learns
about `scale_model_input`, and a model's output at a state means the same under every VP kernel.
The step stays Gaussian with a mean affine in (y, out), so it is one more VPKernel table (a_n = 0).
The last step (sigma_{n+1} = 0, k = 1) is the deterministic x0-hat, so the final state is diffusers'
final latent; intermediate states are diffusers' latents divided by k_n.

The prior is diffusers' own: x_sigma = init_noise_sigma xi, so y_0 = (init_noise_sigma / k_0) xi,
which is xi itself under "leading" spacing (init_noise_sigma = k_0) and sigma_0 / k_0 = sqrt(1 - abar_0)
times xi under "linspace" and "trailing" (init_noise_sigma = sigma_max there).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import EulerAncestralDiscreteScheduler

from ..errors import SpecdemoError
from .base import scheduler_settings
from .vp import VPKernel

PREDICTION_TYPES = ("epsilon", "v_prediction")  # diffusers' step raises NotImplementedError for "sample"
SPACINGS = ("linspace", "leading", "trailing")


class EulerAncestralKernel(VPKernel):
    """m_n(y) = (k_n / k_{n+1}) y + ((sigma_down - sigma_n) / k_{n+1}) eps-hat, s_n = sigma_up / k_{n+1},
    k = sqrt(1 + sigma^2), on the scheduler's own sigma grid (timestep spacing, steps_offset and the
    interpolation at fractional timesteps as set_timesteps makes them); the network gets the
    scheduler's timesteps. The last step is deterministic.
    """

    name = "euler-ancestral"

    def __init__(self, scheduler: EulerAncestralDiscreteScheduler, num_inference_steps: int) -> None:
        scheduler = EulerAncestralDiscreteScheduler.from_config(scheduler.config)
        cfg = scheduler.config
        if cfg.prediction_type not in PREDICTION_TYPES:
            raise SpecdemoError(
                f"Euler ancestral runs epsilon or v_prediction models, not {cfg.prediction_type!r} "
                "(diffusers' EulerAncestralDiscreteScheduler does not implement it)"
            )
        if cfg.timestep_spacing not in SPACINGS:
            raise SpecdemoError(f"timestep spacing {cfg.timestep_spacing!r} is not one of {', '.join(SPACINGS)}")
        scheduler.set_timesteps(num_inference_steps)
        self.scheduler = scheduler
        sigmas = scheduler.sigmas.to(torch.float64)  # the scheduler's float32 grid, then 0
        sigma, sigma_to = sigmas[:-1], sigmas[1:]
        sigma_up = (sigma_to**2 * (sigma**2 - sigma_to**2) / sigma**2).clamp_min(0).sqrt()
        sigma_down = (sigma_to**2 - sigma_up**2).clamp_min(0).sqrt()
        k, k_to = (1 + sigma**2).sqrt(), (1 + sigma_to**2).sqrt()
        self.sigmas, self.sigma_up, self.sigma_down = sigmas, sigma_up, sigma_down
        init_noise_sigma = (
            sigmas.max() if cfg.timestep_spacing in ("linspace", "trailing") else (sigmas.max() ** 2 + 1).sqrt()
        )
        self.prior_std = float(init_noise_sigma / k[0])
        super().__init__(
            timesteps=scheduler.timesteps.clone(),
            a=torch.zeros_like(sigma),
            b=k / k_to,
            c=(sigma_down - sigma) / k_to,
            scales=sigma_up / k_to,
            alphas_cumprod_t=1 / k**2,
            prediction_type=cfg.prediction_type,
        )

    def prior(
        self, shape: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """Y_0 = x_sigma / k_0 with diffusers' x_sigma = init_noise_sigma xi."""
        y = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        return y if self.prior_std == 1.0 else y.mul_(self.prior_std)

    def config(self) -> dict[str, Any]:
        return {"kernel": "euler-ancestral", "steps": self.num_steps, "scheduler": scheduler_settings(self.scheduler)}
