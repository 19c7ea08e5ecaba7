"""The README's results table: the block between `<!-- readme:results -->` and `<!-- /readme:results -->`,
built from the committed results (docs/bench_results/NAME.json) and the peer table (benchmarks/peer.py)
alone, running nothing. `python -m benchmarks.run --readme` writes it; a benchmark run writes it again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specdemo.errors import SpecdemoError

from . import peer
from .common import find, results_path
from .gpu import AUTO, CHAIN, CIFAR, PLAIN
from .latency import against_plain

HEADER = ("what", "setting", "specdemo", "baseline", "machine, date", "results")
BLOCK = re.compile(r"(<!-- readme:results -->\n).*?(<!-- /readme:results -->)", re.S)
SECTIONS = ("latency", "online", "digits", "cold", "auto", "gpu", "launches")  # the results files the table reads
PEER_LINK = "[benchmarks/peer.py](benchmarks/peer.py)"

Row = tuple[str, str, str, str, str, str]  # one cell per column of HEADER


def load_record(report: Path, name: str) -> dict:
    """A section's committed results file: its machine line and its results."""
    path = results_path(report, name)
    if not path.exists():
        raise SpecdemoError(f"no results for section {name}: run python -m benchmarks.run --sections {name}")
    return json.loads(path.read_text())


def link(name: str) -> str:
    return f"[{name}.json](docs/bench_results/{name}.json)"


def cpu(record: dict) -> str:
    """The machine and date of a CPU section's results: "2-core CPU, 2026-12-04"."""
    machine = record["machine"]
    cores = re.search(r"(\d+) CPU cores", machine).group(1)
    return f"{cores}-core CPU, {machine.split(',')[0]}"


def seconds(value: float) -> str:
    return f"{value:.3f} s"


def times(value: float) -> str:
    return f"{value:.2f}x"


def latency_rows(record: dict) -> list[Row]:
    """`--tree auto` against plain sampling, one sample of the digits model, in one process."""
    rows = []
    for steps in (100, 1000):
        cell = [
            r for r in record["results"]["digits"] if (r["config"]["steps"], r["config"]["num_samples"]) == (steps, 1)
        ]
        plain, auto, _ = against_plain(cell)
        speed = times(plain["wall_s"] / auto["wall_s"])
        rows.append(
            (
                "Wall-clock, 1 sample",
                f"digits, {steps:,} steps, `--tree auto`, in one process",
                f"{seconds(auto['wall_s'])}: {speed} faster",
                f"plain: {seconds(plain['wall_s'])}",
                cpu(record),
                link("latency"),
            )
        )
    return rows


def online_rows(record: dict) -> list[Row]:
    """The command line's first run in a new process, nothing cached, against plain sampling."""
    rows = []
    for steps, runs in record["results"]["first"].items():
        online, plain = runs["online"], runs["plain"]
        speed = times(plain["wall_s"] / online["wall_s"])
        rows.append(
            (
                "First run, empty plan cache",
                f"digits, {int(steps):,} steps, the CLI in a new process",
                f"{seconds(online['wall_s'])}, {online['calls']:,} calls: {speed} faster",
                f"plain: {seconds(plain['wall_s'])}, {plain['calls']:,} calls",
                cpu(record),
                link("online"),
            )
        )
    return rows


def digits_calls_rows(digits: dict, cold: dict) -> list[Row]:
    """Target calls on the digits model: the seed paper's chain, and auto planned for calls."""
    chain = find(digits["results"]["runs"], steps=100, method="chain", tree="1x5", draft="frozen")
    rows: list[Row] = [
        (
            "Target calls",
            "digits, 100 steps, chain 1x5 (the seed paper's)",
            f"{times(chain['speedup'])} fewer",
            "plain: one call a step",
            cpu(digits),
            link("digits"),
        )
    ]
    for steps in (100, 1000):
        run = find(cold["results"]["runs"], model="digits", steps=steps, start="cold")
        setting = f"digits, {steps:,} steps, `--tree auto --objective calls`, {run['config']['budget']} rows"
        rows.append(
            (
                "Target calls",
                setting,
                f"{times(run['speedup'])} fewer",
                "plain: one call a step",
                cpu(cold),
                link("cold"),
            )
        )
    return rows


