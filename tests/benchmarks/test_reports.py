"""The sections rendered from their saved results: each section of docs/benchmarks.md named here is its
committed results (docs/bench_results/NAME.json) rendered by its module's render, under the results' machine
line, so that the report and the results cannot drift."""

import json
from pathlib import Path

import pytest

from benchmarks.common import section_block, section_pattern
from benchmarks.run import section

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "benchmarks.md"
RENDERED = ("gm512", "auto", "digits", "block", "whole_tree", "drafts", "network_pricing", "cold", "sd_unet", "latency")


def rendered(name: str) -> str:
    record = json.loads((ROOT / "docs" / "bench_results" / f"{name}.json").read_text())
    module = section(name)
    assert record["section"] == name
    return section_block(name, module.TITLE, record["machine"], module.render(record["results"]))


def check(report: Path, name: str) -> None:
    found = section_pattern(name).search(report.read_text())
    assert found is not None, f"no section {name} in {report}"
    assert found.group(0) == rendered(name), f"re-render section {name} from docs/bench_results/{name}.json"


@pytest.mark.parametrize("name", RENDERED)
def test_a_sections_report_is_its_committed_results_rendered(name):
    check(REPORT, name)


def test_an_edited_figure_is_caught(tmp_path):
    """A copy of the report with one figure changed fails the check."""
    text = REPORT.read_text()
    edited = text.replace("| 1 | 1x9 | rmc | 2.04 |", "| 1 | 1x9 | rmc | 2.05 |", 1)
    assert edited != text
    (tmp_path / "benchmarks.md").write_text(edited)
    check(tmp_path / "benchmarks.md", "gm512")  # the other sections are untouched
    with pytest.raises(AssertionError, match="re-render section latency"):
        check(tmp_path / "benchmarks.md", "latency")
