"""GPU: fp16 UNets at batch 1 and 16, every method against plain sampling of the same batch."""

from __future__ import annotations

import datetime
import statistics
import tempfile
import time
from pathlib import Path

import torch

from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling.cost import time_speedup

from .common import cifar_sized_unet, image_rows

TITLE = "GPU"
PENDING = "GPU figures: pending (no CUDA device on the machine that wrote this file; run scripts/gpu_check.sh)."
# the rows the README names
PLAIN, CHAIN = {"method": "target"}, {"method": "chain", "tree": "1x5", "verifier": "rmc"}
AUTO = {"tree": "auto", "objective": "time"}
CIFAR = "CIFAR-10-sized random UNet"
CONFIGS = [
    ("plain target", PLAIN),
    ("chain 1x5 rmc", CHAIN),
    ("chain 1x9 block", {"method": "chain", "tree": "1x9", "verifier": "block"}),
    ("tree 2,2,1 rank", {"method": "tree", "tree": "2,2,1", "verifier": "rank"}),
    ("auto, the defaults (time)", {"method": "tree", **AUTO}),
    ("auto, the defaults, by calls", {"method": "tree", "tree": "auto", "objective": "calls"}),
]


def call_ms(model: str, launch: str, label: int | None, rows: int = 1, repeats: int = 50) -> float:
    """Milliseconds of one target call of `rows` rows with the networks launched as `launch` (median)."""
    problem = build(
        SamplerConfig(
            pilot=True,
            model=model,
            method="target",
            steps=100,
            num_samples=rows,
            device="cuda",
            launch=launch,
            class_label=label,
        )
    )
    x = torch.randn((rows, *problem.target.shape), device="cuda", dtype=problem.dtype)
    n = torch.full((rows,), 50, device="cuda")
    cond = {k: v.to("cuda") for k, v in problem.cond.items()}
    times = []
    with torch.inference_mode():
        for i in range(repeats + 5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            problem.network(x, n, **cond)
            torch.cuda.synchronize()
            if i >= 5:
                times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict | None]:
    if not torch.cuda.is_available():
        return PENDING, None
    device = torch.cuda.get_device_name()
    lines = [
        f"{device}, {datetime.date.today().isoformat()}; `python -m benchmarks.run --sections gpu`.",
        "",
        "A 1-row call of each UNet, by how its network is launched (`--launch`; median of 50, ms):",
        "",
        "| model | eager | graphs | compile |",
        "|---|---|---|---|",
    ]
    launch_ms = {}
    with tempfile.TemporaryDirectory() as tmp:
        cifar = cifar_sized_unet(Path(tmp) / "cifar-sized")
        for name, model, label in (("digits", "digits", 3), (CIFAR, cifar, None)):
            launch_ms[name] = {launch: call_ms(model, launch, label) for launch in ("eager", "graphs", "compile")}
            lines.append(
                f"| {name} | " + " | ".join(f"{launch_ms[name][k]:.2f}" for k in ("eager", "graphs", "compile")) + " |"
            )
    lines += [
        "",
        "fp16 UNets, 100 DDPM steps, the networks launched as the GPU's default (`launch` auto); every "
        "row against the plain sampler of the same batch size, in one process (median of 3 runs).",
        "",
        "| model | batch | method | speedup | target calls | rows/call | acceptance | wall-clock s | vs plain | not in target call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        cifar = cifar_sized_unet(Path(tmp) / "cifar-sized")
        for name, model, label in (("digits", "digits", 3), (CIFAR, cifar, None)):
            for batch in (1, 16):
                rows = image_rows(model, 100, batch, "cuda", CONFIGS, class_label=label, repeats=3)
                lines += [f"| {name} | {batch} | {row}" for row, _ in rows]
                plain = rows[0][1]
                runs += [
                    {
                        **s,
                        "model": name,
                        "batch": batch,
                        "name": shown_as,
                        "vs_plain": time_speedup(s["wall_s"], plain["wall_s"]),
                        "ms_per_call": 1e3 * s["target_s"] / max(s["target_calls"], 1),
                    }
                    for (shown_as, _), (_, s) in zip(CONFIGS, rows, strict=True)
                ]
    return "\n".join(lines), {
        "device": device,
        "date": datetime.date.today().isoformat(),
        "runs": runs,
        "launch_ms": launch_ms,
    }
