"""The bound section of docs/benchmarks.md: what no plan can beat on this machine, and how close --tree auto
comes to it.

c(L) is a call of the digits UNet with L rows, on one thread. With every draft accepted, a chain of L rows
commits L steps a call, so N steps take (N / L) c(L) against plain sampling's N c(1): no plan beats plain
sampling by more than max over L of L c(1) / c(L). Auto and plain sampling then run in alternated pairs in
one process (one sample, one thread, the defaults otherwise, each built and run once untimed first); a ratio is the median
of the pairs' ratios. Auto plans as a user's first runs would: at 100 steps from the statistics shipped with
the package, priced here; at 1,000 steps (none ship) from the deltas a first run of LEARNING_SAMPLES
trajectories left in a fresh cache.
"""

from __future__ import annotations

import statistics
import tempfile

import torch

from specdemo import SamplerConfig, build
from specdemo.planning import call_seconds

TITLE = "Latency: the bound of this machine, and tree auto against it"

ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the call sizes c(L) is measured at
CALL_REPEATS = 30
LEARNING_SAMPLES = 32  # config.pilot_samples' default: one run of them lets the next plan from runs
DIGITS = dict(model="digits", num_samples=1, device="cpu")


def call_ms(rows: tuple[int, ...] = ROWS, repeats: int = CALL_REPEATS) -> dict[int, float]:
    """c(L) in ms for each L in `rows`: the median of `repeats` calls after an untimed one, timed as planning
    times them (planning.costs.call_seconds)."""
    problem = build(SamplerConfig(**DIGITS, method="target", steps=100))
    return {r: 1e3 * statistics.median(call_seconds(problem, r, repeats)) for r in rows}


def bound_of(calls: dict[int, float]) -> tuple[float, int]:
    """max over L of L c(1) / c(L), and the L that gives it."""
    rows = max(calls, key=lambda r: r * calls[1] / calls[r])
    return rows * calls[1] / calls[rows], rows


def auto_problem(steps: int, cache: str):
    """Tree auto as a user's runs would plan it (module docstring), and what planning it took."""
    config = SamplerConfig(**DIGITS, tree="auto", steps=steps, cache_dir=cache)
    problem = build(config)
    if problem.plan_source == "online":  # nothing ships for this setting: a first run learns
        build(
            SamplerConfig(**{**DIGITS, "num_samples": LEARNING_SAMPLES}, tree="auto", steps=steps, cache_dir=cache)
        ).run()
        problem = build(config)
    return problem


def pairs(steps: int, count: int, cache: str) -> dict:
    """Plain and auto sampling at `steps`, `count` alternated pairs: the median ratio, the medians, and what
    the plan expected."""
    plain = build(SamplerConfig(**DIGITS, method="target", steps=steps))
    auto = auto_problem(steps, cache)
    ran = auto.declined or auto
    plain.run(), auto.run()
    plain_s, auto_s, calls = [], [], []
    for _ in range(count):
        plain_s.append(plain.run().cost.wall_s)
        cost = auto.run().cost
        auto_s.append(cost.wall_s)
        calls.append(cost.target_calls)
    expected = getattr(ran.tree, "expected_s", None)
    return {
        "steps": steps,
        "pairs": count,
        "plan_source": ran.plan_source,
        "declined": auto.declined is not None,
        "verifier": ran.verifier.name if ran.verifier else None,
        "plain_s": statistics.median(plain_s),
        "auto_s": statistics.median(auto_s),
        "ratio": statistics.median(p / a for p, a in zip(plain_s, auto_s, strict=True)),
        "calls": statistics.median(calls),
        "expected_s": expected,
        "planning_s": ran.calibration_s,
    }


def measure(trajectories: int, quick: bool, report) -> tuple[str, dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        calls = call_ms(ROWS[:4] if quick else ROWS, 5 if quick else CALL_REPEATS)
        with tempfile.TemporaryDirectory() as cache:
            runs = [pairs(100, 2 if quick else 9, cache)] + ([] if quick else [pairs(1000, 5, cache)])
    finally:
        torch.set_num_threads(threads)
    results = {"call_ms": {str(r): ms for r, ms in calls.items()}, "runs": runs}
    return render(results), results


def render(results: dict) -> str:
    calls = {int(r): ms for r, ms in results["call_ms"].items()}
    bound, at = bound_of(calls)
    lines = [
        "benchmarks/bound.py says how. One thread.",
        "",
        "| L (rows of a call) | " + " | ".join(str(r) for r in calls) + " |",
        "|---|" + "---|" * len(calls),
        "| c(L) ms | " + " | ".join(f"{ms:.2f}" for ms in calls.values()) + " |",
        "| L c(1) / c(L) | " + " | ".join(f"{r * calls[1] / ms:.2f}" for r, ms in calls.items()) + " |",
        "",
        f"No plan beats plain sampling here by more than **{bound:.2f}x** (at L = {at}).",
        "",
        "| steps | plan | plain s | auto s | auto vs plain | share of the bound | calls | plan expected s | "
        "expected vs took | planning s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        plan = f"{r['plan_source']}, {r['verifier']}" + (" (declined: plain)" if r["declined"] else "")
        expected = r["expected_s"]
        against = f"{100 * (expected / r['auto_s'] - 1):+.0f}%" if expected else ""
        lines.append(
            f"| {r['steps']} | {plan} | {r['plain_s']:.3f} | {r['auto_s']:.3f} | **{r['ratio']:.2f}x** | "
            f"{r['ratio'] / bound:.2f} | {r['calls']:.0f} | {expected or float('nan'):.3f} | {against} | "
            f"{r['planning_s']:.2f} |"
        )
    return "\n".join(lines)
