"""The network-pricing section (benchmarks/network_pricing.py): a quick run plans its three settings from one
pilot and one measurement of the target's calls, and its report states what its rows show."""

import pytest

from benchmarks import network_pricing as section


@pytest.mark.slow
def test_a_quick_run_compares_three_plans_of_one_pilot(tmp_path):
    body, results = section.measure(0, True, tmp_path / "benchmarks.md")
    rows = results["rows"]
    assert [r["plan"] for r in rows] == [section.AT_STEPS, section.SPREAD, section.FROZEN]
    at, spread, frozen = rows
    # network_level_s is measured in seconds: its sign is asserted, not a ratio that CI load can shrink
    assert at["network_level_s"] > 0 and frozen["network_level_s"] == spread["network_level_s"] == 0
    assert at["network_steps"] > 0 and sum(r["kept"] for r in rows) == 1 and not spread["kept"]
    kept = min((at, frozen), key=lambda r: r["planned_s"])
    assert kept["kept"]
    assert all(r["wall_s"] > 0 and r["planned_s"] > 0 and r["calls"] >= 1 and len(r["walls"]) == 2 for r in rows)
    assert body == section.render(results)
    assert "| 20 | 2 |" in body and "(*kept*)" in body
