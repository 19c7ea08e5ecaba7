"""SamplerConfig -> Settings: every default filled in and every cross-setting rule checked, in one place.

`resolve` is the one function that reads a configuration against its model: the CLI, the Python API and
the app call it (through `build`, or alone to bound a click's work before any). Every refusal happens
here, before any pilot, network call or draft network load, and each is a `SettingError` naming the
setting, its value and what is accepted (or a `WorkLimitError`, from specdemo.limits). The settings come
back typed: a method, a freeze form, a start and a prefetch as enums, a fixed topology or a plan request,
and the verifier chosen (None where the planner chooses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

import torch

from .config import KERNEL_NAMES, SamplerConfig
from .errors import SettingError, SpecdemoError
from .limits import Limits
from .trees import Topology

if TYPE_CHECKING:  # the models and kernels are imported by the first resolve (the app's page builds without them)
    from .kernels import Kernel
    from .models import Target

DEFAULT_TREES = {"chain": "1x5", "tree": "auto"}  # a tree by default: planned per step
DEFAULT_VERIFIERS = {"chain": "rmc", "tree": "dgrs"}
MAX_PROMPT = 2000  # characters: the text encoders read 77 (CLIP) or 256 (T5) tokens
# What --tree auto alone uses, by device (a model may override it in Target.defaults["auto"]): on a CPU
# the settings the latency benchmark found fastest (docs/benchmarks.md, section "latency"), the verifier
# planned (block or RMC, whichever plan is expected faster); on CUDA the same with a larger budget, not
# yet tuned on a GPU.
AUTO_DEFAULTS = {
    "cpu": {"freeze": "auto", "prefetch": "auto", "verifier": "auto", "budget": 16},
    "cuda": {"freeze": "auto", "prefetch": "auto", "verifier": "auto", "budget": 64},
}
PILOT_DEPTH = 12  # a pilot run's chain length (planning.stats runs it)
AUTO_FORMS = ("out", "x0", "x0-linear", "gaussian")  # --freeze auto: the frozen forms it chooses among per step


class Method(StrEnum):
    TARGET = "target"
    CHAIN = "chain"
    TREE = "tree"


class Freeze(StrEnum):
    """What the draft keeps from the target (drafts/frozen.py: one class per frozen form)."""

    OUT = "out"
    X0 = "x0"
    X0_LINEAR = "x0-linear"
    GAUSSIAN = "gaussian"
    RESIDUAL = "residual"  # a draft network corrected by the target's residual
    AUTO = "auto"  # per step, planned


class Start(StrEnum):
    COLD = "cold"
    WARM = "warm"


class Prefetch(StrEnum):
    NEAREST = "nearest"
    PARENT = "parent"
    NONE = "none"
    LEAVES = "leaves"
    AUTO = "auto"  # per step, planned


@dataclass(frozen=True)
class PlanRequest:
    """What planning settles (specdemo.planning.plan): the topology per step within `budget` rows a round
    (tree), the draft's form per step (freeze), the verifier (verifier), for `objective`; pilot: measured by
    pilot runs of pilot_samples trajectories before the first run, else learnt from the setting's runs."""

    tree: bool
    freeze: bool
    verifier: bool
    budget: int | None
    objective: str
    pilot: bool
    pilot_samples: int
    draft_network: bool

    @property
    def pilot_runs(self) -> int:
        """The pilot runs planning pays before sampling: none without --pilot; with it one per frozen form
        under --freeze auto, and one more for the corrected draft network with a draft network (they serve
        --tree auto too), else one chain pilot for --tree auto."""
        if not self.pilot:
            return 0
        return len(AUTO_FORMS) + self.draft_network if self.freeze else int(self.tree)


