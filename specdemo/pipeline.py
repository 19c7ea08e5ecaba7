"""A configuration built into what `sample` is called with: build = resolve, then the draft, the network and
the plan (specdemo.planning), then the warm-up of the network's call sizes.

The CLI, the app and the benchmarks all go through `SamplerConfig` and `generate` (or `build`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from .config import SamplerConfig
from .drafts import CorrectedNetworkDraft, Draft, NetworkDraft, frozen_draft
from .errors import SpecdemoError
from .kernels import Kernel
from .limits import Cancel, Limits
from .models import Target, resolve_target
from .parallel import Broadcast, process_state
from .planning import Plan, Report, call_seconds, call_sizes, learnt_seed, measuring, plan, quiet, record
from .planning.cost_model import CostModel
from .planning.programme import DeltaStats
from .resolve import PlanRequest, Settings, resolve
from .sampling import Cost, RoundTrace, SampleResult, sample
from .sampling.graphs import launched
from .sampling.padding import PADDED_ROWS
from .trees import Topology, TopologyPlan
from .verifiers import Verifier, get_verifier

_WARM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(device, call size)} set up


@dataclass(frozen=True)
class Problem:
    """A resolved configuration: what `sample` is called with. Built by `build`; planning settles what
    `request` asks it to (Problem.planned). tree is None only between the two, for --tree auto; verifier is
    None there too for --verifier auto (and for plain sampling)."""

    config: SamplerConfig
    target: Target
    kernel: Kernel
    network: Callable[..., torch.Tensor]
    tree: Topology | TopologyPlan | None
    draft: Draft | None
    verifier: Verifier | None
    device: torch.device
    cond: dict
    request: PlanRequest | None = None  # what planning settles (resolve.PlanRequest); None: nothing
    pilot: Cost | None = None  # the pilot runs, when this build ran them (not part of the run's cost)
    stats: DeltaStats | None = (
        None  # the measured deltas (a pilot's or the runs'), which an auto topology is planned from
    )
    cost_model: CostModel | None = None  # what a round costs, for the time objective
    # for calibrated settings: "pilot", "runs" (planned from earlier runs' deltas), "cache", "shipped", "online"
    # (no plan yet: the online plan, whose runs learn) or "default" (a fixed tree, --freeze auto's first table
    # until the runs have priced its forms)
    plan_source: str | None = None
    learnt: bool = False  # the plan was learnt from the setting's runs (stream_seed)
    learning_table: bool = False  # the run's paths price --freeze auto's forms for later runs (planning.record)
    plain_s: float | None = None  # the expected seconds of plain sampling an auto topology was weighed against
    declined: Problem | None = None  # the planned problem plain sampling was expected to beat (tree is then ())
    measured_s: float | None = None  # what runs under the plan took per batch of slots (planning.record)
    calibration_s: float = 0.0  # pilots, cost measurement and planning, when this build ran them
    planning_calls: int = 0  # target calls that timed the network for the plan, when this build made them
    warmup_s: float = 0.0  # setting the target's kernels up for the run's call sizes (pipeline.warm_up)

    @property
    def slots(self) -> int:
        """Trajectories in flight at once."""
        return min(self.config.max_batch or self.config.num_samples, self.config.num_samples)

    @property
    def stream_seed(self) -> int:
        """The seed the run's random streams are keyed by: config.seed, or under a plan learnt from runs a
        seed derived from it (planning.learnt_seed), so that the plan, a function of the learning runs'
        draws, is independent of this run's draws even at the seed they ran with."""
        return learnt_seed(self.config.seed) if self.learnt else self.config.seed

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def planned(self, settled: Plan) -> Problem:
        """The problem as its plan settles it (specdemo.planning.plan)."""
        return replace(self, **{f.name: getattr(settled, f.name) for f in fields(settled)})

    def run(self, indices=None, *, with_pilot: bool = False, learn_deltas: bool = True, **kwargs) -> SampleResult:
        """Sample every trajectory, or only trajectories `indices` (a process's share). with_pilot:
        charge this build's planning and pilot runs to the run's cost (planning_s, planning_calls, pilot_calls,
        pilot_s; counted in speedup_total and time_speedup_over). learn_deltas:
        hand what the run measured for the setting's later runs to planning (planning.record); False for a
        run that repeats trajectories already kept."""
        num = self.config.num_samples if indices is None else len(indices)
        cond = self.cond if indices is None else {k: v[list(indices)] for k, v in self.cond.items()}
        trajectories = range(num) if indices is None else indices
        measured = measuring(self, trajectories, learn_deltas and _learning_process())
        traced = kwargs.pop("trace", False)
        defaults = {"trace_states": True, "trace_outputs": False, "trace_only": None}  # sample's
        asked = {k: kwargs.get(k, default) for k, default in defaults.items()}
        assert self.tree is not None  # planning settles an auto tree before a run
        if measured.priced:  # the forms are priced along the committed paths: their states and outputs, of those alone
            only = (
                None
                if traced and asked["trace_only"] is None
                else sorted({*measured.priced, *(asked["trace_only"] or ())})
            )
            kwargs.update(trace_states=True, trace_outputs=True, trace_only=only)
        elif measured.deltas and not traced:  # learning reads the deltas alone: no node states kept on the host
            kwargs["trace_states"] = False
        result = sample(
            self.network,
            self.kernel,
            self.target.shape,
            num,
            tree=self.tree,
            draft=self.draft,
            verifier=self.verifier,
            prefetch=self.config.prefetch,
            seed=self.stream_seed,
            indices=indices,
            cond=cond,
            device=self.device,
            dtype=self.dtype,
            max_batch=self.config.max_batch,
            trace=traced or measured.traces,
            **kwargs,
        )
        t0 = time.perf_counter()
        record(self, measured, result, trajectories, cond)
        if not traced:
            result.trace = None
        elif measured.priced:  # the caller's trace holds what it asked for, not what the pricing read
            records = (_as_asked(r, asked) for r in result.trace or [])
            result.trace = [r for r in records if r.trajectories.size]
        result.cost.learn_s = time.perf_counter() - t0
        if with_pilot:
            self.charge_planning(result.cost)
        return result

    def charge_planning(self, cost: Cost) -> None:
        """Charge what this build spent planning (its pilot's runs too) to a run's cost."""
        cost.planning_calls, cost.planning_s = self.planning_calls, self.calibration_s
        if self.pilot is not None:
            cost.pilot_calls, cost.pilot_s = self.pilot.target_calls, self.calibration_s


