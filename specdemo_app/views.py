"""A run's figures (specdemo.figures, plotly) as the page's plots."""

from __future__ import annotations

from gradio.components.plot import PlotData

from specdemo import figures as F

from .runner import Comparison
from .settings import whole


def plot(fig, name: str) -> PlotData:
    """A plotly figure for gr.Plot, with its toolbar's PNG export named and at twice the resolution.
    (gradio's own PlotData: gr.Plot takes a figure it serialises without the export's settings.)"""
    return PlotData(type="plotly", plot=F.figure_json(fig, name))


def data_view(comp: Comparison, trajectory: int, k: int, decode=None) -> PlotData:
    """The round in data space: the 2-D plane, an image model's committed path (a latent model's
    decoded by `decode`, latents -> images, once: Comparison.path_images), or why neither."""
    if comp.kind == "plane":
        assert comp.paths is not None  # run_comparison keeps a plane model's paths
        fig = F.plane_figure(
            comp.trace,
            trajectory,
            k,
            comp.log_density,
            path=comp.paths[trajectory],
            samples=comp.chosen.samples.numpy(),
        )
        return plot(fig, "specdemo-data-plane")
    if comp.kind == "image":
        trace = comp.path_images(trajectory, k, decode) if comp.latent else comp.trace
        return plot(F.path_images_figure(trace, trajectory, k), "specdemo-path-images")
    dims = "×".join(map(str, comp.shape))
    return plot(
        F.message_figure(
            f"{comp.model_name} lives in {dims} dimensions: the data-plane view is drawn for "
            "2-D targets and image models.<br>The Comparison tab plots its first two "
            "coordinates.",
            height=160,
        ),
        "specdemo-data",
    )


def viewable(comp: Comparison) -> int:
    """Trajectories whose rounds the page can show (the first ones the session keeps)."""
    return max(1, min(comp.config.num_samples, comp.traced_trajectories))


def shown_trajectory(comp: Comparison, trajectory) -> int:
    """The trajectory asked for, within the ones the page can show (blank: the first)."""
    asked = 0 if trajectory in (None, "") else whole(trajectory, "the trajectory")
    return min(max(asked, 0), viewable(comp) - 1)


def round_views(comp: Comparison, trajectory, k, decode=None) -> tuple[PlotData, PlotData, PlotData]:
    """Tree, data view and all-rounds figure for one trajectory's k-th round (both clamped to the run);
    decode: a latent model's decoder for the committed path's images (data_view)."""
    t = shown_trajectory(comp, trajectory)
    k = max(1 if k in (None, "") else whole(k, "the round"), 1)
    return (
        plot(F.tree_figure(comp.trace, t, k), "specdemo-tree"),
        data_view(comp, t, k, decode),
        plot(F.rounds_figure(comp.trace, t, comp.num_steps, k=k), "specdemo-rounds"),
    )


def comparison_views(comp: Comparison) -> tuple[PlotData, PlotData, list[list], PlotData]:
    """The Comparison tab: costs, acceptance by depth, the table, the samples side by side."""
    return (
        plot(F.cost_figure(comp.runs), "specdemo-costs"),
        plot(F.acceptance_figure(comp.runs), "specdemo-acceptance"),
        F.comparison_table(comp.runs),
        plot(F.samples_figure(comp.shown_samples(), log_density=comp.log_density), "specdemo-samples"),
    )