@dataclass(frozen=True)
class Settings:
    """A configuration that passed every check made before any work. config has every default filled in;
    the other fields type it: topology is the fixed one (Topology(()) for plain sampling), None where plan
    asks for it to be planned; verifier is a name of specdemo.verifiers, None where the planner chooses it
    (and for plain sampling); cond is each trajectory's conditioning."""

    config: SamplerConfig
    target: Target
    kernel: Kernel
    device: torch.device
    method: Method
    topology: Topology | None
    verifier: str | None
    freeze: Freeze
    start: Start
    prefetch: Prefetch
    plan: PlanRequest | None
    cond: dict

    @property
    def rows_per_round(self) -> int:
        """The most target rows a round may evaluate: the budget or the tree's nodes, and the root's row of a
        warm-up round, which commits no step (1 for plain sampling)."""
        if self.method is Method.TARGET:
            return 1
        if self.topology is not None:
            return self.topology.num_nodes + 1
        assert self.plan is not None and self.plan.budget is not None  # --tree auto: planned within a budget
        return self.plan.budget + 1

    @property
    def round_nodes(self) -> int:
        """The most nodes a round holds: a fixed tree's, or a plan's, at most 2 x budget + 1 (the root whose
        output is known, the evaluated rows, and unevaluated leaves one per parent)."""
        if self.method is Method.TARGET:
            return 1
        if self.topology is not None:
            return self.topology.num_nodes
        assert self.plan is not None and self.plan.budget is not None  # --tree auto: planned within a budget
        return 2 * self.plan.budget + 1

    @property
    def pilot_runs(self) -> int:
        return self.plan.pilot_runs if self.plan is not None else 0

    @property
    def pilot_rows(self) -> int:
        """The most target rows the pilots may evaluate."""
        return self.pilot_runs * self.config.pilot_samples * self.kernel.num_steps * (PILOT_DEPTH + 1)


def resolve_device(name: str) -> torch.device:
    from .parallel import process_state  # with the sampling stack, which the app's page builds without

    state = process_state()
    if state is not None and name in ("auto", state.device.type):
        return state.device  # one device per process under accelerate launch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingError(
            "device",
            name,
            "auto, cpu",
            "device cuda was asked for but no CUDA GPU is available; use --device cpu or auto",
        )
    if name not in ("cpu", "cuda"):
        raise SettingError("device", name, "auto, cpu, cuda", f"unknown device {name!r}; accepted: auto, cpu, cuda")
    return torch.device(name)


def method_of(tree: str) -> Method:
    """The method a typed topology asks for: tree for "auto" (planned trees), chain where every width is 1,
    else tree (malformed widths are refused with the reason)."""
    if tree.strip().lower() == "auto":
        return Method.TREE
    return Method.CHAIN if Topology.parse(tree).is_chain else Method.TREE


def resolve(config: SamplerConfig, target: Target | None = None, *, limits: Limits | None = None) -> Settings:
    """Every default filled in (for --tree auto the fastest settings measured on this device, elsewhere the
    network output frozen, nearest-sibling prefetch, RMC for chains and D-GRS for trees) and every refusal
    `build` makes before any work, each naming the setting and what is accepted. target: config.model,
    already loaded. limits: what the run may ask for (default: Limits.from_env(), generous)."""
    c = config
    limits = limits or Limits.from_env()
    c.validate()
    if not 1 <= c.pilot_samples <= limits.max_samples:
        raise SettingError(
            "pilot_samples",
            c.pilot_samples,
            f"1..{limits.max_samples}",
            f"pilot_samples must be in 1..{limits.max_samples}, got {c.pilot_samples}",
        )
    if target is None:
        from .models import resolve_target

        target = resolve_target(c.model)
    kernel = _kernel(c, target, limits)
    device = resolve_device(c.device)
    method = Method(c.method)
    cond = _conditioning(c, target)
    if target.text_conditioned:
        c = replace(c, guidance_scale=_guidance(c, target.defaults["guidance_scale"]))
    if method is Method.TARGET:
        freeze, prefetch = c.freeze or "out", c.prefetch or "nearest"
        c = replace(c, freeze=freeze, prefetch=prefetch)
        return Settings(
            c,
            target,
            kernel,
            device,
            method,
            Topology(()),
            None,
            Freeze(freeze),
            Start(c.start or "cold"),
            Prefetch(prefetch),
            None,
            cond,
        )
    c = _defaults(c, target, kernel, device)
    assert c.freeze is not None and c.start is not None and c.prefetch is not None  # _defaults settles them
    auto = c.tree == "auto"
    topology = None if auto else _topology(c)
    _check_draft(c, target, kernel)
    plan = None
    if auto or c.freeze == "auto":
        plan = PlanRequest(
            tree=auto,
            freeze=c.freeze == "auto",
            verifier=c.verifier == "auto",
            budget=c.budget,
            objective=c.objective,
            pilot=c.pilot,
            pilot_samples=c.pilot_samples,
            draft_network=c.draft != "frozen",
        )
    settings = Settings(
        c,
        target,
        kernel,
        device,
        method,
        topology,
        None if c.verifier == "auto" else c.verifier,
        Freeze(c.freeze),
        Start(c.start),
        Prefetch(c.prefetch),
        plan,
        cond,
    )
    limits.check(
        steps=kernel.num_steps,
        num_samples=c.num_samples,
        rows_per_round=settings.rows_per_round,
        pilot_runs=settings.pilot_runs,
        pilot_samples=c.pilot_samples,
        pilot_rows_per_round=PILOT_DEPTH + 1,
    )
    return settings


