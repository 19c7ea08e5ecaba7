"""The branching measurement (docs/experiments/branching.py): its Monte Carlo walks give a chain and a fan the laws the
planner's own block laws give, a branch below the root is tried where the chain above it stops, and the
dynamic programme and the report say what their inputs show."""

import numpy as np
import pytest

from benchmarks.experiment import load
from specdemo.planning.programme import DeltaStats, block_fan_stop_probabilities

branching = load("branching")

WALKS = 40_000


def stats_with(delta_at_depth, num_steps: int = 20) -> DeltaStats:
    """Every step's deltas at depth d are delta_at_depth(d) (enough of them that nothing is pooled)."""
    return DeltaStats({(s, d): [delta_at_depth(d)] * 30 for s in range(num_steps) for d in range(1, 30)}, num_steps)


def planner_steps_law(delta_at_depth, width: int, depth: int) -> np.ndarray:
    """P(steps committed) from the planner's fan law: eta = j < L commits j + 1 steps, eta = L commits L."""
    rng = np.random.default_rng(1)
    deltas = np.array([[delta_at_depth(d) for d in range(1, depth + 1)]] * WALKS)
    fans = block_fan_stop_probabilities(
        deltas, rng.standard_normal((WALKS, depth)), rng.standard_normal((WALKS, width)), rng.random(WALKS)
    )
    eta = fans[width - 1, depth - 1]
    law = np.zeros(depth + 2)
    law[1 : depth + 1] += eta[:depth]
    law[depth] += eta[depth]
    return law


@pytest.mark.statistical
def test_a_chain_and_a_fan_walked_have_the_planners_laws():
    growing = lambda d: 0.2 + 0.15 * d  # the frozen draft's delta grows with depth
    stats = stats_with(growing)
    for width in (1, 3):
        walked = branching.steps_law(stats, 0, (width, 0, 6), WALKS, np.random.default_rng(0))
        expected = planner_steps_law(growing, width, 6)
        assert walked.sum() == pytest.approx(1) and walked[0] == 0
        assert np.abs(walked - expected).max() < 0.012, (width, walked, expected)
    # the fan's selection keeps the first level more often than the chain's lone child
    chain, fan = (branching.steps_law(stats, 0, (k, 0, 6), WALKS, np.random.default_rng(0)) for k in (1, 3))
    assert fan[1] < chain[1] - 0.02


def test_a_branch_below_the_root_is_tried_where_the_chain_stops():
    # exact levels but one, at depth 3: the chain stops there often, a tree branching at j = 2 tries siblings
    hard = lambda d: 1.5 if d == 3 else 0.0
    stats = stats_with(hard)
    chain = branching.steps_law(stats, 0, (1, 0, 6), WALKS, np.random.default_rng(0))
    branch = branching.steps_law(stats, 0, (3, 2, 6), WALKS, np.random.default_rng(0))
    assert chain[3] > 0.3 and chain[1:3].sum() == 0  # stops only at the hard level, with its corrected draw
    assert branch[6] > chain[6] + 0.15  # siblings kept where the first child was not
    # with no draft error anywhere every shape commits its whole depth
    exact = stats_with(lambda d: 0.0)
    for shape in ((1, 0, 5), (2, 0, 5), (4, 3, 5)):
        assert branching.steps_law(exact, 0, shape, 256, np.random.default_rng(0))[5] == 1


def test_shapes_fit_the_rows_and_the_programme_adds_calls_up():
    for k, j, depth in branching.shapes(96, 100):
        assert 1 + j + k * (depth - 1 - j) <= 96 < 1 + j + k * (depth - j) or depth == 100
    assert (1, 0, 7) in branching.shapes(96, 7)
    two = np.array([0, 0, 1.0])  # every round commits two steps
    assert branching.expected_calls(dict.fromkeys(range(10), two), 10) == 5
    assert branching.expected_calls({}, 10) == 10  # deterministic steps: one call each
    laws = {n: {(1, 0, 2): two, (2, 0, 2): np.array([0, 1.0, 0])} for n in range(10)}
    picks, value = branching.plan_family(laws, lambda k, j: True, 10)
    assert value == 5 and set(picks.values()) == {(1, 0, 2)}
    picks, value = branching.plan_family(laws, lambda k, j: k == 2, 10)
    assert value == 10


def test_the_report_says_what_the_rows_show():
    def rows(best, steps=100, families=branching.FAMILIES):
        return [
            {
                "steps": steps,
                "rows": 96,
                "draft": "d",
                "family": family,
                "in_sample": calls,
                "fresh": calls,
                "fresh_error": 0.01,
                "branching_steps": 0,
            }
            for (family, _), calls in zip(families, (10.0, 9.5, 9.6, best), strict=False)
        ]

    fans_only = rows(None, 1000, branching.FAMILIES[:2])  # 1,000 steps: chains and fans only
    kept = branching.render({"rows": rows(9.45) + fans_only, "walks": 512, "fresh_walks": 1024})
    worth = branching.render({"rows": rows(9.0), "walks": 512, "fresh_walks": 1024})
    assert "the planner keeps fans" in kept and "Worth planning" not in kept
    assert "Worth planning there" in worth and "100 steps, d" in worth
    assert "| 100 | 96 | d | fans | 9.500 | 9.500 ± 0.010 | +5.3% | 0 |" in kept
    assert "| 1000 | 96 | d | fans | 9.500 | 9.500 ± 0.010 | +5.3% | 0 |" in kept
    assert "100 steps, d: +5.3% ± 0.1%; 1000 steps, d: +5.3% ± 0.1%." in kept  # fans over chains, both settings
    assert "against fans alone, on fresh walks: 100 steps, d: +0.5% ± 0.1%" in kept
    assert "1000 steps, d: +" not in kept.split("against fans alone")[1]  # no branch rows there
