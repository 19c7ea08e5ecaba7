"""The page's settings: what its choices offer, its defaults per model, and the controls' values read
into a SamplerConfig under the Space's policy.

The page sends one value per control, by name: a SamplerConfig field's (controls.py builds the
control from the field), or custom_model, the Hub id or folder read when the model choice is
"custom". A field's value is read by the field's type (read_field), so a new field needs nothing
here; make_config adds the page's own rules (the model and draft a visitor may load, the topology,
what to freeze) and sets three fields itself: method (from the topology), prefetch (left to the library,
which sets it for the topology) and pilot_samples (PILOT_SAMPLES). Every rule between settings is the
library's (specdemo.resolve), checked when the click is (runner.check_click).
"""

from __future__ import annotations

import math
from dataclasses import Field, fields, replace
from typing import TYPE_CHECKING

from specdemo.config import PRESET_NAMES, SamplerConfig, field_type
from specdemo.errors import SpecdemoError
from specdemo.resolve import method_of
from specdemo.trees import Topology

from .curated import CURATED, curated
from .loading import allowed_model, load_for_visitors
from .topology_text import is_auto
from .work import click_limits

if TYPE_CHECKING:
    from specdemo import Target
    from specdemo.limits import Limits

DEFAULT = "default"  # a choice that leaves a setting to the model or the library (the field's None)
CUSTOM = "custom"  # the model choice that reads the custom_model box
MODEL_CHOICES = [
    ("digits · embedded 16×16 UNet", "digits"),
    ("gm2d · 2-D Gaussian mixture", "gm2d"),
    ("banana · 2-D density, Langevin", "banana"),
    ("ring · 2-D density, Langevin", "ring"),
    ("gm16 · 16-D Gaussian mixture", "gm16"),
    ("gm512 · 512-D benchmark (flow)", "gm512"),
    *[(c.label, c.repo) for c in CURATED],  # real Hub models (curated.py), downloaded when picked
    ("Hub id or local folder…", CUSTOM),
]
MODEL_VALUES = [v for _, v in MODEL_CHOICES]
CLASS_MODELS = ("digits", CUSTOM)  # which may have classes: the class label control
IMAGE_MODELS = ("digits", CUSTOM, *[c.repo for c in CURATED])  # whose samples are images: fewer a click
DEFAULT_MODEL = "digits"  # the embedded digits UNet (class-conditional, 16x16), shipped inside the package
DEFAULT_CLASS = 3  # the digit the first click draws
CHURN = 0.06  # the churn control's value (the library's churn where a model sets none)
PILOT_SAMPLES = 8  # trajectories of the pilot run that plans an auto topology (or freeze auto): kept small
BUDGET_RANGE = next(f.metadata["slider"] for f in fields(SamplerConfig) if f.name == "budget")  # rows per round
# an auto topology may plan with here: the span its control offers
EXACTNESS_SAMPLES = 1000  # samples per group of the two-sample test, as the page opens

# What the controls switch to when a model is picked: the first click must be quick and telling.
# The topology "auto" plans every step for the least expected wall-clock on this machine (a call's
# cost by its rows is measured once, then cached with the plan), with the settings that
# docs/benchmarks.md's latency section found fastest (freeze auto, 16 rows, the verifier planned:
# block or RMC). Measured on a 2-core CPU with one thread per run (as here, two runs at a time), with
# block verification then: the digits model at 100 steps is 1.8x faster than plain sampling for one
# sample and 1.4x for two; a batch of four gains nothing on a CPU, where a call's cost grows with its
# rows (the plan then samples plainly).
UI_DEFAULTS = {
    "digits": dict(steps=100, num_samples=1, tree="auto", budget=16, freeze="auto", draft="frozen"),
    "gm2d": dict(steps=100, num_samples=256, tree="auto", budget=16, freeze="x0", draft="frozen"),
    "banana": dict(steps=200, num_samples=256, tree="auto", budget=16, freeze="out", draft="frozen"),
    "ring": dict(steps=200, num_samples=256, tree="auto", budget=16, freeze="out", draft="frozen"),
    "gm16": dict(steps=100, num_samples=256, tree="auto", budget=16, freeze="x0", draft="frozen"),
    "gm512": dict(steps=30, num_samples=64, tree="auto", budget=16, freeze="x0", draft="frozen"),
    CUSTOM: dict(steps=50, num_samples=8, tree="auto", budget=16, freeze="x0", draft="frozen"),
    # the Hub models: one sample at their usual steps, with their paired draft network where they have one
    **{
        c.repo: dict(steps=c.steps, num_samples=1, tree="auto", budget=8, freeze="x0", draft=c.draft or "frozen")
        for c in CURATED
    },
}

