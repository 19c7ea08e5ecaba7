"""The latency section of docs/benchmarks.md: wall-clock next to calls, at batch 1 and in batches.

Every ratio is measured side by side in one process; a configuration is built (pilots run, plans
made) before anything is timed, and each run is timed after a first untimed run of the same
configuration (the target's kernels for each row count are set up by then), as in a long-lived
process such as the app. A fresh process pays that set-up too: the last table runs the CLI as a
user would, in new processes, a second time with the plan in the cache.
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

import numpy as np
import torch
from diffusers import DDPMScheduler

from .drafts import FrozenDraft
from .kernels import DDPMKernel
from .models.diffusers_unet import EMBEDDED
from .pipeline import SamplerConfig, build
from .sampling import sample
from .trees import Topology, TopologyPlan
from .verifiers import get_verifier

# the driver's own cost per round, measured at commit 85c9071 (the driver before the phases
# rewrite) by `driver_overhead` on this machine: (batch, tree, verifier) -> ms per round
BEFORE_MS = {
    (1, "1x9", "rmc"): 1.673, (1, "1x9", "block"): 2.028, (1, "2,2,2", "dgrs"): 1.385, (1, "4x3", "rank"): 1.505,
    (1, "1x30", "rmc"): 2.312, (16, "1x9", "rmc"): 2.404, (16, "1x9", "block"): 2.905, (16, "2,2,2", "dgrs"): 2.432,
    (16, "4x3", "rank"): 2.404, (16, "1x30", "rmc"): 3.660,
}
DRIVER_CELLS = [(b, t, v) for b in (1, 16) for t, v in (("1x9", "rmc"), ("1x9", "block"), ("2,2,2", "dgrs"),
                                                         ("4x3", "rank"), ("1x30", "rmc"))]


def digits_kernel(steps: int = 100) -> DDPMKernel:
    config = json.loads((EMBEDDED["digits"] / "scheduler" / "scheduler_config.json").read_text())
    return DDPMKernel(DDPMScheduler.from_config(config), steps)


def instant_network(kernel: DDPMKernel):
    """The exact eps-prediction for data ~ N(0, I) in the digits shape: eps-hat(x, t) = sqrt(1 - abar_t) x.
    A closed form that returns at once, so that a run's time is the driver's own."""
    noise = kernel.noise.float()
    return lambda x, n, **cond: x * noise.to(x.device)[n].view(-1, *[1] * (x.dim() - 1))


def driver_overhead(batch: int, tree: str, verifier: str, repeats: int = 5) -> float:
    """Milliseconds per round outside the target call: digits' kernel (100 DDPM steps, x0-hat
    clipped), the frozen draft freezing x0-hat, the instant network; median of `repeats` seeds."""
    kernel = digits_kernel()
    net = instant_network(kernel)
    per_round = []
    for seed in range(repeats):
        result = sample(net, kernel, (1, 16, 16), batch, tree=Topology.parse(tree), draft=FrozenDraft("x0"),
                        verifier=get_verifier(verifier), seed=seed)
        cost = result.cost
        per_round.append(1e3 * (cost.wall_s - cost.target_s) / cost.rounds)
    return statistics.median(per_round)


def one_row_call_ms(repeats: int = 50) -> float:
    """A 1-row call of the digits UNet (median)."""
    problem = build(SamplerConfig(model="digits", method="target", steps=100, num_samples=1, device="cpu"))
    x, n, label = torch.randn(1, 1, 16, 16), torch.tensor([50]), torch.tensor([3])
    times = []
    with torch.inference_mode():
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            problem.network(x, n, class_labels=label)
            if i >= 3:
                times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)
