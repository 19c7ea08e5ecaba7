"""Model adapters: analytic targets, and (specdemo.models.diffusers_unet) diffusers UNets."""

from ..errors import SpecdemoError
from ..targets.presets import PRESETS
from .analytic import AnalyticTarget, analytic_target
from .base import KERNEL_NAMES, Target


def resolve_target(spec: str) -> Target:
    """A preset name, a mixture JSON file, a local diffusers folder or a Hub id."""
    target = analytic_target(spec)
    if target is None:
        raise SpecdemoError(f"unknown model {spec!r}; accepted: {', '.join(PRESETS)}, or a mixture .json file")
    return target


__all__ = ["Target", "AnalyticTarget", "resolve_target", "KERNEL_NAMES"]
