"""Side by side, with one seed: the chosen chain, tree or planned topology (tree "auto") with its
trace, the plain target sampler and the chain at the same target rows per round; and the exactness
check (an energy two-sample test of speculative against plain samples).

Everything goes through the public pipeline (SamplerConfig, build, Problem.run); the figures
(specdemo.figures) and the app draw from these records.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from .errors import SpecdemoError
from .limits import Cancel, Limits
from .models import EMBEDDED, Target, resolve_target
from .calibration import PILOT_DEPTH
from .pipeline import Checked, Problem, SamplerConfig, build, check_config
from .sampling import SampleResult
from .targets import GaussianMixture
from .targets.presets import PRESETS
from .sampling import Cost, RoundTrace
from .trees import Topology, TopologyPlan
from .trees.topology import MAX_DEPTH
from .verifiers import ChainVerifier, get_verifier

VERIFIER_LABELS = {"rmc": "RMC", "dgrs": "D-GRS", "rank": "rank-aware", "block": "block", None: ""}


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

    def summary(self) -> dict:
        return {"label": self.label, "tree": self.tree, "verifier": self.verifier,
                "rows_per_round": self.rows_per_round, **self.cost.summary(), "plan_source": self.plan_source,
                "pilot_target_calls": None if self.pilot is None else self.pilot.target_calls,
                "pilot_wall_s": None if self.pilot is None else self.pilot.wall_s}


def energy_test(x: torch.Tensor, y: torch.Tensor, permutations: int = 500, seed: int = 0) -> tuple[float, float]:
    """Energy-distance two-sample test (Szekely and Rizzo) with a permutation p-value.

    x (n, d), y (m, d). Returns (statistic, p-value); the statistic is the V-statistic
    2 E|X - Y| - E|X - X'| - E|Y - Y'|. Every permutation is one column of a single matrix product.
    """
    x, y = x.reshape(len(x), -1).double(), y.reshape(len(y), -1).double()
    n, m = len(x), len(y)
    z = torch.cat([x, y])
    d = torch.cdist(z, z)
    r = d.sum(1)
    total = r.sum()

    def stat(a: torch.Tensor) -> torch.Tensor:  # a: (N, P) indicators of the x group
        sxx = (a * (d @ a)).sum(0)
        ra = r @ a
        sxy = ra - sxx
        syy = total - 2 * ra + sxx
        return 2 * sxy / (n * m) - sxx / n**2 - syy / m**2

    g = torch.Generator().manual_seed(seed)
    observed = stat(torch.cat([torch.ones(n), torch.zeros(m)]).double()[:, None])[0]
    perms = torch.argsort(torch.rand(permutations, n + m, generator=g), dim=1)
    a = torch.zeros(n + m, permutations, dtype=torch.float64)
    a[perms[:, :n].T, torch.arange(permutations)] = 1.0
    null = stat(a)
    p = (1 + int((null >= observed).sum())) / (1 + permutations)
    return float(observed), float(p)


Progress = Callable[[float, str], None]
MAX_TEST_SAMPLES = 2000  # per group: the test's pooled distance matrix grows as the square

_cache: OrderedDict[tuple[str, bool], Target] = OrderedDict()
_cache_lock = threading.Lock()


def cached_target(spec: str, size: int = 4, hub_only: bool = False, max_download_bytes: int | None = None) -> Target:
    """resolve_target, remembering the last `size` models (each loaded once while it is kept: the
    app's check of a run's settings and the run itself share one load)."""
    key = (str(spec).strip(), hub_only)  # the same name read from the Hub only, or from the disk too
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    target = resolve_target(key[0], hub_only=hub_only, max_download_bytes=max_download_bytes)
    with _cache_lock:
        _cache[key] = target
        while len(_cache) > size:
            _cache.popitem(last=False)
    return target


def embedded_available(name: str) -> bool:
    """Whether an embedded model (digits, digits-draft) is installed in this checkout."""
    return name in EMBEDDED and EMBEDDED[name].is_dir()


def is_auto(tree: str | None) -> bool:
    """Whether `tree` asks for a topology planned per step (SamplerConfig.tree = "auto")."""
    return str(tree or "").strip().lower() == "auto"


def speculative_method(tree: str) -> str:
    """chain if every width is 1, else tree; "auto" plans trees (refuses malformed widths with the reason)."""
    if is_auto(tree):
        return "tree"
    return "chain" if Topology.parse(tree).is_chain else "tree"


def rows_per_round(tree: Topology | TopologyPlan, evaluate_leaves: bool = False) -> float:
    """Target rows of a full round: a whole number for a fixed topology, a plan's mean over its steps."""
    if isinstance(tree, TopologyPlan):
        return float(tree.rows_per_round(evaluate_leaves))
    return tree.rows_per_round(evaluate_leaves) if tree.widths else 1


