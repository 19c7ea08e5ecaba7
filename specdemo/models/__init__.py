"""Model adapters: analytic targets; diffusers pixel UNets, latent text-to-image (Stable Diffusion
1.x/2.x) and flow transformer (SD3) pipelines from a folder or the Hub."""

from ..config import KERNEL_NAMES, MODEL_HELP
from ..errors import SpecdemoError
from ..targets.presets import PRESETS
from .analytic import AnalyticTarget, analytic_target
from .base import Target
from .diffusers_unet import EMBEDDED, DiffusersTarget, load_diffusers_target

MAX_MODEL_NAME = 512


def resolve_target(spec: str, hub_only: bool = False, max_download_bytes: int | None = None) -> Target:
    """A preset name, a mixture JSON file, an embedded model, a local diffusers folder or a Hub id.
    hub_only: a preset, an embedded model or a Hub id, never a local path (what a public app lets a
    visitor name); max_download_bytes: a Hub model with more weights is refused before any download."""
    spec = str(spec).strip()
    if not spec:
        raise SpecdemoError(f"no model given; accepted: {MODEL_HELP}")
    if len(spec) > MAX_MODEL_NAME:  # a path or Hub id is never this long; echo only its start
        raise SpecdemoError(
            f"model name {spec[:40]!r}... is {len(spec)} characters long, over the limit of "
            f"{MAX_MODEL_NAME}; accepted: {MODEL_HELP}"
        )
    if hub_only and spec not in PRESETS:
        return load_diffusers_target(spec, hub_only=True, max_download_bytes=max_download_bytes)
    return analytic_target(spec) or load_diffusers_target(spec, max_download_bytes=max_download_bytes)


__all__ = ["Target", "AnalyticTarget", "DiffusersTarget", "resolve_target", "KERNEL_NAMES", "EMBEDDED", "MODEL_HELP"]