def _kernel(c: SamplerConfig, target: Target, limits: Limits) -> Kernel:
    defaults = target.defaults
    name = c.kernel or defaults.get("kernel", target.kernels[0])
    if name not in KERNEL_NAMES:
        raise SettingError(
            "kernel", name, ", ".join(KERNEL_NAMES), f"unknown kernel {name!r}; accepted: {', '.join(KERNEL_NAMES)}"
        )
    steps = c.steps if c.steps is not None else defaults.get("steps", 100)
    limits.check(steps=steps, num_samples=c.num_samples, rows_per_round=1)  # before the kernel's tables
    return target.kernel(
        name,
        steps,
        eta=c.eta,
        churn=c.churn if c.churn is not None else defaults.get("churn", 0.06),
        gamma=c.gamma if c.gamma is not None else defaults.get("gamma", 0.01),
        prediction=c.prediction,
    )


def _defaults(c: SamplerConfig, target: Target, kernel: Kernel, device: torch.device) -> SamplerConfig:
    """A speculative method's defaults: for --tree auto the device's AUTO_DEFAULTS (or the model's own)."""
    auto = (c.tree or DEFAULT_TREES[c.method]).strip().lower() == "auto"
    best = {**AUTO_DEFAULTS[device.type], **target.defaults.get("auto", {})} if auto else {}
    freeze = c.freeze or best.get("freeze", "out")
    if c.freeze is None and freeze != "out" and not kernel.has_denoised:
        freeze = "out"  # the kernel has no x0-hat (Langevin)
    keeps_outputs = c.draft == "frozen" or freeze in ("residual", "auto")  # a draft that keeps target outputs
    # a draft network drafts a first round itself; the frozen draft guesses x0-hat where the kernel has it
    start = c.start or ("cold" if c.draft != "frozen" or kernel.has_denoised else "warm")
    return replace(
        c,
        tree="auto" if auto else (c.tree or DEFAULT_TREES[c.method]),
        freeze=freeze,
        start=start,
        prefetch=c.prefetch or (best.get("prefetch", "nearest") if keeps_outputs else "nearest"),
        verifier=c.verifier or best.get("verifier", DEFAULT_VERIFIERS[c.method]),
        budget=c.budget if c.budget is not None else best.get("budget"),
    )


def _topology(c: SamplerConfig) -> Topology:
    """A fixed topology, checked against the method and the verifier."""
    assert c.tree is not None  # _defaults settles it
    tree = Topology.parse(c.tree)
    if c.verifier == "auto":
        raise SettingError(
            "verifier",
            "auto",
            f"{'rmc, ' if tree.is_chain else ''}block, dgrs or rank",
            f"--verifier auto lets the planner choose block or RMC, which needs --tree auto; with "
            f"tree {tree} use {'rmc, ' if tree.is_chain else ''}block, dgrs or rank",
        )
    if c.method == "chain" and not tree.is_chain:
        raise SettingError(
            "tree",
            c.tree,
            "widths of 1 (1xL) for a chain",
            f"a chain has width 1 at every depth, got tree {tree}; use --method tree for it",
        )
    if c.prefetch == "auto":
        raise SettingError(
            "prefetch",
            "auto",
            "nearest, parent, none or leaves",
            "--prefetch auto lets the planner choose leaf evaluation per step, which needs --tree "
            f"auto; with tree {tree} use nearest, parent, none or leaves",
        )
    return tree


