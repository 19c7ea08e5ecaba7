"""One serialisable configuration for a run, resolved into the sampler's objects.

The CLI, the app and the benchmarks all go through `SamplerConfig` and `generate`.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch

from .config import KERNEL_NAMES, SamplerConfig
from .planning import PILOT_DEPTH, Plan, call_seconds, call_sizes, learn, learnt_seed, pilot_runs, plan
from .drafts import CorrectedNetworkDraft, Draft, FrozenDraft, NetworkDraft
from .errors import SettingError, SpecdemoError
from .kernels import Kernel
from .limits import Cancel, Limits
from .models import Target, resolve_target
from .parallel import Broadcast, process_state
from .sampling import Cost, SampleResult, sample
from .sampling.graphs import launched
from .trees import Topology, TopologyPlan
from .trees.auto import DeltaStats
from .trees.cost_model import PADDED_ROWS, CostModel
from .verifiers import Verifier, get_verifier

DEFAULT_TREES = {"chain": "1x5", "tree": "auto"}  # a tree by default: planned per step
DEFAULT_VERIFIERS = {"chain": "rmc", "tree": "dgrs"}
MAX_PROMPT = 2000  # characters: the text encoders read 77 (CLIP) or 256 (T5) tokens
_WARM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(device, call size)} set up
# What --tree auto alone uses, by device (a model may override it in Target.defaults["auto"]): on a CPU
# the settings the latency benchmark found fastest (docs/benchmarks.md, section "latency"), the verifier
# planned (block or RMC, whichever plan is expected faster); on CUDA the same with a larger budget, not
# yet tuned on a GPU.
AUTO_DEFAULTS = {
    "cpu": {"freeze": "auto", "prefetch": "auto", "verifier": "auto", "budget": 16},
    "cuda": {"freeze": "auto", "prefetch": "auto", "verifier": "auto", "budget": 64},
}


@dataclass(frozen=True)
class Problem:
    """A resolved configuration: what `sample` is called with. Built by `build`; calibration (pilots,
    plans) returns a new Problem. tree is None only between the two, for --tree auto; verifier is None
    there too for --verifier auto (and for plain sampling)."""

    config: SamplerConfig
    target: Target
    kernel: Kernel
    network: object
    tree: Topology | TopologyPlan | None
    draft: Draft | None
    verifier: Verifier | None
    device: torch.device
    cond: dict
    pilot: Cost | None = None  # the pilot runs, when this build ran them (not part of the run's cost)
    stats: DeltaStats | None = None  # the measured deltas (a pilot's or the runs'), which an auto topology is planned from
    cost_model: CostModel | None = None  # what a round costs, for the time objective
    # for calibrated settings: "pilot", "runs" (planned from earlier runs' deltas), "cache", "shipped", "online"
    # (no plan yet: the online plan, whose runs learn) or "default" (a fixed tree, --freeze auto's first table)
    plan_source: str | None = None
    learnt: bool = False  # the plan was learnt from the setting's runs (stream_seed)
    calibration_s: float = 0.0  # pilots, cost measurement and planning, when this build ran them
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

    def run(self, indices=None, *, with_pilot: bool = False, **kwargs) -> SampleResult:
        """Sample every trajectory, or only trajectories `indices` (a process's share). with_pilot:
        charge this build's pilot runs to the run's cost (pilot_calls, pilot_s, speedup_total)."""
        num = self.config.num_samples if indices is None else len(indices)
        cond = self.cond if indices is None else {k: v[list(indices)] for k, v in self.cond.items()}
        learns = self.plan_source == "online" and _learning_process()
        traced = kwargs.pop("trace", False)
        if learns and not traced:  # learning reads the deltas alone: no node states kept on the host
            kwargs["trace_states"] = False
        result = sample(self.network, self.kernel, self.target.shape, num, tree=self.tree, draft=self.draft,
                        verifier=self.verifier, prefetch=self.config.prefetch, seed=self.stream_seed,
                        indices=indices, cond=cond, device=self.device, dtype=self.dtype,
                        max_batch=self.config.max_batch, trace=traced or learns, **kwargs)
        if learns:  # the run's deltas plan the setting's later runs (planning.learn)
            learn(self, result.trace, num)
            result.trace = result.trace if traced else None
        if with_pilot and self.pilot is not None:
            result.cost.pilot_calls, result.cost.pilot_s = self.pilot.target_calls, self.calibration_s
        return result


def _learning_process() -> bool:
    """Whether this process keeps its runs' deltas: the only one, or the main one under accelerate launch
    (the others sample with the plan it sends them)."""
    state = process_state()
    return state is None or state.is_main_process


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
        raise SettingError(what, value, ", ".join(accepted), f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")


def resolve(config: SamplerConfig, target: Target, kernel: Kernel, device: torch.device) -> SamplerConfig:
    """The configuration with every default filled in: for --tree auto the fastest settings measured
    on this device, elsewhere the network output frozen, nearest-sibling prefetch, RMC for chains and
    D-GRS for trees."""
    c = config
    if c.method == "target":
        return replace(c, freeze=c.freeze or "out", prefetch=c.prefetch or "nearest")
    auto = (c.tree or DEFAULT_TREES[c.method]).strip().lower() == "auto"
    best = {**AUTO_DEFAULTS[device.type], **target.defaults.get("auto", {})} if auto else {}
    freeze = c.freeze or best.get("freeze", "out")
    if c.freeze is None and freeze != "out" and not kernel.has_denoised:
        freeze = "out"  # the kernel has no x0-hat (Langevin)
    keeps_outputs = c.draft == "frozen" or freeze in ("residual", "auto")  # a draft that keeps target outputs
    # a draft network drafts a first round itself; the frozen draft guesses x0-hat where the kernel has it
    start = c.start or ("cold" if c.draft != "frozen" or kernel.has_denoised else "warm")
    return replace(c, tree="auto" if auto else c.tree, freeze=freeze, start=start,
                   prefetch=c.prefetch or (best.get("prefetch", "nearest") if keeps_outputs else "nearest"),
                   verifier=c.verifier or best.get("verifier", DEFAULT_VERIFIERS[c.method]),
                   budget=c.budget if c.budget is not None else best.get("budget"))


class Checked(NamedTuple):
    """A configuration that passed every check made before any work: its defaults resolved, its kernel
    and device, its fixed topology (None for tree auto; Topology(()) for plain sampling) and each
    trajectory's conditioning."""

    config: SamplerConfig
    target: Target
    kernel: Kernel
    device: torch.device
    tree: Topology | None
    cond: dict


def check_config(config: SamplerConfig, target: Target | None = None, *, limits: Limits | None = None) -> Checked:
    """Every refusal `build` makes before any work (no pilot, no network call, no draft network
    loaded), each naming the problem and what is accepted. limits: what the run may ask for
    (default: Limits.from_env(), generous)."""
    c = config
    limits = limits or Limits.from_env()
    c.validate()
    if not 1 <= c.pilot_samples <= limits.max_samples:
        raise SettingError("pilot_samples", c.pilot_samples, f"1..{limits.max_samples}",
                           f"pilot_samples must be in 1..{limits.max_samples}, got {c.pilot_samples}")
    target = target or resolve_target(c.model)
    defaults = target.defaults
    kernel_name = c.kernel or defaults.get("kernel", target.kernels[0])
    _choice(kernel_name, KERNEL_NAMES, "kernel")
    steps = c.steps if c.steps is not None else defaults.get("steps", 100)
    limits.check(steps=steps, num_samples=c.num_samples, rows_per_round=1)  # before the kernel's tables
    kernel = target.kernel(kernel_name, steps, eta=c.eta,
                           churn=c.churn if c.churn is not None else defaults.get("churn", 0.06),
                           gamma=c.gamma if c.gamma is not None else defaults.get("gamma", 0.01),
                           prediction=c.prediction)
    device = resolve_device(c.device)
    c = resolve(c, target, kernel, device)
    tree = Topology(())
    if c.method != "target":
        auto = c.tree == "auto"
        if auto and (c.budget is None or c.budget < 1):
            raise SpecdemoError("--tree auto needs a rows budget of at least 1 (--budget R: the target rows a round "
                                "may use)")
        tree = None if auto else Topology.parse(c.tree or DEFAULT_TREES[c.method])
        if c.verifier == "auto" and not auto:
            raise SpecdemoError(f"--verifier auto lets the planner choose block or RMC, which needs --tree auto; with "
                                f"tree {tree} use {'rmc, ' if tree.is_chain else ''}block, dgrs or rank")
        if c.method == "chain" and tree is not None and not tree.is_chain:
            raise SpecdemoError(f"a chain has width 1 at every depth, got tree {tree}; use --method tree for it")
        if c.freeze == "residual" and c.draft == "frozen":
            raise SpecdemoError("--freeze residual corrects a draft network by the target's residual: use it with "
                                "--draft NETWORK (digits-draft, digits-draft-distilled, a folder or a Hub id); the frozen draft takes out, x0, "
                                "x0-linear, gaussian or auto")
        if c.draft != "frozen" and c.freeze not in ("out", "residual", "auto"):
            raise SpecdemoError(f"--freeze {c.freeze} is a form of the frozen draft; with the draft network {c.draft!r} "
                                "use out (the network as it is), residual (corrected by the target's residual) or auto "
                                "(per step, the corrected network or a frozen form)")
        if c.start == "warm" and c.draft != "frozen":
            raise SpecdemoError(f"--start warm spends a warm-up call on the frozen draft's first round; the draft network "
                                f"{c.draft!r} drafts it itself: leave out --start or use cold")
        if c.start == "cold" and c.draft == "frozen" and not kernel.has_denoised:
            raise SpecdemoError(f"--start cold drafts a first round from x0-hat = 0, which the {kernel.name} kernel has "
                                "not; use --start warm")
        pilots = pilot_runs(auto, c.freeze, network=c.draft != "frozen", pilot=c.pilot)
        # a warm-up round adds the root's row and commits no step: one more row a round at most
        limits.check(steps=steps, num_samples=c.num_samples, rows_per_round=(c.budget if auto else tree.num_nodes) + 1,
                     pilot_runs=pilots, pilot_samples=c.pilot_samples, pilot_rows_per_round=PILOT_DEPTH + 1)
    cond = {}
    if target.num_classes:
        label = c.class_label if c.class_label is not None else 0
        if not 0 <= label < target.num_classes:
            raise SettingError("class_label", label, f"0..{target.num_classes - 1}",
                               f"class label {label} is out of range for {target.name}: accepted 0..{target.num_classes - 1}")
        cond["class_labels"] = torch.full((c.num_samples,), label, dtype=torch.long)
    elif c.class_label is not None:
        raise SpecdemoError(f"{target.name} has no classes; leave out --class-label")
    if target.text_conditioned:
        c = replace(c, guidance_scale=check_prompts(c, defaults["guidance_scale"]))
    elif c.prompt or c.negative_prompt or c.guidance_scale is not None:
        raise SpecdemoError(f"{target.name} is not a text-to-image model; leave out --prompt, --negative-prompt and "
                            "--guidance-scale")
    return Checked(c, target, kernel, device, tree, cond)


def check_prompts(c: SamplerConfig, default_guidance: float) -> float:
    """The run's guidance weight w, after checking the prompts and w."""
    guidance = c.guidance_scale if c.guidance_scale is not None else default_guidance
    if not (math.isfinite(guidance) and guidance >= 1):
        raise SpecdemoError(f"the guidance scale must be a finite number >= 1 (1: no guidance), got {guidance}")
    for what, text in (("prompt", c.prompt), ("negative prompt", c.negative_prompt)):
        if not isinstance(text, str) or len(text) > MAX_PROMPT:
            raise SpecdemoError(f"the {what} must be text of at most {MAX_PROMPT} characters, got "
                                f"{len(text) if isinstance(text, str) else type(text).__name__}")
    if c.negative_prompt and guidance == 1:
        raise SpecdemoError("a negative prompt acts through guidance; give a guidance scale above 1 or leave it out")
    return guidance


def build(config: SamplerConfig, target: Target | None = None, *, draft_target: Target | None = None,
          limits: Limits | None = None, cancel: Cancel | None = None, share: Broadcast | None = None) -> Problem:
    """Check a configuration (check_config), then plan it (specdemo.planning: learnt, from pilots, or the plan cache);
    cancel stops the pilots between rounds. target, draft_target: the models config.model and
    config.draft name, already loaded (by default they are loaded here). share: under accelerate
    launch, every process takes the main process's plan (specdemo.planning.plan)."""
    problem = prepare(config, target, draft_target=draft_target, limits=limits)
    return warm_up(problem if problem.config.method == "target" else problem.planned(plan(problem, cancel, share)))


def prepare(config: SamplerConfig, target: Target | None = None, *, draft_target: Target | None = None,
            limits: Limits | None = None) -> Problem:
    """The checked problem before calibration: its draft as configured, an auto tree not yet planned."""
    c, target, kernel, device, tree, cond = check_config(config, target, limits=limits)
    draft = verifier = None
    if c.method != "target":
        verifier = None if c.verifier == "auto" else get_verifier(c.verifier)  # auto: chosen by calibration
        draft = build_draft(c, target, kernel, device, draft_target)
    if target.text_conditioned:  # the prompts encoded once for the run, every trajectory's rows a view of it
        cond = {**cond, **target.prompt_conditioning(c.prompt, c.negative_prompt, c.guidance_scale, c.num_samples,
                                                     device)}
    return Problem(c, target, kernel, launched(target.network(kernel, device), c.launch, device), tree, draft,
                   verifier, device, cond)


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


def build_draft(config: SamplerConfig, target: Target, kernel: Kernel, device: torch.device,
                draft_target: Target | None = None) -> Draft:
    """"frozen", or a draft model (an embedded name, a folder or a Hub id) for a diffusers target: the
    target's conditioning (class labels, prompt embeddings and guidance) goes to the draft network too;
    with --freeze residual the network is corrected by the target's residual (CorrectedNetworkDraft)."""
    if config.draft == "frozen":
        return FrozenDraft(config.freeze, start=config.start)
    if not target.takes_draft_networks:
        raise SpecdemoError(f"{target.name} takes only the frozen draft; got draft {config.draft!r}")
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
