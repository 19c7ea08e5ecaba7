"""The page's controls: one per SamplerConfig field the page offers, placed by LAYOUT.

A field's control comes from the field: its value from the page's defaults (settings.page_values),
its kind from the field's type and choices (a Dropdown for choices, a Checkbox for a bool, a Number
for a number, a Textbox for text and for a number left to the default, which is blank), its help as
its info. WIDGETS holds the page's own words, choices and ranges where they differ. A field that is
neither in LAYOUT nor in NOT_OFFERED is placed in the "advanced" group, so that a new setting appears
on the page and in the /run endpoint (whose inputs are the controls, by name) with no change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import gradio as gr
from gradio import component_meta

from specdemo.config import KERNEL_NAMES, SamplerConfig

from .loading import hub_allowed, hub_offline
from .settings import (
    CLASS_MODELS,
    CUSTOM,
    DEFAULT,
    DEFAULT_KERNEL,
    DRAFT_CHOICES,
    FREEZE_CHOICES,
    IMAGE_MODELS,
    MODEL_CHOICES,
    OBJECTIVE_CHOICES,
    PILOT_SAMPLES,
    VERIFIER_CHOICES,
    field_kind,
    model_kernel,
    text_model,
)
from .topology_text import is_auto
from .work import GPU_SCALE, MAX_SAMPLES, step_limit

API_MAX_SAMPLES = max(MAX_SAMPLES.values()) * GPU_SCALE  # the most samples any model takes on any device


@contextmanager
def _no_stub_files():
    """gradio writes a .pyi file beside the module of every component subclass it sees defined (for its
    custom-component tooling): into the source tree, or site-packages, at import. These subclasses keep
    their parent's interface, so the stub is skipped while they are defined."""
    write = component_meta.create_or_modify_pyi
    component_meta.create_or_modify_pyi = lambda *args: None
    try:
        yield
    finally:
        component_meta.create_or_modify_pyi = write


with _no_stub_files():

    class RawNumber(gr.Number):
        """A number box that hands its value on as sent. gradio's own compares it with its bounds first, so
        text sent through the API fails there with a generic error; the handlers check every value
        (settings.read_field) and name the control in their refusal. The page draws it as a Number. A
        subclass, not an override on the instance: a session's updated copy of a control is built from its
        class."""

        is_template = True  # gradio draws a template with its parent's frontend

        def preprocess(self, payload):
            return payload

    class RawSlider(gr.Slider):
        """A slider that hands its value on as sent (as RawNumber)."""

        is_template = True

        def preprocess(self, payload):
            return payload


# the page's groups, top to bottom, and their controls in order; a tuple is a row of controls
PROMPT_FIELDS = ("prompt", "negative_prompt", "guidance_scale")  # text-to-image models only: model_shows
LAYOUT: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "model": ("model", "custom_model", "class_label"),
    "prompt": PROMPT_FIELDS,
    "draft": ("draft", "freeze", "draft_bias"),
    "topology": ("tree",),
    "plan": ("budget", "objective", "verifier"),
    "sampler": ("kernel", ("steps", "seed"), "eta", "churn", "num_samples", "device"),
}
ADVANCED = "advanced"
# the fields the page sets itself or cannot offer, and why
NOT_OFFERED = {
    "method": "follows from the topology: a chain where every width is 1, else a tree",
    "prefetch": "left to the library (specdemo.resolve), which sets it for the topology",
    "pilot_samples": "kept small on a shared machine (settings.PILOT_SAMPLES)",
    "gamma": "each Langevin density keeps its own step size",
    "prediction": "what an analytic mixture's network predicts: a setting for the library's tests",
    "max_batch": "every sample of a click runs at once (the samples limit bounds them)",
    "cache_dir": "the server's plan cache is its owner's",
    "replan": "the server's plan cache is its owner's",
    "pilot": "plans are learnt from the runs themselves; pilot runs are for the library and the command line",
    "start": "the frozen draft starts cold (no warm-up call); warm is the authors' accounting, for benchmarks",
    "launch": "the server's GPU runs its networks the fastest way measured (auto)",
}


def field_metadata(name: str) -> Mapping[str, Any]:
    """A SamplerConfig field's help and accepted values."""
    return next(f.metadata for f in fields(SamplerConfig) if f.name == name)


