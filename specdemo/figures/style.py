"""One palette and one plotly look for every figure of the app, the docs and the screenshots."""

from __future__ import annotations

import json

import plotly.graph_objects as go

# node statuses, in specdemo.sampling.STATUS_NAMES order (tests/figures/test_figures.py checks it; the app's page
# reads these colours without importing the sampling stack): the legend the app shows uses the same colours
STATUS_COLORS = {
    "unvisited": "#a8b1bd",
    "accepted": "#16a34a",
    "rejected": "#dc2626",
    "corrected": "#f59e0b",
    "root": "#1e293b",
}
STATUS_LABELS = {
    "unvisited": "never examined",
    "accepted": "accepted",
    "rejected": "rejected",
    "corrected": "corrected sample",
    "root": "round start (committed state)",
}
STATUS_SYMBOLS = {
    "unvisited": "circle",
    "accepted": "circle",
    "rejected": "x",
    "corrected": "diamond",
    "root": "square",
}

# methods compared side by side
METHOD_COLORS = {"target": "#64748b", "chain": "#2563eb", "tree": "#7c3aed"}

# the target density behind 2-D views: white to a soft slate blue, so that node colours stand out
DENSITY_COLORSCALE = [[0.0, "#ffffff"], [0.15, "#eef2f8"], [0.45, "#d5deec"], [0.75, "#aebcd6"], [1.0, "#8193b8"]]

FONT = "Inter, ui-sans-serif, system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"


def base_layout(
    fig: go.Figure, *, height: int | None = 420, title: str | None = None, legend: bool = True
) -> go.Figure:
    """The shared look: white background, light grid, one font, compact margins, legend on top."""
    fig.update_layout(
        template="plotly_white",
        height=height,
        font=dict(family=FONT, size=13, color="#1f2937"),
        margin=dict(l=60, r=24, t=64 if title else 36, b=52),
        hoverlabel=dict(font=dict(family=FONT, size=12), align="left"),
        showlegend=legend,
        legend=dict(
            orientation="h",
            yanchor="bottom",
            y=1.01,
            xanchor="left",
            x=0,
            bgcolor="rgba(255,255,255,0)",
            font=dict(size=12),
        ),
        title=dict(text=title, x=0, xanchor="left", y=0.98, yanchor="top", font=dict(size=15)) if title else None,
        paper_bgcolor="white",
        plot_bgcolor="white",
    )
    fig.update_xaxes(
        showline=True, linecolor="#cbd5e1", gridcolor="#eef1f5", zeroline=False, ticks="outside", tickcolor="#cbd5e1"
    )
    fig.update_yaxes(
        showline=True, linecolor="#cbd5e1", gridcolor="#eef1f5", zeroline=False, ticks="outside", tickcolor="#cbd5e1"
    )
    return fig


def legend_below(fig: go.Figure, y: float = -0.14) -> go.Figure:
    """Move the legend under the plot (for figures whose panels have titles of their own)."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=y, xanchor="center", x=0.5))
    return fig


def message_figure(text: str, height: int | None = 320) -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(
        text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14, color="#64748b")
    )
    base_layout(fig, height=height, legend=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def plot_config(filename: str) -> dict:
    """plotly.js config: a PNG button at twice the screen resolution, named after the figure."""
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
        "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
    }


def figure_json(fig: go.Figure, filename: str = "specdemo") -> str:
    """The figure as plotly JSON with its plotly.js config (toolbar PNG export) included."""
    spec = json.loads(fig.to_json())
    spec["config"] = plot_config(filename)
    return json.dumps(spec)
