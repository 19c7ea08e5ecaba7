"""specdemo's web app: pick a model and a draft tree, run, and see the tree, the comparison and exactness.

`python app.py` serves it (a Hugging Face Space runs the same file). It uses the library only through
its public API (specdemo.SamplerConfig and specdemo.figures); every bad input becomes a readable
error in the page and the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager

import gradio as gr
import torch
from gradio.components.plot import PlotData
from gradio.context import LocalContext

from specdemo import (KERNEL_NAMES, PRESETS, Cancel, Cancelled, Limits, SamplerConfig, SpecdemoError, Topology,
                      __version__)
from specdemo import compare as C
from specdemo import figures as F

try:  # ZeroGPU on Hugging Face: the GPU is attached only inside functions decorated with spaces.GPU
    import spaces

    gpu = spaces.GPU(duration=120)
except ImportError:  # anywhere else the decorator is skipped

    def gpu(fn):
        return fn


log = logging.getLogger("specdemo.app")

# ---------------------------------------------------------------------------------------------- settings
# the embedded digits UNet (class-conditional, 16x16); gm2d where a checkout lacks the embedded models
DEFAULT_MODEL = "digits" if C.embedded_available("digits") else "gm2d"
CONCURRENCY_LIMIT = 2  # runs at once; the queue holds the others
QUEUE_SIZE = 64
MAX_SAMPLES = {"image": 64, "other": 4096}  # what one click may ask for on the Space's hardware
MAX_WORK = {"image": 4096, "other": 1_500_000}  # samples x tree nodes per round, ditto (x16 on a GPU)
# a click's bound on target rows (samples x steps x rows per round, pilots included; specdemo.limits),
# steps and seconds; the Space's owner can set each with SPECDEMO_APP_MAX_ROWS, _MAX_STEPS, _MAX_SECONDS
MAX_ROWS = {"image": 250_000, "other": 50_000_000}
MAX_STEPS = 1000
MAX_SECONDS = 120.0
MAX_DOWNLOAD_GB = 12.0  # a Hub model's weights the Space downloads at most (SPECDEMO_APP_MAX_DOWNLOAD_GB)
EXACTNESS_SAMPLES = 1000
KEPT_TRAJECTORIES = 64  # trajectories whose rounds a session keeps (and the page and the export show)
SESSION_BYTES = 16_000_000  # ... and as many as fit in this (an image model's node states are large)
SESSIONS = 256  # sessions whose last run the server keeps (the least recently used goes first)
EXPORT_TTL = 1800  # seconds an exported run stays on the server (ours, and gradio's cached copy)
PILOT_SAMPLES = 8  # trajectories of the pilot run that plans an auto topology (or freeze auto): kept small


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


MODEL_CHOICES = [
    ("digits · embedded 16×16 UNet", "digits"),
    ("gm2d · 2-D Gaussian mixture", "gm2d"),
    ("banana · 2-D density, Langevin", "banana"),
    ("ring · 2-D density, Langevin", "ring"),
    ("gm16 · 16-D Gaussian mixture", "gm16"),
    ("gm512 · 512-D benchmark (flow)", "gm512"),
    ("Hub id or local folder…", "custom"),
]
if not C.embedded_available("digits"):  # not trained yet: offer it once it is
    MODEL_CHOICES = [c for c in MODEL_CHOICES if c[1] != "digits"]
MODEL_VALUES = [v for _, v in MODEL_CHOICES]

# What the controls switch to when a model is picked: the first click must be quick and telling.
# The topology "auto" plans every step for the least expected wall-clock on this machine (a call's
# cost by its rows is measured once, then cached with the plan), with the settings that
# docs/benchmarks.md's latency section found fastest (freeze auto, block-verified chains, 16 rows).
# Measured on a 2-core CPU with one thread per run (as here, two runs at a time): the digits model
# at 100 steps is 1.8x faster than plain sampling for one sample and 1.4x for two; a batch of four
# gains nothing on a CPU, where a call's cost grows with its rows (the plan then samples plainly).
UI_DEFAULTS = {
    "digits": dict(steps=100, samples=1, tree="auto", budget=16, freeze="auto", draft="frozen"),
    "gm2d": dict(steps=100, samples=256, tree="auto", budget=16, freeze="x0", draft="frozen"),
    "banana": dict(steps=200, samples=256, tree="auto", budget=16, freeze="out", draft="frozen"),
    "ring": dict(steps=200, samples=256, tree="auto", budget=16, freeze="out", draft="frozen"),
    "gm16": dict(steps=100, samples=256, tree="auto", budget=16, freeze="x0", draft="frozen"),
    "gm512": dict(steps=30, samples=64, tree="auto", budget=16, freeze="x0", draft="frozen"),
    "custom": dict(steps=50, samples=8, tree="auto", budget=16, freeze="x0", draft="frozen"),
}
DEFAULT_CLASS = 3  # the digit the first click draws

# The topology is typed (what is typed is what runs); these presets fill the box with one click.
TREE_PRESETS = [
    ("auto", "auto: planned per step"),
    ("3,2,1", "3,2,1: tree, 10 rows per round"),
    ("2,2,1", "2,2,1: small tree"),
    ("2x3", "2x3: binary tree, depth 3"),
    ("4x4", "4x4: wide tree, depth 4"),
    ("2,2,2,1,1", "2,2,2,1,1: branches, then a chain"),
    ("1x5", "1x5: chain of 5"),
    ("1x10", "1x10: chain of 10"),
]
VERIFIER_CHOICES = [("default: block for auto, D-GRS for trees, RMC for chains", "default"),
                    ("D-GRS (greedy rejection)", "dgrs"), ("rank-aware", "rank"), ("RMC (chains only)", "rmc"),
                    ("block verification (chains only)", "block")]
OBJECTIVE_CHOICES = [("wall-clock (measured here)", "time"), ("target calls", "calls")]
# the run settings' defaults and help, read from the one config (specdemo/config.py)
CONFIG_DEFAULTS = SamplerConfig()
CONFIG_FIELDS = {f.name: f.metadata for f in dataclasses.fields(SamplerConfig)}  # help, choices
KERNEL_CHOICES = [("the model's default", "default"), *[(k, k) for k in KERNEL_NAMES]]
DRAFT_CHOICES = [("frozen target (training-free)", "frozen"), ("draft network: digits-draft", "digits-draft")]
FREEZE_CHOICES = [("network output", "out"), ("x0-hat", "x0"), ("auto (pilot per step)", "auto")]
BUDGET_RANGE = (1, 64)  # target rows per round an auto topology may plan with


def model_kernel(model: str, kernel: str) -> str:
    if kernel and kernel != "default":
        return kernel
    return PRESETS[model].defaults.get("kernel", "ddpm") if model in PRESETS else "ddpm"


def has_denoised(model: str, kernel: str) -> bool:
    """Whether the kernel has a denoised estimate x0-hat to freeze (every kernel but Langevin)."""
    return model_kernel(model, kernel) != "langevin"


def is_auto(tree) -> bool:
    return C.is_auto(tree)


# ---------------------------------------------------------------------------------------------- errors
MAX_MESSAGE = 600  # characters of an error message: no input is echoed back whole


def user_error(message: str, title: str) -> gr.Error:
    """The page's error for something the visitor can change: one line in the server's log, no
    traceback (gradio prints one for every gr.Error unless told not to)."""
    message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"
    log.info("%s: %s", title, message)
    return gr.Error(message, title=title, print_exception=False)


def readable_errors(fn):
    """Every failure becomes a gr.Error the page shows; the server never goes down with it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Cancelled as err:
            raise user_error(str(err), "Stopped") from None
        except SpecdemoError as err:
            raise user_error(str(err), "Cannot run this") from None
        except (MemoryError, torch.OutOfMemoryError):
            raise user_error("out of memory: use fewer samples or a smaller tree", "Too large") from None
        except Exception as err:  # a bug: its traceback logged once, here; the page says what
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"unexpected error ({type(err).__name__}): {str(err)[:MAX_MESSAGE]}",
                           title="Something went wrong", print_exception=False) from None

    return wrapper


