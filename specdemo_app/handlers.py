"""What the page's events call: the run and its views, the exactness test, the export, and the
controls' updates when the model, kernel, topology or draft changes. Every failure becomes a
readable error in the page, and the server keeps serving.

The run settings arrive by name (the controls are SamplerConfig's fields: controls.py). The library's
sampling stack, the runner and the figures are imported by the first event that needs them (and by
the warm-up, when the server starts), not with this module: building the page needs none of them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import TYPE_CHECKING

import gradio as gr

from specdemo.config import KERNEL_NAMES, PRESET_NAMES, SamplerConfig

from .cancelling import cancellable, runs_going, was_shared
from .controls import (
    PROMPT_FIELDS,
    draft_shows,
    kernel_choices,
    kernel_shows,
    model_shows,
    topology_shows,
)
from .curated import curated
from .gpu import (
    ON_ZERO_GPU,
    ClickTask,
    ExactnessTask,
    call,
    decode_path,
    run_click,
    run_exactness,
    seconds_for,
    timed,
)
from .labels import exactness_text, headline, offered_tree, plan_text, tree_button_text
from .loading import HUB_ID, cached_target, hub_status
from .refusals import readable_errors, user_error
from .settings import (
    CUSTOM,
    DEFAULT,
    DEFAULT_MODEL,
    MODEL_VALUES,
    UI_DEFAULTS,
    has_denoised,
    make_config,
    page_values,
    whole,
)
from .topology_text import is_auto

if TYPE_CHECKING:
    from .runner import Comparison

log = logging.getLogger("specdemo.app")

EXPORT_TTL = 1800  # seconds an exported run stays on the server (ours, and gradio's cached copy)


def path_decoder(comp: Comparison | None):
    """The round views' decode for a session's run: None but for a latent model."""
    if comp is None or not comp.latent:
        return None
    return functools.partial(call, decode_path, comp.model_name, comp.config.device)


@readable_errors
def check_inputs(**settings):
    """Refuse bad settings before a run starts, the library's limits included and applied to the
    click's runs together (what `run` checks too, for API callers), so that a refusal leaves the last
    results on screen."""
    from .runner import check_click

    config, target, _, limits = make_config(settings)
    check_click(config, target, limits)


def _click(settings: dict, request: gr.Request | None, progress) -> Comparison:
    """The click's runs at `settings` in the GPU task (gpu.run_click), which asks for the seconds of the
    click's bounded work; cancelled with the session or past its seconds; whether other visitors' runs
    shared the machine meanwhile, and the GPU time it asked for and used on ZeroGPU."""
    from .runner import click_rows, log_density_of, timing_budget

    config, target, _, limits = make_config(settings)
    seconds = seconds_for(click_rows(config, target, limits), limits, timing_budget(), is_auto(config.tree))
    with cancellable(request, seconds if ON_ZERO_GPU else limits.max_seconds, progress) as (cancel, board):
        comp, comp.gpu = timed(run_click, ClickTask(config, limits, cancel, board, seconds))
        comp.log_density = log_density_of(target)
        comp.shared = was_shared(cancel) or runs_going() > 1
    return comp


@readable_errors
def sample(request: gr.Request | None, **settings) -> dict:
    """The /sample endpoint (api.py): the click's runs at `settings`, those left None at the page's values
    for the model; their headline, plan and costs as JSON, with no figure."""
    comp = _click(with_page_defaults(settings), request, None)
    return {
        "headline": headline(comp),
        "plan": plan_text(comp),
        "runs": [r.summary() for r in comp.runs],
        "seed": comp.config.seed,
        "gpu": None if comp.gpu is None else {"asked_s": comp.gpu.asked, "used_s": comp.gpu.used},
    }


def with_page_defaults(settings: dict) -> dict:
    """`settings` with each None replaced by the page's value for the model (for a model the page does not
    know, the default model's: make_config then refuses the model by name)."""
    model = settings.get("model") or DEFAULT_MODEL
    page = page_values(model if model in UI_DEFAULTS else DEFAULT_MODEL)
    return {name: page[name] if value is None else value for name, value in {**settings, "model": model}.items()}


@readable_errors
def run(request: gr.Request | None = None, progress=gr.Progress(), **settings):
    """Run the chosen chain, tree or planned topology, the plain target sampler and the budget-matched chain."""
    from specdemo import figures as F

    from .views import comparison_views, round_views, viewable

    progress(0, desc="loading the model")
    t0 = time.perf_counter()
    comp = _click(settings, request, progress)
    t, k = F.pick_round(comp.trace)
    n_rounds = max(len(F.trajectory_rounds(comp.trace, t)), 1)
    out = (
        headline(comp),
        plan_text(comp),
        *round_views(comp, t, k),
        *comparison_views(comp),
        comp,
        gr.Slider(minimum=0, maximum=max(viewable(comp) - 1, 1), value=t, step=1, interactive=viewable(comp) > 1),
        gr.Slider(minimum=1, maximum=max(n_rounds, 2), value=k, step=1, interactive=n_rounds > 1),
        tree_offer(comp),
    )
    log.info("run %s took %.2f s", comp.config.to_dict(), time.perf_counter() - t0)
    return out


