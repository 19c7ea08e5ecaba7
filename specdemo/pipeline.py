"""One serialisable configuration for a run, resolved into the sampler's objects.

The CLI, the app and the benchmarks all go through `SamplerConfig` and `generate`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import torch
from scipy.special import ndtr

from .drafts import FREEZE, PREFETCH, BiasedDraft, Draft, FrozenDraft, NetworkDraft
from .errors import SpecdemoError
from .kernels import Kernel
from .models import KERNEL_NAMES, DiffusersTarget, Target, resolve_target
from .parallel import process_state
from .sampler import SampleResult, sample
from .trace import Cost
from .trees import Topology, TopologyPlan
from .trees.auto import DeltaStats, plan_topology
from .verifiers import VERIFIERS, Verifier, get_verifier

METHODS = ("target", "chain", "tree")
DEFAULT_TREES = {"chain": "1x5", "tree": "2x5"}
DEFAULT_VERIFIERS = {"chain": "rmc", "tree": "dgrs"}
MAX_SAMPLES = 100_000
PILOT_DEPTH, PILOT_SEED_OFFSET = 12, 7919
LEAF_OPTIONS = {"auto": (False, True), "leaves": (True,)}  # by prefetch: may the planner evaluate leaves


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that defines a run. None means "the model's default" (see Target.defaults)."""

    model: str = "digits"
    kernel: str | None = None
    steps: int | None = None
    eta: float = 1.0
    churn: float | None = None
    gamma: float | None = None
    prediction: str = "epsilon"
    method: str = "tree"
    tree: str | None = None
    verifier: str | None = None
    draft: str = "frozen"
    freeze: str = "out"
    draft_bias: float = 0.0
    prefetch: str = "nearest"
    budget: int | None = None
    pilot_samples: int = 32
    num_samples: int = 16
    max_batch: int | None = None
    seed: int = 0
    device: str = "auto"
    class_label: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SamplerConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise SpecdemoError(f"unknown settings {sorted(unknown)}; accepted: {sorted(names)}")
        return cls(**d)

    def with_method(self, method: str, tree: str | None = None) -> "SamplerConfig":
        """The same run with another method (for side-by-side comparisons); prefetch auto, which
        only a planned topology takes, becomes its fixed-tree part, nearest."""
        planned = (tree or "").strip().lower() == "auto"
        return replace(self, method=method, tree=tree, verifier=None if method != self.method else self.verifier,
                       prefetch="nearest" if self.prefetch == "auto" and not planned else self.prefetch)


@dataclass
class Problem:
    """A resolved configuration: what `sample` is called with."""

    config: SamplerConfig
    target: Target
    kernel: Kernel
    network: object
    tree: Topology
    draft: Draft | None
    verifier: Verifier | None
    device: torch.device
    cond: dict
    pilot: Cost | None = None  # the pilot run of an auto topology (calibration, not part of the run)
    stats: DeltaStats | None = None  # the pilot's deltas, which an auto topology is planned from

    def run(self, indices=None, **kwargs) -> SampleResult:
        """Sample every trajectory, or only trajectories `indices` (a process's share)."""
        num = self.config.num_samples if indices is None else len(indices)
        cond = self.cond if indices is None else {k: v[list(indices)] for k, v in self.cond.items()}
        return sample(self.network, self.kernel, self.target.shape, num, tree=self.tree, draft=self.draft,
                      verifier=self.verifier, seed=self.config.seed, indices=indices, cond=cond, device=self.device,
                      max_batch=self.config.max_batch, **kwargs)


def resolve_device(name: str) -> torch.device:
    state = process_state()
    if state is not None and name in ("auto", state.device.type):
        return state.device  # one device per process under accelerate launch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecdemoError("device cuda was asked for but no CUDA GPU is available; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise SpecdemoError(f"unknown device {name!r}; accepted: auto, cpu, cuda")
    return torch.device(name)


def _choice(value, accepted, what):
    if value not in accepted:
        raise SpecdemoError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")


