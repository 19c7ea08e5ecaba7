"""A click's runs, side by side with one seed: the chosen chain, tree or planned topology (tree
"auto") with its trace, the plain target sampler, and for a tree the chain at the same target rows
per round; and the bound on what the runs of a click evaluate together.

Everything goes through the library's public pipeline (SamplerConfig, build, Problem.run); the page's
figures (specdemo.figures) draw from these records.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from specdemo import SamplerConfig, SpecdemoError, Target, build, get_verifier
from specdemo.errors import WorkLimitError
from specdemo.limits import Cancel, Limits
from specdemo.models import AnalyticTarget
from specdemo.pipeline import Problem
from specdemo.planning import Report, quiet
from specdemo.resolve import Settings, method_of, resolve, resolve_device
from specdemo.sampling import Cost, RoundTrace, SampleResult
from specdemo.trees import MAX_DEPTH, Topology, TopologyPlan

from .gpu import GpuTime
from .labels import describe, plan_segments
from .loading import cached_target
from .progress import Progress, TimeLeft, stage_callback
from .topology_text import is_auto
from .work import check_round_size, decode_cost, row_cost, target_kind

# A text-to-image model's samples are latents, which its VAE decodes for display only: the first
# SHOWN_IMAGES samples of each run (the samples panel), and the committed path of the round the page
# shows (at most PATH_IMAGES images: the path of a round is at most its depth + 1 long), at most
# DISPLAY_SIZE pixels a side (a 512 px image's plotly array is megabytes of JSON), DECODE_BATCH at a time,
# kept as 8-bit images (a session holds at most SHOWN_IMAGES a run and KEPT_PATHS paths of them: under
# 5 MB at these sizes).
SHOWN_IMAGES = 8
PATH_IMAGES = 18
DISPLAY_SIZE = {"samples": 192, "path": 96}
DECODE_BATCH = 4
KEPT_PATHS = 4  # decoded paths a session keeps (the last rounds it has shown)


def decode_for_display(target: Target, latents: torch.Tensor, size: int, device) -> torch.Tensor:
    """Images (B, 3, H, W), uint8 on the CPU, at most `size` pixels a side: the target's VAE decoding
    of `latents`, DECODE_BATCH at a time on `device` (as_unit reads them back in [-1, 1])."""
    out = []
    for chunk in torch.as_tensor(latents).float().split(DECODE_BATCH):
        images = target.decode(chunk.to(device)).float()
        scale = size / max(images.shape[-2:])
        if scale < 1:
            images = torch.nn.functional.interpolate(images, scale_factor=scale, mode="area")
        out.append(((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu())
    return torch.cat(out) if out else torch.zeros(0, 3, size, size, dtype=torch.uint8)


def as_unit(images: torch.Tensor) -> torch.Tensor:
    """8-bit images (decode_for_display) as the figures take images: floats in [-1, 1]."""
    return images.float() / 127.5 - 1


@dataclass
class MethodRun:
    """One run of the comparison: what it was, what it cost, what it drew (samples on the CPU)."""

    key: str  # target, chain or tree: picks the colour
    label: str
    config: SamplerConfig
    cost: Cost
    samples: torch.Tensor
    tree: str  # the topology as Topology prints it; "none" for plain sampling
    verifier: str | None
    rows_per_round: float  # a whole number for a fixed topology; a plan's mean over the steps
    pilot: Cost | None = None  # calibration runs (auto topology or freeze), not part of `cost`
    plan_source: str | None = None  # where its calibration came from: pilot, cache or shipped
    images: torch.Tensor | None = None  # a latent model's first samples decoded for display (SHOWN_IMAGES)
    timings: int = 1  # how many timings the wall-clock is the median of (timed_again)

    def summary(self) -> dict:
        return {
            "label": self.label,
            "tree": self.tree,
            "verifier": self.verifier,
            "rows_per_round": self.rows_per_round,
            **self.cost.summary(),
            "plan_source": self.plan_source,
            "pilot_target_calls": None if self.pilot is None else self.pilot.target_calls,
            "pilot_wall_s": None if self.pilot is None else self.pilot.wall_s,
        }


def rows_per_round(tree: Topology | TopologyPlan, evaluate_leaves: bool = False) -> float:
    """Target rows of a full round: a whole number for a fixed topology, a plan's mean over its steps."""
    if isinstance(tree, TopologyPlan):
        return float(tree.rows_per_round(evaluate_leaves))
    return tree.rows_per_round(evaluate_leaves) if tree.widths else 1