# The topology is typed (what is typed is what runs); these presets fill the box with one click.
TREE_PRESETS = [
    ("auto", "auto: planned per step"),
    ("3,2,1", "3,2,1: tree, 10 rows per round"),
    ("2,2,1", "2,2,1: small tree"),
    ("2x3", "2x3: binary tree, depth 3"),
    ("3x3", "3x3: wide tree, depth 3"),
    ("2,2,2,1,1", "2,2,2,1,1: branches, then a chain"),
    ("1x5", "1x5: chain of 5"),
    ("1x10", "1x10: chain of 10"),
]
VERIFIER_CHOICES = [
    ("default: auto (block or RMC) for topology auto, D-GRS for trees, RMC for chains", DEFAULT),
    ("D-GRS (greedy rejection)", "dgrs"),
    ("rank-aware", "rank"),
    ("RMC (chains only)", "rmc"),
    ("block verification (whole chains and trees)", "block"),
    ("auto: block or RMC, whichever plan is expected faster (tree auto only)", "auto"),
]
OBJECTIVE_CHOICES = [("wall-clock (measured here)", "time"), ("target calls", "calls")]
DEFAULT_KERNEL = ("the model's default", DEFAULT)  # the kernel choice before the model's own kernels
DRAFT_CHOICES = [
    ("frozen target (training-free)", "frozen"),
    ("draft network: digits-draft", "digits-draft"),
    ("draft network: digits-draft-distilled (learns the target's outputs)", "digits-draft-distilled"),
    *[
        (f"draft network: {c.name} (for {', '.join(m.name for m in CURATED if m.draft == c.repo)}, {c.size})", c.repo)
        for c in CURATED
        if any(m.draft == c.repo for m in CURATED)
    ],
]
FREEZE_CHOICES = [
    ("network output", "out"),
    ("x0-hat", "x0"),
    ("x0-hat extrapolated in time", "x0-linear"),
    ("x0-hat of a fitted Gaussian", "gaussian"),
    ("auto (per step where planned)", "auto"),
    ("the target's residual (a draft network)", "residual"),
]


def model_kernel(model: str, kernel: str | None) -> str:
    """The kernel a run of `model` uses: the chosen one, else the preset's or listed model's default
    (DDPM for the other image models)."""
    if kernel and kernel != DEFAULT:
        return kernel
    if (entry := curated(model)) is not None:
        return entry.kernels[0]
    if model not in PRESET_NAMES:
        return "ddpm"
    from specdemo import PRESETS  # the analytic targets, imported when a preset is asked about

    return PRESETS[model].defaults.get("kernel", "ddpm")


def text_model(model: str) -> bool:
    """Whether the page shows the prompt controls for a model choice: a listed text-to-image model,
    or a custom one (which may be; a model without text ignores them)."""
    entry = curated(model)
    return entry.text if entry else model == CUSTOM


def has_denoised(model: str, kernel: str | None) -> bool:
    """Whether the kernel has a denoised estimate x0-hat to freeze (every kernel but Langevin)."""
    return model_kernel(model, kernel) != "langevin"


def field_kind(f: Field) -> type:
    """A SamplerConfig field's type, None left out of an optional one (int | None: int)."""
    return field_type(SamplerConfig, f)


def page_values(model: str = DEFAULT_MODEL) -> dict:
    """Every control's value as the page opens on `model`: the page's defaults for the model over the
    fields' own (a field left to the model or the library, None, shows as DEFAULT among choices and
    blank elsewhere)."""
    values = {
        f.name: (DEFAULT if f.metadata.get("choices") else "") if f.default is None else f.default
        for f in fields(SamplerConfig)
    }
    return {
        **values,
        "model": model,
        "custom_model": "",
        "class_label": DEFAULT_CLASS,
        "churn": CHURN,
        **UI_DEFAULTS[model],
    }


