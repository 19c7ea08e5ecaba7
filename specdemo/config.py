"""SamplerConfig: every setting of a run, with its default, its help text and what it accepts.

This is the one place a run's settings are written down. The command line's `sample` options are
generated from these fields (specdemo.cli), the app reads the defaults and help of the settings it
shows from them (its controls are laid out by hand), and a config
round-trips through JSON (the `--out` file and an exported run carry it; `--config FILE.json` replays
it). The module imports nothing but the standard library, so that `specdemo --help` answers at once.

The accepted names (kernels, verifiers, ...) are defined here; the registries that implement them
(specdemo.verifiers.VERIFIERS, specdemo.sampling.PREFETCH, specdemo.targets.PRESETS) are checked
against these names by tests/test_packaging.py.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from .errors import SettingError, SpecdemoError

METHODS = ("target", "chain", "tree")
KERNEL_NAMES = ("ddpm", "ddim", "euler-ancestral", "flow-churn", "langevin")
VERIFIER_NAMES = ("rmc", "dgrs", "rank", "block")
PLANNED_VERIFIERS = ("block", "rmc")  # what --verifier auto plans with, in the order ties are kept
FREEZE = ("out", "x0", "x0-linear", "gaussian", "residual", "auto")
PREFETCH_NAMES = ("nearest", "parent", "none", "leaves", "auto")
STARTS = ("cold", "warm")
OBJECTIVES = ("time", "calls")
PREDICTIONS = ("epsilon", "v_prediction", "sample")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHES = ("auto", "graphs", "compile", "eager")  # specdemo.sampling.graphs
PRESET_NAMES = ("gm2d", "gm16", "gm512", "banana", "ring")
EMBEDDED_NAMES = ("digits", "digits-draft", "digits-draft-distilled")
TOPOLOGY_HELP = (
    'widths per depth such as "3,2,1", "KxL" for a uniform tree (K children per node, depth L; '
    '"1xL" is a chain of length L), or "chain:L"'
)
MODEL_HELP = (
    f"a preset ({', '.join(PRESET_NAMES)}), a mixture .json file, {', '.join(EMBEDDED_NAMES)}, "
    "a diffusers folder (a pixel UNet, a Stable Diffusion 1.x/2.x or an SD3-class pipeline) or a Hub id"
)


def _is_a(value, kind: type) -> bool:
    """Whether a JSON value is of a field's type: an integer is a float's value too; a bool is no number."""
    if kind is type(None):
        return value is None
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


ARGPARSE_KEYS = ("help", "choices", "metavar")  # the metadata keys that are argparse's own


def setting(default, help: str, **accepts):
    """A SamplerConfig field: its default, its help text (the CLI's and the app's), and what it accepts:
    choices and metavar (argparse's names); range=(lo, hi), the values accepted (inclusive, None for
    no bound; validate() refuses the others); slider=(lo, hi), the span an interactive control offers
    (within range; values outside it stay accepted)."""
    return field(default=default, metadata={"help": help, **accepts})


def field_type(cls, f) -> type:
    """A config field's type, None left out of an optional one (int | None: int)."""
    hint = typing.get_type_hints(cls)[f.name]
    return next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that defines a run. None means "the default": the model's (Target.defaults), and
    for --tree auto the fastest settings measured on the device (specdemo.resolve.AUTO_DEFAULTS)."""

    model: str = setting(
        "digits",
        MODEL_HELP + ", such as google/ddpm-cifar10-32; a mixture file holds "
        '{"weights": [...], "means": [[...], ...], "stds": [...]}',
        metavar="SPEC",
    )
    kernel: str | None = setting(None, "sampler kernel (default: the model's; gm512: flow-churn)", choices=KERNEL_NAMES)
    steps: int | None = setting(None, "number of sampler steps N (default: the model's)")
    eta: float = setting(1.0, "DDIM eta in [0, 1]; 0 is deterministic", range=(0.0, 1.0))
    churn: float | None = setting(
        None, "flow-matching churn c >= 0 (default: the model's, else 0.06)", range=(0.0, None), slider=(0.0, 1.0)
    )
    gamma: float | None = setting(None, "Langevin step size gamma > 0 (default: the model's, else 0.01)")
    prediction: str = setting(
        "epsilon", "what an analytic mixture's network predicts under ddpm/ddim", choices=PREDICTIONS
    )
    method: str = setting("tree", "plain target sampling, a chain or a tree", choices=METHODS)
    tree: str | None = setting(
        None,
        f"topology: {TOPOLOGY_HELP}; or auto, planned per step (default: a 1x5 chain; for a tree, auto)",
        metavar="WIDTHS",
    )
    verifier: str | None = setting(
        None,
        "rmc (chains only), block (weighs the whole chain or tree at once), dgrs, "
        "rank, or with --tree auto: auto, planned with block and with rmc, keeping "
        "the plan of fewer expected seconds or calls. Default: rmc for a chain, "
        "dgrs for a tree, auto for --tree auto",
        choices=(*VERIFIER_NAMES, "auto"),
    )
    draft: str = setting(
        "frozen",
        "frozen (the training-free frozen target), or a draft network for an image "
        "model: digits-draft, digits-draft-distilled, a folder or a Hub id",
    )
    freeze: str | None = setting(
        None,
        "freeze the network output (out), the denoised estimate x0-hat (x0), x0-hat "
        "extrapolated in time from the last two target outputs (x0-linear), x0-hat of a "
        "Gaussian fitted to them (gaussian), or per step (auto: gaussian until --pilot "
        "runs choose a form per step); with a draft network: the network as it is (out), "
        "corrected by the target's residual (residual), or per step the corrected network "
        "or a frozen form (auto: the corrected network until --pilot runs choose) "
        "(default: out; auto with --tree auto)",
        choices=FREEZE,
    )
    start: str | None = setting(
        None,
        "how the frozen draft gets a trajectory's first frozen output: cold (no warm-up "
        "call: the output of a plain or deterministic step the trajectory took, else "
        "x0-hat = 0) or warm (a warm-up call evaluates the root alone, as the draft-tree "
        "authors do); a draft network always starts cold (default: cold, warm for a "
        "kernel without x0-hat)",
        choices=STARTS,
    )
    draft_bias: float = setting(
        0.0,
        "shift the draft mean by B times the step's scale along a fixed direction; samples stay exact",
        metavar="B",
        slider=(0.0, 3.0),
    )
    prefetch: str | None = setting(
        None,
        "frozen output that starts a round: nearest sibling, parent, none "
        "(re-evaluate the root), leaves (evaluate leaves too), or auto (nearest, "
        "leaves evaluated at the steps where --tree auto plans it) (default: "
        "nearest; auto with --tree auto)",
        choices=PREFETCH_NAMES,
    )
    budget: int | None = setting(
        None,
        "with --tree auto: at most R target rows per round; the setting's first "
        "runs (or --pilot) measure delta, then a dynamic programme picks the widths "
        "of every step (default: the fastest measured on the device, 16 on a CPU)",
        metavar="R",
        range=(1, None),
        slider=(1, 64),
    )
    objective: str = setting(
        "time",
        "with --tree auto: minimise the expected wall-clock (time; a call's cost by "
        "its rows is measured on the device) or the expected target calls (calls)",
        choices=OBJECTIVES,
    )
    pilot_samples: int = setting(
        32,
        "trajectories whose deltas plan --tree auto and --freeze auto: measured by the setting's runs, or with "
        "--pilot by each pilot run",
        metavar="P",
    )
    num_samples: int = setting(16, "samples to draw", metavar="M")
    max_batch: int | None = setting(
        None,
        "at most B trajectories in flight; a finished one frees its slot for the "
        "next (continuous batching; default: all at once)",
        metavar="B",
    )
    seed: int = setting(0, "same seed, device, --max-batch and CPU threads: same samples")
    device: str = setting("auto", "where to run", choices=DEVICES)
    launch: str = setting(
        "auto",
        "how the target network runs on a GPU: graphs (each call size captured once as a "
        "CUDA graph, replayed: one launch a call), compile (torch.compile), eager; auto: "
        "graphs on CUDA, eager on a CPU",
        choices=LAUNCHES,
    )
    class_label: int | None = setting(
        None, "class to sample, for class-conditional models such as digits (default 0)", metavar="0..9"
    )
    prompt: str = setting("", "for text-to-image models: what to draw, encoded once per run", metavar="TEXT")
    negative_prompt: str = setting(
        "", "for text-to-image models: what to steer away from, with a guidance scale above 1", metavar="TEXT"
    )
    guidance_scale: float | None = setting(
        None,
        "for text-to-image models: classifier-free guidance weight w >= 1, "
        "1 for none (default: the model's; 7.5 for Stable Diffusion 1.x/2.x, "
        "7.0 for SD3)",
        metavar="W",
    )
    cache_dir: str | None = setting(
        None,
        "where plans are kept between runs, or off (default: $SPECDEMO_CACHE, else ~/.cache/specdemo)",
        metavar="DIR",
    )
    replan: bool = setting(
        False, "plan again, even if a plan is cached: learn from this run's deltas (or with --pilot, from new pilots)"
    )
    pilot: bool = setting(
        False,
        "measure the deltas --tree auto and --freeze auto plan from with pilot runs "
        "before the first run (default: the setting's own runs measure them, and the "
        "run after P trajectories, --pilot-samples, plans from them)",
    )

    def validate(self) -> None:
        """What can be checked without the model, each a one-line SpecdemoError naming the setting and
        what is accepted: names among the accepted ones, finite numbers, numbers within their field's
        range, the seed's range (specdemo.resolve checks the rest, against the model and the work
        limits)."""
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata.get("choices")
            if choices and value is not None and value not in choices:
                raise SettingError(
                    f.name, value, ", ".join(choices), f"unknown {f.name} {value!r}; accepted: {', '.join(choices)}"
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingError(f.name, value, "a finite number", f"{f.name} must be a finite number, got {value}")
            lo, hi = f.metadata.get("range", (None, None))
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and ((lo is not None and value < lo) or (hi is not None and value > hi))
            ):
                accepted = f"in {lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
                raise SettingError(f.name, value, accepted, f"{f.name} must be {accepted}, got {value:g}")
        if not 0 <= self.seed < 2**63:
            raise SettingError("seed", self.seed, "0..2**63 - 1", f"the seed must be in 0..2**63 - 1, got {self.seed}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SamplerConfig:
        """Settings by name (a saved config), each checked against its field's type."""
        hints = typing.get_type_hints(cls)
        unknown = set(d) - set(hints)
        if unknown:
            raise SpecdemoError(f"unknown settings {sorted(unknown)}; accepted: {sorted(hints)}")
        for name, value in d.items():
            kinds = typing.get_args(hints[name]) or (hints[name],)
            if not any(_is_a(value, kind) for kind in kinds):
                accepted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise SpecdemoError(f"setting {name} must be {accepted}, got {json.dumps(value)[:40]}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, path: str | Path) -> SamplerConfig:
        """A config saved by to_json (or the "config" entry of a saved run)."""
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise SpecdemoError(f"cannot read a config from {str(path)[:80]!r}: {err}") from None
        if not isinstance(d, dict):
            raise SpecdemoError(f"{str(path)[:80]!r} holds no config (a JSON object of settings)")
        return cls.from_dict(d.get("config", d) if isinstance(d.get("config"), dict) else d)

    def with_method(self, method: str, tree: str | None = None) -> SamplerConfig:
        """The same run with another method (for side-by-side comparisons); prefetch auto, which
        only a planned topology takes, becomes its fixed-tree part, nearest, and verifier auto the method's
        default."""
        planned = (tree or "").strip().lower() == "auto"
        keeps_verifier = method == self.method and (planned or self.verifier != "auto")  # auto verifies plans only
        return replace(
            self,
            method=method,
            tree=tree,
            verifier=self.verifier if keeps_verifier else None,
            prefetch="nearest" if self.prefetch == "auto" and not planned else self.prefetch,
        )