def _check_draft(c: SamplerConfig, target: Target, kernel: Kernel) -> None:
    """The rules between the model, the draft, what it freezes, how it starts and the kernel."""
    if c.tree == "auto" and (c.budget is None or c.budget < 1):
        raise SettingError(
            "budget",
            c.budget,
            ">= 1",
            "--tree auto needs a rows budget of at least 1 (--budget R: the target rows a round may use)",
        )
    network = c.draft != "frozen"
    if network and not target.takes_draft_networks:
        raise SettingError(
            "draft",
            c.draft,
            f"frozen ({target.name} takes only the frozen draft)",
            f"{target.name} takes only the frozen draft; got draft {c.draft!r}",
        )
    if c.freeze == "residual" and not network:
        raise SettingError(
            "freeze",
            "residual",
            "out, x0, x0-linear, gaussian or auto with the frozen draft",
            "--freeze residual corrects a draft network by the target's residual: use it with "
            "--draft NETWORK (digits-draft, digits-draft-distilled, a folder or a Hub id); the "
            "frozen draft takes out, x0, x0-linear, gaussian or auto",
        )
    if network and c.freeze not in ("out", "residual", "auto"):
        raise SettingError(
            "freeze",
            c.freeze,
            "out, residual or auto with a draft network",
            f"--freeze {c.freeze} is a form of the frozen draft; with the draft network {c.draft!r} "
            "use out (the network as it is), residual (corrected by the target's residual) or auto "
            "(per step, the corrected network or a frozen form)",
        )
    if not network and c.freeze != "out" and not kernel.has_denoised:
        raise SettingError(
            "freeze",
            c.freeze,
            f"out (the {kernel.name} kernel has no x0-hat)",
            f"--freeze {c.freeze} needs a denoised estimate, which the {kernel.name} kernel has not; use --freeze out",
        )
    if c.start == "warm" and network:
        raise SettingError(
            "start",
            "warm",
            "cold with a draft network",
            f"--start warm spends a warm-up call on the frozen draft's first round; the draft network "
            f"{c.draft!r} drafts it itself: leave out --start or use cold",
        )
    if c.start == "cold" and not network and not kernel.has_denoised:
        raise SettingError(
            "start",
            "cold",
            f"warm (the {kernel.name} kernel has no x0-hat)",
            f"--start cold drafts a first round from x0-hat = 0, which the {kernel.name} kernel has "
            "not; use --start warm",
        )


def _conditioning(c: SamplerConfig, target: Target) -> dict:
    """Each trajectory's class label, for a class-conditional model."""
    if target.num_classes:
        label = c.class_label if c.class_label is not None else 0
        if not 0 <= label < target.num_classes:
            raise SettingError(
                "class_label",
                label,
                f"0..{target.num_classes - 1}",
                f"class label {label} is out of range for {target.name}: accepted 0..{target.num_classes - 1}",
            )
        return {"class_labels": torch.full((c.num_samples,), label, dtype=torch.long)}
    if c.class_label is not None:
        raise SettingError(
            "class_label",
            c.class_label,
            "none for this model",
            f"{target.name} has no classes; leave out --class-label",
        )
    if not target.text_conditioned and (c.prompt or c.negative_prompt or c.guidance_scale is not None):
        raise SpecdemoError(
            f"{target.name} is not a text-to-image model; leave out --prompt, --negative-prompt and --guidance-scale"
        )
    return {}


def _guidance(c: SamplerConfig, default_guidance: float) -> float:
    """The run's guidance weight w, after checking the prompts and w."""
    guidance = c.guidance_scale if c.guidance_scale is not None else default_guidance
    if not (math.isfinite(guidance) and guidance >= 1):
        raise SettingError(
            "guidance_scale",
            guidance,
            ">= 1 (1: no guidance)",
            f"the guidance scale must be a finite number >= 1 (1: no guidance), got {guidance}",
        )
    for name, what, text in (("prompt", "prompt", c.prompt), ("negative_prompt", "negative prompt", c.negative_prompt)):
        if not isinstance(text, str) or len(text) > MAX_PROMPT:
            raise SettingError(
                name,
                text,
                f"text of at most {MAX_PROMPT} characters",
                f"the {what} must be text of at most {MAX_PROMPT} characters, got "
                f"{len(text) if isinstance(text, str) else type(text).__name__}",
            )
    if c.negative_prompt and guidance == 1:
        raise SettingError(
            "guidance_scale",
            guidance,
            "above 1 with a negative prompt",
            "a negative prompt acts through guidance; give a guidance scale above 1 or leave it out",
        )
    return guidance