def build(config: SamplerConfig, target: Target | None = None) -> Problem:
    """Resolve and check a configuration; every refusal names the problem and what is accepted."""
    c = config
    _choice(c.method, METHODS, "method")
    _choice(c.freeze, FREEZE, "freeze")
    _choice(c.prefetch, PREFETCH, "prefetch")
    for name in ("eta", "draft_bias") + tuple(n for n in ("churn", "gamma") if getattr(c, n) is not None):
        if not math.isfinite(getattr(c, name)):
            raise SpecdemoError(f"{name} must be a finite number, got {getattr(c, name)}")
    if not 1 <= c.num_samples <= MAX_SAMPLES:
        raise SpecdemoError(f"the number of samples must be in 1..{MAX_SAMPLES}, got {c.num_samples}")
    if not 1 <= c.pilot_samples <= MAX_SAMPLES:
        raise SpecdemoError(f"pilot_samples must be in 1..{MAX_SAMPLES}, got {c.pilot_samples}")
    target = target or resolve_target(c.model)
    defaults = target.defaults
    kernel_name = c.kernel or defaults.get("kernel", target.kernels[0])
    _choice(kernel_name, KERNEL_NAMES, "kernel")
    steps = c.steps if c.steps is not None else defaults.get("steps", 100)
    kernel = target.kernel(kernel_name, steps, eta=c.eta,
                           churn=c.churn if c.churn is not None else defaults.get("churn", 0.06),
                           gamma=c.gamma if c.gamma is not None else defaults.get("gamma", 0.01),
                           prediction=c.prediction)
    device = resolve_device(c.device)

    if c.method == "target":
        tree, draft, verifier = Topology(()), None, None
    else:
        auto = (c.tree or "").strip().lower() == "auto"
        tree = None if auto else Topology.parse(c.tree or DEFAULT_TREES[c.method])
        if c.method == "chain" and tree is not None and not tree.is_chain:
            raise SpecdemoError(f"a chain has width 1 at every depth, got tree {tree}; use --method tree for it")
        verifier_name = c.verifier or DEFAULT_VERIFIERS[c.method]
        _choice(verifier_name, tuple(VERIFIERS), "verifier")
        verifier = get_verifier(verifier_name)
        draft = build_draft(c, target, kernel, device)

    cond = {}
    if target.num_classes:
        label = c.class_label if c.class_label is not None else 0
        if not 0 <= label < target.num_classes:
            raise SpecdemoError(f"class label {label} is out of range for {target.name}: accepted 0..{target.num_classes - 1}")
        cond["class_labels"] = torch.full((c.num_samples,), label, dtype=torch.long)
    elif c.class_label is not None:
        raise SpecdemoError(f"{target.name} has no classes; leave out --class-label")
    problem = Problem(c, target, kernel, target.network(kernel, device), tree, draft, verifier, device, cond)
    if c.method != "target":
        calibrate(problem)
    return problem


def calibrate(problem: Problem) -> None:
    """What needs pilot runs: --freeze auto (a per-step choice between freezing the output and
    x0-hat) and --tree auto (widths planned per step, specdemo.trees.auto). Pilots are chains
    with their own seeds; their cost is kept in problem.pilot, apart from the run's."""
    c = problem.config
    auto_tree, auto_freeze = problem.tree is None, isinstance(problem.draft, FrozenDraft) and c.freeze == "auto"
    if auto_tree and (c.budget is None or c.budget < 1):
        raise SpecdemoError("--tree auto needs --budget R: the target rows a round may use (R >= 1)")
    if c.prefetch == "auto" and not auto_tree:
        raise SpecdemoError(f"--prefetch auto lets the planner choose leaf evaluation per step, which needs --tree auto; "
                            f"with tree {problem.tree} use {', '.join(p for p in PREFETCH if p != 'auto')}")
    if auto_freeze:
        if not problem.kernel.has_denoised:
            raise SpecdemoError(f"--freeze auto chooses between the output and x0-hat, which the {problem.kernel.name} "
                                "kernel has not; use --freeze out")
        out, x0 = (_pilot(problem, FrozenDraft(mode, c.prefetch)) for mode in ("out", "x0"))
        x0_steps = tuple(_mean_acceptance(x0[0], m) > _mean_acceptance(out[0], m) for m in range(problem.kernel.num_steps))
        problem.draft = FrozenDraft("auto", c.prefetch, x0_steps)
        stats = DeltaStats({k: v for k, v in out[0].deltas.items() if not x0_steps[k[0]]}
                           | {k: v for k, v in x0[0].deltas.items() if x0_steps[k[0]]}, problem.kernel.num_steps)
        problem.pilot = _add_costs(out[1], x0[1])
    elif auto_tree:
        stats, problem.pilot = _pilot(problem, problem.draft)
    if c.draft_bias:
        problem.draft = BiasedDraft(problem.draft, c.draft_bias)
    if auto_tree:
        problem.stats = stats
        problem.tree = plan(problem, c.budget)
    problem.draft.check(problem.kernel)


