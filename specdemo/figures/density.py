"""A 2-D target's density under its points: the views of the round and of the samples share it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go
import torch

from .style import DENSITY_COLORSCALE

LogDensity = Callable[[torch.Tensor], torch.Tensor]


def plot_limits(
    *clouds: np.ndarray | None, pad: float = 0.12, quantile: float = 0.005
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Square-ish limits that hold the bulk of the given (n, 2) point clouds (NaN rows ignored)."""
    pts = np.concatenate([c.reshape(-1, 2) for c in clouds if c is not None and c.size])
    pts = pts[np.isfinite(pts).all(1)]
    if not len(pts):
        return (-3.0, 3.0), (-3.0, 3.0)
    lo, hi = np.quantile(pts, quantile, axis=0), np.quantile(pts, 1 - quantile, axis=0)
    span = np.maximum(hi - lo, 1e-3)
    lo, hi = lo - pad * span, hi + pad * span
    return (float(lo[0]), float(hi[0])), (float(lo[1]), float(hi[1]))


def density_grid(
    log_density: LogDensity, xlim, ylim, resolution: int = 160
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """exp(log density) on a grid, scaled to max 1 (unnormalised densities are fine)."""
    xs = np.linspace(xlim[0], xlim[1], resolution)
    ys = np.linspace(ylim[0], ylim[1], resolution)
    gx, gy = np.meshgrid(xs, ys)
    pts = torch.tensor(np.stack([gx.ravel(), gy.ravel()], 1), dtype=torch.float64)
    with torch.no_grad():
        logp = log_density(pts).double().numpy().reshape(gx.shape)
    z = np.exp(logp - np.nanmax(logp))
    return xs, ys, z


def density_trace(log_density: LogDensity, xlim, ylim, *, showscale: bool = False, resolution: int = 160) -> go.Heatmap:
    xs, ys, z = density_grid(log_density, xlim, ylim, resolution)
    return go.Heatmap(
        x=xs,
        y=ys,
        z=np.sqrt(z).astype(np.float32),
        colorscale=DENSITY_COLORSCALE,
        showscale=showscale,
        hoverinfo="skip",
        zsmooth="best",
    )
