"""The app's GPU tasks, kept to ZeroGPU's contract (the `spaces` package, spaces/zero/wrappers.py).

On ZeroGPU a function decorated with spaces.GPU runs in a forked worker process (which later calls may
reuse): its arguments go in and its result comes back by pickle, and the visitor's quota must cover the
duration it asks for before it starts. Elsewhere (no `spaces`, or a Space without ZeroGPU) the decorator
returns the function itself and it runs in the server's thread. So each task here:

- takes one picklable record (ClickTask, ExactnessTask) that names its models and holds no network: the
  worker finds them in loading's cache, inherited from the server, which loads a click's models before the
  task (and the embedded ones at start-up, on the device: loading.preload);
- asks for the seconds in its record (`seconds`, from the click's bounded work: seconds_for), not a fixed
  figure;
- is stopped through its record's Cancel, which pickles as a flag shared with the server's copy, and
  reports its progress on a ProgressBoard, which the server's watcher reads (cancelling.py);
- words its failures as the page's gr.Error inside the worker (refusals.page_error): ZeroGPU returns a
  gr.Error as it is, and any other exception by its class name alone.
"""

from __future__ import annotations

import functools
import os
import pickle
import struct
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specdemo.config import SamplerConfig
from specdemo.limits import Cancel, Limits
from specdemo.shared_bytes import SharedBytes

from .refusals import page_error

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .exactness import ExactnessReport
    from .runner import Comparison

try:  # on a Space: wraps a function for ZeroGPU, or returns it as it is where the Space has no ZeroGPU
    import spaces
except ImportError:  # anywhere else
    spaces = None

KEPT_TRAJECTORIES = 64  # trajectories whose rounds a session keeps (and the page and the export show)
SESSION_BYTES = 16_000_000  # ... and as many as fit in this (an image model's node states are large)
START_SECONDS = 8.0  # a task's start on ZeroGPU: forking the worker, CUDA, moving the models, capturing graphs
MARGIN = 1.5  # the multiple of a click's share of the time limit that it asks for
# planning a plan priced on the device (tree auto), in the task: at most 16 call sizes timed for 0.25 s each and
# a few of the driver's rounds per option (specdemo/planning/costs.py); 2.2 to 3.4 s on a 2-core CPU
PLANNING_SECONDS = 6.0
DECODE_SECONDS = 10.0  # decoding one round's committed path (at most runner.PATH_IMAGES images)


def seconds_for(rows: int, limits: Limits, repeats: float = 0.0, plans: bool = False) -> float:
    """The GPU seconds a task asks for: its start, its `repeats` seconds of timings, PLANNING_SECONDS where it
    `plans` (tree auto: a plan is priced on the device that runs it, inside the task), and MARGIN times its
    rows' share of the click's seconds limit (the Space's limits give a click limits.max_rows rows of this
    device in about limits.max_seconds: work.py), at most limits.max_seconds."""
    most = limits.max_seconds or 120.0
    start = START_SECONDS + repeats + (PLANNING_SECONDS if plans else 0.0)
    return round(min(most, start + MARGIN * most * rows / max(limits.max_rows, 1)), 1)


class ProgressBoard:
    """A task's last progress report, (share done, what is going on), written by the task in any process
    and read by the server (cancelling.py's watcher) through shared bytes."""

    TEXT = 400  # bytes of the description kept
    _HEAD = struct.Struct("<Idh")  # reports written, share done, description bytes

    def __init__(self):
        self._shared = SharedBytes(self._HEAD.size + self.TEXT)

    def post(self, fraction: float, desc: str) -> None:
        text = desc.encode()[: self.TEXT]
        view, (count, _, _) = self._shared.view, self._HEAD.unpack_from(self._shared.view)
        view[self._HEAD.size : self._HEAD.size + len(text)] = text
        self._HEAD.pack_into(view, 0, count + 1, fraction, len(text))

    def read(self) -> tuple[int, float, str]:
        """(reports written, the last one's share done, its description)."""
        count, fraction, size = self._HEAD.unpack_from(self._shared.view)
        text = bytes(self._shared.view[self._HEAD.size : self._HEAD.size + size])
        return count, fraction, text.decode(errors="ignore")


@dataclass(frozen=True)
class ClickTask:
    """A click's runs (runner.run_comparison), as they cross into the GPU worker."""

    config: SamplerConfig  # model and draft by name: the worker finds them loaded (loading.cached_target)
    limits: Limits
    cancel: Cancel
    board: ProgressBoard
    seconds: float  # GPU seconds asked for (seconds_for)