def plan(problem: Problem, budget: int) -> TopologyPlan:
    """The auto topology of the problem's verifier and method for `budget` target rows a round,
    planned from the pilot's deltas (problem.stats): chains for method chain or a verifier of
    blocks, trees of widths up to 8 (or the verifier's limit) otherwise."""
    if problem.stats is None:
        raise SpecdemoError("planning needs the pilot's deltas: build the problem with tree auto and a budget")
    c = problem.config
    frozen = problem.draft.uses_frozen  # only a frozen draft evaluates leaves or knows a root's output
    return plan_topology(problem.stats, problem.verifier, budget, problem.kernel.stochastic_run_lengths(),
                         max_width=1 if c.method == "chain" else 8,
                         leaf_options=LEAF_OPTIONS.get(c.prefetch, (False,)) if frozen else (False,),
                         exact_known_root=frozen and not c.draft_bias, warm_up=frozen)


def _pilot(problem: Problem, draft: Draft) -> tuple[DeltaStats, Cost]:
    """Deltas on the verified path of config.pilot_samples trajectories drafted by a deep chain.
    PILOT_DEPTH, not the deepest level a plan may reach: a chain's deep levels are reached only by
    the trajectories whose draft fits best, so their deltas flatter the wider trees a plan builds
    (on gm512, a pilot as deep as the horizon, 28, planned trees 2% slower than a pilot of 12)."""
    c = problem.config
    if c.draft_bias:
        draft = BiasedDraft(draft, c.draft_bias)
    depth = max(1, min(PILOT_DEPTH, int(problem.kernel.stochastic_run_lengths().max())))
    pilot = sample(problem.network, problem.kernel, problem.target.shape, c.pilot_samples, tree=Topology.chain(depth),
                   draft=draft, verifier=get_verifier("rmc"), seed=c.seed + PILOT_SEED_OFFSET,
                   cond={k: v[:1].expand(c.pilot_samples, *v.shape[1:]) for k, v in problem.cond.items()},
                   device=problem.device, trace=True, trace_states=False)
    return DeltaStats.from_traces(pilot.trace, problem.kernel.num_steps), pilot.cost


def _mean_acceptance(stats: DeltaStats, step: int) -> float:
    """Mean single-child acceptance 2 Phi(-delta/2) of the nodes verified at `step`, all depths."""
    deltas = [v for (s, _), vals in stats.deltas.items() if s == step for v in vals]
    return float(np.mean(2 * ndtr(-np.asarray(deltas) / 2))) if deltas else 0.0


def _add_costs(a: Cost, b: Cost) -> Cost:
    return Cost(method="pilot", steps=a.steps, stochastic_steps=a.stochastic_steps,
                calls_per_trajectory=a.calls_per_trajectory + b.calls_per_trajectory,
                counted_calls=a.counted_calls + b.counted_calls, rows_per_trajectory=a.rows_per_trajectory + b.rows_per_trajectory,
                target_calls=a.target_calls + b.target_calls, wall_s=a.wall_s + b.wall_s, target_s=a.target_s + b.target_s)


def build_draft(config: SamplerConfig, target: Target, kernel: Kernel, device: torch.device) -> Draft:
    """"frozen", or a draft model (an embedded name, a folder or a Hub id) for a diffusers target."""
    if config.draft == "frozen":
        return FrozenDraft(config.freeze, config.prefetch)
    if not isinstance(target, DiffusersTarget):
        raise SpecdemoError(f"{target.name} takes only the frozen draft; got draft {config.draft!r}")
    draft_target = resolve_target(config.draft)
    if not isinstance(draft_target, DiffusersTarget) or not target.same_process(draft_target):
        raise SpecdemoError(
            f"draft {config.draft!r} cannot draft for {target.name}: a draft network needs the target's sample "
            "shape, classes and noise schedule"
        )
    return NetworkDraft(draft_target.network(kernel, device), name=config.draft)


def generate(config: SamplerConfig, **kwargs) -> tuple[SampleResult, Problem]:
    """Build and run; kwargs go to `sample` (trace, keep_steps, callback)."""
    problem = build(config)
    return problem.run(**kwargs), problem
