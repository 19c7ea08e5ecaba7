"""Auto topology: the dynamic programme finds the best widths, plans respect the budget, and a
planned run is exact."""

import itertools

import numpy as np
import pytest
import torch

from specdemo import SamplerConfig, build
from specdemo.errors import SpecdemoError
from specdemo.trees import Topology
from specdemo.trees.auto import _best_tree

from .test_exactness import min_pvalue_bonferroni


def expected_steps(widths, accept):
    total, reach = 0.0, 1.0
    for d, w in enumerate(widths, start=1):
        total += reach
        reach *= accept(d)[w - 1]
    return total


def brute_force(accept, horizon, budget, max_width):
    best = (0.0, ())
    for depth in range(1, horizon + 1):
        for widths in itertools.product(range(1, max_width + 1), repeat=depth):
            if Topology(widths).rows_per_round() - 1 <= budget:
                value = expected_steps(widths, accept)
                if value > best[0] + 1e-12:
                    best = (value, widths)
    return best


@pytest.mark.parametrize("budget", [0, 3, 10, 30])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_programme_matches_brute_force(budget, seed):
    rng = np.random.default_rng(seed)
    table = {d: np.sort(rng.uniform(0.1, 0.95, size=4)) for d in range(1, 6)}  # wider keeps more
    accept = lambda d: tuple(table[d])
    tree = _best_tree(accept, horizon=5, budget=budget)
    value, _ = brute_force(accept, 5, budget, 4)
    assert tree.rows_per_round() - 1 <= budget
    assert expected_steps(tree.widths, accept) == pytest.approx(value, abs=1e-12)


def test_auto_plans_every_step_within_the_budget():
    problem = build(SamplerConfig(model="gm2d", steps=40, method="tree", tree="auto", budget=15, verifier="dgrs",
                                  num_samples=8, device="cpu"))
    trees = problem.tree.trees
    assert len(trees) == 40 and all(t.rows_per_round() <= 15 for t in trees if t.widths)
    assert problem.pilot is not None and problem.pilot.target_calls > 0


def test_auto_needs_a_budget():
    with pytest.raises(SpecdemoError, match="budget"):
        build(SamplerConfig(model="gm2d", method="tree", tree="auto", device="cpu"))


def test_a_planned_run_is_exact():
    base = dict(model="gm2d", steps=40, num_samples=10_000, device="cpu")
    plain = build(SamplerConfig(**base, method="target", seed=1)).run(keep_steps=[20])
    auto = build(SamplerConfig(**base, method="tree", tree="auto", budget=12, verifier="rank", freeze="auto", draft_bias=1.0,
                               seed=2)).run(keep_steps=[20])
    assert min_pvalue_bonferroni(auto.samples, plain.samples) > 1e-3
    assert min_pvalue_bonferroni(auto.states[20], plain.states[20]) > 1e-3
    assert auto.cost.speedup_total > 1.5
