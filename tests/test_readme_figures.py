"""Every figure of the README's Results is written by the benchmark runner: each bullet sits in a block
`<!-- readme:NAME -->` that section NAME (benchmarks/NAME.py) renders from its committed results
(docs/bench_results/NAME.json), and rendering the blocks again gives the README as committed."""

import json
import re
from pathlib import Path

import pytest

from benchmarks.common import load_results, readme_blocks, with_readme_block, write_readme_block
from benchmarks.run import SECTIONS, rendered_readme, section

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REPORT = ROOT / "docs" / "benchmarks.md"
BLOCK = re.compile(r"<!-- readme:(\w+) -->\n(.*?)<!-- /readme:\1 -->", re.S)


def results_section(readme: str) -> str:
    start = readme.index("## Results")
    return readme[start:readme.index("\n## ", start + 1)]


def test_every_bullet_of_the_results_sits_in_a_block_a_section_writes():
    results = results_section(README.read_text())
    outside = BLOCK.sub("", results)
    assert not re.findall(r"^\s*- .*", outside, re.M), "Results bullets outside a readme block (typed by hand)"
    names = readme_blocks(results)
    assert len(names) == len(set(names)) and set(names) <= set(SECTIONS)
    for name in names:
        assert hasattr(section(name), "readme"), f"section {name} renders no README block"
    assert all(text.strip() for _, text in BLOCK.findall(results)), "an empty block: render it (--readme)"


def test_every_block_is_rendered_from_saved_results():
    """A README block whose section saved no results would hold text that no committed run wrote."""
    without = {name for name in readme_blocks(README.read_text()) if load_results(REPORT, name) is None}
    assert not without, f"no saved results for {sorted(without)}: run python -m benchmarks.run --sections NAME"


@pytest.mark.parametrize("name", sorted(readme_blocks(README.read_text())))
def test_a_block_is_what_its_section_renders_from_the_committed_results(name):
    module, results = section(name), load_results(REPORT, name)
    expected = module.readme(results)
    written = dict(BLOCK.findall(README.read_text()))[name]
    assert written == expected.rstrip() + "\n", f"README block {name} is not what `python -m benchmarks.run --readme` writes"


def test_rendering_again_reproduces_the_readme_and_catches_a_figure_typed_in_by_hand():
    readme = README.read_text()
    rendered, left = rendered_readme(readme, REPORT)
    assert rendered == readme
    name, text = next((n, t) for n, t in BLOCK.findall(readme) if n not in left)
    figure = re.search(r"\d+\.\d\dx", text).group()
    edited = readme.replace(text, text.replace(figure, "9.99x", 1))
    assert edited != readme and rendered_readme(edited, REPORT)[0] == readme  # the hand edit does not survive


def test_the_committed_results_are_the_runs_the_report_shows():
    """Each section's results file and its section of the report were written by the same run (same
    machine line, which carries the date)."""
    report = REPORT.read_text()
    for path in sorted((REPORT.parent / "bench_results").glob("*.json")):
        record = json.loads(path.read_text())
        name = record["section"]
        assert path.stem == name in SECTIONS
        line = re.search(rf"<!-- section:{name} -->\n## .*\n\n_(.*)_\n", report).group(1)
        assert record["machine"] == line, f"{path.name} and the report's {name} section come from different runs"


def test_a_benchmark_section_writes_the_readme_block_it_measured(tmp_path):
    (tmp_path / "docs").mkdir()
    report = tmp_path / "docs" / "benchmarks.md"
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- readme:latency -->\n- old 2.32x\n<!-- /readme:latency -->\n- other 1.0x\n")
    write_readme_block(report, "latency", "- new 2.50x\n")
    assert readme.read_text() == "intro\n<!-- readme:latency -->\n- new 2.50x\n<!-- /readme:latency -->\n- other 1.0x\n"
    write_readme_block(report, "gm512", "- nothing to replace")  # no such block: the README stays as it is
    assert "nothing to replace" not in readme.read_text()
    assert with_readme_block("<!-- readme:gpu -->\n<!-- /readme:gpu -->", "gpu", "- pending") == \
        "<!-- readme:gpu -->\n- pending\n<!-- /readme:gpu -->"
