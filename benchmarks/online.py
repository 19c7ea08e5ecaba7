"""Section online: plans learnt from runs, against pilots (specdemo/planning/, docs/algorithms.md section 6).

Three tables. First runs: the command line in new processes, one sample, each run with a new empty plan cache
(`--tree auto --replan`), plain sampling alternated with it; and at 100 steps the same pair at torch's
own threads (`--threads 0`), and the first run with `--pilot`. Steady state: calls of a run planned from
what the first runs learnt (the tree and the freeze table; for a fixed tree the table alone), against a
run planned from pilots, same seed and calls objective.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdemo.pipeline import SamplerConfig, build

TITLE = "Plans without a pilot: learnt from the runs"
REPEATS = 7
TORCH_THREADS_SUFFIX = ", torch's threads"  # the runs with `--threads 0`, beside the CLI's default one thread
# (label, model, steps, trajectories, settings): the steady-state cells, the three
STEADY = (
    ("digits, 100 steps, 16 rows", "digits", 100, 32, {"budget": 16}),
    ("digits, 1,000 steps, 16 rows", "digits", 1000, 32, {"budget": 16}),
    ("gm512, 85 rows", "gm512", None, 300, {"budget": 85}),
    ("digits, 100 steps, topology 3,2,1", "digits", 100, 32, {"tree": "3,2,1", "verifier": "dgrs"}),
)


def cli(steps: int, cache: Path, *extra: str) -> dict:
    """One `specdemo sample` on the digits model, one sample, in a new process: its JSON."""
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
        "--cache-dir",
        str(cache),
        *extra,
    ]
    done = subprocess.run(
        args, capture_output=True, text=True, check=True, env={**os.environ, "SPECDEMO_CACHE": str(cache)}
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_runs(steps: int, repeats: int, pilot: bool, torch_threads: bool) -> dict:
    """`repeats` first runs (each with an empty cache) alternated with plain sampling, at the CLI's threads; with
    torch_threads, as many pairs at torch's own (`--threads 0`); with pilot, one piloted first run too. Medians of
    wall-clock; calls are the same every time (the online plan is fixed). Against plain: at the same threads."""
    settings = {"": ()} | ({TORCH_THREADS_SUFFIX: ("--threads", "0")} if torch_threads else {})
    runs: dict[str, list[dict]] = {}
    for _ in range(repeats):
        for suffix, threads in settings.items():
            with tempfile.TemporaryDirectory() as tmp:
                runs.setdefault("online" + suffix, []).append(
                    cli(steps, Path(tmp), "--tree", "auto", "--replan", *threads)
                )
            runs.setdefault("plain" + suffix, []).append(cli(steps, Path(tmp), "--method", "target", *threads))
    if pilot:
        with tempfile.TemporaryDirectory() as tmp:
            runs["pilot"] = [cli(steps, Path(tmp), "--tree", "auto", "--replan", "--pilot")]
    return {
        name: {
            "calls": r[0]["target_calls"] + r[0]["pilot_calls"],
            "speedup_total": r[0].get("speedup_total"),
            "wall_s": statistics.median(d["wall_s"] + d["pilot_s"] + d["learn_s"] for d in r),
            "threads": r[0]["threads"],
            "runs": len(r),
        }
        for name, r in runs.items()
    }


def steady(model: str, steps: int | None, trajectories: int, settings: dict) -> dict:
    """Calls per trajectory of a run planned from pilots and of one planned from what a first run of as many
    trajectories learnt (seed 1; the compared runs seed 0), calls objective, --freeze auto: the tree and the
    table (--tree auto), or the table alone (a fixed tree in `settings`); and how many steps the two tables
    give the same form."""
    base = {
        "model": model,
        "steps": steps,
        "num_samples": trajectories,
        "device": "cpu",
        "method": "tree",
        "tree": "auto",
        "freeze": "auto",
        "objective": "calls",
        "pilot_samples": min(32, trajectories),
        **settings,
    }
    if model == "digits":
        base["class_label"] = 3
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        piloted = build(SamplerConfig(**base, seed=0, pilot=True, cache_dir="off"))
        out["pilot"] = float(piloted.run().cost.calls_per_trajectory.mean())
        first = build(SamplerConfig(**base, seed=1, cache_dir=tmp))
        out["online"] = float(first.run().cost.calls_per_trajectory.mean())
        learnt = build(SamplerConfig(**base, seed=0, cache_dir=tmp))
        assert learnt.plan_source == "runs", learnt.plan_source
        out["learnt"] = float(learnt.run().cost.calls_per_trajectory.mean())
        if base["tree"] == "auto":
            out["planned"] = {"pilot": piloted.tree.expected_calls, "learnt": learnt.tree.expected_calls}
        out["same_form"] = float((piloted.draft.forms == learnt.draft.forms).float().mean())
    return out


# the page's defaults on the digits model (tree auto, 100 steps, one sample) with one setting changed: each
# topology preset of the page (specdemo_app.settings.TREE_PRESETS), then these
OTHER_CLICKS = (
    ("topology 4x4, typed (85 rows a round; the preset was 4x4 until 2026-12-07)", {"tree": "4x4"}),
    ("topology 3,2,1, verifier rank", {"tree": "3,2,1", "verifier": "rank"}),
    ("topology 3,2,1, verifier block", {"tree": "3,2,1", "verifier": "block"}),
    ("auto, verifier block", {"verifier": "block"}),
    ("auto, verifier rmc", {"verifier": "rmc"}),
    ("auto, draft network digits-draft", {"draft": "digits-draft"}),
    ("auto, 1,000 steps", {"steps": 1000}),
)


CLICK_REPEATS = 3  # each click this many times, in alternated passes; the least kept (load only slows a click)


def clicks(quick: bool) -> list[dict]:
    """Seconds of each click (the defaults, each topology preset, OTHER_CLICKS) through the app's runner, the
    least of CLICK_REPEATS alternated passes (a first click loads the model), no plan cache."""
    import torch

    from specdemo_app import controls, runner, settings

    presets = tuple((f"topology {t}", {"tree": t}) for t, _ in settings.TREE_PRESETS if t != "auto")
    every = (("the defaults (shipped statistics)", {}), *presets, *OTHER_CLICKS)
    every = every[:3] if quick else every
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    values = settings.page_values("digits")
    page = {name: values[name] for name in controls.control_names()}
    seconds: dict[str, list[float]] = {label: [] for label, _ in every}
    out = {}

    def click(change: dict):
        config, target, draft_target, limits = settings.make_config({**page, **change})
        return runner.run_comparison(config, target=target, draft_target=draft_target, limits=limits)

    try:
        click({})  # the warm-up: loads the model
        for _ in range(1 if quick else CLICK_REPEATS):
            for label, change in every:
                t0 = time.perf_counter()
                comp = click(change)
                seconds[label].append(time.perf_counter() - t0)
                out[label] = {
                    "label": label,
                    "plan_source": comp.chosen.plan_source,
                    "pilot_calls": comp.chosen.pilot.target_calls if comp.chosen.pilot else 0,
                }
    finally:
        torch.set_num_threads(threads)
    return [{**out[label], "s": min(seconds[label]), "repeats": len(seconds[label])} for label, _ in every]


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    repeats = 2 if quick else REPEATS
    first = {
        steps: first_runs(steps, repeats, pilot=steps == 100, torch_threads=steps == 100)
        for steps in ((100,) if quick else (100, 1000))
    }
    cells = STEADY[:1] if quick else STEADY
    steady_runs = [
        {"label": label, "trajectories": 8 if quick else count, **steady(model, steps, 8 if quick else count, settings)}
        for label, model, steps, count, settings in cells
    ]
    results = {
        "first": {str(k): v for k, v in first.items()},
        "steady": steady_runs,
        "repeats": repeats,
        "clicks": clicks(quick),
    }
    return report_text(results), results


def report_text(results: dict) -> str:
    lines = [
        "### First run, nothing cached (digits, one sample, `--tree auto --replan`, new processes, an empty "
        f"cache each; median of {results['repeats']} wall-clocks, planning and learning included; at the CLI's "
        "default one thread and, at 100 steps, at torch's own, `--threads 0`)",
        "",
        "| steps | run | threads | target calls (pilot included) | speedup_total | wall-clock s | "
        "against plain at its threads |",
        "|---|---|---|---|---|---|---|",
    ]
    for steps, runs in results["first"].items():
        for suffix in ("", TORCH_THREADS_SUFFIX):
            for kind in ("online", "pilot", "plain"):
                if kind + suffix not in runs:
                    continue
                r, plain = runs[kind + suffix], runs["plain" + suffix]["wall_s"]
                total = "" if r["speedup_total"] is None else f"{r['speedup_total']:.2f}"
                lines.append(
                    f"| {steps} | {kind} | {r.get('threads', '')} | {r['calls']} | {total} | "
                    f"{r['wall_s']:.3f} | {plain / r['wall_s']:.2f}x |"
                )
    lines += [
        "",
        "### Steady state (target calls a sample; calls objective, `--freeze auto`; the learnt plan from a first "
        "run of as many trajectories, seed 1; compared runs seed 0)",
        "",
        "| setting | trajectories | first run | planned from pilots | planned from the runs | "
        "learnt against pilot | steps of the same form |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["steady"]:
        same = f"{100 * row['same_form']:.0f}%" if "same_form" in row else ""
        lines.append(
            f"| {row['label']} | {row['trajectories']} | {row['online']:.2f} | {row['pilot']:.2f} | "
            f"{row['learnt']:.2f} | {100 * (row['learnt'] / row['pilot'] - 1):+.1f}% | {same} |"
        )
    lines += [
        "",
        "### The app's clicks (digits, the page's defaults with one setting changed: 100 steps, one sample; "
        "a click runs plain sampling, the matched chain and the setting; nothing cached, one thread; the least of "
        f"{results['clicks'][0].get('repeats', 1)} alternated passes)",
        "",
        "| click | seconds | plan | pilot calls |",
        "|---|---|---|---|",
    ]
    for row in results["clicks"]:
        plan = {None: "a fixed tree", "default": "a fixed tree, the first freeze table"}.get(
            row["plan_source"], row["plan_source"]
        )
        lines.append(f"| {row['label']} | {row['s']:.2f} | {plan} | {row['pilot_calls']} |")
    return "\n".join(lines)