def matched_chain(tree: str | Topology | TopologyPlan, stochastic_steps: int, evaluate_leaves: bool = False) -> str:
    """The chain with the tree's target rows per round (a chain of length L evaluates L rows; a
    plan's mean rows, rounded), capped at the stochastic steps and the deepest topology allowed."""
    tree = Topology.parse(tree) if isinstance(tree, str) else tree
    rows = int(round(rows_per_round(tree, evaluate_leaves)))
    return f"1x{max(1, min(rows, stochastic_steps, MAX_DEPTH))}"


def log_density_of(target: Target):
    """The analytic target's log density (a callable on (n, d) tensors), or None."""
    inner = getattr(target, "target", None)
    return getattr(inner, "log_density", None)


@dataclass
class Comparison:
    """The chosen run (with its trace) and the baselines, the plain target sampler first and the
    chosen run last. Holds plain data only (no networks), so that it can be kept per session."""

    config: SamplerConfig
    runs: list[MethodRun]
    trace: list[RoundTrace]
    kind: str  # plane, image or vector
    num_steps: int
    model_name: str
    kernel_name: str
    shape: tuple[int, ...]
    log_density: Callable | None  # the analytic target's, for 2-D views
    paths: np.ndarray | None  # (B, N + 1, 2) every trajectory's states, for 2-D targets
    plan: TopologyPlan | None = None  # the chosen run's trees per step, when its topology was planned
    # an auto topology that sampled plainly: the plan plain sampling was expected to beat, and its seconds
    declined: TopologyPlan | None = None
    plain_s: float | None = None
    shared: bool = False  # timed while another visitor's run computed too (handlers.run)
    gpu: GpuTime | None = None  # the ZeroGPU seconds the click asked for and used (None elsewhere)
    latent: bool = False  # its samples and node states are latents, decoded for display only
    # (trajectory, k) -> the committed path of that round decoded for display (path_images)
    decoded_paths: dict = field(default_factory=dict)

    def shown_samples(self) -> list[MethodRun]:
        """The runs as the samples panel draws them: a latent model's decoded images as samples."""
        if not self.latent:
            return self.runs
        shown = []
        for r in self.runs:
            assert r.images is not None  # run_comparison decodes every run of a latent model
            shown.append(replace(r, samples=as_unit(r.images)))
        return shown

    def path_latents(self, trajectory: int, k: int) -> tuple[int, np.ndarray] | None:
        """(round index, the latents of the committed path) of the trajectory's k-th round (k clamped),
        at most PATH_IMAGES of them; None where it has no round."""
        from specdemo import figures as F

        rounds = F.trajectory_rounds(self.trace, trajectory)
        if not rounds:
            return None
        r, row = rounds[int(np.clip(k, 1, len(rounds))) - 1]
        nodes = F.round_nodes(self.trace, r, row)
        if nodes.states is None:
            return None
        return r, nodes.states[nodes.path()[:PATH_IMAGES]]

    def path_images(self, trajectory: int, k: int, decode: Callable | None) -> list[RoundTrace]:
        """The trace as the committed-path view draws a latent model's round: the trajectory's k-th
        round holding the decoded images of its path (decoded once by `decode`, latents -> images,
        and kept), the other rounds no states. Without `decode` and not decoded yet: no states."""
        from specdemo import figures as F

        found = self.path_latents(trajectory, k)
        trace = [replace(rt, states=None) for rt in self.trace]
        if found is None:
            return trace
        r, latents = found
        k = int(np.clip(k, 1, len(F.trajectory_rounds(self.trace, trajectory))))
        images = self.decoded_paths.get((trajectory, k))
        if images is None:
            if decode is None:
                return trace
            images = decode(np.ascontiguousarray(latents))
            while len(self.decoded_paths) >= KEPT_PATHS:
                self.decoded_paths.pop(next(iter(self.decoded_paths)))
            self.decoded_paths[(trajectory, k)] = images
        rt = self.trace[r]
        one = replace(rt, states=None).restricted(rt.trajectories == trajectory)
        nodes = F.round_nodes([one], 0, 0)
        states = np.full((1, rt.parent.shape[0], *images.shape[1:]), np.nan, dtype=np.float32)
        states[0, nodes.node[nodes.path()[: len(images)]]] = as_unit(images).numpy()
        trace[r] = replace(one, states=states)
        return trace

    @property
    def chosen(self) -> MethodRun:
        return self.runs[-1]

    def headline(self) -> dict:
        """The chosen run against plain sampling (and the chain) in calls and in wall-clock, and what
        the plan expected of it."""
        base, chosen = self.runs[0], self.chosen
        calls = lambda r: float(np.mean(r.cost.calls_per_trajectory))
        out = {
            "chosen": chosen.label,
            "speedup": chosen.cost.speedup_over(base.cost),
            "calls_plain": calls(base),
            "calls_chosen": calls(chosen),
            "time_plain": base.cost.wall_s,
            "time_chosen": chosen.cost.wall_s + chosen.cost.planning_s,
            "speedup_time": chosen.cost.time_speedup_over(base.cost),
            "wall_s": sum(r.cost.wall_s for r in self.runs),
        }
        if len(self.runs) == 3:
            chain = self.runs[1]
            out.update(
                chain=chain.label,
                speedup_chain=chain.cost.speedup_over(base.cost),
                speedup_time_chain=chain.cost.time_speedup_over(base.cost),
            )
        if self.plan is not None and self.plan.predicts:
            out.update(planned_calls=self.plan.expected_calls, planned_s=self.plan.expected_s)
        return out

    @property
    def traced_trajectories(self) -> int:
        """How many trajectories (the first ones) the trace and paths hold."""
        return max((int(rt.trajectories.max()) + 1 for rt in self.trace if len(rt.trajectories)), default=0)

    def summarised(self, max_trajectories: int, max_bytes: int | None = None) -> Comparison:
        """The trace and paths of the first trajectories only: at most max_trajectories, and as many
        as fit in max_bytes (at least one), what a session keeps whatever the number of samples
        (the samples and every cost are kept whole)."""
        kept = self._first(max_trajectories)
        if max_bytes is not None and self.trace:
            per_trajectory = (self.trace_bytes() + (0 if self.paths is None else self.paths.nbytes)) / max(
                self.traced_trajectories, 1
            )
            count = max(1, min(max_trajectories, int(max_bytes // max(per_trajectory, 1))))
            kept = self._first(count)
            # the first trajectories may hold more than the mean (more rounds): one fewer until they fit
            while count > 1 and kept.trace_bytes() + (0 if kept.paths is None else kept.paths.nbytes) > max_bytes:
                count -= 1
                kept = self._first(count)
        return kept

    def _first(self, count: int) -> Comparison:
        trace = [rt.restricted(rt.trajectories < count) for rt in self.trace]
        return replace(
            self,
            trace=[rt for rt in trace if len(rt.trajectories)],
            paths=None if self.paths is None else self.paths[:count],
        )

    def trace_bytes(self) -> int:
        """Bytes of the arrays the trace holds (node states included)."""
        return sum(v.nbytes for rt in self.trace for v in vars(rt).values() if isinstance(v, np.ndarray))

    def to_json(self, max_trajectories: int | None = None) -> dict:
        """The run as JSON: settings, every method's cost summary, the chosen run's samples and its
        trace (node states kept for 2-D targets only; rows of the first max_trajectories)."""
        comp = self if max_trajectories is None else self.summarised(max_trajectories)
        rounds = [
            (rt if self.kind == "plane" or rt.states is None else replace(rt, states=None)).to_json()
            for rt in comp.trace
        ]
        return {
            "format": "specdemo-run/1",
            "config": self.config.to_dict(),
            "model": {
                "name": self.model_name,
                "shape": list(self.shape),
                "kernel": self.kernel_name,
                "steps": self.num_steps,
            },
            "methods": [json.loads(json.dumps(r.summary(), default=_plain)) for r in self.runs],
            "plan": None
            if self.plan is None
            else [{"steps": [a, b], "tree": tree} for a, b, tree in plan_segments(self.plan)],
            "samples": self.chosen.samples.tolist(),
            "trace": rounds,
        }


def _plain(v):
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(type(v).__name__)


def _method_run(key: str, problem: Problem, result: SampleResult) -> MethodRun:
    assert problem.tree is not None  # a problem that has run was planned
    return MethodRun(
        key=key,
        label=describe(problem),
        config=problem.config,
        cost=result.cost,
        samples=result.samples.detach().float().cpu(),
        tree=str(problem.tree),
        verifier=problem.verifier.name if problem.verifier else None,
        rows_per_round=rows_per_round(problem.tree, problem.config.prefetch == "leaves"),
        pilot=problem.pilot,
        plan_source=problem.plan_source,
    )


TIMING_SECONDS = 1.0  # a click's runs are timed again while all its timings together stay within this
# (SPECDEMO_APP_TIMING_SECONDS, where the owner sets it; the tests set 0: one timing a run)
TIMING_RUNS = 5  # ... up to this many timings of each run, the least kept


def timing_budget() -> float:
    """The seconds a click's runs may spend timed again (TIMING_SECONDS; SPECDEMO_APP_TIMING_SECONDS)."""
    return float(os.environ.get("SPECDEMO_APP_TIMING_SECONDS", TIMING_SECONDS))


def timed_again(runs: list[MethodRun], problems: list[Problem], cancel: Cancel | None) -> None:
    """Time each run again, in turn (so that a burst of load falls on all of them alike), while another pass
    fits in TIMING_SECONDS with the ones made (up to TIMING_RUNS timings each); each run's wall-clock becomes
    the least of its timings (load only ever slows a run down), its seconds in target calls scaled alike. A run of the analytic targets takes
    a tenth of a second, which a shared CPU moved by a quarter from click to click; a click of the digits
    model makes one pass. A traced run's timing leaves out writing its records (Cost.trace_s), as the
    untraced baselines have none."""
    timings = [[r.cost.wall_s - r.cost.trace_s] for r in runs]
    budget = timing_budget()
    while len(timings[0]) < TIMING_RUNS and sum(map(sum, timings)) / len(timings[0]) * (len(timings[0]) + 1) <= budget:
        for times, p in zip(timings, problems, strict=True):
            times.append(p.run(learn_deltas=False, cancel=cancel).cost.wall_s)
    for r, times in zip(runs, timings, strict=True):
        least = float(min(times))
        r.cost.target_s *= least / times[0] if times[0] else 1.0
        r.cost.wall_s, r.cost.trace_s, r.timings = least, 0.0, len(times)


def click_work(settings: Settings, chain: bool, plain: bool) -> list[tuple[str, int]]:
    """(run, the most target rows it may evaluate) for each run of a click, bounded as
    specdemo.limits bounds one run: samples x steps x (rows a round + the warm-up's root row), and
    the chosen run's pilots (Settings). chain: with the chain at the same rows per round (for an auto
    plan, at most its budget; for a block-verified chain, the same chains under RMC); plain: with plain
    sampling."""
    c, kernel = settings.config, settings.kernel
    steps, samples = kernel.num_steps, c.num_samples
    auto = settings.topology is None
    chosen = "planned topology" if auto else f"{c.method} {settings.topology}"
    work = [(chosen, samples * steps * settings.rows_per_round + settings.pilot_rows)]
    if chain and c.method == "tree":
        stochastic = int((kernel.scales > 0).sum())
        if settings.topology is not None:
            basis = settings.topology
        else:
            assert settings.plan is not None and settings.plan.budget is not None  # --tree auto: within a budget
            basis = Topology.chain(settings.plan.budget)
        matched = Topology.parse(matched_chain(basis, stochastic, c.prefetch == "leaves"))
        work.append((f"chain {matched}", samples * steps * (matched.num_nodes + 1)))
    elif chain and get_verifier(c.verifier).weighs_whole_tree:
        work.append((f"chain {settings.topology} under RMC", samples * steps * settings.rows_per_round))
    if plain:
        work.append(("plain target", samples * steps))
    decoding = decode_cost(settings.target)
    if decoding:  # a latent model's images for display, counted in rows of its own
        images = min(samples, SHOWN_IMAGES) * len(work) + PATH_IMAGES
        work.append(
            (
                f"decoding {images} images for display",
                math.ceil(images * decoding / row_cost(settings.target, c.guidance_scale)),
            )
        )
    return work


def weighed_rows(target: Target, limits: Limits, guidance_scale: float | None, device: torch.device) -> str:
    """Why a costly model's rows limit is small (work.row_cost), to end a refusal; "" for rows as cheap
    as the digits model's."""
    cost = row_cost(target, guidance_scale)
    if cost <= 1:
        return ""
    return (
        f" (a row of {target.name[:80]} costs about {cost:,.0f} rows of the digits model: {limits.max_rows:,} are "
        f"this {'GPU' if device.type == 'cuda' else 'CPU'}'s share of a click's work for it"
        + ("; a GPU runs far more)" if device.type == "cpu" else ")")
    )


def check_click(
    config: SamplerConfig, target: Target, limits: Limits, *, chain: bool = True, plain: bool = True, test: bool = False
) -> Settings:
    """Refuse a click whose runs together could evaluate more target rows than limits.max_rows
    (each run alone passes specdemo.resolve), or whose rounds hold more nodes than the Space runs at once
    (work.check_round_size; test: an exactness test's), before any work; the chosen configuration's
    settings. A refusal for rows says how costly the model's rows are where they are (weighed_rows)."""
    try:
        settings = resolve(config, target, limits=limits)
    except WorkLimitError as err:
        why = weighed_rows(target, limits, config.guidance_scale, resolve_device(config.device))
        raise WorkLimitError(err.rows, err.limit, f"{err}{why}") from None
    check_round_size(settings, test)
    work = click_work(settings, chain, plain)
    total = sum(rows for _, rows in work)
    if total > limits.max_rows:
        parts = " + ".join(f"{rows:,} ({what})" for what, rows in work)
        runs = sum(1 for what, _ in work if not what.startswith("decoding"))
        raise SpecdemoError(
            f"the {runs} runs of this click could evaluate up to {total:,} target rows together ({parts}), over "
            f"the limit of {limits.max_rows:,} a click; use fewer samples, fewer steps or a smaller tree or budget"
            + weighed_rows(target, limits, settings.config.guidance_scale, settings.device)
        )
    return settings


def click_rows(
    config: SamplerConfig,
    target: Target,
    limits: Limits,
    *,
    num_samples: int | None = None,
    chain: bool = True,
    test: bool = False,
) -> int:
    """The most target rows a click's runs evaluate together (click_work), after check_click refuses what is
    over the limits: the comparison's, or with test an exactness test's of num_samples a group."""
    if num_samples is not None:
        config = replace(config, num_samples=num_samples)
    settings = check_click(config, target, limits, chain=chain, plain=True, test=test)
    return sum(rows for _, rows in click_work(settings, chain, True))


def plan_expects(problem: Problem) -> tuple[float | None, float | None]:
    """A planned run's expected seconds and sequential target calls (the plan's calls per trajectory
    for each batch of slots); (None, None) for a fixed topology and the online plan."""
    plan = problem.tree
    if not isinstance(plan, TopologyPlan) or not plan.predicts:
        return None, None
    return plan.expected_s, plan.expected_calls * math.ceil(problem.config.num_samples / problem.slots)


def plain_calls(problem: Problem) -> int:
    """Sequential target calls of plain sampling: one a step for each batch of slots."""
    return problem.kernel.num_steps * math.ceil(problem.config.num_samples / problem.slots)


def planning_progress(progress: Progress | None) -> Report:
    """Planning's progress on the page: its own bar, before the runs' (a plan priced here times the network)."""
    if progress is None:
        return quiet
    return lambda done, what: progress(done, f"planning the topology: {what}")


def run_comparison(  # noqa: C901, PLR0912, PLR0915 (issue 56 splits it)
    config: SamplerConfig,
    *,
    progress: Progress | None = None,
    baselines: bool = True,
    target: Target | None = None,
    draft_target: Target | None = None,
    limits: Limits | None = None,
    cancel: Cancel | None = None,
    traced: int = 64,
) -> Comparison:
    """Run `config` (its method taken from its tree: chain, tree, or tree "auto" planned per step)
    with a trace of its first `traced` trajectories for the views (recorded as it runs, or in a run of them
    again: see below), then, with the same seed, the plain target sampler and, for a tree, the RMC chain
    at the same target rows per round (a plan's mean rows per round, rounded); for a block-verified
    chain, the same chains verified node by node (RMC). `limits` bound the runs together: their
    rows are checked before any work (check_click), and `cancel` (which carries the seconds
    limit) stops whichever run is going; every configuration is built before anything is sampled.
    `progress` hears each round's share of the click and the time left (TimeLeft)."""
    if config.tree is None:
        raise SpecdemoError("no topology given; accepted: widths such as 3,2,1, KxL or 1xL")
    target = target or cached_target(config.model)
    method = method_of(config.tree).value
    config = replace(config, method=method)
    check_click(config, target, limits or Limits.from_env(), chain=baselines, plain=baselines)
    if progress is not None and is_auto(config.tree):
        progress(0.0, "planning the topology (from the deltas of earlier runs of these settings, if any)")
    problem = build(
        config, target, draft_target=draft_target, limits=limits, cancel=cancel, report=planning_progress(progress)
    )
    config = problem.config  # every default resolved
    kind = target_kind(target)
    steps = problem.kernel.num_steps
    stochastic = int((problem.kernel.scales > 0).sum())
    others: list[tuple[str, Problem]] = []
    if baselines:
        if method == "tree":
            planned = problem.declined.tree if problem.declined is not None else problem.tree
            chain_cfg = config.with_method("chain", matched_chain(planned, stochastic, config.prefetch == "leaves"))
            if config.freeze == "auto" and config.draft == "frozen" and problem.declined is None:
                # the chain drafts with the run's own per-step freeze table (a plan's, or the first one), which
                # building the chain alone would not find
                chain_cfg = replace(chain_cfg, verifier="rmc")
                others.append(
                    (
                        "chain",
                        replace(
                            problem,
                            config=chain_cfg,
                            tree=Topology.parse(chain_cfg.tree),
                            verifier=get_verifier("rmc"),
                            plan_source=None,
                            learning_table=False,
                        ),
                    )
                )  # it learns nothing
            else:
                others.append(
                    ("chain", build(chain_cfg, target, draft_target=draft_target, limits=limits, cancel=cancel))
                )
        elif problem.verifier.weighs_whole_tree:
            # the same chains (the same plan) verified node by node: what weighing the block gains
            others.append(
                ("chain", replace(problem, config=replace(config, verifier="rmc"), verifier=get_verifier("rmc")))
            )
        others.append(("target", build(config.with_method("target"), target, limits=limits, cancel=cancel)))
    shown = range(min(config.num_samples, traced))
    views_kwargs = dict(
        trace=True, trace_states=kind in ("plane", "image"), keep_steps=range(steps + 1) if kind == "plane" else ()
    )
    # A network's run records the views' rounds as it goes, where they are all its trajectories: recording adds
    # 0-3% to a round of the digits network (0.96-1.03x, 2026-12-07), and running them again would double the
    # click. An analytic target's run is timed untraced, as the baselines are (recording its rounds added 20-40%
    # at one sample), and the shown trajectories run again, traced: their own streams give them the same draws
    # (bit for bit: tests/test_reproducible.py).
    views_in_run = len(shown) == config.num_samples and not isinstance(target, AnalyticTarget)
    stages = len(others) + (1 if views_in_run else 2)
    plan = problem.tree if isinstance(problem.tree, TopologyPlan) else None
    clock = TimeLeft(
        [plain_calls(p) if key == "target" else None for key, p in others] + ([] if views_in_run else [None]),
        *plan_expects(problem),
    )  # a views' run, where there is one: about as many sequential calls as the first
    result = problem.run(  # charged with what planning it took (its seconds count in its wall-clock)
        callback=stage_callback(progress, 0, 1 / stages, describe(problem), clock),
        cancel=cancel,
        with_pilot=True,
        **(views_kwargs if views_in_run else {}),
    )
    runs = [_method_run(method, problem, result)]
    for i, (key, p) in enumerate(others, start=1):
        r = p.run(callback=stage_callback(progress, i / stages, (i + 1) / stages, describe(p), clock), cancel=cancel)
        runs.append(_method_run(key, p, r))
    timed_again(runs, [problem, *(p for _, p in others)], cancel)
    runs = runs[::-1]  # plain target first, the chosen run last
    views = (
        result
        if views_in_run
        else problem.run(
            indices=shown,
            learn_deltas=False,
            cancel=cancel,
            callback=stage_callback(
                progress, 1 - 1 / stages, 1.0, f"the rounds of {len(shown)} trajectories for the views", clock
            ),
            **views_kwargs,
        )
    )
    paths = None
    if kind == "plane":
        paths = torch.stack([views.states[n] for n in range(steps + 1)], 1).float().cpu().numpy()
    if target.text_conditioned:  # the samples panel's images, decoded by the VAE (bounded: SHOWN_IMAGES a run)
        if progress is not None:
            progress(1.0, f"decoding {min(config.num_samples, SHOWN_IMAGES)} images a run for display")
        decoded: list[MethodRun] = []
        for run in runs:  # a run's images at a time, the cancel checked between them
            if cancel is not None:
                cancel.check()
            decoded.append(
                replace(
                    run,
                    images=decode_for_display(
                        target, run.samples[:SHOWN_IMAGES], DISPLAY_SIZE["samples"], problem.device
                    ),
                )
            )
        runs = decoded
    if progress is not None:
        progress(1.0, "drawing the figures")
    return Comparison(
        config=config,
        runs=runs,
        trace=views.trace or [],
        kind=kind,
        num_steps=steps,
        model_name=target.name,
        kernel_name=problem.kernel.name,
        shape=tuple(target.shape),
        log_density=log_density_of(target),
        paths=paths,
        plan=plan,
        latent=target.text_conditioned,
        declined=problem.declined.tree if problem.declined is not None else None,
        plain_s=problem.plain_s,
    )