def _as_asked(record: RoundTrace, asked: dict) -> RoundTrace:
    """A round's record as a traced run's caller asked for it (sample's trace_states, trace_outputs, trace_only),
    from the record of a run that also priced the forms."""
    if asked["trace_only"] is not None:
        record = record.restricted(np.isin(record.trajectories, np.asarray(asked["trace_only"], dtype=np.int64)))
    record.states = record.states if asked["trace_states"] else None
    record.outputs = record.outputs if asked["trace_outputs"] else None
    return record


def _learning_process() -> bool:
    """Whether this process keeps its runs' deltas: the only one, or the main one under accelerate launch
    (the others sample with the plan it sends them)."""
    state = process_state()
    return state is None or state.is_main_process


def build(
    config: SamplerConfig,
    target: Target | None = None,
    *,
    draft_target: Target | None = None,
    limits: Limits | None = None,
    cancel: Cancel | None = None,
    share: Broadcast | None = None,
    report: Report = quiet,
) -> Problem:
    """Resolve a configuration (specdemo.resolve), then plan it (specdemo.planning: learnt, from pilots, or the plan cache);
    cancel stops the pilots between rounds. target, draft_target: the models config.model and
    config.draft name, already loaded (by default they are loaded here). share: under accelerate
    launch, every process takes the main process's plan (specdemo.planning.plan). report: planning's progress
    (share done, what it measures next)."""
    problem = prepare(config, target, draft_target=draft_target, limits=limits)
    if problem.config.method == "target":
        return warm_up(problem)
    return warm_up(problem.planned(plan(problem, cancel, share, report)))


