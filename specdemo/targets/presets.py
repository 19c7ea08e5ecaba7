"""Built-in analytic targets, each with the kernel settings it is meant for."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .densities import Banana, Density, Ring
from .mixture import GaussianMixture

GM512_SEED = 20260714


def gm512() -> GaussianMixture:
    """The draft-tree authors' benchmark (algorithms.md section 5): d = 512, 5 equal components,
    means uniform in [-2, 2] then stds uniform in [0.10, 0.25], from numpy's default_rng(20260714)."""
    rng = np.random.default_rng(GM512_SEED)
    means = rng.uniform(-2.0, 2.0, size=(5, 512))
    stds = rng.uniform(0.10, 0.25, size=5)
    return GaussianMixture.from_arrays(np.full(5, 0.2), means, stds)


def gm2d() -> GaussianMixture:
    """Eight components on a circle of radius 2 plus a heavier one at the centre."""
    angles = np.arange(8) * 2 * math.pi / 8
    means = np.concatenate([2 * np.stack([np.cos(angles), np.sin(angles)], 1), np.zeros((1, 2))])
    return GaussianMixture.from_arrays([1.0] * 8 + [2.0], means, [0.15] * 8 + [0.3])


def gm16() -> GaussianMixture:
    """Four components in 16 dimensions, means and stds drawn from a fixed seed."""
    rng = np.random.default_rng(16)
    return GaussianMixture.from_arrays(
        [0.4, 0.3, 0.2, 0.1], rng.uniform(-1.5, 1.5, size=(4, 16)), rng.uniform(0.2, 0.5, size=4)
    )


@dataclass(frozen=True)
class Preset:
    """A named target and the kernel settings (CLI flags) it defaults to."""

    name: str
    description: str
    build: Callable[[], GaussianMixture | Density]
    defaults: dict = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "gm2d", "2-D mixture: 8 Gaussians on a circle and one at the centre", gm2d, {"kernel": "ddpm", "steps": 100}
        ),
        Preset("gm16", "16-D mixture of 4 Gaussians (fixed seed)", gm16, {"kernel": "ddpm", "steps": 100}),
        Preset(
            "gm512",
            "the draft-tree authors' benchmark: 512-D, 5 Gaussians, flow matching with churn 0.06, T = 30",
            gm512,
            {"kernel": "flow-churn", "steps": 30, "churn": 0.06},
        ),
        Preset(
            "banana",
            "unnormalised 2-D banana density (Langevin only)",
            Banana,
            {"kernel": "langevin", "steps": 200, "gamma": 0.01},
        ),
        Preset(
            "ring",
            "unnormalised 2-D ring density (Langevin only)",
            Ring,
            {"kernel": "langevin", "steps": 200, "gamma": 0.005},
        ),
    )
}
