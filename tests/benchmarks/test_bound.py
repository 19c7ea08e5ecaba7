"""The bound section (benchmarks/bound.py): the bound is the best L c(1) / c(L), and each ratio is reported
beside it as a share."""

from benchmarks import bound


def test_the_bound_is_the_best_chain_of_all_accepted_drafts():
    assert bound.bound_of({1: 4.0, 2: 6.0, 4: 8.0, 8: 20.0}) == (2.0, 4)  # 4 x 4 / 8 beats 2 x 4 / 6 and 8 x 4 / 20


def test_the_section_reports_each_ratio_as_a_share_of_the_bound():
    run = dict(
        steps=100,
        pairs=3,
        plan_source="shipped",
        declined=False,
        verifier="block",
        plain_s=0.4,
        auto_s=0.2,
        ratio=2.0,
        calls=20,
        expected_s=0.18,
        planning_s=2.5,
    )
    text = bound.render({"call_ms": {"1": 4.0, "2": 6.0, "4": 8.0}, "runs": [run]})
    assert "more than **2.00x** (at L = 4)" in text
    assert "| 100 | shipped, block | 0.400 | 0.200 | **2.00x** | 1.00 | 20 | 0.180 | -10% | 2.50 |" in text
