"""The benchmarks' runner (benchmarks/run.py) and the peer table every figure of the authors' code is read from."""

import json
import re
from pathlib import Path

from benchmarks import peer
from benchmarks.run import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_section_writes_its_part_of_the_report_and_its_results(tmp_path, capsys):
    report = tmp_path / "docs" / "benchmarks.md"
    assert main(["--sections", "prefetch", "--trajectories", "4", "--out", str(report)]) == 0
    text = report.read_text()
    assert text.startswith("# Benchmarks\n\nWritten by `python -m benchmarks.run`")
    section = re.search(
        r"<!-- section:prefetch -->\n## Prefetch policies\n\n_(.*); `python -m benchmarks.run --sections prefetch`_\n\n(.*)\n"
        r"<!-- /section:prefetch -->",
        text,
        re.S,
    )
    assert section and "| prefetch | speedup | target calls per trajectory | acceptance |" in section.group(2)
    record = json.loads((tmp_path / "docs" / "bench_results" / "prefetch.json").read_text())
    assert record["section"] == "prefetch" and record["machine"] == section.group(1)
    assert [r["prefetch"] for r in record["results"]["runs"]] == ["nearest", "parent", "none", "leaves"]
    assert all(r["config"]["num_samples"] == 4 for r in record["results"]["runs"])
    # a second run replaces the section in place; a quick run writes the section but keeps the full run's results
    assert main(["--sections", "prefetch", "--trajectories", "4", "--quick", "--out", str(report)]) == 0
    assert report.read_text().count("<!-- section:prefetch -->") == 1
    assert json.loads((tmp_path / "docs" / "bench_results" / "prefetch.json").read_text()) == record


def test_an_unknown_section_is_one_line(capsys):
    assert main(["--sections", "gm512,nosuch"], prog="bench") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench: error: unknown section(s) nosuch; accepted: gm512")


def test_the_cli_says_in_one_line_where_the_benchmarks_are_when_they_are_not_there(monkeypatch, tmp_path, capsys):
    from specdemo import cli

    monkeypatch.setattr(
        cli, "__file__", str(tmp_path / "site-packages" / "specdemo" / "cli.py")
    )  # an installed package
    assert cli.main(["bench", "--sections", "gm512"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkout" in err[0] and "python -m benchmarks.run" in err[0]


def test_every_peer_figure_is_in_its_source():
    """benchmarks/peer.py is the one table the report and the README read the authors' figures from;
    its source is docs/algorithms.md section 5."""
    text = (ROOT / "docs" / "algorithms.md").read_text()
    source = " ".join(text[text.index("## 5.") : text.index("## 6.")].split())
    names = {"rmc": "RMC chain", "dgrs": "D-GRS", "rank": "rank-aware"}
    for row in peer.PEER:
        if row.source == peer.SIDE_BY_SIDE:
            assert f"{row.speedup:.3f} / {row.ours_speedup:.3f}, {row.ms:g} / {row.ours_ms:g} ms" in source, row
        elif row.prefetch == "nearest":
            cells = (
                f"| {names[row.verifier]} | ({row.k}, {row.depth}) | {'yes' if row.leaves else 'no'} | "
                f"{row.rows_per_round} | {row.speedup:.2f}"
            )
            assert cells in source, row
            assert row.trajectories == (
                500
                if f"{cells} |" in source
                else int(re.search(re.escape(cells) + r" \((\d+) trajectories\)", source).group(1))
            )
        else:
            assert f"to {row.speedup:.2f}x" in source, row
    assert f"side by side with specdemo on {peer.SIDE_BY_SIDE_DATE} (300 trajectories a cell" in source
    assert {r.trajectories for r in peer.PEER if r.source == peer.SIDE_BY_SIDE} == {300}
