"""Wall-clock next to calls on a 2-D mixture at 1,000 DDPM steps, where a target call is cheap."""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig
from specdemo.sampling.cost import time_speedup

from .common import run_cell

TITLE = "Wall-clock on a 2-D mixture at 1,000 DDPM steps"
METHODS = (("target", None, None), ("chain", "1x5", "rmc"), ("tree", "3,2,2", "dgrs"), ("tree", "3,2,2", "rank"))


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    steps = 200 if quick else 1000
    lines = [
        f"`gm2d` with {steps} DDPM steps, {trajectories} samples in one batch, each method run "
        "3 times in the same process (median wall-clock).",
        "",
        "| method | tree | verifier | speedup (calls) | target calls | wall-clock s | plain's wall-clock / this |",
        "|---|---|---|---|---|---|---|",
    ]
    plain, runs = None, []
    for method, tree, verifier in METHODS:
        s = run_cell(
            SamplerConfig(
                pilot=True,
                model="gm2d",
                steps=steps,
                method=method,
                tree=tree,
                verifier=verifier,
                num_samples=trajectories,
                device="cpu",
            ),
            repeats=3,
        )
        plain = plain or s
        runs.append({"method": method, "tree": tree, "verifier": verifier, **s})
        lines.append(
            f"| {method} | {tree or ''} | {verifier or ''} | {s['speedup_total']:.2f} | "
            f"{s['target_calls']} | {s['wall_s']:.3f} | {time_speedup(s['wall_s'], plain['wall_s']):.2f}x |"
        )
    return "\n".join(lines), {"steps": steps, "trajectories": trajectories, "runs": runs}
