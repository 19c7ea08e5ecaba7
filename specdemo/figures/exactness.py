"""Exactness at a glance: a two-sample test of speculative samples against plain target samples."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..targets import GaussianMixture
from .style import METHOD_COLORS, base_layout, legend_below


def mixture_marginal(mixture: GaussianMixture, coord: int, grid: np.ndarray) -> np.ndarray:
    w = np.asarray(mixture.weights) / np.sum(mixture.weights)
    mu = np.asarray(mixture.means)[:, coord]
    sd = np.asarray(mixture.stds)
    z = (grid[:, None] - mu[None]) / sd[None]
    return (w * np.exp(-0.5 * z**2) / (sd * np.sqrt(2 * np.pi))).sum(1)


def exactness_figure(
    plain: torch.Tensor,
    spec: torch.Tensor,
    p_value: float,
    *,
    spec_label: str = "speculative",
    mixture: GaussianMixture | None = None,
    coords: int = 2,
    height: int = 340,
) -> go.Figure:
    """Overlaid histograms of the first coordinates of both sample sets, with the mixture's exact
    marginal where the target is a Gaussian mixture."""
    plain_x = plain.reshape(len(plain), -1).double().numpy()
    spec_x = spec.reshape(len(spec), -1).double().numpy()
    k = min(coords, plain_x.shape[1])
    fig = make_subplots(
        rows=1, cols=k, subplot_titles=[f"coordinate {i + 1}" for i in range(k)], horizontal_spacing=0.08
    )
    for i in range(k):
        both = np.concatenate([plain_x[:, i], spec_x[:, i]])
        lo, hi = np.quantile(both, [0.002, 0.998])
        bins = dict(start=lo, end=hi, size=(hi - lo) / 40)
        for data, name, key in ((plain_x[:, i], "plain target", "target"), (spec_x[:, i], spec_label, "tree")):
            fig.add_trace(
                go.Histogram(
                    x=data,
                    xbins=bins,
                    histnorm="probability density",
                    name=name,
                    marker_color=METHOD_COLORS[key],
                    opacity=0.55,
                    showlegend=i == 0,
                    legendgroup=name,
                ),
                row=1,
                col=i + 1,
            )
        if mixture is not None:
            grid = np.linspace(lo, hi, 300)
            fig.add_trace(
                go.Scatter(
                    x=grid,
                    y=mixture_marginal(mixture, i, grid),
                    mode="lines",
                    name="target density (marginal)",
                    line=dict(color="#0f172a", width=1.6, dash="dot"),
                    showlegend=i == 0,
                    legendgroup="density",
                ),
                row=1,
                col=i + 1,
            )
    verdict = "no evidence of a difference" if p_value >= 0.05 else "difference detected at the 5% level"
    base_layout(fig, height=height, title=f"energy two-sample test: p = {p_value:.3f} ({verdict})")
    legend_below(fig, y=-0.16)
    fig.update_layout(barmode="overlay", margin=dict(t=70, b=70))
    fig.update_yaxes(title_text="density", col=1)
    return fig