def _int(value, what: str, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecdemoError(f"{what} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise SpecdemoError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def _float(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecdemoError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise SpecdemoError(f"{what} must be a finite number, got {value!r}")
    return number


# ---------------------------------------------------------------------------------------------- models a visitor may load
HUB_ID = re.compile(r"(?!.*\.json$)[A-Za-z0-9][\w.-]{0,95}/(?!\.\.?$)[\w.-]{1,96}")  # org/name, no "..", no .json


def local_models() -> bool:
    return os.environ.get("SPECDEMO_APP_LOCAL_MODELS") == "1"


def max_download_bytes() -> int:
    """The most weights a visitor's Hub model may bring (the owner sets SPECDEMO_APP_MAX_DOWNLOAD_GB)."""
    text = os.environ.get("SPECDEMO_APP_MAX_DOWNLOAD_GB", str(MAX_DOWNLOAD_GB))
    try:
        return int(float(text) * 1e9)
    except ValueError:
        raise SpecdemoError(f"SPECDEMO_APP_MAX_DOWNLOAD_GB must be a number, got {text[:40]!r}") from None


def allowed_model(spec: str, what: str = "model") -> None:
    """Refuse a model the Space's owner has not opened to visitors: local folders and files unless
    SPECDEMO_APP_LOCAL_MODELS=1, Hub ids unless listed in SPECDEMO_APP_HUB_MODELS (comma-separated;
    "*" for any). A path is refused by its form alone, so the answer is the same whether it names a
    folder, a file or nothing: it says nothing about the server's disk."""
    if spec in PRESETS or spec in C.EMBEDDED or spec == "frozen":
        return
    if HUB_ID.fullmatch(spec):
        listed = [s.strip() for s in os.environ.get("SPECDEMO_APP_HUB_MODELS", "").split(",") if s.strip()]
        # a draft is loaded by the library, which looks for a local folder of that name first
        local_name = what == "draft" and not local_models() and os.path.lexists(spec)
        if ("*" not in listed and spec not in listed) or local_name:
            raise SpecdemoError(f"the Hub {what} {spec!r} is not on this Space's list"
                                + (f"; accepted: {', '.join(listed)}" if listed else " (the list is empty)")
                                + "; the Space's owner can add it to SPECDEMO_APP_HUB_MODELS")
        return
    if not local_models():
        raise SpecdemoError(f"local {what}s are off on this Space; pick a listed model, or a Hub id (org/name) on the "
                            "Space's list (its owner can turn local models on with SPECDEMO_APP_LOCAL_MODELS=1)")


# ---------------------------------------------------------------------------------------------- config
def tree_work(tree: str, budget: int | None) -> tuple[int, str]:
    """Nodes a round of `tree` may hold (an auto plan: at most 2 x budget + 1, the root whose output
    is known, the evaluated rows, and unevaluated leaves one per parent) and how to name it in a refusal."""
    if is_auto(tree):
        return 2 * budget + 1, f"auto topology of {budget} rows"
    topology = Topology.parse(tree)
    return topology.num_nodes, f"tree {topology} ({topology.num_nodes} nodes per round)"


def kind_and_scale(target, device: str) -> tuple[str, int]:
    """Which of the app's limits apply ("image" or "other"), and their multiple (x16 on a GPU)."""
    return ("image" if C.target_kind(target) == "image" else "other",
            16 if device != "cpu" and torch.cuda.is_available() else 1)


def app_limits(target, device: str) -> Limits:
    """What one click may ask for (the library checks it before any work)."""
    kind, scale = kind_and_scale(target, device)
    return Limits.from_env("SPECDEMO_APP_", max_steps=MAX_STEPS, max_samples=MAX_SAMPLES[kind] * scale,
                           max_rows=MAX_ROWS[kind] * scale, max_seconds=MAX_SECONDS)


def make_config(model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn,
                num_samples, class_label, seed, device, objective="time"
                ) -> tuple[SamplerConfig, object, object | None, Limits]:
    """The controls as a SamplerConfig, the resolved target and draft network (None for the frozen
    draft), both loaded under the Space's policy (allowed_model, Hub only, the download cap), and the
    run's limits (app_limits; the library checks the rest of them before any work)."""
    if model not in MODEL_VALUES:
        raise SpecdemoError(f"unknown model choice {model!r}; accepted: {', '.join(MODEL_VALUES)}")
    spec = (custom_model or "").strip() if model == "custom" else model
    if not spec:
        raise SpecdemoError("type a Hub id (org/name) or a local diffusers folder in the custom model field")
    allowed_model(spec)
    allowed_model((draft or "frozen").strip(), "draft")
    tree = str(tree or "").strip()
    if not tree:
        raise SpecdemoError("no topology given; accepted: auto, or widths such as 3,2,1, KxL or 1xL")
    rows = None
    if is_auto(tree):
        tree = "auto"
        rows = _int(budget, "the rows per round", UI_DEFAULTS["custom"]["budget"])
        if not BUDGET_RANGE[0] <= rows <= BUDGET_RANGE[1]:
            raise SpecdemoError(f"the rows per round of an auto topology must be in {BUDGET_RANGE[0]}..{BUDGET_RANGE[1]}, "
                                f"got {rows}")
    elif not Topology.parse(tree).widths:  # malformed widths: a readable refusal before any model loads
        raise SpecdemoError("the topology needs at least one level, such as 1x5 or 3,2,1")
    freeze = str(freeze or "out").strip()
    if freeze not in [v for _, v in FREEZE_CHOICES]:
        raise SpecdemoError(f"unknown freeze {freeze!r}; accepted: {', '.join(v for _, v in FREEZE_CHOICES)}")
    if (draft or "frozen").strip() == "frozen" and freeze != "out" and not has_denoised(model, kernel):
        raise SpecdemoError(f"freezing {'x0-hat' if freeze == 'x0' else 'auto'} needs a denoised estimate, which the "
                            f"{model_kernel(model, kernel)} kernel has not; set freeze to the network output")
    objective = str(objective or "time").strip()
    if objective not in [v for _, v in OBJECTIVE_CHOICES]:
        raise SpecdemoError(f"unknown objective {objective!r}; accepted: {', '.join(v for _, v in OBJECTIVE_CHOICES)}")
    samples = _int(num_samples, "the number of samples")
    device = str(device or "auto")
    # a Hub id never reads the local disk, and a repo of too many weights is refused before any download
    target = C.cached_target(spec, hub_only=not local_models(), max_download_bytes=max_download_bytes())
    draft_spec = (draft or "frozen").strip()
    draft_target = None if draft_spec == "frozen" else C.cached_target(
        draft_spec, hub_only=not local_models(), max_download_bytes=max_download_bytes())
    if target.text_conditioned:  # no prompt box yet, and its latents need the VAE to be shown
        raise SpecdemoError(f"{spec[:80]!r} is a text-to-image model, which this page does not run yet; use the "
                            "command line (--prompt) or a pixel-space model")
    limits = app_limits(target, device)
    if samples is None or not 1 <= samples <= limits.max_samples:
        raise SpecdemoError(f"the number of samples must be in 1..{limits.max_samples} here, got {samples}")
    kind, scale = kind_and_scale(target, device)
    nodes, what = tree_work(tree, rows)
    if samples * nodes > MAX_WORK[kind] * scale:
        raise SpecdemoError(
            f"{samples} samples with {what} is more than this app runs at once "
            f"(samples × nodes ≤ {MAX_WORK[kind] * scale}); use fewer samples or a smaller tree"
        )
    kernel_name = None if not kernel or kernel == "default" else kernel
    label = _int(class_label, "the class label", 0) if target.num_classes else None
    config = SamplerConfig(
        model=spec, kernel=kernel_name, steps=_int(steps, "steps"), eta=_float(eta, "eta"),
        churn=_float(churn, "churn") if model_kernel(model, kernel) == "flow-churn" else None,
        method=C.speculative_method(tree), tree=tree, budget=rows,
        verifier=None if not verifier or verifier == "default" else verifier, objective=objective,
        draft=(draft or "frozen").strip(), freeze=freeze, draft_bias=_float(draft_bias, "the draft bias"),
        prefetch="auto" if tree == "auto" and (draft or "frozen").strip() == "frozen" else "nearest",
        pilot_samples=PILOT_SAMPLES, num_samples=samples, seed=_int(seed, "the seed", 0), device=device,
        class_label=label,
    )
    return config, target, draft_target, limits


# ---------------------------------------------------------------------------------------------- views
def plot(fig, name: str) -> PlotData:
    """A plotly figure for gr.Plot, with its toolbar's PNG export named and at twice the resolution."""
    return PlotData(type="plotly", plot=F.figure_json(fig, name))


def data_view(comp: C.Comparison, trajectory: int, k: int) -> PlotData:
    """The round in data space: the 2-D plane, an image model's committed path, or why neither."""
    if comp.kind == "plane":
        fig = F.plane_figure(comp.trace, trajectory, k, comp.log_density, path=comp.paths[trajectory],
                             samples=comp.chosen.samples.numpy())
        return plot(fig, "specdemo-data-plane")
    if comp.kind == "image":
        return plot(F.path_images_figure(comp.trace, trajectory, k), "specdemo-path-images")
    dims = "×".join(map(str, comp.shape))
    return plot(F.message_figure(f"{comp.model_name} lives in {dims} dimensions: the data-plane view is drawn for "
                                 "2-D targets and image models.<br>The Comparison tab plots its first two "
                                 "coordinates.", height=160), "specdemo-data")


def viewable(comp: C.Comparison) -> int:
    """Trajectories whose rounds the page can show (the first ones the session keeps)."""
    return max(1, min(comp.config.num_samples, comp.traced_trajectories))


def round_views(comp: C.Comparison | None, trajectory, k):
    """Tree, data view and all-rounds figure for one trajectory's k-th round."""
    if comp is None:
        raise user_error("run the sampler first", "Nothing to show yet")
    t = min(max(_int(trajectory, "the trajectory", 0), 0), viewable(comp) - 1)
    k = max(_int(k, "the round", 1), 1)
    return (plot(F.tree_figure(comp.trace, t, k), "specdemo-tree"), data_view(comp, t, k),
            plot(F.rounds_figure(comp.trace, t, comp.num_steps, k=k), "specdemo-rounds"))


TIE = 0.03  # speedups within 3% of each other are "about the same" (a few samples, one seed)


def rows_text(rows: float) -> str:
    return f"{rows:.0f}" if float(rows).is_integer() else f"{rows:.1f}"


def headline(comp: C.Comparison) -> str:
    """The result in words, in wall-clock first where the chosen run saved time, else in target
    calls: against plain sampling and, for a tree or plan, against the chain at the same target rows
    per round (for a block-verified chain, against the same chains verified node by node), saying
    which won (whichever it is); then what the plan expected, and what planning cost."""
    h = comp.headline()
    chosen = comp.chosen
    acceptance = chosen.cost.acceptance
    by_time = h["speedup_time"] > 1 + TIE
    calls = f"{h['calls_chosen']:.1f} target calls per sample instead of {h['calls_plain']:.0f}"
    accepted = "" if acceptance is None else f", {acceptance:.0%} of the verified nodes kept a drafted child"
    if by_time:
        text = (f"### {chosen.label}: **{h['speedup_time']:.2f}× faster** than plain sampling\n"
                f"{h['time_chosen']:.2f} s against {h['time_plain']:.2f} s of sampling, with {h['speedup']:.2f}× fewer "
                f"target calls ({calls}){accepted}.")
    else:
        text = f"### {chosen.label}: **{h['speedup']:.2f}×** fewer target calls than plain sampling\n{calls}{accepted}."
    # the baseline in the headline's unit
    unit = "speedup_time" if by_time else "speedup"
    ours, theirs = h[unit], h.get(unit + "_chain")
    shown = (lambda v: f"**{v:.2f}× faster** than plain") if by_time else (lambda v: f"**{v:.2f}×**")
    if theirs is not None and comp.config.verifier == "block" and comp.plan is None:
        chain = f"The same chains verified node by node ({h['chain']})"
        if theirs > ours * (1 + TIE):
            text += (f" {chain} do better: {shown(theirs)}. *Block verification commits at least as many steps "
                     "per round on average; with few samples, try another seed, or longer chains (it gains most "
                     "where many nodes follow a rejection).*")
        elif theirs < ours * (1 - TIE):
            text += f" {chain} do less well: {shown(theirs)}; weighing the whole chain pays."
        else:
            text += f" {chain} do about the same: {shown(theirs)}."
    elif theirs is not None:
        rows = rows_text(round(chosen.rows_per_round, 1))
        chain = (f"The {h['chain']} at the same {rows} target rows per round" if comp.plan is None else
                 f"The {h['chain']}, at the plan's mean of {rows} target rows per round,")
        if theirs > ours * (1 + TIE):
            text += f" {chain} does better: {shown(theirs)}."
            text += (f" *The plan is fitted on a pilot of {comp.config.pilot_samples} trajectories and does not always "
                     "find the best topology; with few samples, try another seed too.*" if comp.plan is not None else
                     " *Drafts are mostly accepted here, so depth pays more than width: try the topology auto "
                     "(widths planned per step), or a draft bias of 2 or more to see width pay.*")
        elif theirs < ours * (1 - TIE):
            text += (f" {chain} does less well: {shown(theirs)}; "
                     + ("the plan pays." if comp.plan is not None else "the width pays."))
        else:
            text += f" {chain} does about the same: {shown(theirs)}."
    if h.get("planned_s") is not None:
        text += (f" The plan expected {h['planned_s']:.2f} s and {h['planned_calls']:.1f} target calls per sample "
                 f"(measured {h['time_chosen']:.2f} s and {h['calls_chosen']:.1f}).")
    text += (f"  \nEvery sample is an exact draw of the target sampler, whatever the draft. "
             f"{'Three' if len(comp.runs) == 3 else 'Two'} runs, seed {comp.config.seed}, {h['wall_s']:.2f} s of sampling")
    pilot = chosen.pilot
    if pilot is not None:
        text += (f"; the pilot that planned the run ({comp.config.pilot_samples} trajectories, {pilot.target_calls} "
                 f"calls, {pilot.wall_s:.2f} s) is not counted above: the plan is kept, and the next run of these "
                 "settings pays none")
    elif chosen.plan_source in ("cache", "shipped"):
        text += "; the plan came from the plan cache (no pilot)"
    if not by_time and h["time_chosen"] > h["time_plain"]:
        text += (f". Wall-clock {h['time_chosen']:.2f} s against {h['time_plain']:.2f} s plain: here the extra rows, "
                 "the drafts and the verification cost more than the calls saved; the saving shows in time when a "
                 "target call is expensive and its rows run in parallel (a large network on a GPU), or with the "
                 "topology auto, which plans for wall-clock")
    return text + "."


def plan_text(comp: C.Comparison, max_segments: int = 7) -> str:
    """One line on the topology: a fixed tree, or the planned trees along the steps."""
    chosen, c = comp.chosen, comp.config
    freeze = {"out": "the network output", "x0": "x0-hat", "auto": "the network output or x0-hat (planned per step)"}
    draft = (f"frozen draft keeping {freeze.get(c.freeze, c.freeze)}" if c.draft == "frozen"
             else f"draft network {c.draft}") + (f", biased by {c.draft_bias:g}" if c.draft_bias else "")
    if comp.plan is None:
        return (f"**Topology** `{chosen.tree}` at every step: {rows_text(chosen.rows_per_round)} target rows a round "
                f"(cut short near the end) · {draft}.")
    segments = C.plan_segments(comp.plan)
    branching = sum(1 for t in comp.plan.trees if t.widths and not t.is_chain)
    speculative = sum(1 for t in comp.plan.trees if t.widths)
    parts = [f"{a}–{b} `{tree}`" if b > a else f"{a} `{tree}`" for a, b, tree in segments[:max_segments]]
    if len(segments) > max_segments:
        parts.append(f"… {len(segments) - max_segments} more")
    goal = "the least expected wall-clock on this machine" if c.objective == "time" else "the fewest expected target calls"
    known = ""
    if any(comp.plan.leaves):  # the round view shows these trees too: say where they come from
        deepest = max((t for t in comp.plan.known_trees if t.widths), key=lambda t: t.num_nodes, default=None)
        known = (" · a round that starts where an evaluated leaf was committed knows its root's output (no row for "
                 f"it) and drafts from the plan's trees for a known root{f', up to `{deepest}`' if deepest else ''}; "
                 "the round view marks it \"root output known\"")
    return (f"**Planned trees** for {goal} (≤ {c.budget} target rows a round, "
            f"{rows_text(round(chosen.rows_per_round, 1))} on average; branching at {branching} of {speculative} steps) "
            f"by starting step: " + " · ".join(parts) + known + f" · {comp.chosen.verifier} verifier · {draft}.")


# ---------------------------------------------------------------------------------------------- handlers
# ---------------------------------------------------------------------------------------------- cancellation
_RUNNING: dict[str, set[Cancel]] = {}  # session -> its runs' stop flags
_RUNNING_LOCK = threading.Lock()


@contextmanager
def cancellable(request: gr.Request | None, seconds: float | None):
    """A run's stop flag: set by the Stop button and by closing the page (`stop`), by gradio's cancel
    of the event (`watched`), or `seconds` after the run started."""
    cancel = Cancel(seconds)
    session = getattr(request, "session_hash", None) or ""
    with _RUNNING_LOCK:
        _RUNNING.setdefault(session, set()).add(cancel)
    try:
        yield cancel
    finally:
        with _RUNNING_LOCK:
            runs = _RUNNING.get(session, set())
            runs.discard(cancel)
            if not runs:
                _RUNNING.pop(session, None)


def stop(request: gr.Request):
    """Stop this session's runs between rounds (the Stop button, and a closed page)."""
    with _RUNNING_LOCK:
        runs = list(_RUNNING.get(getattr(request, "session_hash", None) or "", ()))
    for cancel in runs:
        cancel.cancel()


def _event_alive() -> bool:
    """Whether gradio still runs this thread's event: a cancelled event (gradio_client's job.cancel(),
    a `cancels=` trigger) leaves the queue's active jobs while the worker thread runs on."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return True  # not inside a queued event (a direct call)
    return any(evt._id == event_id for job in queue.active_jobs if job for evt in job)


def watched(progress, cancel: Cancel, every: float = 0.1):
    """gr.Progress at most every `every` seconds (a round can take a millisecond), the end always;
    each update also stops the run once gradio has dropped its event."""
    last = [0.0]

    def update(fraction: float, desc: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every or fraction >= 1:
            last[0] = now
            if not _event_alive():
                cancel.cancel()
            progress(fraction, desc=desc)
    return update


@gpu
def _compute(config: SamplerConfig, target, draft_target, progress, limits: Limits, cancel: Cancel) -> C.Comparison:
    return C.run_comparison(config, target=target, draft_target=draft_target, progress=watched(progress, cancel),
                            limits=limits, cancel=cancel)


@readable_errors
def check_inputs(model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn,
                 num_samples, class_label, seed, device, objective="time"):
    """Refuse bad settings before a run starts, the library's limits included and applied to the
    click's runs together (what `run` checks too, for API callers), so that a refusal leaves the last
    results on screen."""
    config, target, draft_target, limits = make_config(
        model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn, num_samples,
        class_label, seed, device, objective)
    C.check_click(config, target, limits)


@readable_errors
def run(model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn, num_samples,
        class_label, seed, device, objective="time", request: gr.Request = None, progress=gr.Progress()):
    """Run the chosen chain, tree or planned topology, the plain target sampler and the budget-matched chain."""
    progress(0, desc="loading the model")
    t0 = time.perf_counter()
    config, target, draft_target, limits = make_config(
        model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn, num_samples,
        class_label, seed, device, objective)
    with cancellable(request, limits.max_seconds) as cancel:
        # the session keeps the trace of the first KEPT_TRAJECTORIES only: a few MB whatever the samples
        comp = _compute(config, target, draft_target, progress, limits, cancel).summarised(KEPT_TRAJECTORIES, SESSION_BYTES)
    t, k = F.pick_round(comp.trace)
    n_rounds = max(len(F.trajectory_rounds(comp.trace, t)), 1)
    tree_fig, data_fig, rounds_fig = round_views(comp, t, k)
    out = (
        headline(comp),
        plan_text(comp),
        tree_fig, data_fig, rounds_fig,
        plot(F.cost_figure(comp.runs), "specdemo-costs"),
        plot(F.acceptance_figure(comp.runs), "specdemo-acceptance"),
        F.comparison_table(comp.runs),
        plot(F.samples_figure(comp.runs, log_density=comp.log_density), "specdemo-samples"),
        comp,
        gr.Slider(minimum=0, maximum=max(viewable(comp) - 1, 1), value=t, step=1, interactive=viewable(comp) > 1),
        gr.Slider(minimum=1, maximum=max(n_rounds, 2), value=k, step=1, interactive=n_rounds > 1),
    )
    log.info("run %s took %.2f s", config.to_dict(), time.perf_counter() - t0)
    return out


@readable_errors
def show_round(comp, trajectory, k):
    """Redraw the tree views for a trajectory and round of the last run."""
    return round_views(comp, trajectory, k)


@readable_errors
def show_trajectory(comp, trajectory):
    """Pick a trajectory: its first round, and the round slider's range."""
    if comp is None:
        raise user_error("run the sampler first", "Nothing to show yet")
    t = min(max(_int(trajectory, "the trajectory", 0), 0), viewable(comp) - 1)
    n_rounds = max(len(F.trajectory_rounds(comp.trace, t)), 1)
    return (*round_views(comp, t, 1), gr.Slider(minimum=1, maximum=max(n_rounds, 2), value=1, step=1,
                                                interactive=n_rounds > 1))


@gpu
def _exactness(config, num, target, draft_target, progress, limits: Limits, cancel: Cancel):
    return C.exactness_check(config, num, target=target, draft_target=draft_target, progress=watched(progress, cancel),
                             limits=limits, cancel=cancel)


@readable_errors
def exactness(model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn,
              num_samples, class_label, seed, device, objective, test_samples, request: gr.Request = None,
              progress=gr.Progress()):
    """Two-sample test of the chosen chain, tree or plan against plain target sampling (analytic targets)."""
    progress(0, desc="loading the model")
    config, target, draft_target, limits = make_config(
        model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn, 1,
        class_label, seed, device, objective)
    num = _int(test_samples, "the number of test samples")
    nodes, what = tree_work(config.tree, config.budget)
    if num * nodes > MAX_WORK["other"] * 2:
        raise SpecdemoError(f"{num} test samples with {what} is more than this app runs at once; "
                            "use fewer samples or a smaller tree")
    with cancellable(request, limits.max_seconds) as cancel:
        report = _exactness(config, num, target, draft_target, progress, limits, cancel)
    fig = F.exactness_figure(report.plain, report.speculative, report.p_value, spec_label=report.label,
                             mixture=report.mixture)
    text = (f"### p = {report.p_value:.3f}: {report.verdict}\n"
            f"Energy-distance permutation test of {num} samples from **{report.label}**"
            + (f" (draft biased by {config.draft_bias:g})" if config.draft_bias else "")
            + f" against {num} from the "
            f"plain target sampler (independent seeds; statistic {report.statistic:.4f}). Under exactness p is "
            f"uniform on [0, 1]: it falls under 0.05 in one run out of twenty, whatever the draft or its bias.")
    return text, plot(fig, "specdemo-exactness")


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
def model_kernels(model: str) -> tuple[str, ...]:
    """The kernels a model offers (a custom diffusers model: DDPM and DDIM)."""
    if model == "custom":
        return ("ddpm", "ddim")
    return C.cached_target(model).kernels if model in MODEL_VALUES else KERNEL_NAMES


def model_changed(model, kernel):
    """Switch the controls to what suits the picked model; only its own kernels are offered, and a
    kernel it lacks falls back to its default."""
    d = UI_DEFAULTS.get(model, UI_DEFAULTS["custom"])
    image = model in ("digits", "custom")
    kernels = model_kernels(model)
    kernel = kernel if kernel in kernels else "default"
    freeze = d["freeze"] if has_denoised(model, kernel) else "out"
    return (
        gr.update(choices=[KERNEL_CHOICES[0], *[(k, k) for k in kernels]], value=kernel),
        gr.update(visible=model == "custom"),
        gr.update(value=d["steps"]),
        gr.update(value=d["samples"], maximum=MAX_SAMPLES["image" if image else "other"]),
        gr.update(value=d["tree"]),
        gr.update(value=d["budget"], visible=is_auto(d["tree"])),
        gr.update(visible=image, label="class label (the digit to draw)" if model == "digits" else "class label"),
        gr.update(value=d["draft"]),
        gr.update(value=freeze, visible=d["draft"] == "frozen"),
        *kernel_changed(model, kernel),
    )


def kernel_changed(model, kernel):
    k = model_kernel(model, kernel)
    return gr.update(visible=k == "ddim"), gr.update(visible=k == "flow-churn")


def freeze_follows_kernel(model, kernel, freeze):
    """Langevin has no x0-hat: the frozen draft keeps the network output there, and the model's
    default comes back with a kernel that has one."""
    if not has_denoised(model, kernel):
        return gr.update(value="out")
    return gr.update(value=UI_DEFAULTS.get(model, UI_DEFAULTS["custom"])["freeze"] if freeze == "out" else freeze)


def exactness_button(model) -> dict:
    """The two-sample test needs the target's law in closed form: offered for the analytic targets,
    and said so in place for the image models."""
    analytic = model in PRESETS
    return {"interactive": analytic,
            "value": "Run the two-sample test" if analytic else "Two-sample test: for the analytic targets only"}


def exactness_offered(model):
    return gr.update(**exactness_button(model))


def tree_changed(tree):
    """The rows-per-round budget and the plan's objective are settings of the auto topology only."""
    return gr.update(visible=is_auto(tree)), gr.update(visible=is_auto(tree))


def draft_changed(draft):
    """What to freeze is a setting of the frozen draft only."""
    return gr.update(visible=(draft or "frozen").strip() == "frozen")


def warm_up() -> None:
    """At start-up, not in the first click: load the default model, and run a tiny comparison on the
    CPU and draw its figures, so that torch, the sampler and plotly pay their first-call costs here."""
    try:
        target = C.cached_target(DEFAULT_MODEL)
        comp = C.run_comparison(SamplerConfig(model=DEFAULT_MODEL, tree="2,1", steps=4, num_samples=2, device="cpu",
                                              class_label=0 if target.num_classes else None), target=target)
        t, k = F.pick_round(comp.trace)
        round_views(comp, t, k)
        plot(F.cost_figure(comp.runs), "warm-up"), plot(F.acceptance_figure(comp.runs), "warm-up")
        plot(F.samples_figure(comp.runs, log_density=comp.log_density), "warm-up")
    except Exception:  # the app serves anyway; the first click pays instead
        log.exception("warm-up failed")

# ---------------------------------------------------------------------------------------------- page
LEGEND = "".join(
    f'<span class="sd-chip"><span class="sd-dot" style="background:{F.STATUS_COLORS[s]}"></span>{label}</span>'
    for s, label in (("accepted", "accepted"), ("rejected", "rejected"), ("corrected", "corrected sample"),
                     ("unvisited", "never examined"), ("root", "round start"))
)
HEADER = f"""
<div class="sd-header">
  <h1>Exact speculative sampling for diffusion models</h1>
  <p>A cheap draft guesses the next few denoising steps as a chain or a tree; the expensive target model
  checks all of them in one batched call, keeps the longest accepted path and replaces the first rejected
  step by a corrected draw. The coupling makes every sample an exact draw of the plain target sampler,
  whatever the draft: only the number of target calls changes.</p>
  <div class="sd-legend">{LEGEND}</div>
</div>
"""
CSS = """
.sd-header h1 { font-size: 1.6rem; font-weight: 700; margin: 0.2rem 0 0.4rem 0; letter-spacing: -0.01em; }
.sd-header p { font-size: 0.98rem; line-height: 1.45; color: var(--body-text-color-subdued); max-width: 70rem; margin: 0; }
.sd-legend { display: flex; flex-wrap: wrap; gap: 0.5rem 1.1rem; margin-top: 0.7rem; font-size: 0.9rem; }
.sd-chip { display: inline-flex; align-items: center; gap: 0.4rem; }
.sd-dot { width: 0.8rem; height: 0.8rem; border-radius: 50%; display: inline-block; box-shadow: 0 0 0 1px #fff, 0 0 0 2px #e2e8f0; }
.sd-headline h3 { margin-bottom: 0.2rem; font-size: 1.15rem; }
.sd-plan p { font-size: 0.92rem; line-height: 1.5; margin: 0.1rem 0 0.3rem 0; }
.sd-plan code { font-size: 0.85rem; padding: 0.05rem 0.3rem; }
#compare-table table, #compare-table th, #compare-table td, #compare-table span { font-family: var(--font) !important; }
footer { display: none !important; }
"""
THEME = gr.themes.Soft(
    primary_hue="violet", neutral_hue="slate", radius_size="md",
    font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "DejaVu Sans", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "DejaVu Sans Mono", "monospace"],
)

def build_demo() -> gr.Blocks:
    """The page: controls on the left, the run's views in tabs on the right, and their events."""
    d0 = UI_DEFAULTS[DEFAULT_MODEL]
    image0 = DEFAULT_MODEL in ("digits", "custom")
    with gr.Blocks(title="specdemo · speculative sampling for diffusion models",
                   delete_cache=(EXPORT_TTL // 3, EXPORT_TTL)) as demo:
        gr.HTML(HEADER)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=330):
                with gr.Group():
                    model = gr.Dropdown(MODEL_CHOICES, value=DEFAULT_MODEL, label="target model", elem_id="model")
                    custom_model = gr.Textbox("", label="Hub id or local diffusers folder", elem_id="custom-model",
                                              placeholder="google/ddpm-cifar10-32", visible=DEFAULT_MODEL == "custom")
                    class_label = gr.Number(value=DEFAULT_CLASS, precision=0, visible=image0, elem_id="class-label",
                                            label="class label (the digit to draw)" if DEFAULT_MODEL == "digits"
                                            else "class label")
                with gr.Group():
                    draft = gr.Dropdown(DRAFT_CHOICES, value=d0["draft"], label="draft", allow_custom_value=True,
                                        info="or a draft network's folder or Hub id (same noise schedule)",
                                        elem_id="draft")
                    freeze = gr.Radio(FREEZE_CHOICES, value=d0["freeze"], label="freeze (frozen draft)",
                                      elem_id="freeze", info="what the draft keeps from the last target call",
                                      visible=d0["draft"] == "frozen")
                    draft_bias = gr.Slider(0, 3, value=CONFIG_DEFAULTS.draft_bias, step=0.1, label="draft bias",
                                           elem_id="draft-bias", info=CONFIG_FIELDS["draft_bias"]["help"])
                with gr.Group():
                    tree = gr.Textbox(d0["tree"], label="topology", elem_id="topology", max_lines=1,
                                      info="auto, or widths per depth such as 3,2,1, 4x4, 1x5 (Enter runs it)")
                    gr.Examples([[value] for value, _ in TREE_PRESETS], inputs=[tree], label="presets",
                                example_labels=[label for _, label in TREE_PRESETS], examples_per_page=len(TREE_PRESETS),
                                elem_id="topology-presets")
                    budget = gr.Slider(*BUDGET_RANGE, value=d0["budget"], step=1, label="rows per round (auto)",
                                       info=f"target rows a round may use; widths planned per step from a pilot of "
                                            f"{PILOT_SAMPLES} trajectories", visible=is_auto(d0["tree"]), elem_id="budget")
                    objective = gr.Radio(OBJECTIVE_CHOICES, value=CONFIG_DEFAULTS.objective, label="the plan minimises (auto)",
                                         visible=is_auto(d0["tree"]), elem_id="objective")
                    verifier = gr.Dropdown(VERIFIER_CHOICES, value="default", label="verifier", elem_id="verifier")
                with gr.Accordion("sampler", open=True):
                    kernel = gr.Dropdown([KERNEL_CHOICES[0], *[(k, k) for k in model_kernels(DEFAULT_MODEL)]],
                                         value="default", label="kernel", elem_id="kernel")
                    with gr.Row():
                        steps = gr.Number(value=d0["steps"], precision=0, label="steps", min_width=100, minimum=1,
                                          maximum=Limits.from_env("SPECDEMO_APP_", max_steps=MAX_STEPS).max_steps,
                                          elem_id="steps")
                        seed = gr.Number(value=CONFIG_DEFAULTS.seed, precision=0, label="seed", min_width=100,
                                         elem_id="seed")
                    eta = gr.Slider(0, 1, value=CONFIG_DEFAULTS.eta, step=0.05, label="eta (DDIM)", visible=False,
                                    elem_id="eta", info=CONFIG_FIELDS["eta"]["help"])
                    churn = gr.Slider(0, 1, value=0.06, step=0.01, label="churn (flow matching)", elem_id="churn",
                                      visible=model_kernel(DEFAULT_MODEL, "default") == "flow-churn")
                    num_samples = gr.Slider(1, MAX_SAMPLES["image" if image0 else "other"], value=d0["samples"], step=1,
                                            label="samples", elem_id="num-samples")
                    device = gr.Radio(list(CONFIG_FIELDS["device"]["choices"]), value=CONFIG_DEFAULTS.device, label="device", elem_id="device")
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", size="lg", elem_id="run-button", scale=3)
                    stop_button = gr.Button("Stop", variant="stop", size="lg", elem_id="stop-button", scale=1)
                gr.Markdown(f"<small>specdemo {__version__} · same seed, device and batch: same samples · runs queue "
                            f"{CONCURRENCY_LIMIT} at a time</small>")
            with gr.Column(scale=3):
                summary = gr.Markdown("Press **Run**: the chosen topology, the plain target sampler and the chain at "
                                      "the same target rows per round draw samples with one seed.",
                                      elem_classes="sd-headline", elem_id="headline")
                with gr.Tabs():
                    with gr.Tab("Draft tree", id="tree-tab"):
                        plan_line = gr.Markdown(elem_id="plan-line", elem_classes="sd-plan")
                        with gr.Row():
                            trajectory = gr.Slider(0, 1, value=0, step=1, label="trajectory", interactive=False)
                            round_k = gr.Slider(1, 2, value=1, step=1, label="round of this trajectory",
                                                interactive=False)
                        tree_plot = gr.Plot(label="draft tree", show_label=False, elem_id="tree-plot")
                        data_plot = gr.Plot(label="the round in the data plane", show_label=False, elem_id="data-plot")
                        rounds_plot = gr.Plot(label="all rounds", show_label=False, elem_id="rounds-plot")
                    with gr.Tab("Comparison", id="compare-tab"):
                        cost_plot = gr.Plot(label="costs", show_label=False, elem_id="cost-plot")
                        table = gr.Dataframe(headers=F.TABLE_HEADERS, label="the same seed, three samplers",
                                             interactive=False, wrap=True, elem_id="compare-table",
                                             column_widths=["20%", "11%", "8%", "9%", "9%", "11%", "11%", "10%", "11%"])
                        with gr.Row():
                            accept_plot = gr.Plot(label="acceptance by depth", show_label=False, elem_id="accept-plot",
                                                  scale=2)
                        samples_plot = gr.Plot(label="samples", show_label=False, elem_id="samples-plot")
                    with gr.Tab("Exactness", id="exact-tab", elem_id="exact-tab-content"):
                        gr.Markdown("Draws fresh samples with the chosen chain, tree or plan and with the plain target "
                                    "sampler (independent seeds) and tests whether they come from the same "
                                    "distribution. For the analytic targets. Try a large draft bias: the speedup "
                                    "drops, the p-value does not.")
                        with gr.Row():
                            test_samples = gr.Slider(100, 2000, value=EXACTNESS_SAMPLES, step=100,
                                                     label="samples per group")
                            test_button = gr.Button(variant="secondary", **exactness_button(DEFAULT_MODEL))
                        test_summary = gr.Markdown(elem_id="exact-summary")
                        test_plot = gr.Plot(label="histograms", show_label=False, elem_id="exact-plot")
                    with gr.Tab("Export", id="export-tab"):
                        gr.Markdown("Every figure downloads as a PNG from its toolbar (camera icon, top right of the "
                                    "figure). The run downloads as JSON: settings, every method's costs, the chosen "
                                    "run's samples and its trace (rounds of the first 64 trajectories; node states "
                                    "for 2-D targets).")
                        export_button = gr.Button("Export the run as JSON")
                        export_file = gr.File(label="run JSON", interactive=False)
        state = gr.State(None, time_to_live=3600)

        controls = [model, custom_model, draft, freeze, draft_bias, tree, budget, verifier, kernel, steps, eta, churn,
                    num_samples, class_label, seed, device, objective]
        # the inputs are checked in an event with no outputs first: a refusal is a message, and the last
        # results stay on screen (an error in the run itself marks every output panel); Enter in the
        # topology box runs what it holds, as the Run button does
        run_check = gr.on([run_button.click, tree.submit], check_inputs, controls, None, api_name="check",
                          show_progress="hidden")
        run_event = run_check.success(
            run, controls,
            [summary, plan_line, tree_plot, data_plot, rounds_plot, cost_plot, accept_plot, table, samples_plot, state,
             trajectory, round_k],
            api_name="run", concurrency_id="sampler",
        )
        round_k.input(show_round, [state, trajectory, round_k], [tree_plot, data_plot, rounds_plot],
                      api_name="tree_view", trigger_mode="always_last", show_progress="hidden")
        trajectory.input(show_trajectory, [state, trajectory], [tree_plot, data_plot, rounds_plot, round_k],
                         api_name="trajectory_view", trigger_mode="always_last", show_progress="hidden")
        test_check = test_button.click(check_inputs, controls, None, api_name="check_exactness",
                                       show_progress="hidden")
        test_event = test_check.success(
            exactness, [*controls, test_samples], [test_summary, test_plot], api_name="exactness",
            concurrency_id="sampler")
        # the flag stops the work between rounds; `cancels` frees the queue's slot and the page at once
        stop_button.click(stop, None, None, cancels=[run_check, run_event, test_check, test_event], api_name="stop",
                          queue=False)
        demo.unload(stop)
        export_button.click(export, [state], [export_file], api_name="export")
        model.change(model_changed, [model, kernel],
                     [kernel, custom_model, steps, num_samples, tree, budget, class_label, draft, freeze, eta, churn],
                     api_name="model_defaults", show_progress="hidden")
        model.change(exactness_offered, [model], [test_button], api_name="exactness_options", show_progress="hidden")
        kernel.change(kernel_changed, [model, kernel], [eta, churn], api_name="kernel_options", show_progress="hidden")
        kernel.change(freeze_follows_kernel, [model, kernel, freeze], [freeze], api_name="kernel_freeze",
                      show_progress="hidden")
        tree.change(tree_changed, [tree], [budget, objective], api_name="topology_options", show_progress="hidden")
        draft.change(draft_changed, [draft], [freeze], api_name="draft_options", show_progress="hidden")
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT, max_size=QUEUE_SIZE)
    return demo


demo = build_demo()  # what `gradio app.py` and a Space look for; building it runs no sampling


def launch(**kwargs):
    """Serve the app with its theme and styles (what `python app.py` and the Space do): each run's
    share of the CPUs first, then the warm-up, then the server."""
    # on a 2-core machine two concurrent runs of two threads each fight over the cores, and small tensors
    # gain nothing from intra-op threads (measured: 1.05 s against 7-9 s for the default click with
    # another process busy)
    torch.set_num_threads(max(1, cpu_budget() // CONCURRENCY_LIMIT))
    warm_up()
    return demo.launch(theme=THEME, css=CSS, **{"state_session_capacity": SESSIONS, **kwargs})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch()
