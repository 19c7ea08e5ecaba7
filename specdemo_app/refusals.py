"""Every failure of an event as the page shows it: a gr.Error of one line, titled by what happened. The
server keeps serving. The GPU tasks (gpu.py) word their failures here too, inside ZeroGPU's worker: it
sends a gr.Error back as it is, and any other exception as its class name alone."""

from __future__ import annotations

import functools
import logging

import gradio as gr
import torch

from specdemo.errors import SettingError, SpecdemoError
from specdemo.limits import Cancelled

from .controls import control_label

log = logging.getLogger("specdemo.app")

MAX_MESSAGE = 600  # characters of an error message: no input is echoed back whole


def user_error(message: str, title: str) -> gr.Error:
    """The page's error for something the visitor can change: one line in the server's log, no
    traceback (gradio prints one for every gr.Error unless told not to)."""
    message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"
    log.info("%s: %s", title, message)
    return gr.Error(as_text(message), title=title, print_exception=False)


def as_text(message: str) -> str:
    """A message the page's pop-up shows as typed: it renders HTML, so no "<" may open a tag (a visitor's
    input is echoed in some refusals)."""
    return message.replace("<", "&lt;")


def setting_words(err: SettingError) -> str:
    """A refused setting in the page's words: its control's label, not the command line's option."""
    value = repr(err.value) if isinstance(err.value, str) else str(err.value)
    return f"{control_label(err.setting)}: {value[:80]} is not accepted here; accepted: {err.accepted}"


def page_error(err: Exception, where: str) -> gr.Error:
    """`err`, raised in the event or task `where`, as the page's gr.Error."""
    if isinstance(err, gr.Error):
        return err
    if isinstance(err, Cancelled):
        return user_error(str(err), "Stopped")
    if isinstance(err, SettingError):
        return user_error(setting_words(err), "Cannot run this")
    if isinstance(err, SpecdemoError):
        return user_error(str(err), "Cannot run this")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return user_error("out of memory: use fewer samples or a smaller tree", "Too large")
    # a bug: its traceback logged once, here; the page says what
    log.error("unexpected error in %s", where, exc_info=err)
    return gr.Error(
        as_text(f"unexpected error ({type(err).__name__}): {str(err)[:MAX_MESSAGE]}"),
        title="Something went wrong",
        print_exception=False,
    )


def readable_errors(fn):
    """Every failure of `fn` becomes the gr.Error the page shows (page_error)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            raise page_error(err, fn.__name__) from None

    return wrapper
