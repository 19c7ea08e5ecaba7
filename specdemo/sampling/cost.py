"""The cost accounting of algorithms.md section 4: calls and rows next to wall-clock, per phase.

Every speedup the library reports is defined here, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch


def time_speedup(wall_s: float, plain_wall_s: float) -> float:
    """How many times less wall-clock a run took than plain sampling measured side by side: the one
    definition, for Cost objects (Cost.time_speedup_over) and for runs saved as numbers (summaries, the
    CLI's JSON)."""
    return plain_wall_s / wall_s


@dataclass
class Cost:
    """Cost of one run of B trajectories.

    target_calls counts sequential batched calls (the batch moves at its slowest member's pace; with
    several processes side by side, the slowest process's), total_target_calls the calls of every
    process together; calls_per_trajectory counts, per trajectory, the calls that had a row of it. counted_calls
    leaves out calls spent on deterministic steps whose output no draft uses (the endpoint steps
    of section 5), and keeps a warm-up call. speedup = stochastic steps / mean counted calls, as
    the table of section 5 counts; speedup_total = all steps / (mean calls + the pilot's sequential
    calls when this run paid for a pilot), everything counted. speedup_batch = steps / target_calls:
    the batch's sequential calls against plain sampling's (a batch waits for its slowest trajectory,
    so this is at most the per-trajectory figures). speedup_over and time_speedup_over compare with a
    measured run of plain sampling instead, in calls per sample and in wall-clock.
    """

    method: str
    steps: int
    stochastic_steps: int
    calls_per_trajectory: np.ndarray
    counted_calls: np.ndarray
    rows_per_trajectory: np.ndarray
    target_calls: int = 0
    draft_calls: int = 0
    rounds: int = 0
    wall_s: float = 0.0
    target_s: float = 0.0  # in target calls
    draft_s: float = 0.0  # drafting: noise and draft means, draft-network calls included
    verify_s: float = 0.0  # walking the trees: verification, commits, prefetch
    examined_per_depth: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)
    padded_rows: int = (
        0  # rows the calls were padded with to a few shapes (sampling/padding.py), in no trajectory's rows
    )
    warm_ups: int = 0  # warm-up rows: roots evaluated alone because their trajectory held no frozen output
    pilot_calls: int = 0  # sequential target calls of the pilot this run paid for (0: none, or a cached plan)
    pilot_s: float = 0.0  # its wall-clock, planning included
    planning_calls: int = 0  # target calls planning made to time the network, when this run paid for its plan
    planning_s: float = 0.0  # the seconds its plan took (pilots, timing, the programme), when this run paid for it
    learn_s: float = 0.0  # after sampling, keeping what the run measured for later runs (specdemo.planning)
    trace_s: float = 0.0  # of wall_s, writing the rounds' records of a traced run (RoundTrace), on the host
    processes_calls: int | None = None  # every process's target calls together (None: one process)

    @property
    def num_trajectories(self) -> int:
        return len(self.calls_per_trajectory)

    @property
    def speedup(self) -> float:
        if not self.stochastic_steps:  # every step deterministic (DDIM, eta 0): nothing to speculate on
            return 1.0
        return self.stochastic_steps / float(np.mean(self.counted_calls))

    @property
    def total_target_calls(self) -> int:
        return self.target_calls if self.processes_calls is None else self.processes_calls

    @property
    def speedup_batch(self) -> float:
        return self.steps / self.target_calls if self.target_calls else 1.0

    @property
    def speedup_total(self) -> float:
        return self.steps / (float(np.mean(self.calls_per_trajectory)) + self.pilot_calls + self.planning_calls)

    def speedup_over(self, plain: Cost) -> float:
        """Against a measured run of plain sampling (the same samples and seed, side by side): how many
        times fewer target calls per sample this run made."""
        return float(np.mean(plain.calls_per_trajectory)) / float(np.mean(self.calls_per_trajectory))

    def time_speedup_over(self, plain: Cost) -> float:
        """Against a measured run of plain sampling: how many times less wall-clock this run took, each run's
        planning counted (planning_s)."""
        return time_speedup(self.wall_s + self.planning_s, plain.wall_s + plain.planning_s)

    @property
    def acceptance_per_depth(self) -> list[float | None]:
        """Fraction of verified nodes at each depth that kept a drafted child (None: never reached)."""
        return [a / e if e else None for a, e in zip(self.accepted_per_depth, self.examined_per_depth, strict=True)]

    @property
    def acceptance(self) -> float | None:
        examined = sum(self.examined_per_depth)
        return sum(self.accepted_per_depth) / examined if examined else None

    @property
    def rows_per_call(self) -> float:
        """Mean target rows per target call, per trajectory."""
        return float(np.mean(self.rows_per_trajectory / np.maximum(self.calls_per_trajectory, 1)))

    def summary(self) -> dict:
        """The figures the CLI prints and the benchmarks tabulate (strict JSON: None, never NaN)."""
        b = self.num_trajectories
        return {
            "method": self.method,
            "steps": self.steps,
            "stochastic_steps": self.stochastic_steps,
            "num_samples": b,
            "target_calls": self.target_calls,
            "total_target_calls": self.total_target_calls,
            "target_calls_per_sample": float(np.mean(self.calls_per_trajectory)),
            "counted_calls_per_sample": float(np.mean(self.counted_calls)),
            "target_rows": int(np.sum(self.rows_per_trajectory)),
            "target_rows_per_sample": float(np.mean(self.rows_per_trajectory)),
            "rows_per_call": self.rows_per_call,
            "draft_calls": self.draft_calls,
            "rounds": self.rounds,
            "speedup": self.speedup,
            "speedup_total": self.speedup_total,
            "speedup_batch": self.speedup_batch,
            "acceptance": self.acceptance,
            "acceptance_per_depth": self.acceptance_per_depth,
            "wall_s": self.wall_s,
            "wall_s_per_sample": self.wall_s / b,
            "target_s": self.target_s,
            "non_target_fraction": 1 - self.target_s / self.wall_s if self.wall_s else None,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "padded_rows": self.padded_rows,
            "warm_ups": self.warm_ups,
            "pilot_calls": self.pilot_calls,
            "pilot_s": self.pilot_s,
            "planning_calls": self.planning_calls,
            "planning_s": self.planning_s,
            "learn_s": self.learn_s,
            "trace_s": self.trace_s,
        }


class PhaseClock:
    """Seconds spent per phase of the driver. On CUDA the marks are events, read once at the end:
    timing a phase adds no host synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.seconds: dict[str, float] = {}

    def mark(self) -> torch.cuda.Event | float:
        return self._event() if self.cuda else time.perf_counter()

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, phase: str, start: torch.cuda.Event | float) -> None:
        """Count the time from `start` (a mark) to now against `phase`."""
        if isinstance(start, torch.cuda.Event):  # a CUDA clock's mark
            self.spans.append((phase, start, self._event()))
        else:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def totals(self) -> dict[str, float]:
        if self.cuda and self.spans:
            torch.cuda.synchronize()
            for phase, start, end in self.spans:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + start.elapsed_time(end) / 1e3
            self.spans.clear()
        return self.seconds
