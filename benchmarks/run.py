"""`python -m benchmarks.run` (from the checkout's root; `python -m specdemo bench` runs it too): run
benchmark sections and write them into docs/benchmarks.md, with each section's raw results
(docs/bench_results/NAME.json), then the README's results table rendered from those results
(benchmarks/readme_table.py).

`--readme` renders the README's table from the committed results alone, running nothing.
Importing this module imports no torch, so that --help answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from specdemo.errors import SpecdemoError

# in the report's order; each is a module of this package
SECTIONS = (
    "gm512",
    "prefetch",
    "gm2d",
    "auto",
    "digits",
    "block",
    "whole_tree",
    "drafts",
    "distilled",
    "network_pricing",
    "equal_rows",
    "cold",
    "online",
    "visit",
    "quality",
    "throughput",
    "sd_unet",
    "gpu",
    "launches",
    "latency",
    "bound",
)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the benchmarks and write a markdown report, their raw results and the README's figures.",
    )
    parser.add_argument(
        "--out",
        default="docs/benchmarks.md",
        help="the report (default %(default)s); results go to bench_results/ next to it, and the "
        "README's table to the README of the folder above",
    )
    parser.add_argument(
        "--trajectories", type=int, default=100, help="trajectories per gm512 cell (default %(default)s)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small smoke run (few cells, shorter runs): writes the report's sections only",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sections", help="comma-separated sections to refresh (default: all): " + ", ".join(SECTIONS))
    what.add_argument(
        "--readme",
        action="store_true",
        help="render the README's results table from the committed results, running nothing",
    )
    return parser


def section(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def run(args) -> int:
    path = Path(args.out)
    names = args.sections.split(",") if args.sections else list(SECTIONS)
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        raise SpecdemoError(f"unknown section(s) {', '.join(n[:40] for n in unknown)}; accepted: {', '.join(SECTIONS)}")
    from .common import save_results, write_section
    from .readme_table import readme_path, write_readme_table

    if args.readme:
        print(f"{write_readme_table(path)}: results table written from {path.parent / 'bench_results'}")
        return 0
    os.environ.setdefault("SPECDEMO_CACHE", "off")  # every planned setting pilots afresh: its pilot is reported
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = section(name)
        t0 = time.perf_counter()
        body, results = module.measure(args.trajectories, args.quick, path)
        write_section(path, name, module.TITLE, body)
        # a quick run's figures are a smoke test's: the saved results and the README keep the full run's
        if results is not None and not args.quick:
            save_results(path, name, results, {"trajectories": args.trajectories})
        print(f"{name}: {time.perf_counter() - t0:.0f} s -> {path}")
    if not args.quick and readme_path(path).exists():
        try:
            print(f"{write_readme_table(path)}: results table written again")
        except SpecdemoError as err:  # a report of its own (scripts/gpu_check.sh): the README stays as it is
            print(f"README table left as it was: {err}")
    return 0


def main(argv=None, prog: str = "python -m benchmarks.run") -> int:
    """Bad arguments exit with status 2 and one line on stderr."""
    args = build_parser(prog).parse_args(argv)
    try:
        return run(args)
    except (SpecdemoError, OSError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
