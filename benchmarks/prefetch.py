"""Prefetch policies: which target output the next round starts from, on gm512's RMC chain L = 5."""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig

from . import peer
from .common import run_cell

TITLE = "Prefetch policies"
POLICIES = ("nearest", "parent", "none", "leaves")


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    theirs = peer.chain_by_prefetch()
    lines = [
        "RMC chain L = 5 on `gm512`, freezing the network output, by prefetch policy (the authors' code, "
        f"algorithms.md section 5: {theirs['nearest']:.2f}x nearest, {theirs['parent']:.2f}x parent, "
        f"{theirs['none']:.2f}x re-evaluating every root).",
        "",
        "| prefetch | speedup | target calls per trajectory | acceptance |",
        "|---|---|---|---|",
    ]
    runs = []
    for prefetch in POLICIES:
        s = run_cell(
            SamplerConfig(
                pilot=True,
                model="gm512",
                method="chain",
                tree="1x5",
                prefetch=prefetch,
                num_samples=trajectories,
                device="cpu",
                start="warm",
            )
        )  # as the authors count
        runs.append({"prefetch": prefetch, **s})
        lines.append(
            f"| {prefetch} | {s['speedup']:.2f} | {s['target_calls_per_sample']:.1f} | {s['acceptance']:.3f} |"
        )
    return "\n".join(lines), {"trajectories": trajectories, "runs": runs}
