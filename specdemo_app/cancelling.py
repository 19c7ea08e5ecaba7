"""Stopping a session's runs between rounds: by its Stop button, by its page closing, by gradio
dropping its event (gradio_client's job.cancel(), a `cancels=` trigger), or by the seconds limit."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import gradio as gr
from gradio.context import LocalContext

from specdemo.limits import Cancel

RUNNING: dict[str, set[Cancel]] = {}  # session -> its runs' stop flags
RUNNING_LOCK = threading.Lock()


@contextmanager
def cancellable(request: gr.Request | None, seconds: float | None):
    """A run's stop flag: set by the Stop button and by closing the page (`stop`), by gradio's cancel
    of the event (`watched`), or `seconds` after the run started."""
    cancel = Cancel(seconds)
    session = getattr(request, "session_hash", None) or ""
    with RUNNING_LOCK:
        RUNNING.setdefault(session, set()).add(cancel)
    try:
        yield cancel
    finally:
        with RUNNING_LOCK:
            runs = RUNNING.get(session, set())
            runs.discard(cancel)
            if not runs:
                RUNNING.pop(session, None)


def stop(request: gr.Request):
    """Stop this session's runs between rounds (the Stop button, and a closed page)."""
    with RUNNING_LOCK:
        runs = list(RUNNING.get(getattr(request, "session_hash", None) or "", ()))
    for cancel in runs:
        cancel.cancel()


def event_alive() -> bool:
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
            if not event_alive():
                cancel.cancel()
            progress(fraction, desc=desc)
    return update
