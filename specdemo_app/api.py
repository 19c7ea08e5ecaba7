"""The /sample endpoint's signature and description: every setting optional.

/run's parameters are the page's controls, so an omitted one takes the control's value as the page
opens: the default model's. /sample (handlers.sample) takes every setting as None by default, and None
means the page's value for the model asked for: `client.predict(model="gm2d", api_name="/sample")` runs
what picking gm2d on the page and pressing Run does. gradio reads an endpoint's parameters, their types
and defaults from its function's signature, which is built here from the controls, and the MCP server
(`launch(mcp_server=True)`) offers it as a tool, described by its docstring: written here from the
SamplerConfig fields' help, the page's choices and the page's values per model, so that it stays true
to the settings.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import fields

import gradio as gr

from specdemo.config import SamplerConfig

from . import handlers
from .controls import WIDGETS, control_names, first_shown
from .settings import DEFAULT, DEFAULT_MODEL, UI_DEFAULTS, field_kind, page_values

FIELDS = {f.name: f for f in fields(SamplerConfig)}

# the tool in a few sentences, for an agent: what it does, what it returns, how to start small
SUMMARY = (
    "Run exact speculative sampling on a diffusion model and compare it with plain sampling, at one seed.",
    "Draws num_samples samples with the chosen draft topology (a chain, a tree, or auto: trees planned per "
    "step) verified by the target model, with the plain target sampler and, for a tree or a plan, with the "
    "chain at the same target rows per round; every sample is an exact draw of the target sampler. Reports "
    "their costs (target calls, wall-clock, acceptance) in one object, with no figures.",
    "Every parameter is optional: one left out (or null) takes the value the page shows for the chosen model, "
    'so model="gm2d" alone runs what picking gm2d on the page and pressing Run does.',
    'A quick first call: model="gm2d", steps=12, num_samples=8, tree="2,1". A setting the server refuses '
    "comes back as an error naming the setting and what it accepts.",
)
# what the returned object holds, by key (one line in the docstring: gradio joins its lines with commas)
RETURNS = (
    "headline: markdown text comparing the chosen sampler with plain sampling (and with the chain at the "
    "same target rows per round): target calls per sample, speedup, wall-clock, acceptance, the seed",
    "plan: markdown, one line on the topology that ran (a fixed tree, or the trees planned along the steps)",
    "runs: a list of one summary per run (two or three), plain target sampling first and the chosen run last, "
    "each with label, tree, verifier, rows_per_round, method, steps, num_samples, target_calls, "
    "target_calls_per_sample, target_rows, draft_calls, rounds, speedup, acceptance, acceptance_per_depth, "
    "wall_s and the wall-clock's parts",
    "seed: the seed the runs used (an integer)",
    "gpu: on a ZeroGPU Space, the GPU seconds asked for and used (asked_s, used_s); null elsewhere",
)
# the page's own settings (no SamplerConfig field), and the model, which is the page's choice rather
# than the library's model spec (a custom one is read from custom_model)
PAGE_HELP = {
    "model": 'the target model, as the page offers it; "custom" runs the Hub id or folder given as custom_model',
    "custom_model": 'with model="custom": the Hub id (org/name) or diffusers folder to run, such as '
    "google/ddpm-cifar10-32 (only the models this server opens to visitors load)",
}
DEFAULT_CLAUSE = re.compile(r"\s*\(default\b[^()]*\)$")  # a help text's closing "(default: ...)"
CLI_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")  # a help text's command-line option, such as --tree


def setting_names() -> tuple[str, ...]:
    """The settings /sample takes: the page's controls, model first."""
    return ("model", *(name for name in control_names() if name != "model"))


def offered(name: str) -> list[str]:
    """The values the page's control for `name` offers, as the page opens: none for text, numbers and a list
    open to other values (the draft); the page's "default" left out (an omitted setting leaves it so)."""
    own = (WIDGETS.get(name) or (None, {}))[1]
    if own.get("allow_custom_value"):
        return []
    choices = (
        first_shown(page_values()).get(name, {}).get("choices")
        or own.get("choices")
        or (FIELDS[name].metadata.get("choices") if name in FIELDS else None)
        or ()
    )
    values = [c[1] if isinstance(c, tuple) else c for c in choices]
    return [str(v) for v in values if v != DEFAULT]


def omitted(name: str) -> str:
    """What an omitted setting runs, in words: the page's value for each model it lists; "" where the page
    leaves the setting to the model or the library ("default", or blank: what the field's help says)."""
    if name == "model":
        return DEFAULT_MODEL
    values = list(dict.fromkeys(page_values(model)[name] for model in UI_DEFAULTS))
    if all(v in (DEFAULT, "") for v in values):
        return ""
    if len(values) == 1:
        return str(values[0])
    if all(isinstance(v, (int, float)) for v in values):
        values.sort()
    words = [str(v) for v in values]
    return f"the page's value for the model: {', '.join(words[:-1])} or {words[-1]}"


def describe(name: str) -> str:
    """One line on setting `name` for an agent: its field's help (the command line's options named as the
    parameters), the values the page offers, and what an omitted one runs."""
    field_help = FIELDS[name].metadata.get("help", "") if name in FIELDS else ""  # a field added since import
    text = PAGE_HELP.get(name) or CLI_FLAG.sub(lambda m: m[1].replace("-", "_"), field_help) or name.replace("_", " ")
    text = " ".join(text.split())
    clause = DEFAULT_CLAUSE.search(text)
    core, default = (text[: clause.start()], clause[0].strip()) if clause else (text, "")
    if choices := offered(name):
        core += f"; one of: {', '.join(choices)}"
    if page := omitted(name):
        default = f"(omitted: {page})"
    return f"{core} {default}".strip()


def docstring(names: tuple[str, ...]) -> str:
    """The tool's docstring in the form gradio reads for an MCP tool (gradio.utils.get_function_description):
    the description, then `Args:` with one `name: description` line per parameter, then `Returns:`, whose
    line gradio adds to the tool's description."""
    args = [f"    {name}: {describe(name)}" for name in names]
    returns = f"    an object with {len(RETURNS)} keys. " + "; ".join(RETURNS)
    return "\n".join([*SUMMARY, "", "Args:", *args, "", "Returns:", returns])


def sample_endpoint() -> Callable[..., dict]:
    """handlers.sample with the signature gradio reads: the request, then each setting, typed as its
    SamplerConfig field (text for the page's own, such as custom_model) and None by default; described for
    API callers and agents by `docstring`."""
    names = setting_names()

    def sample(request: gr.Request | None, *values) -> dict:
        return handlers.sample(request, **dict(zip(names, values, strict=True)))

    parameters = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request | None)]
    parameters += [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=(field_kind(FIELDS[name]) if name in FIELDS else str) | None,
        )
        for name in names
    ]
    sample.__signature__ = inspect.Signature(parameters, return_annotation=dict)  # type: ignore[attr-defined]
    sample.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": dict}
    sample.__doc__ = docstring(names)
    return sample
