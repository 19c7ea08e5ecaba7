"""GPU: fp16 UNets at batch 1 and 16, every method against plain sampling of the same batch."""

from __future__ import annotations

import datetime
import re
import tempfile
from pathlib import Path

import torch

from specdemo.sampling.cost import time_speedup

from .common import cifar_sized_unet, image_rows

TITLE = "GPU"
PENDING = "GPU figures: pending (no CUDA device on the machine that wrote this file; run scripts/gpu_check.sh)."
PLAIN, CHAIN = "plain target", "chain 1x5 rmc"  # the README's pair, by their names in the table
CIFAR = "CIFAR-10-sized random UNet"
NO_GAIN = 1.1  # x: plain sampling's wall-clock over a method's, below which the README says it gains none
CONFIGS = [(PLAIN, {"method": "target"}),
           (CHAIN, {"method": "chain", "tree": "1x5", "verifier": "rmc"}),
           ("chain 1x9 block", {"method": "chain", "tree": "1x9", "verifier": "block"}),
           ("tree 2,2,1 rank", {"method": "tree", "tree": "2,2,1", "verifier": "rank"}),
           ("auto, the defaults (time)", {"method": "tree", "tree": "auto"}),
           ("auto, the defaults, by calls", {"method": "tree", "tree": "auto", "objective": "calls"})]


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict | None]:
    if not torch.cuda.is_available():
        return PENDING, None
    device = torch.cuda.get_device_name()
    lines = [f"{device}: fp16 UNets, 100 DDPM steps; every row against the plain sampler of "
             "the same batch size, in one process (median of 3 runs).", "",
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
                runs += [{"model": name, "batch": batch, "method": method, "vs_plain": time_speedup(s['wall_s'], plain['wall_s']), **s}
                         for (method, _), (_, s) in zip(CONFIGS, rows)]
    return "\n".join(lines), {"device": device, "date": datetime.date.today().isoformat(), "runs": runs}


def committed_table(report: Path) -> dict | None:
    """The GPU table the report holds, read back as results (None: it holds none): an earlier run's,
    written before the section saved its results; its date and device from the section's lines."""
    found = re.search(r"<!-- section:gpu -->(.*?)<!-- /section:gpu -->", report.read_text(), re.S)
    lines = [line for line in found.group(1).splitlines() if line.startswith("|")] if found else []
    if not lines:
        return None
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    runs = []
    for line in lines[2:]:
        row = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        runs.append({"model": row["model"], "batch": int(row["batch"]), "method": row["method"],
                     "speedup": float(row["speedup"]), "vs_plain": float(row["vs plain"].rstrip("x"))})
    return {"device": re.search(r"^NVIDIA (\S+)", found.group(1), re.M).group(1),
            "date": re.search(r"^_(\d{4}-\d\d-\d\d),", found.group(1), re.M).group(1), "runs": runs}


def bullet(results: dict, table: str) -> str:
    """The README's GPU bullet: the CIFAR-10-sized UNet's 1x5 chain at batch 1, and the most the digits
    UNet gains in wall-clock; `table` says which run they come from."""
    by = {(r["model"], r["batch"], r["method"]): r for r in results["runs"]}
    chain = by[(CIFAR, 1, CHAIN)]
    digits = max(r["vs_plain"] for r in results["runs"] if r["model"] == "digits" and r["method"] != PLAIN)
    return (f"- **GPU** ({results['device']}, fp16, {table}): a CIFAR-10-sized UNet at batch 1 samples in "
            f"{chain['vs_plain']:.2f}x less wall-clock with a 1x5 chain ({chain['speedup']:.2f}x fewer calls); the small "
            "digits UNet " + (f"is too cheap per call to gain wall-clock there (at most {digits:.2f}x)." if digits < NO_GAIN
                              else f"gains up to {digits:.2f}x in wall-clock there."))


def readme(results: dict) -> str:
    return bullet(results, f"the GPU table of {results['date']}")


def readme_without_results(report: Path) -> str:
    """Before this driver has run on a GPU: the figures of the report's GPU table, written by an earlier
    driver, and this driver's said to be pending."""
    table = committed_table(report)
    if table is None:
        return "- **GPU:** figures pending (the report holds no GPU table; scripts/gpu_check.sh runs the section)."
    return (bullet(table, f"an earlier driver's GPU table of {table['date']}")
            + " The GPU figures of this driver are pending (no GPU was lent to the tasks that rewrote it).")