def tree_offer(comp: Comparison) -> dict:
    """The Draft tree tab's button after a run: shown where the run drafted no tree, naming the tree it runs."""
    tree = offered_tree(comp)
    return gr.update(visible=tree is not None, value=tree_button_text(tree) if tree else "")


@readable_errors
def offer_tree(comp):
    """The topology box set to the tree the last run offers (the Run chain then runs it, seed unchanged)."""
    tree = offered_tree(last_run(comp))
    if tree is None:
        raise user_error("the last run drafted trees: it offers none", "Nothing to offer")
    return tree


def last_run(comp: Comparison | None) -> Comparison:
    if comp is None:
        raise user_error("run the sampler first", "Nothing to show yet")
    return comp


@readable_errors
def show_round(comp, trajectory, k):
    """Redraw the tree views for a trajectory and round of the last run."""
    from .views import round_views

    return round_views(last_run(comp), trajectory, k, path_decoder(comp))


@readable_errors
def show_trajectory(comp, trajectory):
    """Pick a trajectory: its first round, and the round slider's range."""
    from specdemo import figures as F

    from .views import round_views, shown_trajectory

    t = shown_trajectory(last_run(comp), trajectory)
    n_rounds = max(len(F.trajectory_rounds(comp.trace, t)), 1)
    return (
        *round_views(comp, t, 1, path_decoder(comp)),
        gr.Slider(minimum=1, maximum=max(n_rounds, 2), value=1, step=1, interactive=n_rounds > 1),
    )


@readable_errors
def exactness(test_samples, request: gr.Request | None = None, progress=gr.Progress(), **settings):
    """Two-sample test of the chosen chain, tree or plan against plain target sampling (analytic targets)."""
    from specdemo import figures as F

    from .exactness import check_test
    from .runner import click_rows, timing_budget
    from .views import plot

    progress(0, desc="loading the model")
    config, target, _, limits = make_config({**settings, "num_samples": 1})
    num = whole(test_samples, "the number of test samples")
    check_test(target, num)
    rows = click_rows(config, target, limits, num_samples=num, chain=False, test=True)
    seconds = seconds_for(rows, limits, timing_budget(), is_auto(config.tree))
    with cancellable(request, seconds if ON_ZERO_GPU else limits.max_seconds, progress) as (cancel, board):
        report, _ = timed(run_exactness, ExactnessTask(config, num, limits, cancel, board, seconds))
    fig = F.exactness_figure(
        report.plain, report.speculative, report.p_value, spec_label=report.label, mixture=report.mixture
    )
    return exactness_text(report, num, config.draft_bias), plot(fig, "specdemo-exactness")


@readable_errors
def export(comp):
    """The last run as JSON: settings, every method's costs, the chosen run's samples and its trace."""
    if comp is None:
        raise user_error("run the sampler first", "Nothing to export yet")
    c = comp.config
    tree = f"auto{c.budget}" if is_auto(c.tree) else c.tree
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"specdemo-run-{c.model}-{tree}-seed{c.seed}")[:120] + ".json"
    folder = tempfile.mkdtemp(prefix="specdemo-export-", dir=export_root())
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(comp.to_json(), f)  # summarised already
    return path


_EXPORT_ROOT: list[str] = []


def export_root() -> str:
    """The one folder exports are written under (gradio serves a copy from its cache, which it
    clears itself: `delete_cache`); each export first removes those older than EXPORT_TTL."""
    if not _EXPORT_ROOT:
        _EXPORT_ROOT.append(tempfile.mkdtemp(prefix="specdemo-exports-"))
    root = _EXPORT_ROOT[0]
    os.makedirs(root, exist_ok=True)  # a temporary-files cleaner may have removed it
    cutoff = time.time() - EXPORT_TTL
    for entry in os.scandir(root):
        try:
            if entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # removed meanwhile by another export's pruning
            pass
    return root


# The handlers below return gr.update(...): only the named properties change (a fresh component
# would be checked against its own empty list of choices).
CUSTOM_KERNELS = ("ddpm", "ddim", "euler-ancestral", "flow-churn")  # a diffusers model's, whichever it is


