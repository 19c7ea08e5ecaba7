"""The /sample endpoint's signature: every setting optional.

/run's parameters are the page's controls, so an omitted one takes the control's value as the page
opens: the default model's. /sample (handlers.sample) takes every setting as None by default, and None
means the page's value for the model asked for: `client.predict(model="gm2d", api_name="/sample")` runs
what picking gm2d on the page and pressing Run does. gradio reads an endpoint's parameters, their types
and defaults from its function's signature, which is built here from the controls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import fields

import gradio as gr

from specdemo.config import SamplerConfig

from . import handlers
from .controls import control_names
from .settings import field_kind

FIELDS = {f.name: f for f in fields(SamplerConfig)}


def setting_names() -> tuple[str, ...]:
    """The settings /sample takes: the page's controls, model first."""
    return ("model", *(name for name in control_names() if name != "model"))


def sample_endpoint() -> Callable[..., dict]:
    """handlers.sample with the signature gradio reads: the request, then each setting, typed as its
    SamplerConfig field (text for the page's own, such as custom_model) and None by default."""
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
    sample.__doc__ = handlers.sample.__doc__
    return sample