def prepare(
    config: SamplerConfig,
    target: Target | None = None,
    *,
    draft_target: Target | None = None,
    limits: Limits | None = None,
) -> Problem:
    """The resolved problem before planning: its draft as configured, an auto tree not yet planned."""
    settings = resolve(config, target, limits=limits)
    c, target, kernel, device, cond = settings.config, settings.target, settings.kernel, settings.device, settings.cond
    draft = verifier = None
    if c.method != "target":
        verifier = get_verifier(settings.verifier) if settings.verifier else None  # None: chosen by planning
        draft = build_draft(settings, draft_target)
    if target.text_conditioned:  # the prompts encoded once for the run, every trajectory's rows a view of it
        assert c.guidance_scale is not None  # resolve() settles a text-conditioned target's
        cond = {
            **cond,
            **target.prompt_conditioning(c.prompt, c.negative_prompt, c.guidance_scale, c.num_samples, device),
        }
    return Problem(
        c,
        target,
        kernel,
        launched(target.network(kernel, device), c.launch, device),
        settings.topology,
        draft,
        verifier,
        device,
        cond,
        request=settings.plan,
    )


def warm_up(problem: Problem) -> Problem:
    """Set up the target's kernels for every padded call size the run can use (a first call of a new
    input shape took twice as long as later ones on the digits UNet: oneDNN builds its convolutions
    per shape), once per size and process, as loading a model does; so that a run is timed as in a
    long-lived process. The time it took is problem.warmup_s."""
    done = _WARM.setdefault(problem.target, set())
    sizes = sorted(n for n in call_sizes(problem) if n <= PADDED_ROWS and (problem.device, n) not in done)
    t0 = time.perf_counter()
    for n in sizes:
        call_seconds(problem, n, 0)
        done.add((problem.device, n))
    return replace(problem, warmup_s=time.perf_counter() - t0)


def build_draft(settings: Settings, draft_target: Target | None = None) -> Draft:
    """ "frozen", or a draft model (an embedded name, a folder or a Hub id) for a diffusers target: the
    target's conditioning (class labels, prompt embeddings and guidance) goes to the draft network too;
    with --freeze residual the network is corrected by the target's residual (CorrectedNetworkDraft)."""
    config, target, kernel, device = settings.config, settings.target, settings.kernel, settings.device
    assert config.freeze is not None and config.start is not None  # resolve() settles both
    if config.draft == "frozen":
        return frozen_draft(config.freeze, start=config.start)
    draft_target = draft_target or resolve_target(config.draft)
    mismatch = target.draft_mismatch(draft_target)
    if mismatch:
        raise SpecdemoError(f"draft {config.draft!r} cannot draft for {target.name}: {mismatch}")
    network_type = CorrectedNetworkDraft if config.freeze == "residual" else NetworkDraft
    return network_type(draft_target.network(kernel, device), name=config.draft)  # eager: its calls take many shapes


def generate(config: SamplerConfig, **kwargs) -> tuple[SampleResult, Problem]:
    """Build and run; kwargs go to `sample` (trace, keep_steps, callback, cancel). The run's cost
    counts the pilot runs when the build ran them (not for a plan from the cache). With
    SPECDEMO_MAX_SECONDS set (Limits.from_env), the build and the run stop past that many seconds."""
    limits = Limits.from_env()
    cancel = kwargs.pop("cancel", None) or Cancel(limits.max_seconds)
    problem = build(config, limits=limits, cancel=cancel)
    return problem.run(with_pilot=True, cancel=cancel, **kwargs), problem
