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

from .common import cifar_sized_unet, find, image_rows

TITLE = "GPU"
PENDING = "GPU figures: pending (no CUDA device on the machine that wrote this file; run scripts/gpu_check.sh)."
# the rows the README names
PLAIN, CHAIN = {"method": "target"}, {"method": "chain", "tree": "1x5", "verifier": "rmc"}
AUTO = {"tree": "auto", "objective": "time"}
CIFAR = "CIFAR-10-sized random UNet"
NO_GAIN = 1.1  # x: plain sampling's wall-clock over a method's, below which the README says it gains none
CONFIGS = [("plain target", PLAIN),
           ("chain 1x5 rmc", CHAIN),
           ("chain 1x9 block", {"method": "chain", "tree": "1x9", "verifier": "block"}),
           ("tree 2,2,1 rank", {"method": "tree", "tree": "2,2,1", "verifier": "rank"}),
           ("auto, the defaults (time)", {"method": "tree", **AUTO}),
           ("auto, the defaults, by calls", {"method": "tree", "tree": "auto", "objective": "calls"})]


def call_ms(model: str, launch: str, label: int | None, rows: int = 1, repeats: int = 50) -> float:
    """Milliseconds of one target call of `rows` rows with the networks launched as `launch` (median)."""
    problem = build(SamplerConfig(pilot=True, model=model, method="target", steps=100, num_samples=rows, device="cuda",
                                  launch=launch, class_label=label))
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
    lines = [f"{device}, {datetime.date.today().isoformat()}; `python -m benchmarks.run --sections gpu`.", "",
             "A 1-row call of each UNet, by how its network is launched (`--launch`; median of 50, ms):", "",
             "| model | eager | graphs | compile |", "|---|---|---|---|"]
    launch_ms = {}
    with tempfile.TemporaryDirectory() as tmp:
        cifar = cifar_sized_unet(Path(tmp) / "cifar-sized")
        for name, model, label in (("digits", "digits", 3), (CIFAR, cifar, None)):
            launch_ms[name] = {launch: call_ms(model, launch, label) for launch in ("eager", "graphs", "compile")}
            lines.append(f"| {name} | " + " | ".join(f"{launch_ms[name][k]:.2f}" for k in ("eager", "graphs", "compile"))
                         + " |")
    lines += ["", "fp16 UNets, 100 DDPM steps, the networks launched as the GPU's default (`launch` auto); every "
              "row against the plain sampler of the same batch size, in one process (median of 3 runs).", "",
              "| model | batch | method | speedup | target calls | rows/call | acceptance | wall-clock s | vs plain | not in target call |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        cifar = cifar_sized_unet(Path(tmp) / "cifar-sized")
        for name, model, label in (("digits", "digits", 3), (CIFAR, cifar, None)):
            for batch in (1, 16):
                rows = image_rows(model, 100, batch, "cuda", CONFIGS, class_label=label, repeats=3)
                lines += [f"| {name} | {batch} | {row}" for row, _ in rows]
                plain = rows[0][1]
                runs += [{**s, "model": name, "batch": batch, "name": shown_as, "vs_plain": time_speedup(s['wall_s'], plain['wall_s']),
                          "ms_per_call": 1e3 * s["target_s"] / max(s["target_calls"], 1)}
                         for (shown_as, _), (_, s) in zip(CONFIGS, rows)]
    return "\n".join(lines), {"device": device, "date": datetime.date.today().isoformat(), "runs": runs,
                              "launch_ms": launch_ms}


def readme(results: dict) -> str:
    """The README's GPU bullet: the CIFAR-10-sized UNet's 1x5 chain at batch 1, the most the digits UNet
    gains in wall-clock, and how `tree="auto"` with the device's defaults fares against that chain."""
    runs = results["runs"]
    cells = sorted({(r["model"], r["batch"]) for r in runs})
    in_cell = {cell: [r for r in runs if (r["model"], r["batch"]) == cell] for cell in cells}
    chain = find(in_cell[(CIFAR, 1)], **CHAIN)
    digits = max(r["vs_plain"] for r in runs if r["model"] == "digits" and not PLAIN.items() <= r["config"].items())
    # auto against the chain, cell by cell: the chain's wall-clock over auto's (below 1: auto is slower)
    auto = [(find(rows, **AUTO), find(rows, **CHAIN)) for rows in in_cell.values()]
    vs_chain = [time_speedup(a["wall_s"], c["wall_s"]) for a, c in auto]
    slower = sum(x < 1 for x in vs_chain)
    fewer = sum(a["target_calls"] < c["target_calls"] for a, c in auto)
    outside = [a["non_target_fraction"] for a, _ in auto]
    per_cell = ", ".join(f"{'digits' if model == 'digits' else 'CIFAR-sized'} batch {batch} {x:.2f}x"
                         for (model, batch), x in zip(in_cell, vs_chain))
    share = lambda k: f"all {k}" if k == len(auto) else f"{k} of the {len(auto)}"  # of the cells
    verdict = f"slower than that chain in {share(slower)} cells" if slower else \
        f"at least as fast as that chain in {share(len(auto))} cells"
    # runs before the verifier was planned carry none: their defaults verified by blocks
    planned = sorted({a.get("verifier") or "block, the defaults then" for a, _ in auto})
    return (f"- **GPU** ({results['device']}, fp16, the GPU table of {results['date']}): a CIFAR-10-sized UNet at "
            f"batch 1 samples in {chain['vs_plain']:.2f}x less wall-clock with a 1x5 chain ({chain['speedup']:.2f}x fewer calls); "
            "the small digits UNet " + (f"is too cheap per call to gain wall-clock there (at most {digits:.2f}x)"
                                        if digits < NO_GAIN else f"gains up to {digits:.2f}x in wall-clock there")
            + f". `tree=\"auto\"` with the GPU's defaults (AUTO_DEFAULTS in specdemo/resolve.py; verifier: "
            f"{'; '.join(planned)}) makes fewer calls "
            f"than the 1x5 chain in {share(fewer)} cells and is {verdict} "
            f"(its speed against the chain's: {per_cell}); "
            f"{min(outside):.0%} to {max(outside):.0%} of its time is spent outside the target call"
            + (", so on this GPU the 1x5 chain is the faster choice for now." if slower == len(auto) else "."))
