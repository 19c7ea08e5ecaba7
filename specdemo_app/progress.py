"""The progress bar's words for a click of several runs: the round, the samples done, the time left."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

Progress = Callable[[float, str], None]  # (share of the click done, what is going on)


class TimeLeft:
    """The seconds a click of several runs has left, for its progress bar. The run in progress:
    its measured pace (the share of its trajectories' steps done, per second), or before its first
    round its plan's expected seconds. A later run: its expected sequential target calls at the
    seconds per call measured so far (before any, the plan's expected seconds per expected call),
    where `later_calls` gives them (plain sampling: one per step and batch of slots), or None for
    "as many as the first run" (the chain at the same rows)."""

    def __init__(
        self, later_calls: Sequence[float | None], expected_s: float | None = None, expected_calls: float | None = None
    ):
        self.later_calls = later_calls
        self.expected_s = expected_s
        self.stage = -1
        self.started = time.perf_counter()
        self.seconds_per_call: float | None = (
            expected_s / expected_calls if expected_s is not None and expected_calls else None
        )
        self.first_calls: float | None = expected_calls  # the first run's calls, projected to its end

    def next_stage(self) -> None:
        self.stage += 1
        self.started = time.perf_counter()

    def seconds(self, done: float, calls: int | None) -> float | None:
        """Seconds left after this round of the current run (`done`: its share in [0, 1]; `calls`:
        its sequential target calls so far); None while nothing tells."""
        elapsed = time.perf_counter() - self.started
        if calls:
            self.seconds_per_call = elapsed / calls
            if self.stage == 0 and done > 0:
                self.first_calls = calls / done
        if done > 0:
            left = elapsed * (1 - done) / done
        elif self.stage == 0 and self.expected_s is not None:
            left = self.expected_s
        else:
            return None
        for calls_later in self.later_calls[self.stage :]:
            calls_later = self.first_calls if calls_later is None else calls_later
            if calls_later is None or self.seconds_per_call is None:
                return None
            left += calls_later * self.seconds_per_call
        return left


def time_left_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f" · about {max(1, math.ceil(seconds))} s left"
    return f" · about {seconds / 60:.0f} min left" if seconds < 5400 else f" · about {seconds / 3600:.1f} h left"


def stage_callback(progress: Progress | None, lo: float, hi: float, label: str, clock: TimeLeft):
    """The sampler's per-round callback for one run of a click, which fills [lo, hi] of the bar;
    starts the run's stage on `clock`. None where nobody listens."""
    clock.next_stage()
    if progress is None:
        return None

    def cb(info: dict) -> None:
        done = min(max(float(info["progress"]), 0.0), 1.0)
        detail = f"round {info['round']}, {info['finished']}/{info['num_samples']} samples done"
        detail += time_left_text(clock.seconds(done, info.get("target_calls")))
        progress(lo + (hi - lo) * done, f"{label}: {detail}")

    return cb
