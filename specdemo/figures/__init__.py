"""Plotly figures of speculative sampling runs: draft trees, rounds, comparisons, exactness.

Plotly only (no gradio): the app (app.py) and the docs call these with the records of specdemo runs.

    from specdemo import SamplerConfig
    from specdemo.compare import run_comparison
    from specdemo.figures import tree_figure, pick_round
    comp = run_comparison(SamplerConfig(model="gm2d", tree="3,2,1", verifier="dgrs", num_samples=64))
    t, k = pick_round(comp.trace)
    tree_figure(comp.trace, t, k).show()
"""

from .compare import TABLE_HEADERS, acceptance_figure, comparison_table, cost_figure, samples_figure, speedup_over
from .exactness import exactness_figure
from .plane import density_grid, path_images_figure, plane_figure, plot_limits
from .style import METHOD_COLORS, STATUS_COLORS, STATUS_LABELS, base_layout, figure_json, message_figure, plot_config
from .tree import (RoundNodes, pick_round, round_nodes, round_widths, rounds_figure, statuses_in_run,
                   trajectory_rounds, tree_figure)

__all__ = [
    "tree_figure", "rounds_figure", "plane_figure", "path_images_figure", "cost_figure", "acceptance_figure",
    "samples_figure", "comparison_table", "TABLE_HEADERS", "exactness_figure", "speedup_over",
    "pick_round", "trajectory_rounds", "round_nodes", "round_widths", "statuses_in_run", "RoundNodes",
    "density_grid", "plot_limits",
    "STATUS_COLORS", "STATUS_LABELS", "METHOD_COLORS", "base_layout", "message_figure", "figure_json", "plot_config",
]
