"""Plotly figures of speculative sampling runs: draft trees, rounds, comparisons, exactness.

Plotly only (no gradio): the app (app.py, specdemo_app/) and the docs call these with the records of
specdemo runs.

    from specdemo import SamplerConfig
    from specdemo.figures import tree_figure, pick_round
    from specdemo_app.runner import run_comparison   # the app's runner, next to app.py in a checkout
    comp = run_comparison(SamplerConfig(model="gm2d", tree="3,2,1", verifier="dgrs", num_samples=64))
    t, k = pick_round(comp.trace)
    tree_figure(comp.trace, t, k).show()

The names below are imported on first use (PEP 562), each with its own module only: the app's page
reads the colours and the table's headers without the sampling stack the round views need.
"""

from importlib import import_module

import plotly  # noqa: F401  (the figures need the app extra: without plotly, importing them says so at once)

_PUBLIC = {  # name: the module that defines it
    "TABLE_HEADERS": "compare",
    "acceptance_figure": "compare",
    "comparison_table": "compare",
    "cost_figure": "compare",
    "samples_figure": "compare",
    "exactness_figure": "exactness",
    "density_grid": "density",
    "plot_limits": "density",
    "path_images_figure": "plane",
    "plane_figure": "plane",
    "METHOD_COLORS": "style",
    "STATUS_COLORS": "style",
    "STATUS_LABELS": "style",
    "base_layout": "style",
    "figure_json": "style",
    "message_figure": "style",
    "plot_config": "style",
    "RoundNodes": "tree",
    "pick_round": "tree",
    "round_nodes": "tree",
    "round_widths": "tree",
    "rounds_figure": "tree",
    "statuses_in_run": "tree",
    "trajectory_rounds": "tree",
    "tree_figure": "tree",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted([*globals(), *__all__])
