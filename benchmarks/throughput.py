"""Continuous batching: a finished trajectory frees its slot for the next one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specdemo.pipeline import SamplerConfig, build

from .common import BY_CALLS

TITLE = "Continuous batching"


def _throughput(slots: int, kind: str, costs, total: int) -> dict:
    calls = sum(c.target_calls for c in costs)
    rows = sum(int(c.rows_per_trajectory.sum()) for c in costs)
    return {
        "slots": slots,
        "batching": kind,
        "batch_target_calls": calls,
        "samples_per_s": total / sum(c.wall_s for c in costs),
        "rows_per_call": rows / calls,
    }


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    total = 64 if quick else 256
    lines = [
        f"`gm512`, {total} trajectories, auto tree (rank-aware, 85 rows, freeze auto; the plan built once), "
        "in slots of the given size: each slot takes the next trajectory as soon as its own is done. Fixed "
        "batches of the same size run one after another.",
        "",
        "| slots | batching | batch target calls | samples per second | rows per call (batch) |",
        "|---|---|---|---|---|",
    ]
    problem = build(
        SamplerConfig(
            pilot=True,
            model="gm512",
            method="tree",
            tree="auto",
            budget=85,
            verifier="rank",
            freeze="auto",
            **BY_CALLS,
            num_samples=total,
            device="cpu",
        )
    )
    runs = []
    for slots in (total, total // 4, total // 16):
        problem = replace(problem, config=replace(problem.config, max_batch=slots))
        costs = [problem.run().cost]
        kind = "continuous"
        if slots < total:
            runs.append(_throughput(slots, kind, costs, total))
            # the same slots as fixed batches, one after another: each waits for its slowest trajectory
            problem = replace(problem, config=replace(problem.config, max_batch=None))
            costs = [problem.run(indices=range(i, i + slots)).cost for i in range(0, total, slots)]
            kind = "fixed batches, one after another"
        runs.append(_throughput(slots, kind if slots < total else "one batch", costs, total))
    lines += [
        f"| {r['slots']} | {r['batching']} | {r['batch_target_calls']} | {r['samples_per_s']:.0f} | "
        f"{r['rows_per_call']:.0f} |"
        for r in runs
    ]
    return "\n".join(lines), {"trajectories": total, "runs": runs}
