"""The latency section of docs/benchmarks.md: wall-clock next to calls, at batch 1 and in batches.

Every ratio is measured side by side in one process; a configuration is built (pilots run, plans
made) before anything is timed, and each run is timed after a first untimed run of the same
configuration (the target's kernels for each row count are set up by then), as in a long-lived
process such as the app. A fresh process pays that set-up too: the last table runs the CLI as a
user would, in new processes, a second time with the plan in the cache.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from diffusers import DDPMScheduler

from specdemo.kernels import DDPMKernel
from specdemo.models.diffusers_unet import EMBEDDED
from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling.cost import time_speedup
from specdemo.trees import TopologyPlan

from .common import cifar_sized_unet, find

TITLE = "Latency: wall-clock next to calls"

# the driver before it was rewritten as phases: timed from this commit's sources, side by side with today's
BEFORE_COMMIT = "85c9071"
ROOT = Path(__file__).resolve().parents[1]
DRIVER_CELLS = [
    (b, t, v)
    for b in (1, 16)
    for t, v in (("1x9", "rmc"), ("1x9", "block"), ("2,2,2", "dgrs"), ("4x3", "rank"), ("1x30", "rmc"))
]


def digits_kernel(steps: int = 100) -> DDPMKernel:
    config = json.loads((EMBEDDED["digits"] / "scheduler" / "scheduler_config.json").read_text())
    return DDPMKernel(DDPMScheduler.from_config(config), steps)


def instant_network(kernel: DDPMKernel):
    """The exact eps-prediction for data ~ N(0, I) in the digits shape: eps-hat(x, t) = sqrt(1 - abar_t) x.
    A closed form that returns at once, so that a run's time is the driver's own."""
    noise = kernel.noise.float()
    return lambda x, n, **cond: x * noise.to(x.device)[n].view(-1, *[1] * (x.dim() - 1))


def driver_side_by_side(cells: list[tuple[int, str, str]], alternations: int = 5, seeds: int = 9) -> dict:
    """Milliseconds per round outside the target call, now and at BEFORE_COMMIT, for each (batch, tree,
    verifier): digits' kernel (100 DDPM steps, x0-hat clipped), the frozen draft freezing x0-hat, the
    instant network. Each measurement is the median of `seeds` runs in a fresh process
    (benchmarks/driver_probe.py); the two drivers alternate `alternations` times and each cell keeps its
    fastest median, the one least disturbed by the machine's other work. The 1-row call of the digits
    UNet is timed between them, in the same window: on one thread, as the probe runs the driver (the
    yardstick of issue "latency"), and on this process's threads."""
    scheduler = json.loads((EMBEDDED["digits"] / "scheduler" / "scheduler_config.json").read_text())
    spec = json.dumps({"scheduler": scheduler, "steps": 100, "shape": [1, 16, 16], "cells": cells, "seeds": seeds})
    probe = Path(__file__).with_name("driver_probe.py")
    fastest = {"now": {}, "before": {}}
    call_ms = {1: math.inf, torch.get_num_threads(): math.inf}
    with tempfile.TemporaryDirectory() as old:
        sources = subprocess.run(
            ["git", "archive", BEFORE_COMMIT, "specdemo"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", old], input=sources.stdout, check=True)
        for _ in range(alternations):
            for label, root in (("before", Path(old)), ("now", ROOT)):
                done = subprocess.run(
                    [sys.executable, str(probe), spec],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "PYTHONPATH": str(root)},
                )
                out = json.loads(done.stdout)
                if not Path(out["specdemo"]).resolve().is_relative_to(root.resolve()):
                    raise RuntimeError(f"the {label} probe imported {out['specdemo']}, not the sources under {root}")
                for key, ms in out["ms"].items():
                    fastest[label][key] = min(fastest[label].get(key, math.inf), ms)
            for threads in call_ms:
                call_ms[threads] = min(call_ms[threads], one_row_call_ms(20, threads))
    return {
        "call_ms": call_ms[1],
        "call_ms_threads": call_ms,
        "cells": [
            {
                "batch": b,
                "tree": t,
                "verifier": v,
                "ms": fastest["now"][f"{b}|{t}|{v}"],
                "before_ms": fastest["before"][f"{b}|{t}|{v}"],
            }
            for b, t, v in cells
        ],
    }


def one_row_call_ms(repeats: int = 50, threads: int | None = None) -> float:
    """A 1-row call of the digits UNet (median), on `threads` threads (None: the process's)."""
    problem = build(SamplerConfig(pilot=True, model="digits", method="target", steps=100, num_samples=1, device="cpu"))
    x, n, label = torch.randn(1, 1, 16, 16), torch.tensor([50]), torch.tensor([3])
    times, before = [], torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.inference_mode():
            for i in range(repeats + 3):
                t0 = time.perf_counter()
                problem.network(x, n, class_labels=label)
                if i >= 3:
                    times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 1e3 * statistics.median(times)


def _timed(problem, repeats: int) -> dict:
    """A built problem run once untimed, then `repeats` times: the fastest wall-clock (the least
    disturbed by the machine's other work) with its run's figures."""
    problem.run()
    runs = [problem.run().cost for _ in range(repeats)]
    best = min(runs, key=lambda c: c.wall_s)
    return {"cost": best, "wall_s": best.wall_s, "target_s": best.target_s}


def _configs(steps: int) -> list[tuple[str, dict]]:
    """plain, chain 1x5, fixed chains (the best of them is named after the run), auto by time (its
    verifier planned, and block verification alone) and by calls; each with the settings named, the rest
    the defaults."""
    chains = [
        (
            f"chain 1x{length}, {verifier}, freeze x0",
            {"method": "chain", "tree": f"1x{length}", "verifier": verifier, "freeze": "x0"},
        )
        for length in (5, 9, 16)
        for verifier in ("rmc", "block")
    ]
    return [
        ("plain target", {"method": "target"}),
        ("chain 1x5 (the defaults: rmc, freeze out)", {"method": "chain", "tree": "1x5"}),
        *chains,
        ("auto (the defaults: time)", {"method": "tree", "tree": "auto"}),
        ("auto, verifier block (the defaults before)", {"method": "tree", "tree": "auto", "verifier": "block"}),
        ("auto, objective calls", {"method": "tree", "tree": "auto", "objective": "calls"}),
    ]


def digits_table(steps: int, samples: int, repeats: int) -> tuple[list[str], list[dict]]:
    """Rows of the digits table for one step count and batch (class 3, every row against the plain sampler of
    the same block); each run's figures with its configuration."""
    rows, runs, plain = [], [], None
    for name, extra in _configs(steps):
        config = SamplerConfig(
            pilot=True, model="digits", steps=steps, num_samples=samples, device="cpu", seed=0, class_label=3, **extra
        )
        problem = build(config)
        run = _timed(problem, repeats)
        cost = run["cost"]
        plain = plain or run
        planned = problem.tree if isinstance(problem.tree, TopologyPlan) else None
        verifier = problem.verifier.name if problem.verifier else None
        if problem.config.verifier == "auto":
            name = f"{name}, verifier auto: {verifier}"
        runs.append(
            {
                "name": name,
                "config": config.to_dict(),
                "verifier": verifier,
                "wall_s": run["wall_s"],
                "target_s": run["target_s"],
                "calls_per_trajectory": float(cost.calls_per_trajectory.mean()),
                "rows_per_trajectory": float(cost.rows_per_trajectory.mean()),
                "planned_s": planned.expected_s if planned is not None else None,
                "planned_calls": planned.expected_calls if planned is not None else None,
            }
        )
        rows.append(
            f"| {steps} | {samples} | {name} | {run['wall_s']:.3f} | **{cost.time_speedup_over(plain['cost']):.2f}x** | "
            f"{cost.calls_per_trajectory.mean():.1f} | {cost.speedup_over(plain['cost']):.2f}x | "
            f"{cost.rows_per_trajectory.mean():.0f} | {1 - run['target_s'] / run['wall_s']:.0%} | "
            + (
                f"{planned.expected_s:.3f} | {planned.expected_calls:.1f} |"
                if planned is not None and planned.expected_s
                else (f"| {planned.expected_calls:.1f} |" if planned is not None else "| |")
            )
        )
    return rows, runs


def cli_runs(steps: int, cache: Path, repeats: int = 5) -> dict:
    """The command line as a user runs it: new processes, the auto plan's first run (pilot), then
    `repeats` times the second (plan from the cache) and the same command with --method target, in
    alternation (one fresh process is noisy: the ratio is of their medians); each JSON's last line."""

    def cli(*extra):
        args = [
            sys.executable,
            "-m",
            "specdemo",
            "sample",
            "--model",
            "digits",
            "--steps",
            str(steps),
            "--num-samples",
            "1",
            *extra,
            "--cache-dir",
            str(cache),
        ]
        done = subprocess.run(
            args, capture_output=True, text=True, check=True, env={**os.environ, "SPECDEMO_CACHE": str(cache)}
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    # --replan --pilot: the first run pilots (the package ships statistics of these settings); the others take the cache's
    runs = {"first": [cli("--method", "tree", "--tree", "auto", "--replan", "--pilot")], "second": [], "target": []}
    for _ in range(repeats):
        runs["second"].append(cli("--method", "tree", "--tree", "auto"))
        runs["target"].append(cli("--method", "target"))
    return runs


def median_run(runs: list[dict]) -> dict:
    """The run of median wall-clock (the lower middle of an even count)."""
    return sorted(runs, key=lambda d: d["wall_s"])[(len(runs) - 1) // 2]


def cifar_rows(repeats: int) -> list[str]:
    """A CIFAR-10-sized random UNet (about 36M parameters) at batch 1 on this CPU, 100 DDPM steps."""
    rows, plain = [], None
    with tempfile.TemporaryDirectory() as tmp:
        folder = cifar_sized_unet(Path(tmp) / "cifar-sized")
        for name, extra in (
            ("plain target", {"method": "target"}),
            ("chain 1x5 (rmc, freeze out)", {"method": "chain", "tree": "1x5"}),
            ("auto (the defaults: time), pilot of 4", {"method": "tree", "tree": "auto", "pilot_samples": 4}),
        ):
            problem = build(
                SamplerConfig(pilot=True, model=folder, steps=100, num_samples=1, device="cpu", seed=0, **extra)
            )
            run = _timed(problem, repeats)
            cost = run["cost"]
            plain = plain or run
            rows.append(
                f"| {name} | {run['wall_s']:.2f} | **{cost.time_speedup_over(plain['cost']):.2f}x** | "
                f"{cost.calls_per_trajectory.mean():.0f} | "
                f"{cost.speedup_over(plain['cost']):.2f}x | "
                f"{cost.acceptance if cost.acceptance is not None else float('nan'):.2f} |"
            )
    return rows


def defaults_rows(repeats: int) -> list[str]:
    """--tree auto around its defaults, one setting changed at a time: digits, 100 steps, one sample."""
    base = dict(
        model="digits", steps=100, num_samples=1, device="cpu", seed=0, class_label=3, method="tree", tree="auto"
    )
    changes = [
        ("the defaults", {}),
        ("verifier block", {"verifier": "block"}),
        ("verifier rmc", {"verifier": "rmc"}),
        ("verifier rank (trees)", {"verifier": "rank"}),
        ("freeze x0", {"freeze": "x0"}),
        ("freeze out", {"freeze": "out"}),
        ("prefetch nearest", {"prefetch": "nearest"}),
        ("budget 8", {"budget": 8}),
        ("budget 32", {"budget": 32}),
    ]
    plain = _timed(build(SamplerConfig(pilot=True, **{**base, "method": "target"})), repeats)["cost"]
    rows = []
    for name, change in changes:
        problem = build(SamplerConfig(pilot=True, **{**base, **change}))
        run = _timed(problem, repeats)
        c = problem.config
        verifier = f"auto: {problem.verifier.name}" if c.verifier == "auto" else c.verifier
        rows.append(
            f"| {name} | {verifier} | {c.freeze} | {c.prefetch} | {c.budget} | {run['wall_s']:.3f} | "
            f"**{run['cost'].time_speedup_over(plain):.2f}x** | {run['cost'].calls_per_trajectory.mean():.1f} |"
        )
    return rows


def philox_normals(keys: torch.Tensor, counters: torch.Tensor, count: int) -> torch.Tensor:
    """Normals from a counter-based generator written with torch operations: Philox-4x32-10 keyed
    by each row's key, counting from each row's counter, then Box-Muller. (count,) per row."""
    mask = 0xFFFFFFFF
    j = torch.arange((count + 3) // 4, device=keys.device)
    c = [
        j[None].expand(len(keys), -1),
        (counters & mask)[:, None].expand(-1, len(j)),
        (counters >> 32)[:, None].expand(-1, len(j)),
        torch.zeros(len(keys), len(j), dtype=torch.long),
    ]
    k0, k1 = (keys & mask)[:, None], (keys >> 32)[:, None]
    for _ in range(10):
        p0, p1 = c[0] * 0xD2511F53, c[2] * 0xCD9E8D57
        c = [((p1 >> 32) & mask) ^ c[1] ^ k0, p1 & mask, ((p0 >> 32) & mask) ^ c[3] ^ k1, p0 & mask]
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    u = (torch.stack(c, -1).flatten(1)[:, : count + count % 2].double() + 0.5) / 2**32
    radius, angle = (-2 * u[:, 0::2].log()).sqrt(), 2 * math.pi * u[:, 1::2]
    return torch.stack([radius * angle.cos(), radius * angle.sin()], -1).flatten(1)[:, :count].float()


def stream_rows() -> list[str]:
    """One torch generator call per trajectory against a counter-based generator in torch operations
    (one call for the whole batch), for a round's normals. Each trajectory draws from its own generator, so
    that its samples do not depend on its batch; the counter-based one (Philox-4x32-10 and Box-Muller),
    keyed by trajectory, would draw the batch in one call, but was slower at every size measured."""
    rows = []
    for batch, count, what in (
        (1, 9 * 256, "a chain of 9 on digits, batch 1"),
        (16, 9 * 256, "the same, batch 16"),
        (100, 84 * 512, "gm512, a (4, 4) tree's drafted internal nodes, 100 trajectories"),
    ):
        generators = [torch.Generator().manual_seed(i) for i in range(batch)]
        out = torch.empty(batch, count)
        keys, counters = torch.arange(batch) * 7919 + 1, torch.arange(batch)

        def per_trajectory():  # called in this iteration only
            for i, g in enumerate(generators):  # noqa: B023
                torch.randn(count, generator=g, out=out[i])  # noqa: B023

        times = {}
        for name, fn in (("loop", per_trajectory), ("philox", lambda: philox_normals(keys, counters, count))):  # noqa: B023
            fn()
            runs = []
            for _ in range(7):
                t0 = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t0)
            times[name] = 1e3 * min(runs)
        rows.append(
            f"| {what} | {times['loop']:.3f} | {times['philox']:.3f} | {times['philox'] / times['loop']:.0f}x |"
        )
    return rows


# the one figure of the 2026-12-04 run that its results did not save (call_ms_threads is saved since)
UNSAVED_THREADS = (
    "A 1-row digits UNet call on 2 threads took 3.26 ms (the fastest median of 20; not in the saved results)."
)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    """The section's runs: the driver alone (before and now, side by side; the 1-row call timed between them),
    the digits model against plain sampling (fixed chains freeze x0-hat; the auto rows' planned seconds and
    calls leave the pilot out), the command line in new processes (the first run pilots with --replan, the
    second takes the plan from the cache, alternating five times with --method target; a row is the run of
    median wall-clock; wall_s is the sampling, warmup_s the kernels' set-up at build), --tree auto around its
    defaults (AUTO_DEFAULTS in specdemo/resolve.py), the random streams and a CIFAR-10-sized UNet."""
    repeats = 2
    side_by_side = driver_side_by_side(DRIVER_CELLS if not quick else DRIVER_CELLS[:2], 5 if not quick else 1)
    digits = []
    for steps, samples in [(100, 1), (100, 16)] + ([] if quick else [(1000, 1), (1000, 16)]):
        digits += digits_table(steps, samples, repeats)[1]
    cli = {}
    with tempfile.TemporaryDirectory() as cache:
        for steps in (100,) if quick else (100, 1000):
            cli[steps] = cli_runs(steps, Path(cache), 1 if quick else 5)
    # the tables' rows as written (defaults, streams, CIFAR-sized): nothing reads their figures but the report
    results = {
        "call_ms": side_by_side["call_ms"],
        "call_ms_threads": {str(k): v for k, v in side_by_side["call_ms_threads"].items()},
        "driver": side_by_side["cells"],
        "digits": digits,
        "cli": {str(k): v for k, v in cli.items()},
        "defaults_rows": defaults_rows(repeats),
        "stream_rows": stream_rows(),
        "cifar_rows": [] if quick else cifar_rows(2),
    }
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone."""
    call_ms = results["call_ms"]
    lines = [
        "Ratios are side by side in one process, each configuration built and run once untimed before timing "
        "(benchmarks/latency.py says how).",
        "",
        "### The driver alone",
        "",
        f"| batch | tree | verifier | before: {BEFORE_COMMIT} (ms/round) | now (ms/round) | before / now | "
        "now / a 1-row call (1 thread) |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in results["driver"]:
        lines.append(
            f"| {d['batch']} | {d['tree']} | {d['verifier']} | {d['before_ms']:.2f} | {d['ms']:.2f} | "
            f"{d['before_ms'] / d['ms']:.1f}x | {d['ms'] / call_ms:.2f}x |"
        )
    threads = results.get("call_ms_threads", {"1": call_ms})
    lines += ["", "| a 1-row digits UNet call | ms |", "|---|---|"]
    lines += [
        f"| {t} thread{'s' if t != '1' else ''} | {ms:.2f} |"
        for t, ms in sorted(threads.items(), key=lambda kv: int(kv[0]))
    ]
    if "call_ms_threads" not in results:
        lines += ["", UNSAVED_THREADS]
    lines += [
        "",
        "### The embedded digits model on this CPU",
        "",
        "| steps | samples | method | wall-clock s | x vs plain | calls / sample | x fewer calls | rows / sample | "
        "outside the target call | planned s | planned calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = None
    for r in results["digits"]:
        c = r["config"]
        if c["method"] == "target":
            plain = r
        planned = (
            f"{r['planned_s']:.3f} | {r['planned_calls']:.1f} |"
            if r["planned_s"]
            else (f"| {r['planned_calls']:.1f} |" if r["planned_calls"] is not None else "| |")
        )
        lines.append(
            f"| {c['steps']} | {c['num_samples']} | {r['name']} | {r['wall_s']:.3f} | "
            f"**{time_speedup(r['wall_s'], plain['wall_s']):.2f}x** | {r['calls_per_trajectory']:.1f} | "
            f"{plain['calls_per_trajectory'] / r['calls_per_trajectory']:.2f}x | {r['rows_per_trajectory']:.0f} | "
            f"{1 - r['target_s'] / r['wall_s']:.0%} | " + planned
        )
    lines += [
        "",
        "### The command line, as a user runs it",
        "",
        "| steps | run | runs | plan | wall_s | target_s | calls | speedup_total | pilot_s | warmup_s | plain wall_s / this |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for steps, out in results["cli"].items():
        plain_run = median_run(out["target"])
        for run in ("first", "second", "target"):
            d = median_run(out[run])
            lines.append(
                f"| {steps} | {run if run != 'target' else '--method target'} | {len(out[run])} | "
                f"{d['plan_source'] or ''} | {d['wall_s']:.3f} | "
                f"{d['target_s']:.3f} | {d['target_calls']} | {d['speedup_total']:.2f} | {d['pilot_s']:.1f} | "
                f"{d['warmup_s']:.2f} | **{time_speedup(d['wall_s'], plain_run['wall_s']):.2f}x** |"
            )
    lines += [
        "",
        "### What `--tree auto` alone picks (digits, 100 steps, one sample)",
        "",
        "| setting | verifier | freeze | prefetch | budget | wall-clock s | x vs plain | calls / sample |",
        "|---|---|---|---|---|---|---|---|",
        *results["defaults_rows"],
        "",
        "### Random streams: a round's normals (ms, the fastest of 7)",
        "",
        "| a round's normals | one call per trajectory | counter-based (Philox in torch), one call | ratio |",
        "|---|---|---|---|",
        *results["stream_rows"],
    ]
    if results["cifar_rows"]:
        lines += [
            "",
            "### A CIFAR-10-sized UNet on this CPU (random weights, batch 1, 100 DDPM steps)",
            "",
            "| method | wall-clock s | x vs plain | calls | x fewer calls | acceptance |",
            "|---|---|---|---|---|---|",
            *results["cifar_rows"],
        ]
    lines += ["", 'On a GPU: section "GPU" (`scripts/gpu_check.sh` runs it).']
    return "\n".join(lines)


def against_plain(runs: list[dict]) -> tuple[dict, dict, dict]:
    """Plain sampling, auto planned for time and auto planned for calls (the defaults otherwise), among
    one block's runs."""
    return (
        find(runs, method="target"),
        find(runs, tree="auto", objective="time", verifier=None),
        find(runs, tree="auto", objective="calls"),
    )
