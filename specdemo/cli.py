"""Command line: `python -m specdemo sample ...` and `python -m specdemo bench ...`.

`sample` prints one JSON object as the last line of stdout. Bad arguments exit with status 2 and a
one-line reason on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from .drafts import FREEZE
from .errors import SpecdemoError
from .limits import Cancel, Limits
from .images import save_grid
from .models import KERNEL_NAMES
from .parallel import gather, launched_by_torchrun, my_indices, process_state
from .pipeline import METHODS, OBJECTIVES, SamplerConfig, build
from .sampling import PREFETCH
from .targets.presets import PRESETS
from .trees import TOPOLOGY_HELP, TopologyPlan
from .verifiers import VERIFIERS


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_sample_args(p: argparse.ArgumentParser) -> None:
    d = SamplerConfig()
    models = ", ".join(PRESETS)
    p.add_argument("--model", default=d.model, metavar="SPEC",
                   help=f"a preset ({models}), a mixture JSON file "
                        '{"weights": [...], "means": [[...], ...], "stds": [...]}, the embedded image model digits, '
                        "a local diffusers folder or a Hub id such as google/ddpm-cifar10-32 (default %(default)s)")
    p.add_argument("--kernel", choices=KERNEL_NAMES, help="sampler kernel (default: the model's; gm512: flow-churn)")
    p.add_argument("--steps", type=int, help="number of sampler steps N (default: the model's)")
    p.add_argument("--eta", type=float, default=d.eta, help="DDIM eta in [0, 1]; 0 is deterministic (default %(default)s)")
    p.add_argument("--churn", type=float, help="flow-matching churn c >= 0 (default: the model's, else 0.06)")
    p.add_argument("--gamma", type=float, help="Langevin step size gamma > 0 (default: the model's, else 0.01)")
    p.add_argument("--prediction", default=d.prediction, choices=("epsilon", "v_prediction", "sample"),
                   help="what an analytic mixture's network predicts under ddpm/ddim (default %(default)s)")
    p.add_argument("--method", default=d.method, choices=METHODS,
                   help="plain target sampling, a chain or a tree (default %(default)s)")
    p.add_argument("--tree", metavar="WIDTHS", help=f"topology: {TOPOLOGY_HELP}; or auto, planned per step "
                                                    "(default: 1x5 chain, 2x5 tree)")
    p.add_argument("--budget", type=int, metavar="R",
                   help="with --tree auto: at most R target rows per round; a pilot run measures delta, then a "
                        "dynamic programme picks the widths of every step (default: the fastest measured on the "
                        "device, 16 on a CPU)")
    p.add_argument("--objective", default=d.objective, choices=OBJECTIVES,
                   help="with --tree auto: minimise the expected wall-clock (time; a call's cost by its rows is "
                        "measured on the device) or the expected target calls (calls) (default %(default)s)")
    p.add_argument("--verifier", choices=tuple(VERIFIERS),
                   help="rmc or block (chains only; block weighs the whole chain at once), dgrs or rank "
                        "(default: rmc for a chain, dgrs for a tree, block for --tree auto)")
    p.add_argument("--draft", default=d.draft,
                   help="frozen (the training-free frozen target), or a draft network for an image model: "
                        "digits-draft, a folder or a Hub id (default %(default)s)")
    p.add_argument("--freeze", choices=FREEZE,
                   help="freeze the network output (out), the denoised estimate x0-hat (x0), or choose per step "
                        "from pilot runs (auto) (default: out; auto with --tree auto)")
    p.add_argument("--draft-bias", type=float, default=d.draft_bias, metavar="B",
                   help="shift the draft mean by B times the step's scale along a fixed direction; "
                        "samples stay exact (default %(default)s)")
    p.add_argument("--prefetch", choices=tuple(PREFETCH),
                   help="frozen output that starts a round: nearest sibling, parent, none (re-evaluate the root), "
                        "leaves (evaluate leaves too), or auto (nearest, leaves evaluated at the steps where "
                        "--tree auto plans it) (default: nearest; auto with --tree auto)")
    p.add_argument("--pilot-samples", type=int, default=d.pilot_samples, metavar="P",
                   help="trajectories of the pilot runs that plan --tree auto and --freeze auto (default %(default)s)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where plans are kept between runs, or off (default: $SPECDEMO_CACHE, else "
                        "~/.cache/specdemo)")
    p.add_argument("--replan", action="store_true", help="run the pilots and plan again, even if a plan is cached")
    p.add_argument("--num-samples", type=int, default=d.num_samples, metavar="M", help="(default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="same seed, device and --max-batch: same samples (default %(default)s)")
    p.add_argument("--max-batch", type=int, metavar="B",
                   help="at most B trajectories in flight; a finished one frees its slot for the next "
                        "(continuous batching; default: all at once)")
    p.add_argument("--device", default=d.device, choices=("auto", "cpu", "cuda"), help="(default %(default)s)")
    p.add_argument("--class-label", type=int, metavar="0..9",
                   help="class to sample, for class-conditional models such as digits (default 0)")


def _sample(args) -> int:
    config = SamplerConfig(
        model=args.model, kernel=args.kernel, steps=args.steps, eta=args.eta, churn=args.churn, gamma=args.gamma,
        prediction=args.prediction, method=args.method, tree=args.tree, verifier=args.verifier, draft=args.draft,
        freeze=args.freeze, draft_bias=args.draft_bias, prefetch=args.prefetch, budget=args.budget,
        objective=args.objective, pilot_samples=args.pilot_samples, num_samples=args.num_samples,
        max_batch=args.max_batch, seed=args.seed, device=args.device, class_label=args.class_label,
        cache_dir=args.cache_dir, replan=args.replan,
    )
    if args.trace and launched_by_torchrun():
        raise SpecdemoError("--trace is for single-process runs; leave it out under accelerate launch")
    for option, path in (("--out", args.out), ("--grid", args.grid), ("--trace", args.trace)):
        if path and not Path(path).resolve().parent.is_dir():
            raise SpecdemoError(f"{option} {path[:80]!r}: its folder does not exist")
    limits = Limits.from_env()
    cancel = Cancel(limits.max_seconds)  # SPECDEMO_MAX_SECONDS, if set
    problem = build(config, limits=limits, cancel=cancel)
    if args.grid and len(problem.target.shape) != 3:
        raise SpecdemoError(f"--grid draws images; {config.model} samples are vectors of shape {problem.target.shape}")
    state = process_state()
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
    plan = problem.tree if isinstance(problem.tree, TopologyPlan) else None
    c = problem.config
    summary = {**cost.summary(), "model": c.model, "kernel": problem.kernel.name, "tree": str(problem.tree),
               "verifier": problem.verifier.name if problem.verifier else None, "freeze": c.freeze,
               "prefetch": c.prefetch, "budget": c.budget, "objective": c.objective if plan else None,
               "plan_source": problem.plan_source, "plan_cached": problem.plan_source in ("cache", "shipped")
               if problem.plan_source else None, "planned_calls": plan.expected_calls if plan else None,
               "planned_s": plan.expected_s if plan else None, "warmup_s": problem.warmup_s,
               "device": str(problem.device), "seed": c.seed,
               "processes": state.num_processes if state else 1}
    if args.out:
        np.savez(args.out, samples=samples, config=json.dumps(c.to_dict()), cost=json.dumps(summary))
    if args.grid:
        save_grid(torch.from_numpy(samples), args.grid)
    if args.trace:
        Path(args.trace).write_text(json.dumps({"config": c.to_dict(), "cost": summary,
                                                "rounds": [r.to_json() for r in result.trace]}))
    print(json.dumps(summary, allow_nan=False))
    return 0


def _bench(args) -> int:
    from . import bench  # imported on demand: the benchmarks are not needed to sample

    return bench.main(args)


def main(argv=None) -> int:
    parser = _Parser(prog="python -m specdemo", description="Exact speculative sampling for diffusion models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("sample", help="draw samples and print the cost as JSON",
                       description="Draw exact samples of the target; print the cost as one JSON line.")
    _add_sample_args(p)
    p.add_argument("--out", metavar="FILE.npz", help="save `samples` (and the config and cost) here")
    p.add_argument("--grid", metavar="FILE.png", help="for image models: save the samples as a PNG grid")
    p.add_argument("--trace", metavar="FILE.json", help="save every round's tree (no states) as JSON")
    p.set_defaults(func=_sample)
    b = sub.add_parser("bench", help="run the benchmarks and write docs/benchmarks.md",
                       description="Run the benchmarks and write a markdown report.")
    b.add_argument("--out", default="docs/benchmarks.md", help="(default %(default)s)")
    b.add_argument("--trajectories", type=int, default=100, help="trajectories per gm512 cell (default %(default)s)")
    b.add_argument("--quick", action="store_true", help="a small smoke run (few cells, shorter runs)")
    b.add_argument("--sections", help="comma-separated sections to refresh (default: all): "
                                      "gm512, prefetch, gm2d, auto, digits, block, equal_rows, quality, throughput, gpu, latency")
    b.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecdemoError as err:
        print(f"python -m specdemo: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"python -m specdemo: error: {err}", file=sys.stderr)
        return 2