def gm512_rows(auto: dict) -> list[Row]:
    """The draft-tree authors' benchmark: the best auto setting within their (4, 4) tree's rows against the
    authors' best there, and the time a trajectory takes, measured side by side."""
    budget = auto["results"]["budget"]
    best = max(auto["results"]["auto"], key=lambda a: a["speedup"])
    theirs = peer.best(peer.side_by_side().values(), budget)
    return [
        (
            "Target calls",
            f"`gm512`, `--tree auto` within {budget} rows, verifier {best['verifier']}, freeze {best['freeze']}",
            f"{times(best['speedup'])} fewer",
            f"authors' code: {times(theirs.speedup)} fewer",
            f"{cpu(auto)}; peer {peer.SIDE_BY_SIDE_DATE}",
            f"{link('auto')}, {PEER_LINK}",
        ),
        (
            "Time a trajectory",
            f"`gm512`, verifier {theirs.verifier}, tree {theirs.k}x{theirs.depth}, one thread",
            f"{theirs.ours_ms:g} ms: {theirs.ms / theirs.ours_ms:.0f}x less",
            f"authors' code: {theirs.ms:,.0f} ms",
            f"CPU, {peer.SIDE_BY_SIDE_DATE}",
            PEER_LINK,
        ),
    ]


def gpu_rows(record: dict) -> list[Row]:
    """The CIFAR-10-sized UNet at batch 1: the 1x5 chain against plain, and `tree="auto"` against the chain."""
    results = record["results"]
    cell = [r for r in results["runs"] if (r["model"], r["batch"]) == (CIFAR, 1)]
    plain, chain, auto = (find(cell, **settings) for settings in (PLAIN, CHAIN, AUTO))
    machine = f"{results['device']}, {results['date']}"
    return [
        (
            "Wall-clock on a GPU, 1 sample",
            f"{CIFAR}, fp16, chain 1x5",
            f"{seconds(chain['wall_s'])}: {times(plain['wall_s'] / chain['wall_s'])} faster",
            f"plain: {seconds(plain['wall_s'])}",
            machine,
            link("gpu"),
        ),
        (
            "Wall-clock on a GPU, 1 sample",
            'the same UNet, `tree="auto"` against the chain',
            f"{seconds(auto['wall_s'])}: {times(chain['wall_s'] / auto['wall_s'])} the chain's speed",
            "chain 1x5: the row above",
            machine,
            link("gpu"),
        ),
    ]


def launches_rows(record: dict) -> list[Row]:
    """Operations a round dispatches outside the network (a kernel launch each on a GPU), now and before."""
    results = record["results"]
    cell = next(c for c in results["cells"] if c["name"] == "auto, 1 sample")
    return [
        (
            "Operations a round outside the network",
            f"digits, 100 steps, {cell['name']}",
            f"{cell['now']['ops_per_round']:.0f}",
            f"before the fused round ({results['before_commit']}): {cell['before']['ops_per_round']:.0f}",
            f"{results['machine']}, {results['date']}",
            link("launches"),
        )
    ]


def results_table(report: Path) -> str:
    """The README's table, from the results files next to the report."""
    record = {name: load_record(report, name) for name in SECTIONS}
    rows = [
        *latency_rows(record["latency"]),
        *online_rows(record["online"]),
        *digits_calls_rows(record["digits"], record["cold"]),
        *gm512_rows(record["auto"]),
        *gpu_rows(record["gpu"]),
        *launches_rows(record["launches"]),
    ]
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def readme_path(report: Path) -> Path:
    """The README next to the report's folder (docs/benchmarks.md -> README.md)."""
    return report.resolve().parent.parent / "README.md"


def rendered_readme(readme: str, report: Path) -> str:
    """The README with its results block holding the table written from the results next to the report."""
    if not BLOCK.search(readme):
        raise SpecdemoError("the README has no block <!-- readme:results --> ... <!-- /readme:results -->")
    table = results_table(report)
    return BLOCK.sub(lambda m: m.group(1) + table + m.group(2), readme)


def write_readme_table(report: Path) -> Path:
    """Write the table into the README next to the report's folder."""
    readme = readme_path(report)
    readme.write_text(rendered_readme(readme.read_text(), report))
    return readme
