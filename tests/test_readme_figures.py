"""Every figure of the README is written by the benchmark runner: its results table is what
benchmarks/readme_table.py renders from the committed results (docs/bench_results/NAME.json) and the peer
table (benchmarks/peer.py), each number in it is found there, and each figure is given once."""

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import peer
from benchmarks.common import command
from benchmarks.readme_table import BLOCK, HEADER, SECTIONS, rendered_readme
from benchmarks.run import SECTIONS as RUNNER_SECTIONS
from benchmarks.run import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REPORT = ROOT / "docs" / "benchmarks.md"
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# a number standing alone (not inside a name such as gm512, fp16, 1x5 or e2c14cd), with its decimals and an
# optional "x" of a ratio
NUMBER = re.compile(r"(?<![\w.-])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(x)?(?!\w)")
TIMED = re.compile(r"(?<![\w.,-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?) (s|ms)\b")  # a duration, which a ratio may divide


def table_rows(readme: str) -> list[list[str]]:
    block = BLOCK.search(readme).group(0)
    lines = [line for line in block.splitlines() if line.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(HEADER)
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def values(node, numbers: list[float], texts: list[str]) -> None:
    """Every number of a results file, and every text (keys too: steps are keys in some files)."""
    if isinstance(node, dict):
        for key, value in node.items():
            texts.append(str(key))
            values(value, numbers, texts)
    elif isinstance(node, list):
        for value in node:
            values(value, numbers, texts)
    elif isinstance(node, bool) or node is None:
        return
    elif isinstance(node, (int, float)):
        numbers.append(float(node))
    else:
        texts.append(str(node))


def sources(cell: str) -> tuple[list[float], list[str]]:
    """The numbers and texts of the files a row cites in its results column."""
    numbers: list[float] = []
    texts: list[str] = []
    for name in re.findall(r"docs/bench_results/(\w+)\.json\)", cell):
        values(json.loads((ROOT / "docs" / "bench_results" / f"{name}.json").read_text()), numbers, texts)
    if "benchmarks/peer.py" in cell:
        for row in peer.PEER:
            numbers += [
                float(v) for v in (*row, row.rows_per_round) if isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
        texts.append(peer.SIDE_BY_SIDE_DATE)
    for text in list(texts):  # numbers written in texts: "2 CPU cores", "100" as a key
        numbers += [
            float(m.group(1).replace(",", "") + (f".{m.group(2)}" if m.group(2) else ""))
            for m in NUMBER.finditer(DATE.sub("", text))
        ]
    return numbers, texts


def shown(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def quotient_of(ratio: str, durations: list[str]) -> bool:
    """Whether a ratio as shown can be the quotient of two durations as shown, each within its rounding."""
    half = 0.5 * 10.0 ** -len(ratio.partition(".")[2])
    for i, a in enumerate(durations):
        for j, b in enumerate(durations):
            if i == j:
                continue
            ea, eb = (0.5 * 10.0 ** -len(x.partition(".")[2]) for x in (a, b))
            low, high = (float(a) - ea) / (float(b) + eb), (float(a) + ea) / (float(b) - eb)
            if low - half <= float(ratio) <= high + half:
                return True
    return False


def unfound_numbers(readme: str) -> list[str]:
    """The numbers of the README's table that are not in the files their row cites (after the table's rounding),
    each as "row: number". A ratio "N.NNx" in a row that shows a duration must be the quotient of two durations
    of the rows citing the same files, within their rounding."""
    rows = table_rows(readme)
    durations = {}
    for row in rows:
        durations.setdefault(row[-1], []).extend(
            m.group(1).replace(",", "") for m in TIMED.finditer(" ".join(row[:-1]))
        )
    missing = []
    for row in rows:
        numbers, texts = sources(row[-1])
        cells = " | ".join(row[:-1])
        missing += [f"{row[0]}: {date}" for date in DATE.findall(cells) if not any(date in t for t in texts)]
        for m in NUMBER.finditer(DATE.sub("", cells)):
            whole, decimals, ratio = m.group(1).replace(",", ""), m.group(2) or "", m.group(3)
            figure = f"{whole}.{decimals}" if decimals else whole
            if ratio and TIMED.search(cells):
                found = quotient_of(figure, durations[row[-1]])
            else:
                found = any(shown(v, len(decimals)) == figure for v in numbers)
            if not found:
                missing.append(f"{row[0]}: {m.group(0)}")
    return missing


def test_the_readme_table_is_what_the_runner_writes_from_the_committed_results():
    readme = README.read_text()
    assert rendered_readme(readme, REPORT) == readme, "run python -m benchmarks.run --readme"


def test_every_number_of_the_table_is_in_the_results_it_cites():
    assert set(SECTIONS) <= set(RUNNER_SECTIONS)
    assert table_rows(README.read_text()), "an empty table"
    assert unfound_numbers(README.read_text()) == []


def test_each_figure_is_given_once():
    """A figure with decimals or a ratio appears once in the README (names such as 1x5 and integers such
    as steps may repeat)."""
    readme = README.read_text()
    figures = [m.group(0) for m in NUMBER.finditer(DATE.sub("", readme)) if m.group(2) or m.group(3)]
    assert sorted({f for f in figures if figures.count(f) > 1}) == []


def test_a_figure_typed_in_by_hand_is_caught_and_does_not_survive_rendering():
    readme = README.read_text()
    figure = re.search(r"\d+\.\d\dx", BLOCK.search(readme).group(0)).group()
    edited = readme.replace(figure, "9.99x", 1)
    assert edited != readme
    assert unfound_numbers(edited) != []
    assert rendered_readme(edited, REPORT) == readme


def test_the_runner_writes_the_table_from_the_results_alone_and_again_the_same(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "docs" / "bench_results", tmp_path / "docs" / "bench_results")
    readme = README.read_text()
    (tmp_path / "README.md").write_text(BLOCK.sub(lambda m: m.group(1) + m.group(2), readme))  # an empty block
    report = str(tmp_path / "docs" / "benchmarks.md")
    assert main(["--readme", "--out", report]) == 0
    assert (tmp_path / "README.md").read_text() == readme
    assert main(["--readme", "--out", report]) == 0
    assert (tmp_path / "README.md").read_text() == readme
    (tmp_path / "docs" / "bench_results" / "gpu.json").unlink()
    assert main(["--readme", "--out", report], prog="bench") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu" in err[0]


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "bench_results").glob("*.json")), ids=lambda p: p.stem)
def test_the_committed_results_are_the_runs_the_report_shows(path):
    """A section's results file and its section of the report were written by the same run (the same machine
    line, which carries the date)."""
    record = json.loads(path.read_text())
    name = record["section"]
    assert path.stem == name in RUNNER_SECTIONS
    line = re.search(
        rf"<!-- section:{name} -->\n## .*\n\n_(.*); `{re.escape(command(name))}`_\n", REPORT.read_text()
    ).group(1)
    assert record["machine"] == line, f"{path.name} and the report's {name} section come from different runs"
