"""Command line: `specdemo sample ...` and `specdemo bench ...` (or `python -m specdemo ...`).

`sample` prints one JSON object as the last line of stdout. Bad arguments exit with status 2 and a
one-line reason on stderr, never a traceback.

sample's options are generated from SamplerConfig's fields (specdemo.config: each field's default, help
and accepted values), so a new setting is a new field. Building the parser imports nothing but the
standard library and specdemo.config, so that --help answers at once: torch and the library are imported
by the command that runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import fields
from pathlib import Path

from .config import ARGPARSE_KEYS, SamplerConfig, field_type
from .errors import SpecdemoError


def sample_options() -> list[tuple[str, dict]]:
    """sample's options, one per SamplerConfig field (the field draft_bias is the option --draft-bias):
    default, help and accepted values from the field (the metadata argparse knows: ARGPARSE_KEYS; a
    field's range is checked by SamplerConfig.validate); the type from its annotation."""
    options = []
    for f in fields(SamplerConfig):
        accepts = {key: value for key, value in f.metadata.items() if key in ARGPARSE_KEYS}
        kind = field_type(SamplerConfig, f)
        if kind is bool:
            options.append(
                (
                    f"--{f.name.replace('_', '-')}",
                    dict(action=argparse.BooleanOptionalAction, default=f.default, **accepts),
                )
            )
            continue
        accepts["type"] = kind
        if f.default not in (None, ""):
            accepts["help"] += " (default %(default)s)"
        options.append((f"--{f.name.replace('_', '-')}", dict(default=f.default, **accepts)))
    return options


# the process's own settings (not a run's): where sample writes, besides the JSON line on stdout, and its threads
# on a CPU, one thread a run: runs side by side oversubscribe the cores least (on 2 cores beside a second
# 2-thread torch process, the app's default click took over 120 s instead of 2.4 s: tests/conftest.py). A run
# alone took its calls of several rows faster at torch's own threads, its 1-row calls not (docs/benchmarks.md,
# section online)
CPU_THREADS = 1
PROCESS_OPTIONS: tuple[tuple[str, dict], ...] = (
    (
        "--threads",
        dict(
            type=int,
            metavar="T",
            help=f"torch's CPU threads for the run, which the planner's costs are "
            f"measured with too (default {CPU_THREADS} on a CPU: runs side by "
            "side oversubscribe the cores least; 0: torch's default, which "
            "took a run's calls of several rows faster where it ran alone). "
            "The samples are the same for the same seed, device, batch and "
            "threads",
        ),
    ),
    ("--out", dict(metavar="FILE.npz", help="save `samples` (and the config and cost) here")),
    ("--grid", dict(metavar="FILE.png", help="for image models: save the samples as a PNG grid")),
    ("--trace", dict(metavar="FILE.json", help="save every round's tree (no states) as JSON")),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def sample_settings(args: argparse.Namespace) -> dict:
    """The SamplerConfig fields that sample's options set, by name (--draft-bias sets draft_bias)."""
    return {f.name: getattr(args, f.name) for f in fields(SamplerConfig)}


def _sample(args) -> int:  # noqa: C901, PLR0912, PLR0915 (issue 56 splits it)
    import numpy as np
    import torch

    from .images import save_grid
    from .limits import Cancel, Limits
    from .parallel import Broadcast, gather, launched_by_torchrun, my_indices, process_state, single_process_note
    from .pipeline import build
    from .trees import TopologyPlan

    config = SamplerConfig(**sample_settings(args))
    if args.trace and launched_by_torchrun():
        raise SpecdemoError("--trace is for single-process runs; leave it out under accelerate launch")
    for option, path in (("--out", args.out), ("--grid", args.grid), ("--trace", args.trace)):
        if path and not Path(path).resolve().parent.is_dir():
            raise SpecdemoError(f"{option} {path[:80]!r}: its folder does not exist")
    limits = Limits.from_env()
    cancel = Cancel(limits.max_seconds)  # SPECDEMO_MAX_SECONDS, if set
    threads = cpu_threads(args.threads, config.device)
    if threads:  # before the build, so that a plan priced by time is priced as the run runs
        torch.set_num_threads(threads)
    state = process_state()
    problem = build(config, limits=limits, cancel=cancel, share=Broadcast(state) if state else None)
    if args.grid and len(problem.target.shape) != 3:
        raise SpecdemoError(f"--grid draws images; {config.model} samples are vectors of shape {problem.target.shape}")
    if note := single_process_note():
        print(note, file=sys.stderr)
    if state is None:
        result = problem.run(trace=args.trace is not None, trace_states=False, with_pilot=True, cancel=cancel)
        samples, cost = result.samples.cpu().numpy(), result.cost
    else:
        indices = my_indices(state, config.num_samples)
        try:
            result = problem.run(indices=indices, with_pilot=True, cancel=cancel)
            gathered = gather(state, indices, result.samples, result.cost)
        finally:
            # every process leaves the group before it exits: a gloo thread that outlives it aborts
            state.destroy_process_group()
        if gathered is None:
            return 0  # the main process writes the outputs
        samples, cost = gathered
    # the plan made, whether it ran or was declined (--objective time: plain sampling was expected faster)
    made = problem.declined.tree if problem.declined is not None else problem.tree
    plan = made if isinstance(made, TopologyPlan) else None
    planned = plan if plan is not None and plan.predicts else None
    c = problem.config
    summary = {
        **cost.summary(),
        "method": c.method,
        "model": c.model,
        "kernel": problem.kernel.name,
        "tree": str(problem.tree),
        "verifier": problem.verifier.name if problem.verifier else None,
        "freeze": c.freeze,
        "prefetch": c.prefetch,
        "budget": c.budget,
        "objective": c.objective if plan else None,
        "plan_source": problem.plan_source,
        "plan_cached": problem.plan_source in ("cache", "shipped") if problem.plan_source else None,
        "planned_calls": planned.expected_calls if planned else None,
        "planned_s": planned.expected_s if planned else None,
        "declined": problem.declined is not None,
        "plain_s": problem.plain_s,
        "warmup_s": problem.warmup_s,
        "device": str(problem.device),
        "seed": c.seed,
        "threads": torch.get_num_threads(),
        "processes": state.num_processes if state else 1,
    }
    if args.out:
        np.savez(args.out, samples=samples, config=json.dumps(c.to_dict()), cost=json.dumps(summary))
    if args.grid:
        images = torch.from_numpy(samples)
        if problem.target.text_conditioned:  # latents: the VAE draws them
            images = problem.target.decode(images.to(problem.device)).cpu()
        save_grid(images, args.grid)
    if args.trace:
        assert result.trace is not None  # the run was traced (--trace)
        Path(args.trace).write_text(
            json.dumps({"config": c.to_dict(), "cost": summary, "rounds": [r.to_json() for r in result.trace]})
        )
    print(json.dumps(summary, allow_nan=False))
    return 0


def cpu_threads(asked: int | None, device: str) -> int:
    """The threads to set: as asked (0: leave torch's default), else CPU_THREADS where the run is on a CPU."""
    import torch

    if asked is not None:
        if asked < 0:
            raise SpecdemoError(f"--threads must be >= 0 (0: torch's default), got {asked}")
        return asked
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return CPU_THREADS if on_cpu else 0


def _bench(argv: list[str], prog: str) -> int:
    """`bench`: the benchmarks' runner (benchmarks/run.py), which lives in the checkout next to this
    package and is not installed with it; it parses its own options."""
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "benchmarks" / "run.py").is_file():
        raise SpecdemoError(
            "the benchmarks are not part of the installed package: run `python -m benchmarks.run` "
            "(or this command) from a checkout of the repository"
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    runner = importlib.import_module("benchmarks.run")  # the checkout's folder, not an installed distribution
    return runner.main(argv, prog=f"{prog} bench")


def build_parser(prog: str = "specdemo", sample_defaults: dict | None = None) -> argparse.ArgumentParser:
    """The command line; sample_defaults (SamplerConfig settings) replace the fields' defaults."""
    parser = _Parser(prog=prog, description="Exact speculative sampling for diffusion models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser(
        "sample",
        help="draw samples and print the cost as JSON",
        description="Draw exact samples of the target; print the cost as one JSON line.",
    )
    p.add_argument(
        "--config",
        metavar="FILE.json",
        help="start from the settings saved in this file (SamplerConfig.to_json, or a run's --trace "
        "file); the options given here change them",
    )
    for flag, options in sample_options() + list(PROCESS_OPTIONS):
        p.add_argument(flag, **options)
    p.set_defaults(**(sample_defaults or {}))
    p.set_defaults(func=_sample)
    # the options are the runner's own (`bench --help` lists them): everything after `bench` goes to it
    sub.add_parser("bench", add_help=False, help="run the benchmarks and write docs/benchmarks.md (from a checkout)")
    return parser


def main(argv=None, prog: str = "specdemo") -> int:
    """The `specdemo` command; `python -m specdemo` passes its own name as prog."""
    parser = build_parser(prog)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "bench":
            return _bench(rest, prog)
        args = parser.parse_args(argv)  # anywhere but in bench, an unknown option is an error
        if getattr(args, "config", None):  # the file's settings become the defaults the options change
            args = build_parser(prog, SamplerConfig.from_json(args.config).to_dict()).parse_args(argv)
        return args.func(args)
    except (SpecdemoError, OSError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
