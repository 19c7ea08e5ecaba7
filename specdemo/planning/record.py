"""What a run hands back to planning: the one way a run's measurements reach the plan cache.

Before a run, `measuring` says what the run must trace for its setting's later runs; after it, `record` keeps
it: the deltas of its verified paths under the online plan (stats.learn), --freeze auto's forms priced along
its committed paths while the table is learnt (forms.learn_forms), or, under a plan priced by time, its
seconds (stats.observe), weighed against plain sampling's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..sampling import SampleResult
from ..trees import TopologyPlan
from .forms import learn_forms, learns_table, to_price
from .setup import Setup
from .stats import learn, observe


@dataclass(frozen=True)
class Measuring:
    """What a run measures for planning: its verified paths' deltas (`deltas`), the forms along the paths of
    trajectories `priced` (their states and outputs traced), or its seconds (`seconds`); at most one of them."""

    deltas: bool = False
    priced: tuple[int, ...] = ()
    seconds: bool = False

    @property
    def traces(self) -> bool:
        """The run must keep its trace for planning."""
        return self.deltas or bool(self.priced)


def measuring(problem: Setup, trajectories: Sequence[int], keep: bool) -> Measuring:
    """What a run of `trajectories` measures for its setting; nothing where it does not `keep` (a run that
    repeats trajectories already kept, or a process that is not the main one under accelerate launch)."""
    if not keep:
        return Measuring()
    if problem.plan_source == "online" and not learns_table(problem):
        return Measuring(deltas=True)
    if problem.learning_table:
        priced = tuple(to_price(problem, trajectories))
        if priced:
            return Measuring(priced=priced)
    return Measuring(seconds=problem.plain_s is not None and isinstance(problem.tree, TopologyPlan))


def record(problem: Setup, measured: Measuring, result: SampleResult, trajectories: Sequence[int], cond: dict) -> None:
    """Keep what the run measured (`measured`, measuring's) in the plan cache. result: the run's, with its
    trace where measured.traces; cond: the run's conditioning, in the order of `trajectories`."""
    trace = result.trace or []  # a run that measures deltas or forms kept its trace (measured.traces)
    if measured.deltas:
        learn(problem, trace, trajectories)
    if measured.priced:
        position = {i: p for p, i in enumerate(trajectories)}
        rows = [position[i] for i in measured.priced]
        learn_forms(problem, trace, measured.priced, {k: v[rows] for k, v in cond.items()})
    if measured.seconds:  # what the plan took, less writing a trace's records
        observe(problem, result.cost.wall_s - result.cost.trace_s, len(trajectories))
