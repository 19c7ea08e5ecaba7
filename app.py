"""specdemo's web app: pick a model and a draft tree, run, and see the tree, the comparison and exactness.

`python app.py` serves it (a Hugging Face Space runs the same file). This file lays the page out
(build_demo) and serves it (launch); what the page's events do is in specdemo_app/, next to it, which
uses the library through its public API. The controls are SamplerConfig's fields (specdemo_app/
controls.py): a new setting of the library appears on the page and in the /run endpoint.
"""

from __future__ import annotations

import logging
import os

import gradio as gr
import torch

from specdemo import __version__
from specdemo.figures import TABLE_HEADERS
from specdemo_app import api, cancelling, controls, handlers, settings, style

CONCURRENCY_LIMIT = cancelling.RUNS_AT_ONCE  # runs at once; the queue holds the others
QUEUE_SIZE = 64
# sessions whose last run the server keeps (the least recently used goes first): with gpu.SESSION_BYTES
# a session, the kept runs hold at most about 1 GB in all
SESSIONS = 64


def build_demo() -> gr.Blocks:  # noqa: PLR0915 (issue 56 splits it)
    """The page: controls on the left, the run's views in tabs on the right, and their events."""
    values = settings.page_values(settings.DEFAULT_MODEL)
    with gr.Blocks(
        title="specdemo · speculative sampling for diffusion models",
        delete_cache=(handlers.EXPORT_TTL // 3, handlers.EXPORT_TTL),
    ) as demo:
        gr.HTML(style.HEADER)
        # Run, Stop and the headline first, so that they are in view without scrolling on a desktop and on
        # a phone, and the click's progress (one display, on the headline) shows where the visitor looks
        with gr.Row(equal_height=False, elem_id="run-bar"):
            with gr.Column(scale=1, min_width=220):
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", size="lg", elem_id="run-button", scale=3)
                    stop_button = gr.Button("Stop", variant="stop", size="lg", elem_id="stop-button", scale=1)
            with gr.Column(scale=3, min_width=300):
                summary = gr.Markdown(
                    "Press **Run**: the chosen topology, the plain target sampler and the chain at "
                    "the same target rows per round draw samples with one seed.",
                    elem_classes="sd-headline",
                    elem_id="headline",
                    min_height=60,
                )
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=330):
                with gr.Group():
                    run_settings = controls.place("model", values)
                    model_status = gr.Markdown(
                        **handlers.model_status_shown(settings.DEFAULT_MODEL),
                        elem_id="model-status",
                        elem_classes="sd-plan",
                    )
                with gr.Group():  # shown for text-to-image models only
                    run_settings |= controls.place("prompt", values)
                with gr.Group():
                    run_settings |= controls.place("draft", values)
                with gr.Group():
                    run_settings |= controls.place("topology", values)
                    gr.Examples(
                        [[value] for value, _ in settings.TREE_PRESETS],
                        inputs=[run_settings["tree"]],
                        label="presets",
                        example_labels=[label for _, label in settings.TREE_PRESETS],
                        examples_per_page=len(settings.TREE_PRESETS),
                        elem_id="topology-presets",
                    )
                    run_settings |= controls.place("plan", values)
                with gr.Accordion("sampler", open=True):
                    run_settings |= controls.place("sampler", values)
                if controls.advanced_fields():  # settings the library has and the layout does not name yet
                    with gr.Accordion(controls.ADVANCED, open=False):
                        run_settings |= controls.place(controls.ADVANCED, values)
                gr.Markdown(
                    f"<small>specdemo {__version__} · same seed, device and batch: same samples · runs queue "
                    f"{CONCURRENCY_LIMIT} at a time</small>"
                )
            with gr.Column(scale=3):
                with gr.Tabs():
                    with gr.Tab("Draft tree", id="tree-tab"):
                        plan_line = gr.Markdown(elem_id="plan-line", elem_classes="sd-plan")
                        # shown where the run drafted no tree: the branching preset of about its rows, one click away
                        tree_button = gr.Button(visible=False, size="sm", elem_id="tree-button")
                        with gr.Row():
                            trajectory = controls.RawSlider(
                                0, 1, value=0, step=1, label="trajectory", interactive=False
                            )
                            round_k = controls.RawSlider(
                                1, 2, value=1, step=1, label="round of this trajectory", interactive=False
                            )
                        tree_plot = gr.Plot(label="draft tree", show_label=False, elem_id="tree-plot")
                        data_plot = gr.Plot(label="the round in the data plane", show_label=False, elem_id="data-plot")
                        rounds_plot = gr.Plot(label="all rounds", show_label=False, elem_id="rounds-plot")
                    with gr.Tab("Comparison", id="compare-tab"):
                        cost_plot = gr.Plot(label="costs", show_label=False, elem_id="cost-plot")
                        table = gr.Dataframe(
                            headers=TABLE_HEADERS,
                            label="the same seed, three samplers",
                            interactive=False,
                            wrap=True,
                            elem_id="compare-table",
                            column_widths=["20%", "11%", "8%", "9%", "9%", "11%", "11%", "10%", "11%"],
                        )
                        with gr.Row():
                            accept_plot = gr.Plot(
                                label="acceptance by depth", show_label=False, elem_id="accept-plot", scale=2
                            )
                        samples_plot = gr.Plot(label="samples", show_label=False, elem_id="samples-plot")
                    with gr.Tab("Exactness", id="exact-tab", elem_id="exact-tab-content"):
                        gr.Markdown(
                            "Draws fresh samples with the chosen chain, tree or plan and with the plain target "
                            "sampler (independent seeds) and tests whether they come from the same "
                            "distribution. For the analytic targets. Try a large draft bias: the speedup "
                            "drops, the p-value does not."
                        )
                        with gr.Row():
                            test_samples = controls.RawSlider(
                                100, 2000, value=settings.EXACTNESS_SAMPLES, step=100, label="samples per group"
                            )
                            test_button = gr.Button(
                                variant="secondary", **handlers.exactness_button(settings.DEFAULT_MODEL)
                            )
                        test_summary = gr.Markdown(elem_id="exact-summary")
                        test_plot = gr.Plot(label="histograms", show_label=False, elem_id="exact-plot")
                    with gr.Tab("Export", id="export-tab"):
                        gr.Markdown(
                            "Every figure downloads as a PNG from its toolbar (camera icon, top right of the "
                            "figure). The run downloads as JSON: settings, every method's costs, the chosen "
                            "run's samples and its trace (rounds of the first 64 trajectories; node states "
                            "for 2-D targets)."
                        )
                        export_button = gr.Button("Export the run as JSON")
                        export_file = gr.File(label="run JSON", interactive=False)
        state = gr.State(None, time_to_live=3600)

        # the run settings go by name (the endpoints' parameters are the settings' names); they are
        # checked in an event with no outputs first: a refusal is a message, and the last results stay on
        # screen (an error in the run itself marks every output panel); Enter in the topology box runs
        # what it holds, as the Run button does, and so does the offered tree's button once it has set it
        tree, model, kernel = run_settings["tree"], run_settings["model"], run_settings["kernel"]
        run_outputs = [
            summary,
            plan_line,
            tree_plot,
            data_plot,
            rounds_plot,
            cost_plot,
            accept_plot,
            table,
            samples_plot,
            state,
            trajectory,
            round_k,
            tree_button,
        ]

        def then_run(check: gr.events.Dependency, api: bool) -> gr.events.Dependency:
            return check.success(
                handlers.run,
                None,
                run_outputs,
                inputs_kwargs=run_settings,
                api_name="run" if api else None,
                api_visibility="public" if api else "private",
                concurrency_id="sampler",
                show_progress_on=[summary],
            )

        run_check = gr.on(
            [run_button.click, tree.submit],
            handlers.check_inputs,
            None,
            None,
            inputs_kwargs=run_settings,
            api_name="check",
            show_progress="hidden",
        )
        run_event = then_run(run_check, api=True)
        offer = tree_button.click(handlers.offer_tree, [state], [tree], api_name="offered_tree", show_progress="hidden")
        offer_check = offer.success(
            handlers.check_inputs,
            None,
            None,
            inputs_kwargs=run_settings,
            api_visibility="private",
            show_progress="hidden",
        )
        offer_event = then_run(offer_check, api=False)
        round_k.input(
            handlers.show_round,
            [state, trajectory, round_k],
            [tree_plot, data_plot, rounds_plot],
            api_name="tree_view",
            trigger_mode="always_last",
            show_progress="hidden",
        )
        trajectory.input(
            handlers.show_trajectory,
            [state, trajectory],
            [tree_plot, data_plot, rounds_plot, round_k],
            api_name="trajectory_view",
            trigger_mode="always_last",
            show_progress="hidden",
        )
        test_check = test_button.click(
            handlers.check_inputs,
            None,
            None,
            inputs_kwargs=run_settings,
            api_name="check_exactness",
            show_progress="hidden",
        )
        test_event = test_check.success(
            handlers.exactness,
            [test_samples],
            [test_summary, test_plot],
            inputs_kwargs=run_settings,
            api_name="exactness",
            concurrency_id="sampler",
            show_progress_on=[test_summary],
        )
        # the flag stops the work between rounds; `cancels` frees the queue's slot and the page at once
        stop_button.click(
            cancelling.stop,
            None,
            None,
            cancels=[run_check, run_event, offer, offer_check, offer_event, test_check, test_event],
            api_name="stop",
            queue=False,
        )
        demo.unload(cancelling.stop)
        export_button.click(handlers.export, [state], [export_file], api_name="export")
        # the click's runs for API callers: an omitted setting takes the page's value for the model asked for
        gr.api(api.sample_endpoint(), api_name="sample", concurrency_id="sampler")
        demo.load(handlers.offered_kernels, [model, kernel], [kernel], api_name="model_kernels", show_progress="hidden")
        demo.load(
            handlers.samples_range,
            [model],
            [run_settings["num_samples"]],
            api_name="samples_range",
            show_progress="hidden",
        )
        model.change(
            handlers.model_changed,
            [model, kernel],
            [
                kernel,
                run_settings["custom_model"],
                run_settings["steps"],
                run_settings["num_samples"],
                tree,
                run_settings["budget"],
                run_settings["class_label"],
                run_settings["draft"],
                run_settings["freeze"],
                run_settings["eta"],
                run_settings["churn"],
                *[run_settings[name] for name in controls.PROMPT_FIELDS],
            ],
            api_name="model_defaults",
            show_progress="hidden",
        )
        # a Hub model: whether the server holds it, or how to fetch it, in one line and at once
        model.change(handlers.model_status, [model], [model_status], api_name="model_status", show_progress="hidden")
        model.change(
            handlers.exactness_offered, [model], [test_button], api_name="exactness_options", show_progress="hidden"
        )
        kernel.change(
            handlers.kernel_changed,
            [model, kernel],
            [run_settings["eta"], run_settings["churn"]],
            api_name="kernel_options",
            show_progress="hidden",
        )
        kernel.change(
            handlers.freeze_follows_kernel,
            [model, kernel, run_settings["freeze"]],
            [run_settings["freeze"]],
            api_name="kernel_freeze",
            show_progress="hidden",
        )
        tree.change(
            handlers.tree_changed,
            [tree],
            [run_settings["budget"], run_settings["objective"]],
            api_name="topology_options",
            show_progress="hidden",
        )
        run_settings["draft"].change(
            handlers.draft_changed,
            [run_settings["draft"]],
            [run_settings["freeze"]],
            api_name="draft_options",
            show_progress="hidden",
        )
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT, max_size=QUEUE_SIZE)
    return demo


demo = build_demo()  # what `gradio app.py` and a Space look for; building it runs no sampling


def cpu_budget() -> int:
    """CPUs this process may use: the cgroup quota where one is set, else the affinity mask."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return max(1, int(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def launch(**kwargs):
    """Serve the app with its theme and styles (what `python app.py` and the Space do): each run's
    share of the CPUs first, then the warm-up, then the server, with gradio's MCP server on (the
    endpoints as tools, /sample the one for agents, at /gradio_api/mcp/; mcp_server=False turns it off)."""
    # on a 2-core machine two concurrent runs of two threads each fight over the cores, and small tensors
    # gain nothing from intra-op threads (measured: 1.05 s against 7-9 s for the default click with
    # another process busy)
    torch.set_num_threads(max(1, cpu_budget() // CONCURRENCY_LIMIT))
    handlers.warm_up()
    return demo.launch(
        theme=style.THEME, css=style.CSS, **{"state_session_capacity": SESSIONS, "mcp_server": True, **kwargs}
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch()