def plan_segments(plan: TopologyPlan) -> list[tuple[int, int, str]]:
    """(first step, last step, topology) for each run of steps that share a planned tree (for a
    root whose output is not known, worded as Topology.text); steps with no speculation
    (deterministic ones, the last step) are left out."""
    out: list[tuple[int, int, str]] = []
    for n, (tree, leaves) in enumerate(zip(plan.trees, plan.leaves)):
        if not tree.widths:
            continue
        text = tree.text(leaves)
        if out and out[-1][2] == text and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n, text)
        else:
            out.append((n, n, text))
    return out


def matched_chain(tree: str | Topology | TopologyPlan, stochastic_steps: int, evaluate_leaves: bool = False) -> str:
    """The chain with the tree's target rows per round (a chain of length L evaluates L rows; a
    plan's mean rows, rounded), capped at the stochastic steps and the deepest topology allowed."""
    tree = Topology.parse(tree) if isinstance(tree, str) else tree
    rows = int(round(rows_per_round(tree, evaluate_leaves)))
    return f"1x{max(1, min(rows, stochastic_steps, MAX_DEPTH))}"


def describe(problem: Problem) -> str:
    c = problem.config
    if c.method == "target":
        return "plain target"
    return f"{c.method} {problem.tree} · {VERIFIER_LABELS.get(problem.verifier.name, problem.verifier.name)}"


