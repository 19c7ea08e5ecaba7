"""Stopping a session's runs between rounds: by its Stop button, by its page closing, by gradio
dropping its event (gradio_client's job.cancel(), a `cancels=` trigger), or by the seconds limit; and
counting the runs at a time by the work running, not by the queue's slots.

A dropped event is noticed by a watcher thread that looks every WATCH_SECONDS, whatever phase the run is
in (planning, sampling, decoding), and sets the run's flag, which each phase checks. The flag is shared
with the GPU task's copy of it, in the worker process on ZeroGPU (gpu.py); the same watcher relays the
task's progress from its board to the page.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import gradio as gr
from gradio.context import LocalContext

from specdemo.limits import Cancel

from .gpu import ProgressBoard

RUNS_AT_ONCE = 2  # runs at once (the queue's concurrency limit, and the work slots below); the queue holds the others
WATCH_SECONDS = 0.2  # how often a run's watcher looks whether gradio still runs its event
RUNNING: dict[str, set[Cancel]] = {}  # session -> its runs' stop flags
RUNNING_LOCK = threading.Lock()
# A cancelled event frees its queue slot at once while its thread finishes its round: the work slots are
# held until the work has stopped, so a cancel never lets more than RUNS_AT_ONCE runs compute together
WORK_SLOTS = threading.BoundedSemaphore(RUNS_AT_ONCE)
SHARED: set[int] = set()  # the runs (id of their flag) that another run computed beside, at some look


def runs_going() -> int:
    """Runs computing now (each holds a work slot)."""
    return RUNS_AT_ONCE - WORK_SLOTS._value


def was_shared(cancel: Cancel) -> bool:
    """Whether another run computed beside this one at some look of its watcher (its timings are noisier)."""
    return id(cancel) in SHARED


@contextmanager
def cancellable(request: gr.Request | None, seconds: float | None, progress: Callable | None = None):
    """A run's stop flag and progress board: the flag is set by the Stop button and by closing the page
    (`stop`), by gradio's cancel of the event (a watcher thread: event_alive), or `seconds` after the run
    started; the watcher relays the board's reports to `progress` (gr.Progress, in the event's context).
    The run holds one of the WORK_SLOTS until it returns."""
    cancel, board = Cancel(seconds), ProgressBoard()
    session = getattr(request, "session_hash", None) or ""
    event = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    relay = None
    if progress is not None:
        context = contextvars.copy_context()  # gr.Progress finds its event in the context it is called in
        relay = lambda fraction, desc: context.run(progress, fraction, desc=desc)
    with WORK_SLOTS:
        with RUNNING_LOCK:
            RUNNING.setdefault(session, set()).add(cancel)
        done = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(event, cancel, board, relay, done), daemon=True, name="specdemo-watch"
        )
        watcher.start()
        try:
            yield cancel, board
        finally:
            done.set()
            SHARED.discard(id(cancel))
            with RUNNING_LOCK:
                runs = RUNNING.get(session, set())
                runs.discard(cancel)
                if not runs:
                    RUNNING.pop(session, None)


def _watch(event, cancel: Cancel, board: ProgressBoard, relay: Callable | None, done: threading.Event) -> None:
    relayed = 0
    while not done.wait(WATCH_SECONDS):
        if runs_going() > 1:
            SHARED.add(id(cancel))
        if not cancel.cancelled and not event_alive(*event):
            cancel.cancel()
        count, fraction, desc = board.read()
        if relay is not None and count != relayed:
            relayed = count
            try:
                relay(fraction, desc)
            except Exception:  # a page gone meanwhile: the flag still matters, the bar no more
                relay = None


def stop(request: gr.Request):
    """Stop this session's runs between rounds (the Stop button, and a closed page)."""
    with RUNNING_LOCK:
        runs = list(RUNNING.get(getattr(request, "session_hash", None) or "", ()))
    for cancel in runs:
        cancel.cancel()


def event_alive(blocks, event_id) -> bool:
    """Whether gradio still runs the event `event_id` of `blocks`: a cancelled event (gradio_client's
    job.cancel(), a `cancels=` trigger) leaves the queue's active jobs while the worker thread runs on."""
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return True  # not inside a queued event (a direct call)
    return any(evt._id == event_id for job in queue.active_jobs if job for evt in job)


def watched(progress, cancel: Cancel, every: float = 0.1):
    """gr.Progress at most every `every` seconds (a round can take a millisecond), the end always; an
    update also stops at once a run whose flag is set."""
    last = [0.0]

    def update(fraction: float, desc: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every or fraction >= 1:
            last[0] = now
            cancel.check()
            progress(fraction, desc=desc)

    return update