def span(name: str) -> dict:
    """A slider's minimum and maximum: its field's slider span, else its accepted range."""
    lo, hi = field_metadata(name).get("slider") or field_metadata(name)["range"]
    return dict(minimum=lo, maximum=hi)


# where the page's control differs from what its field alone gives: its kind and keyword arguments
# (each control's elem_id is its name, dashed, unless given here)
WIDGETS: dict[str, tuple[type, dict]] = {
    "model": (
        gr.Dropdown,
        dict(
            choices=MODEL_CHOICES,
            label="target model",
            info="the Hub is offline here: Hub models run where this server holds them"
            if hub_offline()
            else "Hub models are downloaded when first run (their size in the label)",
        ),
    ),
    "custom_model": (gr.Textbox, dict(label="Hub id or local diffusers folder", placeholder="google/ddpm-cifar10-32")),
    # numbers pass as typed (precision None: gradio would round 2.5 to 2); a whole number is checked by the field
    "class_label": (RawNumber, dict(precision=None, step=1)),
    "prompt": (
        gr.Textbox,
        dict(
            lines=2, max_lines=4, placeholder="a watercolour lighthouse at dawn", info=field_metadata("prompt")["help"]
        ),
    ),
    "negative_prompt": (
        gr.Textbox,
        dict(
            label="negative prompt",
            max_lines=2,
            placeholder="blurry, low quality",
            info=field_metadata("negative_prompt")["help"],
        ),
    ),
    "draft": (
        gr.Dropdown,
        dict(
            choices=DRAFT_CHOICES,
            label="draft",
            allow_custom_value=True,
            info="or a draft network's folder or Hub id (same noise schedule)",
        ),
    ),
    "freeze": (
        gr.Radio,
        dict(choices=FREEZE_CHOICES, label="freeze", info="what the draft keeps from the last target call"),
    ),
    "draft_bias": (
        RawSlider,
        dict(**span("draft_bias"), step=0.1, label="draft bias", info=field_metadata("draft_bias")["help"]),
    ),
    "tree": (
        gr.Textbox,
        dict(
            label="topology",
            elem_id="topology",
            max_lines=1,
            info="auto, or widths per depth such as 3,2,1, 4x4, 1x5 (Enter runs it)",
        ),
    ),
    "budget": (
        RawSlider,
        dict(
            **span("budget"),
            step=1,
            label="rows per round (auto)",
            info=f"target rows a round may use; widths planned per step from the deltas of "
            f"the first {PILOT_SAMPLES} trajectories run with these settings",
        ),
    ),
    "objective": (gr.Radio, dict(choices=OBJECTIVE_CHOICES, label="the plan minimises (auto)")),
    "verifier": (gr.Dropdown, dict(choices=VERIFIER_CHOICES, label="verifier")),
    "kernel": (gr.Dropdown, dict(label="kernel")),  # the model's own kernels: kernel_choices
    "steps": (RawNumber, dict(precision=None, step=1, label="steps", min_width=100, minimum=1)),
    "seed": (RawNumber, dict(precision=None, step=1, label="seed", min_width=100)),
    "eta": (RawSlider, dict(**span("eta"), step=0.05, label="eta (DDIM)", info=field_metadata("eta")["help"])),
    "churn": (RawSlider, dict(**span("churn"), step=0.01, label="churn (flow matching)")),
    "num_samples": (RawSlider, dict(minimum=1, step=1, label="samples")),
    "device": (gr.Radio, dict(choices=list(field_metadata("device")["choices"]), label="device")),
}


def kernel_choices(kernels) -> list[tuple[str, str]]:
    """The kernel control's choices: the model's default, then `kernels`."""
    return [DEFAULT_KERNEL, *[(k, k) for k in kernels]]


# What the controls show beyond their values, following the model, the kernel, the topology and the
# draft: the page's first state, and the updates when one of them changes (handlers.py).
def offered_models() -> list[tuple[str, str]]:
    """The model choices: the listed Hub models only where the Space's list opens them."""
    return [(label, value) for label, value in MODEL_CHOICES if "/" not in value or hub_allowed(value)]


def model_shows(model: str) -> dict[str, dict]:
    image, text = model in IMAGE_MODELS, text_model(model)
    return {
        "custom_model": dict(visible=model == CUSTOM),
        "class_label": dict(
            visible=model in CLASS_MODELS,
            label="class label (the digit to draw)" if model == "digits" else "class label",
        ),
        "num_samples": dict(maximum=MAX_SAMPLES["image" if image else "other"]),
        **{name: dict(visible=text) for name in PROMPT_FIELDS},
    }