def target_kind(target: Target) -> str:
    """plane (2-D vectors), image (C, H, W), or vector."""
    if len(target.shape) == 3:
        return "image"
    return "plane" if tuple(target.shape) == (2,) else "vector"


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

    @property
    def chosen(self) -> MethodRun:
        return self.runs[-1]

    def headline(self) -> dict:
        """The chosen run against plain sampling (and the chain) in calls and in wall-clock, and what
        the plan expected of it."""
        base, chosen = self.runs[0], self.chosen
        calls = lambda r: float(np.mean(r.cost.calls_per_trajectory))
        out = {"chosen": chosen.label, "speedup": calls(base) / calls(chosen), "calls_plain": calls(base),
               "calls_chosen": calls(chosen), "time_plain": base.cost.wall_s, "time_chosen": chosen.cost.wall_s,
               "speedup_time": base.cost.wall_s / chosen.cost.wall_s, "wall_s": sum(r.cost.wall_s for r in self.runs)}
        if len(self.runs) == 3:
            chain = self.runs[1]
            out.update(chain=chain.label, speedup_chain=calls(base) / calls(chain),
                       speedup_time_chain=base.cost.wall_s / chain.cost.wall_s)
        if self.plan is not None:
            out.update(planned_calls=self.plan.expected_calls, planned_s=self.plan.expected_s)
        return out

    @property
    def traced_trajectories(self) -> int:
        """How many trajectories (the first ones) the trace and paths hold."""
        return max((int(rt.trajectories.max()) + 1 for rt in self.trace if len(rt.trajectories)), default=0)

    def summarised(self, max_trajectories: int, max_bytes: int | None = None) -> "Comparison":
        """The trace and paths of the first trajectories only: at most max_trajectories, and as many
        as fit in max_bytes (at least one), what a session keeps whatever the number of samples
        (the samples and every cost are kept whole)."""
        if max_bytes is not None and self.trace:
            per_trajectory = (self.trace_bytes() + (0 if self.paths is None else self.paths.nbytes)) / max(
                self.traced_trajectories, 1)
            max_trajectories = max(1, min(max_trajectories, int(max_bytes // max(per_trajectory, 1))))
        trace = [rt.restricted(rt.trajectories < max_trajectories) for rt in self.trace]
        return replace(self, trace=[rt for rt in trace if len(rt.trajectories)],
                       paths=None if self.paths is None else self.paths[:max_trajectories])

    def trace_bytes(self) -> int:
        """Bytes of the arrays the trace holds (node states included)."""
        return sum(v.nbytes for rt in self.trace for v in vars(rt).values() if isinstance(v, np.ndarray))

    def to_json(self, max_trajectories: int | None = None) -> dict:
        """The run as JSON: settings, every method's cost summary, the chosen run's samples and its
        trace (node states kept for 2-D targets only; rows of the first max_trajectories)."""
        comp = self if max_trajectories is None else self.summarised(max_trajectories)
        rounds = [(rt if self.kind == "plane" or rt.states is None else replace(rt, states=None)).to_json()
                  for rt in comp.trace]
        return {
            "format": "specdemo-run/1",
            "config": self.config.to_dict(),
            "model": {"name": self.model_name, "shape": list(self.shape), "kernel": self.kernel_name,
                      "steps": self.num_steps},
            "methods": [json.loads(json.dumps(r.summary(), default=_plain)) for r in self.runs],
            "plan": None if self.plan is None else [
                {"steps": [a, b], "tree": tree} for a, b, tree in plan_segments(self.plan)],
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
    return MethodRun(key=key, label=describe(problem), config=problem.config, cost=result.cost,
                     samples=result.samples.detach().float().cpu(), tree=str(problem.tree),
                     verifier=problem.verifier.name if problem.verifier else None,
                     rows_per_round=rows_per_round(problem.tree, problem.config.prefetch == "leaves"),
                     pilot=problem.pilot, plan_source=problem.plan_source)


class TimeLeft:
    """The seconds a click of several runs has left, for its progress bar. The run in progress:
    its measured pace (the share of its trajectories' steps done, per second), or before its first
    round its plan's expected seconds. A later run: its expected sequential target calls at the
    seconds per call measured so far (before any, the plan's expected seconds per expected call),
    where `later_calls` gives them (plain sampling: one per step and batch of slots), or None for
    "as many as the first run" (the chain at the same rows)."""

    def __init__(self, later_calls: list[float | None], expected_s: float | None = None,
                 expected_calls: float | None = None):
        self.later_calls = later_calls
        self.expected_s = expected_s
        self.stage = -1
        self.started = time.perf_counter()
        known = expected_s is not None and expected_calls
        self.seconds_per_call: float | None = expected_s / expected_calls if known else None
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
        for calls_later in self.later_calls[self.stage:]:
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


def _stage_callback(progress: Progress | None, lo: float, hi: float, label: str, clock: TimeLeft):
    clock.next_stage()
    if progress is None:
        return None

    def cb(info: dict) -> None:
        done = min(max(float(info["progress"]), 0.0), 1.0)
        detail = f"round {info['round']}, {info['finished']}/{info['num_samples']} samples done"
        detail += time_left_text(clock.seconds(done, info.get("target_calls")))
        progress(lo + (hi - lo) * done, f"{label}: {detail}")
    return cb


def click_work(checked: Checked, chain: bool, plain: bool) -> list[tuple[str, int]]:
    """(run, the most target rows it may evaluate) for each run of a click, bounded as
    specdemo.limits bounds one run: samples x steps x (rows a round + the warm-up's root row), and
    the chosen run's pilots. chain: with the chain at the same rows per round (for an auto plan, at
    most its budget; for a block-verified chain, the same chains under RMC); plain: with plain
    sampling."""
    c, kernel = checked.config, checked.kernel
    steps, samples = kernel.num_steps, c.num_samples
    auto = c.tree == "auto"
    rows = c.budget if auto else checked.tree.num_nodes
    pilots = ((2 if c.freeze == "auto" else 1) if auto or c.freeze == "auto" else 0) * c.pilot_samples
    chosen = "planned topology" if auto else f"{c.method} {checked.tree}"
    work = [(chosen, samples * steps * (rows + 1) + pilots * steps * (PILOT_DEPTH + 1))]
    if chain and c.method == "tree":
        stochastic = int((kernel.scales > 0).sum())
        matched = Topology.parse(matched_chain(Topology.chain(c.budget) if auto else checked.tree, stochastic,
                                               c.prefetch == "leaves"))
        work.append((f"chain {matched}", samples * steps * (matched.num_nodes + 1)))
    elif chain and isinstance(get_verifier(c.verifier), ChainVerifier):
        work.append((f"chain {checked.tree} under RMC", samples * steps * (rows + 1)))
    if plain:
        work.append(("plain target", samples * steps))
    return work


def check_click(config: SamplerConfig, target: Target, limits: Limits, *, chain: bool = True,
                plain: bool = True) -> Checked:
    """Refuse a click whose runs together could evaluate more target rows than limits.max_rows
    (each run alone passes check_config), before any work; the checked chosen configuration."""
    checked = check_config(config, target, limits=limits)
    work = click_work(checked, chain, plain)
    total = sum(rows for _, rows in work)
    if total > limits.max_rows:
        parts = " + ".join(f"{rows:,} ({what})" for what, rows in work)
        raise SpecdemoError(
            f"the {len(work)} runs of this click could evaluate up to {total:,} target rows together ({parts}), over "
            f"the limit of {limits.max_rows:,} a click; use fewer samples, fewer steps or a smaller tree or budget")
    return checked


def plan_expects(problem: Problem) -> tuple[float | None, float | None]:
    """A planned run's expected seconds and sequential target calls (the plan's calls per trajectory
    for each batch of slots); (None, None) for a fixed topology."""
    plan = problem.tree
    if not isinstance(plan, TopologyPlan):
        return None, None
    return plan.expected_s, plan.expected_calls * math.ceil(problem.config.num_samples / problem.slots)


def plain_calls(problem: Problem) -> int:
    """Sequential target calls of plain sampling: one a step for each batch of slots."""
    return problem.kernel.num_steps * math.ceil(problem.config.num_samples / problem.slots)


def run_comparison(config: SamplerConfig, *, progress: Progress | None = None, baselines: bool = True,
                   target: Target | None = None, draft_target: Target | None = None, limits: Limits | None = None,
                   cancel: Cancel | None = None) -> Comparison:
    """Run `config` (its method taken from its tree: chain, tree, or tree "auto" planned per step)
    with a trace, then, with the same seed, the plain target sampler and, for a tree, the RMC chain
    at the same target rows per round (a plan's mean rows per round, rounded); for a block-verified
    chain, the same chains verified node by node (RMC). `limits` bound the runs together: their
    rows are checked before any work (check_click), and `cancel` (which carries the seconds
    limit) stops whichever run is going; every configuration is built before anything is sampled.
    `progress` hears each round's share of the click and the time left (TimeLeft)."""
    if config.tree is None:
        raise SpecdemoError("no topology given; accepted: widths such as 3,2,1, KxL or 1xL")
    target = target or cached_target(config.model)
    method = speculative_method(config.tree)
    config = replace(config, method=method)
    check_click(config, target, limits or Limits.from_env(), chain=baselines, plain=baselines)
    if progress is not None and (is_auto(config.tree) or (config.freeze == "auto" and config.draft == "frozen")):
        progress(0.0, f"pilot run of {config.pilot_samples} trajectories: planning the "
                      + ("topology" if is_auto(config.tree) else "frozen draft"))
    problem = build(config, target, draft_target=draft_target, limits=limits, cancel=cancel)
    config = problem.config  # every default resolved
    kind = target_kind(target)
    steps = problem.kernel.num_steps
    stochastic = int((problem.kernel.scales > 0).sum())
    others: list[tuple[str, Problem]] = []
    if baselines:
        if method == "tree":
            chain_cfg = config.with_method("chain", matched_chain(problem.tree, stochastic, config.prefetch == "leaves"))
            if config.freeze == "auto" and config.draft == "frozen":
                # the per-step freeze table comes from chain pilots seeded by the run's seed, whatever the
                # topology: building the chain would run the same two pilots again and find the same table
                chain_cfg = replace(chain_cfg, verifier="rmc")
                others.append(("chain", replace(problem, config=chain_cfg, tree=Topology.parse(chain_cfg.tree),
                                                verifier=get_verifier("rmc"))))
            else:
                others.append(("chain", build(chain_cfg, target, draft_target=draft_target, limits=limits,
                                              cancel=cancel)))
        elif isinstance(problem.verifier, ChainVerifier):
            # the same chains (the same plan) verified node by node: what weighing the block gains
            others.append(("chain", replace(problem, config=replace(config, verifier="rmc"),
                                            verifier=get_verifier("rmc"))))
        others.append(("target", build(config.with_method("target"), target, limits=limits, cancel=cancel)))
    stages = 1 + len(others)
    plan = problem.tree if isinstance(problem.tree, TopologyPlan) else None
    clock = TimeLeft([plain_calls(p) if key == "target" else None for key, p in others], *plan_expects(problem))
    result = problem.run(trace=True, trace_states=kind in ("plane", "image"),
                         keep_steps=range(steps + 1) if kind == "plane" else (),
                         callback=_stage_callback(progress, 0, 1 / stages, describe(problem), clock), cancel=cancel)
    runs = [_method_run(method, problem, result)]
    for i, (key, p) in enumerate(others, start=1):
        r = p.run(callback=_stage_callback(progress, i / stages, (i + 1) / stages, describe(p), clock), cancel=cancel)
        runs.append(_method_run(key, p, r))
    runs = runs[::-1]  # plain target first, the chosen run last
    paths = None
    if kind == "plane":
        paths = torch.stack([result.states[n] for n in range(steps + 1)], 1).float().cpu().numpy()
    if progress is not None:
        progress(1.0, "drawing the figures")
    return Comparison(config=config, runs=runs, trace=result.trace or [], kind=kind, num_steps=steps,
                      model_name=target.name, kernel_name=problem.kernel.name, shape=tuple(target.shape),
                      log_density=log_density_of(target), paths=paths, plan=plan)


@dataclass
class ExactnessReport:
    statistic: float
    p_value: float
    plain: torch.Tensor
    speculative: torch.Tensor
    label: str
    mixture: GaussianMixture | None

    @property
    def verdict(self) -> str:
        return ("no evidence of a difference at the 5% level" if self.p_value >= 0.05
                else "the samples differ at the 5% level (expected about once in twenty runs)")


def exactness_check(config: SamplerConfig, num_samples: int, *, permutations: int = 500,
                    progress: Progress | None = None, target: Target | None = None,
                    draft_target: Target | None = None, limits: Limits | None = None,
                    cancel: Cancel | None = None) -> ExactnessReport:
    """Draw num_samples with the chosen chain or tree and num_samples with the plain target sampler
    (independent seeds), then run the energy two-sample test. Analytic targets only. `limits`
    bound the two runs together, as in run_comparison."""
    if not 20 <= num_samples <= MAX_TEST_SAMPLES:
        raise SpecdemoError(f"the exactness test takes 20..{MAX_TEST_SAMPLES} samples per group, got {num_samples}")
    target = target or cached_target(config.model)
    if log_density_of(target) is None:
        raise SpecdemoError(f"the exactness test is offered for the analytic targets ({', '.join(PRESETS)}); "
                            f"{target.name} is an image model")
    if config.tree is None:
        raise SpecdemoError("no topology given; accepted: widths such as 3,2,1, KxL or 1xL")
    spec_cfg = replace(config, method=speculative_method(config.tree), num_samples=num_samples)
    check_click(spec_cfg, target, limits or Limits.from_env(), chain=False, plain=True)
    spec_problem = build(spec_cfg, target, draft_target=draft_target, limits=limits, cancel=cancel)
    plain_problem = build(replace(spec_cfg.with_method("target"), seed=config.seed + 1), target, limits=limits)
    clock = TimeLeft([plain_calls(plain_problem)], *plan_expects(spec_problem))
    spec = spec_problem.run(callback=_stage_callback(progress, 0, 0.5, describe(spec_problem), clock),
                            cancel=cancel).samples.float().cpu()
    plain = plain_problem.run(callback=_stage_callback(progress, 0.5, 0.95, "plain target", clock),
                              cancel=cancel).samples.float().cpu()
    if progress is not None:
        progress(0.97, "two-sample test")
    statistic, p = energy_test(spec, plain, permutations=permutations, seed=config.seed)
    mixture = target.target if isinstance(getattr(target, "target", None), GaussianMixture) else None
    return ExactnessReport(statistic, p, plain, spec, describe(spec_problem), mixture)
