"""Launches: the ATen operations a round dispatches outside the target network, today's driver against the
driver before the fused round (BEFORE_COMMIT), each counted in a fresh process (benchmarks/launches_probe.py).
On a GPU every operation is a kernel launch or a view's dispatch, so this is what the round costs a
launch-bound device, measured on a CPU."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

TITLE = "Launches: operations per round outside the target network"
BEFORE_COMMIT = "e2c14cd"  # the driver before the fused round
ROOT = Path(__file__).resolve().parents[1]
DIGITS = {"model": "digits", "steps": 100, "device": "cpu", "seed": 0}
# the cells of issue "The round in a few launches", with the most operations each may take
CELLS = {
    "chain 1x5 rmc": ({"method": "chain", "tree": "1x5", "verifier": "rmc", "num_samples": 1}, 52),
    "chain 1x9 block": ({"method": "chain", "tree": "1x9", "verifier": "block", "num_samples": 1}, 52),
    "tree 2,2,1 rank": ({"method": "tree", "tree": "2,2,1", "verifier": "rank", "num_samples": 1}, 156),
    "auto, 1 sample": ({"method": "tree", "tree": "auto", "num_samples": 1}, 156),
    # tree auto's plan is priced on the machine that runs it, so its operations move with that machine's timing
    # here; tests/benchmarks/test_launches.py counts one plan priced with recorded prices
    "auto, 16 samples": ({"method": "tree", "tree": "auto", "num_samples": 16}, 156),
}


def settings(name: str) -> dict:
    return {**DIGITS, **CELLS[name][0]}


def counted(root: Path, cells: list[str]) -> dict:
    """Run the probe with `root`'s sources first on the path: its counts per cell."""
    spec = json.dumps({"cells": {name: settings(name) for name in cells}})
    probe = Path(__file__).with_name("launches_probe.py")
    done = subprocess.run(
        [sys.executable, str(probe), spec],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    out = json.loads(done.stdout)
    if not Path(out["specdemo"]).resolve().is_relative_to(root.resolve()):
        raise RuntimeError(f"the probe imported {out['specdemo']}, not the sources under {root}")
    return out["cells"]


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict | None]:
    cells = list(CELLS)[:2] if quick else list(CELLS)
    now = counted(ROOT, cells)
    with tempfile.TemporaryDirectory() as old:
        sources = subprocess.run(
            ["git", "archive", BEFORE_COMMIT, "specdemo"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", old], input=sources.stdout, check=True)
        before = counted(Path(old), cells)
    machine = f"{platform.machine()}, CPU, one thread"
    lines = [
        f"{machine}, {datetime.date.today().isoformat()}; `python -m benchmarks.run --sections launches`. Digits "
        f"UNet, 100 DDPM steps, the defaults otherwise; ATen operations per round outside the target network "
        f"(a TorchDispatchMode counter around `Problem.run()`, after one uncounted run), before: commit "
        f"{BEFORE_COMMIT}.",
        "",
        "| method | before | now | at most | rounds now | network's own per call |",
        "|---|---|---|---|---|---|",
    ]
    for name in cells:
        lines.append(
            f"| {name} | {before[name]['ops_per_round']:.0f} | {now[name]['ops_per_round']:.0f} | "
            f"{CELLS[name][1]} | {now[name]['rounds']} | {now[name]['network_ops_per_call']} |"
        )
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "before_commit": BEFORE_COMMIT,
        "cells": [
            {
                "name": name,
                "settings": settings(name),
                "limit": CELLS[name][1],
                "now": now[name],
                "before": before[name],
            }
            for name in cells
        ],
    }
    return "\n".join(lines), results
