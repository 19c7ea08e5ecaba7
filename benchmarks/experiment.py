"""`python -m benchmarks.experiment NAME` (from the checkout's root): run a study of something the library does
not build, docs/experiments/NAME.py, and write its report docs/experiments/NAME.md and its raw results
docs/experiments/NAME.json. The studies are kept out of the benchmarks' report (docs/benchmarks.md) and its
runner; their index is docs/experiments/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "experiments"
STUDIES = ("redraft", "branching")


def load(name: str) -> ModuleType:
    """A study's module, docs/experiments/NAME.py, imported from its file (docs/ is no package)."""
    module_name = f"experiments_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, FOLDER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def command(name: str) -> str:
    return f"python -m benchmarks.experiment {name}"


def report(title: str, machine: str, name: str, body: str) -> str:
    """A study's report: its title, one line with the machine, date and command, and the study's text."""
    return f"# {title}\n\n_{machine}; `{command(name)}`_\n\n{body}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiment", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=STUDIES)
    parser.add_argument("--trajectories", type=int, default=100, help="as the benchmarks' (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run: writes the report only")
    args = parser.parse_args(argv)
    from .common import machine

    module = load(args.name)
    path = FOLDER / f"{args.name}.md"
    body, results = module.measure(args.trajectories, args.quick, path)
    line = machine()
    path.write_text(report(module.TITLE, line, args.name, body))
    if results is not None and not args.quick:  # as the benchmarks' (common.save_results)
        record = {
            "section": args.name,
            "machine": line,
            "settings": {"trajectories": args.trajectories},
            "results": results,
        }
        path.with_suffix(".json").write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    print(f"{args.name} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