def model_kernels(model: str) -> tuple[str, ...]:
    """The kernels a model offers: a listed Hub model's from the list (nothing is loaded), a preset's
    or the embedded model's from the model, a custom diffusers model's any of CUSTOM_KERNELS (the
    library refuses one its scheduler has not, saying which it has)."""
    if model == CUSTOM:
        return CUSTOM_KERNELS
    if (entry := curated(model)) is not None:
        return entry.kernels
    return cached_target(model).kernels if model in MODEL_VALUES else KERNEL_NAMES


def offered_kernels(model, kernel):
    """Only the model's own kernels are offered; a kernel it lacks falls back to its default (also
    when the page loads: the model's kernels need the model loaded, which building the page does not)."""
    kernels = model_kernels(model)
    return gr.update(choices=kernel_choices(kernels), value=kernel if kernel in kernels else DEFAULT)


def samples_range(model):
    """The samples control's range for the model the page opened on (the control itself spans every model's)."""
    return gr.update(**model_shows(model)["num_samples"])


def model_changed(model, kernel):
    """Switch the controls to what suits the picked model, its own kernels only."""
    d = UI_DEFAULTS.get(model, UI_DEFAULTS[CUSTOM])
    kernel_update = offered_kernels(model, kernel)
    kernel = kernel_update["value"]
    # UI_DEFAULTS mixes numbers and names (typed object): its draft and tree are names
    shows = {**model_shows(model), **draft_shows(str(d["draft"])), **topology_shows(str(d["tree"]))}
    freeze = d["freeze"] if has_denoised(model, kernel) else "out"
    return (
        kernel_update,
        gr.update(**shows["custom_model"]),
        gr.update(value=d["steps"]),
        gr.update(value=d["num_samples"], **shows["num_samples"]),
        gr.update(value=d["tree"]),
        gr.update(value=d["budget"], **shows["budget"]),
        gr.update(**shows["class_label"]),
        gr.update(value=d["draft"]),  # a listed model's paired draft network, else the frozen draft
        gr.update(value=freeze, **shows["freeze"]),
        *kernel_changed(model, kernel),
        *[gr.update(**shows[name]) for name in PROMPT_FIELDS],  # text-to-image models only
    )


def model_status_shown(model) -> dict:
    """The line under the model choice: for a Hub model, whether the server holds it, or why it cannot
    be loaded now and what to do (loading.hub_status: no request, so it answers at once); hidden for
    the others."""
    spec = str(model or "").strip()
    if not HUB_ID.fullmatch(spec) or spec not in MODEL_VALUES:
        return {"value": "", "visible": False}
    ok, line = hub_status(spec)
    entry = curated(spec)
    pairs = f" Pairs with the draft network `{entry.draft}`." if entry and entry.draft else ""
    return {"value": (line if ok else f"**Not available here:** {line}.") + pairs, "visible": True}


def model_status(model):
    return gr.update(**model_status_shown(model))


def kernel_changed(model, kernel):
    shows = kernel_shows(model, kernel)
    return gr.update(**shows["eta"]), gr.update(**shows["churn"])


def freeze_follows_kernel(model, kernel, freeze):
    """Langevin has no x0-hat: the frozen draft keeps the network output there, and the model's
    default comes back with a kernel that has one."""
    if not has_denoised(model, kernel):
        return gr.update(value="out")
    return gr.update(value=UI_DEFAULTS.get(model, UI_DEFAULTS[CUSTOM])["freeze"] if freeze == "out" else freeze)


def exactness_button(model) -> dict:
    """The two-sample test needs the target's law in closed form: offered for the analytic targets,
    and said so in place for the image models."""
    analytic = model in PRESET_NAMES
    return {
        "interactive": analytic,
        "value": "Run the two-sample test" if analytic else "Two-sample test: for the analytic targets only",
    }


def exactness_offered(model):
    return gr.update(**exactness_button(model))


def tree_changed(tree):
    shows = topology_shows(tree)
    return gr.update(**shows["budget"]), gr.update(**shows["objective"])


def draft_changed(draft):
    return gr.update(**draft_shows(draft)["freeze"])


def warm_up() -> None:
    """At start-up, not in the first click: import the sampling stack, load the default model, and
    run a tiny comparison on the CPU and draw its figures, so that torch, the sampler and plotly pay
    their first-call costs here."""
    try:
        from specdemo import figures as F

        from .loading import preload
        from .runner import run_comparison
        from .views import comparison_views, round_views

        preload()
        target = cached_target(DEFAULT_MODEL)
        comp = run_comparison(
            SamplerConfig(
                model=DEFAULT_MODEL,
                tree="2,1",
                steps=4,
                num_samples=2,
                device="cpu",
                class_label=0 if target.num_classes else None,
            ),
            target=target,
        )
        round_views(comp, *F.pick_round(comp.trace))
        comparison_views(comp)
    except Exception:  # the app serves anyway; the first click pays instead
        log.exception("warm-up failed")
