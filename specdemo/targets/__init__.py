"""Analytic targets: Gaussian mixtures (exact for every kernel) and unnormalised 2-D densities."""

from .densities import Banana, Density, Ring
from .mixture import GaussianMixture, MixtureNetwork
from .presets import PRESETS, Preset, gm2d, gm16, gm512

__all__ = [
    "GaussianMixture",
    "MixtureNetwork",
    "Density",
    "Banana",
    "Ring",
    "PRESETS",
    "Preset",
    "gm2d",
    "gm16",
    "gm512",
]