@dataclass(frozen=True)
class ExactnessTask:
    """An exactness test (exactness.exactness_check) as it crosses into the GPU worker."""

    config: SamplerConfig
    num_samples: int  # a group's
    limits: Limits
    cancel: Cancel
    board: ProgressBoard
    seconds: float


def _asked(task: ClickTask | ExactnessTask) -> float:
    return task.seconds


SERVER_PID = os.getpid()


def gpu_task(duration):
    """`fn` as a GPU task (spaces.GPU, asking for `duration`: seconds, or a callable of the arguments), that
    returns its result pickled, and words its failures as the page's gr.Error (refusals.page_error), both
    in the worker. Call it with call(task, ...).

    The result crosses as bytes because the worker's queue pickles with torch's multiprocessing reductions,
    which move a tensor's storage into shared memory in place: under the worker's other views of it (a
    sampler's reused buffers) that corrupts the worker's next call. A forked worker also computes on one
    CPU thread: GNU OpenMP, which torch's CPU kernels use, hangs in a child forked after the server ran a
    parallel region (its warm-up does), and the worker's work is the GPU's."""

    def wrap(fn):
        @functools.wraps(fn)
        def task(*args):
            if os.getpid() != SERVER_PID:
                import torch

                torch.set_num_threads(1)
            try:
                return pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as err:
                raise page_error(err, fn.__name__) from None

        return task if spaces is None else spaces.GPU(duration=duration)(task)

    return wrap


def call(task, *args):
    """A GPU task's result (gpu_task), unpickled."""
    return pickle.loads(task(*args))


def _run_arguments(task: ClickTask | ExactnessTask) -> dict:
    """What the app's runs take from a task: the target and draft network as the server loaded them for the
    click (the worker's copy of loading's cache; loaded here once where the worker was forked before the
    server loaded them), the progress board, the limits and the cancel."""
    from .cancelling import watched
    from .loading import load_for_visitors

    config = task.config
    return {
        "target": load_for_visitors(config.model),
        "draft_target": None if config.draft == "frozen" else load_for_visitors(config.draft),
        "progress": watched(task.board.post, task.cancel),
        "limits": task.limits,
        "cancel": task.cancel,
    }


@gpu_task(_asked)
def run_click(task: ClickTask) -> Comparison:
    """The click's runs, summarised as the session keeps them (KEPT_TRAJECTORIES, SESSION_BYTES), without
    the target's log density (the server's own target gives it back); for a latent model, with the path of
    the round the page opens on decoded here, on the run's device."""
    from specdemo import figures as F

    from .runner import run_comparison

    arguments = _run_arguments(task)
    comp = run_comparison(task.config, **arguments, traced=KEPT_TRAJECTORIES).summarised(
        KEPT_TRAJECTORIES, SESSION_BYTES
    )
    if comp.latent:
        trajectory, k = F.pick_round(comp.trace)
        comp.path_images(trajectory, k, decoder(arguments["target"], comp.config.device))
    return replace(comp, log_density=None)


@gpu_task(_asked)
def run_exactness(task: ExactnessTask) -> ExactnessReport:
    """The two-sample test of the chosen sampler against plain sampling (exactness.exactness_check)."""
    from .exactness import exactness_check

    return exactness_check(task.config, task.num_samples, **_run_arguments(task))


def decoder(target, device: str):
    """latents (an array) -> images for the committed-path view (runner.decode_for_display), on the GPU
    where the run may use one."""
    import torch

    from .runner import DISPLAY_SIZE, decode_for_display
    from .work import on_gpu

    where = torch.device("cuda" if on_gpu(device) else "cpu")
    return lambda latents: decode_for_display(target, latents, DISPLAY_SIZE["path"], where)


@gpu_task(DECODE_SECONDS)
def decode_path(model_name: str, device: str, latents: np.ndarray) -> torch.Tensor:
    """Decode a round's committed path the page has not shown yet, with the model as the run loaded
    it (loading.load_for_visitors: cached), on the GPU where there is one (ZeroGPU lends it here)."""
    from .loading import load_for_visitors

    return decoder(load_for_visitors(model_name), device)(latents)


ON_ZERO_GPU = hasattr(run_click, "zerogpu")  # spaces.GPU marks the functions it wraps for ZeroGPU


@dataclass
class GpuTime:
    """What a ZeroGPU task asked for and used (the seconds between asking and its result, as the quota
    counts them)."""

    asked: float
    used: float


def timed(task_fn, task):
    """The GPU task task_fn's result for `task` (call) and its GpuTime (None where the app is not on ZeroGPU)."""
    t0 = time.perf_counter()
    out = call(task_fn, task)
    return out, GpuTime(task.seconds, round(time.perf_counter() - t0, 2)) if ON_ZERO_GPU else None
