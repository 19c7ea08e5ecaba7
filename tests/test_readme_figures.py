"""Every figure the README's Results quote is one the benchmark runner wrote into docs/benchmarks.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ratios, percentages and times: "2.32x", "+12%", "0.46 ms", "1,155 ms"
FIGURE = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?(?:x|%| ms| s)(?![\w])")


def figures_missing(readme: str, report: str) -> list[str]:
    results = readme[readme.index("## Results"):readme.index("\n## ", readme.index("## Results") + 1)]
    written = report.replace("**", "").replace(",", "")
    missing = []
    for figure in FIGURE.findall(results):
        number = figure.replace(",", "")
        # the report's tables write figures without their unit: "0.46" in a column of milliseconds,
        # "3.30" in a column of speedups
        bare = re.sub(r"( ms| s|x)$", "", number)
        if not any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", written) for f in (number, bare)):
            missing.append(figure)
    return missing


def test_every_figure_in_the_readme_results_is_in_the_benchmark_report():
    missing = figures_missing((ROOT / "README.md").read_text(), (ROOT / "docs" / "benchmarks.md").read_text())
    assert not missing, f"README figures not written by the benchmark runner: {missing}"


def test_a_figure_typed_in_by_hand_is_caught():
    readme = "## Results\n\nThe tree samples 9.99x faster, 2.3x fewer calls, 12.34 ms per round.\n## Next\n"
    assert figures_missing(readme, "| 9.99x | 12.3x |") == ["2.3x", "12.34 ms"]


def test_a_benchmark_section_writes_the_readme_block_it_measured(tmp_path):
    from specdemo.bench import write_readme_block

    (tmp_path / "docs").mkdir()
    report = tmp_path / "docs" / "benchmarks.md"
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- readme:latency -->\n- old 2.32x\n<!-- /readme:latency -->\n- other 1.0x\n")
    write_readme_block(report, "latency", "- new 2.50x\n")
    assert readme.read_text() == "intro\n<!-- readme:latency -->\n- new 2.50x\n<!-- /readme:latency -->\n- other 1.0x\n"
    write_readme_block(report, "gm512", "- nothing to replace")  # no such block: the README stays as it is
    assert "nothing to replace" not in readme.read_text()
    # the repository's README has the latency block the benchmark writes
    assert "<!-- readme:latency -->" in (Path(__file__).resolve().parents[1] / "README.md").read_text()
