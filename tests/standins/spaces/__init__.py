"""A stand-in for Hugging Face's `spaces` package that keeps ZeroGPU's contract (spaces 0.51.x,
spaces/zero/wrappers.py), for the app's tests only: it is never shipped.

What `spaces.GPU` does on ZeroGPU, and this module does too:
- the duration is asked for before the task runs: a number of seconds, a timedelta, or a callable of the
  task's arguments; a duration over the visitor's quota is refused before any work (SPACES_STANDIN_QUOTA
  seconds, where a test sets it), in ZeroGPU's words;
- the task runs in a forked worker process, which later calls reuse while it lives; its arguments go in by
  pickle (an argument that does not pickle fails the call) and its result comes back by pickle;
- a gr.Error raised by the task reaches the caller as it is; any other exception reaches it as
  gr.Error("<its class name>", title="ZeroGPU worker error"), its traceback printed;
- a worker that dies mid-task gives gr.Error("GPU task aborted", title="ZeroGPU worker error").

Each call's duration is recorded in REQUESTS, and appended as a JSON line to the file SPACES_STANDIN_LOG
names (a served app's test reads it from its own process). What it does not do: attach a GPU, move
tensors to it, keep a quota over time, or relay gr.Progress and gr.Info from the worker (docs/space.md).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import pickle
import threading
import time
import traceback
from datetime import timedelta

import gradio as gr

__all__ = ["GPU", "REQUESTS"]

REQUESTS: list[dict] = []  # one record per call: the task's name and the seconds it asked for
_context = multiprocessing.get_context("fork")
_in_worker = False


def GPU(task=None, *, duration=None, size=None, **kwargs):
    """@spaces.GPU, @spaces.GPU(duration=...): `task` wrapped to run as ZeroGPU runs it."""
    if task is None or not callable(task):
        return functools.partial(_wrap, duration=task if duration is None and task is not None else duration)
    return _wrap(task, duration=duration)


def _seconds(duration, args, kwargs) -> float:
    if callable(duration):
        duration = duration(*args, **kwargs)
    if duration is None:
        return 60.0  # ZeroGPU's default
    if isinstance(duration, timedelta):
        return duration.total_seconds()
    return float(duration)


class _Worker:
    def __init__(self, task):
        self.args, self.results = _context.SimpleQueue(), _context.SimpleQueue()
        self.busy = False  # set while a call uses it (under the wrapper's lock)
        self.process = _context.Process(target=_serve, args=(task, self.args, self.results), daemon=True)
        self.process.start()

    def call(self, args, kwargs):
        try:
            self.args.put((args, kwargs))
        except Exception as err:  # ZeroGPU re-raises it as a PicklingError
            raise pickle.PicklingError(str(err)) from err
        while True:
            if not self.process.is_alive() and self.results.empty():
                raise gr.Error("GPU task aborted", title="ZeroGPU worker error", print_exception=False)
            if self.results._reader.poll(0.05):  # a SimpleQueue's pipe: wait while the worker lives
                return self.results.get()


def _serve(task, args_queue, results) -> None:
    global _in_worker
    _in_worker = True
    while True:
        args, kwargs = args_queue.get()
        try:
            outcome = ("ok", task(*args, **kwargs))
        except gr.Error as err:
            outcome = ("gradio", err)
        except Exception as err:
            outcome = ("other", (type(err).__name__, "".join(traceback.format_exception(err))))
        try:
            results.put(outcome)
        except Exception as err:  # the result does not pickle
            results.put(("other", (type(err).__name__, "".join(traceback.format_exception(err)))))


def _wrap(task, duration):
    workers: list[_Worker] = []
    lock = threading.Lock()

    @functools.wraps(task)
    def gradio_handler(*args, **kwargs):
        if _in_worker:
            return task(*args, **kwargs)
        seconds = _seconds(duration, args, kwargs)
        record = {"task": task.__name__, "seconds": seconds, "time": time.time()}
        REQUESTS.append(record)
        if path := os.environ.get("SPACES_STANDIN_LOG"):
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        quota = os.environ.get("SPACES_STANDIN_QUOTA")
        if quota is not None and seconds > float(quota):
            raise gr.Error(
                f"You have exceeded your ZeroGPU quota ({round(seconds)}s requested vs. {round(float(quota))}s left)",
                title="ZeroGPU quota exceeded",
                print_exception=False,
            )
        with lock:  # a free worker is reused; a busy or dead one is not
            workers[:] = [w for w in workers if w.process.is_alive()]
            worker = next((w for w in workers if not w.busy), None)
            if worker is None:
                worker = _Worker(task)
                workers.append(worker)
            worker.busy = True
        try:
            kind, value = worker.call(args, kwargs)
        finally:
            worker.busy = False
        if kind == "ok":
            return value
        if kind == "gradio":
            raise value
        name, text = value
        print(text)
        raise gr.Error(name, title="ZeroGPU worker error", print_exception=False)

    gradio_handler.zerogpu = None
    return gradio_handler