def kernel_shows(model: str, kernel: str) -> dict[str, dict]:
    k = model_kernel(model, kernel)
    return {"eta": dict(visible=k == "ddim"), "churn": dict(visible=k == "flow-churn")}


def topology_shows(tree: str) -> dict[str, dict]:
    """The rows-per-round budget and the plan's objective are settings of the auto topology only."""
    return {"budget": dict(visible=is_auto(tree)), "objective": dict(visible=is_auto(tree))}


def draft_shows(draft: str) -> dict[str, dict]:
    """What to freeze is a setting of the frozen draft only."""
    return {"freeze": dict(visible=(draft or "frozen").strip() == "frozen")}


def first_shown(values: dict) -> dict[str, dict]:
    """What every control shows as the page opens with `values`. Until the page has loaded, the kernel
    control offers every kernel (the model's own need the model loaded: handlers.offered_kernels), and the
    samples control spans what any model takes (API_MAX_SAMPLES), so that an API call of another model's page
    defaults is not refused by the control's range; the page narrows it to the model's (handlers.samples_range)."""
    return {
        **model_shows(values["model"]),
        **kernel_shows(values["model"], values["kernel"]),
        **topology_shows(values["tree"]),
        **draft_shows(values["draft"]),
        "kernel": dict(choices=kernel_choices(KERNEL_NAMES)),
        "steps": dict(maximum=step_limit()),
        "model": dict(choices=offered_models()),
        "num_samples": dict(maximum=API_MAX_SAMPLES),
    }


def laid_out() -> tuple[str, ...]:
    """The controls LAYOUT places, in the page's order."""
    return tuple(n for row in LAYOUT.values() for item in row for n in (item if isinstance(item, tuple) else (item,)))


def advanced_fields() -> tuple[str, ...]:
    """The fields the page places in no group of LAYOUT and does not leave out: new settings."""
    return tuple(f.name for f in fields(SamplerConfig) if f.name not in laid_out() and f.name not in NOT_OFFERED)


def control_label(name: str) -> str:
    """The page's name for setting `name`: its control's label (the field's name in words where the page sets
    it itself)."""
    own = (WIDGETS.get(name) or (None, {}))[1]
    return own.get("label", name.replace("_", " "))


def control_names() -> tuple[str, ...]:
    """Every control, in the page's order: the settings the Run button sends (by these names)."""
    return laid_out() + advanced_fields()


def field_widget(name: str) -> tuple[type, dict]:
    """A field's control from the field alone: its kind from its type and choices, its help as info."""
    f = next(f for f in fields(SamplerConfig) if f.name == name)
    kind, choices, info = field_kind(f), f.metadata.get("choices"), f.metadata["help"]
    left_to_default = f.default is None
    if choices:
        return gr.Dropdown, dict(
            choices=([(DEFAULT, DEFAULT)] if left_to_default else []) + [(c, c) for c in choices], info=info
        )
    if kind is bool:
        return gr.Checkbox, dict(info=info)
    if kind in (int, float) and not left_to_default:
        return RawNumber, dict(precision=None, step=1 if kind is int else None, info=info)  # read_field checks it
    return gr.Textbox, dict(max_lines=1, info=info + ("; blank: the default" if left_to_default else ""))


def control(name: str, value, shown: dict) -> gr.components.Component:
    """The control of setting `name` at `value`, showing `shown` (first_shown's entry for it)."""
    kind, own = WIDGETS.get(name) or field_widget(name)
    props = {"label": name.replace("_", " "), "elem_id": name.replace("_", "-"), **own, **shown}
    return kind(value=value, **props)


def place(group: str, values: dict) -> dict[str, Any]:
    """The controls of a group (a LAYOUT key, or ADVANCED) in the current gradio layout, by name (typed Any:
    gradio's metaclass makes their events, .change and .submit, which a type checker does not see)."""
    items = advanced_fields() if group == ADVANCED else LAYOUT[group]
    shown = first_shown(values)
    out = {}
    for item in items:
        if isinstance(item, tuple):
            with gr.Row():
                out.update({name: control(name, values[name], shown.get(name, {})) for name in item})
        else:
            out[item] = control(item, values[item], shown.get(item, {}))
    return out
