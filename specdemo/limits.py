"""Work limits, checked before any work starts, and a run's cancellation.

A run's work is bounded by its target rows: a round evaluates at most rows_per_round rows (a fixed
tree's nodes, an auto plan's budget, one for plain sampling) and commits at least one step, so a
run evaluates at most  num_samples x steps x rows_per_round  rows, and a pilot (tree auto, freeze
auto)  pilot_samples x steps x (PILOT_DEPTH + 1)  rows per pilot run. `Limits` caps steps, samples
and that bound, and optionally the seconds a run may take (`Cancel` stops it between rounds).

The library's defaults are generous (a researcher's machine); the app reads stricter ones. Both can
be set through environment variables: SPECDEMO_MAX_STEPS, SPECDEMO_MAX_SAMPLES, SPECDEMO_MAX_ROWS,
SPECDEMO_MAX_SECONDS for the CLI and the Python API; the same names with SPECDEMO_APP_ for the app.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import SettingError, SpecdemoError, WorkLimitError
from .shared_bytes import SharedBytes


@dataclass(frozen=True)
class Limits:
    """What one run may ask for. max_seconds None: no time limit."""

    max_steps: int = 10_000
    max_samples: int = 100_000
    max_rows: int = 10_000_000_000
    max_seconds: float | None = None

    @classmethod
    def from_env(cls, prefix: str = "SPECDEMO_", **defaults) -> Limits:
        """These limits (or `defaults`), each overridden by the variable {prefix}MAX_STEPS etc."""
        limits = replace(cls(), **defaults)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = prefix + f.name.upper()
            text = os.environ.get(name)
            if text is None:
                continue
            try:
                value = float(text) if f.name == "max_seconds" else int(text)
            except ValueError:
                raise SpecdemoError(f"{name} must be a number, got {text[:40]!r}") from None
            if value <= 0:
                raise SpecdemoError(f"{name} must be positive, got {text[:40]!r}")
            values[f.name] = value
        return replace(limits, **values)

    def check(
        self,
        *,
        steps: int,
        num_samples: int,
        rows_per_round: int,
        pilot_runs: int = 0,
        pilot_samples: int = 0,
        pilot_rows_per_round: int = 0,
    ) -> None:
        """Refuse a run whose steps, samples or row bound (module docstring) is over a limit, saying
        what to lower."""
        if steps > self.max_steps:  # (a model refuses steps below 1, or beyond its schedule, itself)
            raise SettingError(
                "steps",
                steps,
                f"at most {self.max_steps}",
                f"--steps {steps} is over the limit of {self.max_steps} steps here",
            )
        if not 1 <= num_samples <= self.max_samples:
            raise SettingError(
                "num_samples",
                num_samples,
                f"1..{self.max_samples}",
                f"the number of samples must be in 1..{self.max_samples}, got {num_samples}",
            )
        run_rows = num_samples * steps * rows_per_round
        pilot = pilot_runs * pilot_samples * steps * pilot_rows_per_round
        if run_rows + pilot > self.max_rows:
            parts = f"{num_samples} samples x {steps} steps x {rows_per_round} rows a round"
            if pilot:
                parts += f", plus {pilot:,} for the pilot"
            raise WorkLimitError(
                run_rows + pilot,
                self.max_rows,
                f"this run could evaluate up to {run_rows + pilot:,} target rows ({parts}), over the limit of "
                f"{self.max_rows:,}; use fewer samples, fewer steps or a smaller tree or budget",
            )


class Cancelled(SpecdemoError):
    """A run stopped before its end: cancelled, or over its time limit."""


class Cancel:
    """A run's stop flag, which the sampling driver checks between rounds: `cancel()` from any
    thread, or `seconds` after it was made.

    Pickled, it travels to another process and stays the same flag (ZeroGPU runs the app's sampler in a
    forked worker, its arguments pickled: specdemo_app/gpu.py). The first pickling moves the flag into
    shared bytes (shared_bytes.py): `cancel()` on the original or on any copy is seen by all of them. A
    copy keeps the deadline (the time left when it was pickled); once the original has gone, a new copy is
    a flag of its own."""

    _lock = threading.Lock()

    def __init__(self, seconds: float | None = None):
        self._event = threading.Event()
        self.seconds = seconds
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._shared: SharedBytes | None = None  # made by the first pickling

    def __reduce__(self):
        with self._lock:
            if self._shared is None:
                shared = SharedBytes(1)
                shared.view[0] = self._event.is_set()
                self._shared = shared
        left = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
        return _attached, (self._shared, left, self.seconds)

    def cancel(self) -> None:
        self._event.set()
        if self._shared is not None:
            self._shared.view[0] = 1

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or (self._shared is not None and self._shared.view[0] == 1)

    def check(self) -> None:
        """Raise Cancelled when the run should stop."""
        if self.cancelled:
            raise Cancelled("the run was cancelled")
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise Cancelled(
                f"the run took longer than its limit of {self.seconds:g} s; use fewer samples, fewer "
                "steps or a smaller tree"
            )


def _attached(shared: SharedBytes, left: float | None, seconds: float | None) -> Cancel:
    """A pickled Cancel's copy: the original's flag and deadline."""
    cancel = Cancel(seconds)
    cancel._deadline = None if left is None else time.monotonic() + left
    cancel._shared = shared
    return cancel