def whole(value, what: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecdemoError(f"{what} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise SpecdemoError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def finite(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecdemoError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise SpecdemoError(f"{what} must be a finite number, got {value!r}")
    return number


def read_field(f: Field, value):
    """A control's value as its field's: blank (or DEFAULT) is the field's default; a whole number for
    an int field, a finite one for a float field; text stripped. Refusals name the field by its
    control's label, as the page shows it."""
    from .controls import control_label  # controls lays out the choices defined here

    blank = isinstance(value, str) and (not value.strip() or (value == DEFAULT and f.metadata.get("choices")))
    if value is None or blank:
        return f.default
    kind, option = field_kind(f), control_label(f.name)
    if kind is bool:
        return bool(value)
    if kind is int:
        return whole(value, option)
    if kind is float:
        return finite(value, option)
    return str(value).strip()


def make_config(settings: dict) -> tuple[SamplerConfig, Target, Target | None, Limits]:  # noqa: C901, PLR0912 (issue 56 splits it)
    """The controls' values (by name) as a SamplerConfig, the resolved target and draft network (None
    for the frozen draft), both loaded under the Space's policy (loading.py), and the click's limits
    (work.click_limits; the library checks the rest of them before any work). What can be refused
    without a model is refused before one loads."""
    s = dict(settings)
    model, custom = s.pop("model", DEFAULT_MODEL), s.pop("custom_model", "")
    if model not in MODEL_VALUES:
        raise SpecdemoError(f"unknown model choice {model!r}; accepted: {', '.join(MODEL_VALUES)}")
    spec = str(custom or "").strip() if model == CUSTOM else model
    if not spec:
        raise SpecdemoError("type a Hub id (org/name) or a local diffusers folder in the custom model field")
    draft = str(s.pop("draft", None) or "frozen").strip()
    allowed_model(spec)
    allowed_model(draft, "draft")
    tree, budget = str(s.pop("tree", None) or "").strip(), s.pop("budget", None)
    if not tree:
        raise SpecdemoError("no topology given; accepted: auto, or widths such as 3,2,1, KxL or 1xL")
    if is_auto(tree):
        tree = "auto"
        budget = UI_DEFAULTS[CUSTOM]["budget"] if budget in (None, "") else whole(budget, "the rows per round")
        if not BUDGET_RANGE[0] <= budget <= BUDGET_RANGE[1]:
            raise SpecdemoError(
                f"the rows per round of an auto topology must be in {BUDGET_RANGE[0]}..{BUDGET_RANGE[1]}, got {budget}"
            )
    elif not Topology.parse(tree).widths:  # malformed widths: a readable refusal before any model loads
        raise SpecdemoError("the topology needs at least one level, such as 1x5 or 3,2,1")
    else:
        budget = None
    freeze = str(s.pop("freeze", None) or "out").strip()
    if freeze not in [v for _, v in FREEZE_CHOICES]:
        raise SpecdemoError(f"unknown freeze {freeze!r}; accepted: {', '.join(v for _, v in FREEZE_CHOICES)}")
    if draft != "frozen" and freeze != "residual":
        # the page hides what to freeze for a draft network: it drafts as it is (the per-step choice, freeze auto,
        # needs pilots of five drafts, more than a click's baselines account for; the library and the CLI offer it)
        freeze = "out"
    kernel = s.get("kernel")
    churn = s.pop("churn", None)
    by_name = {f.name: f for f in fields(SamplerConfig)}
    unknown = set(s) - set(by_name)
    if unknown:
        raise SpecdemoError(f"unknown settings {sorted(unknown)}")
    values = {name: read_field(by_name[name], value) for name, value in s.items()}
    config = SamplerConfig(
        **{
            **values,
            "model": spec,
            "draft": draft,
            "tree": tree,
            "budget": budget,
            "freeze": freeze,
            "churn": read_field(by_name["churn"], churn) if model_kernel(model, kernel) == "flow-churn" else None,
            "method": method_of(tree).value,
            "prefetch": None,
            "pilot_samples": PILOT_SAMPLES,
        }
    )
    config.validate()  # names, finite numbers and the seed's range, before any model loads
    target = load_for_visitors(spec)
    draft_target = None if draft == "frozen" else load_for_visitors(draft)
    if not target.text_conditioned:  # the prompt controls are hidden (or a custom model has no text)
        config = replace(config, prompt="", negative_prompt="", guidance_scale=None)
    limits = click_limits(target, config.device, config.guidance_scale)
    if not 1 <= config.num_samples <= limits.max_samples:
        raise SpecdemoError(f"the number of samples must be in 1..{limits.max_samples} here, got {config.num_samples}")
    if not target.num_classes:  # the class label control is hidden for a model without classes
        config = replace(config, class_label=None)
    return config, target, draft_target, limits
