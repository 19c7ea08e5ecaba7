"""What one click may ask for on the Space's hardware, checked before any work.

The library bounds a run's target rows, steps, samples and seconds (specdemo.limits) and the runner
bounds a click's runs together (runner.check_click); here are the Space's own figures for those
bounds and its bound on a round's size, samples x tree nodes. The Space's owner can set the rows,
steps and seconds with SPECDEMO_APP_MAX_ROWS, SPECDEMO_APP_MAX_STEPS and SPECDEMO_APP_MAX_SECONDS.

A target row does not cost the same on every model: MAX_ROWS counts rows of the embedded digits UNet
(an image model's figure; a preset's rows are cheaper still), and a network's row is weighed by
row_cost, its estimated work in digits rows (a Stable Diffusion 1.5 row with guidance: about 43,000).
A click may evaluate MAX_ROWS / row_cost of its rows on a CPU; a GPU runs small rows about 16 times as
many (its calls are bound by their launch, not their work) and large ones up to GPU_COMPUTE_SCALE
times (bound by their work): gpu_scale. So Stable Diffusion is refused on a CPU Space, with the reason,
and bounded to a few thousand rows a click on a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from specdemo.errors import SpecdemoError
from specdemo.limits import Limits

if TYPE_CHECKING:
    from specdemo import Target
    from specdemo.resolve import Settings

MAX_SAMPLES = {"image": 64, "other": 4096}  # what one click may ask for (x16 on a GPU)
MAX_WORK = {"image": 4096, "other": 1_500_000}  # samples x tree nodes per round, ditto
# a click's bound on target rows (samples x steps x rows per round, pilots included; specdemo.limits),
# steps and seconds
MAX_ROWS = {"image": 250_000, "other": 50_000_000}
MAX_STEPS = 1000
MAX_SECONDS = 120.0
GPU_SCALE = 16  # a GPU's multiple of a CPU click's rows for rows as cheap as the digits model's ...
GPU_COMPUTE_SCALE = 1000  # ... and at most, for rows whose work keeps it busy (fp16 against one fp32 CPU thread)
DIGITS_WORK = 635_553 * 16 * 16  # the digits UNet's parameters x the positions it runs at: a row_cost of 1
TEST_WORK = 2 * MAX_WORK["other"]  # the exactness test's samples x tree nodes per round (analytic targets only)


def target_kind(target: Target) -> str:
    """plane (2-D vectors), image (C, H, W), or vector."""
    if len(target.shape) == 3:
        return "image"
    return "plane" if tuple(target.shape) == (2,) else "vector"


def limit_kind(target: Target) -> str:
    """Which of the Space's figures bound a target's runs: "image" or "other"."""
    return "image" if target_kind(target) == "image" else "other"


def on_gpu(device: str) -> bool:
    return device != "cpu" and torch.cuda.is_available()


def gpu_scale(device: str, cost: float = 1.0) -> float:
    """The multiple of a CPU click's work a click gets on a GPU for rows of `cost` (row_cost): 16 for
    rows as cheap as the digits model's, growing with the row's work up to GPU_COMPUTE_SCALE; 1 on the CPU."""
    return min(GPU_SCALE * max(cost, 1.0), GPU_COMPUTE_SCALE) if on_gpu(device) else 1


def _parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def denoiser_work(target: Target) -> float | None:
    """A network target's work per evaluation of one row, in parameters x positions: its denoiser's
    parameters times the positions it is applied at (the sample's H x W; a transformer's patches).
    A rough measure of its multiply-adds (a UNet's deeper weights act at lower resolutions), kept for
    comparing models; None for a target without a network module (the analytic presets)."""
    denoiser = getattr(target, "denoiser", None) or getattr(target, "unet", None)
    if denoiser is None or len(target.shape) != 3:
        return None
    patch = getattr(getattr(denoiser, "config", None), "patch_size", None) or 1
    return float(_parameters(denoiser)) * target.shape[1] * target.shape[2] / patch**2


def guided(target: Target, guidance_scale: float | None) -> bool:
    """Whether a text-to-image run evaluates two rows per node (classifier-free guidance, w > 1)."""
    if not getattr(target, "text_conditioned", False):
        return False
    w = guidance_scale if guidance_scale is not None else target.defaults.get("guidance_scale", 1.0)
    return w > 1


def row_cost(target: Target, guidance_scale: float | None = None) -> float:
    """A target row's estimated work in rows of the digits UNet (at least 1): denoiser_work over the
    digits model's, twice for a guided row (its conditional and unconditional evaluations)."""
    work = denoiser_work(target)
    if work is None:
        return 1.0
    return max(1.0, work / DIGITS_WORK * (2 if guided(target, guidance_scale) else 1))


def decode_cost(target: Target) -> float:
    """Decoding one latent for display, in digits rows (the VAE decoder's parameters x a quarter of
    the image's pixels: most of its weights act below full resolution); 0 for a pixel model."""
    vae = getattr(getattr(target, "pipeline", None), "vae", None)
    if vae is None or not getattr(target, "text_conditioned", False):
        return 0.0
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    pixels = target.shape[1] * target.shape[2] * scale**2
    return _parameters(vae.decoder) * pixels / 4 / DIGITS_WORK


def step_limit() -> int:
    """The most steps a click may ask for, as the owner set it."""
    return Limits.from_env("SPECDEMO_APP_", max_steps=MAX_STEPS).max_steps


def click_limits(target: Target, device: str, guidance_scale: float | None = None) -> Limits:
    """What one click may ask for (the library checks it before any work): MAX_ROWS digits rows times
    the device's scale for rows of the target's cost (SPECDEMO_APP_MAX_ROWS, where the owner sets it,
    is the digits rows a click may evaluate on any device), over that cost: the target's own rows."""
    kind, cost = limit_kind(target), row_cost(target, guidance_scale)
    samples_scale = GPU_SCALE if on_gpu(device) else 1
    limits = Limits.from_env(
        "SPECDEMO_APP_",
        max_steps=MAX_STEPS,
        max_samples=MAX_SAMPLES[kind] * samples_scale,
        max_rows=int(MAX_ROWS[kind] * gpu_scale(device, cost)),
        max_seconds=MAX_SECONDS,
    )
    return replace(limits, max_rows=max(1, int(limits.max_rows / cost)))


def check_round_size(settings: Settings, test: bool = False) -> None:
    """Refuse more samples x tree nodes a round (Settings.round_nodes) than the Space runs at once: MAX_WORK
    for a click, TEST_WORK for an exactness test (test)."""
    nodes, samples = settings.round_nodes, settings.config.num_samples
    if settings.topology is not None:
        what = f"tree {settings.topology} ({nodes} nodes per round)"
    else:
        assert settings.plan is not None  # resolve(): a run without a fixed topology has a plan request
        what = f"auto topology of {settings.plan.budget} rows"
    if test:
        most = TEST_WORK
    else:
        most = MAX_WORK[limit_kind(settings.target)] * (GPU_SCALE if on_gpu(settings.config.device) else 1)
    if samples * nodes > most:
        bound = "" if test else f" (samples × nodes ≤ {most})"
        raise SpecdemoError(
            f"{samples} {'test ' if test else ''}samples with {what} is more than this app runs at "
            f"once{bound}; use fewer samples or a smaller tree"
        )
