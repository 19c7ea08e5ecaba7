"""Auto topology: the dynamic programme finds the best widths, plans respect the budget, and a
planned run is exact."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from specdemo import SamplerConfig, build
from specdemo import figures as F
from specdemo.errors import SpecdemoError
from specdemo.planning import plan_tree
from specdemo.planning.costs import CallCosts
from specdemo.planning.programme import DeltaStats, _best_round
from specdemo.resolve import AUTO_DEFAULTS
from specdemo.sampling import ACCEPTED
from specdemo.trees import Topology

from ..helpers import recorded_prices
from ..test_exactness import min_pvalue_bonferroni


def calls_after(widths, leaves, accept, calls_ahead):
    """sum_d P(stop at d) V(n + d, .) by the definition: level d rejected -> V(n + d, 0); every
    level kept -> V(n + L, leaves)."""
    total, reach = 0.0, 1.0
    for d, w in enumerate(widths, start=1):
        a = accept(d)[w - 1]
        total += reach * (1 - a) * calls_ahead[d, 0]
        reach *= a
    return total + reach * calls_ahead[len(widths), int(leaves)]


def brute_force(accept, calls_ahead, horizon, budget, max_width, leaf_options):
    best = np.inf
    for depth in range(1, horizon + 1):
        for widths in itertools.product(range(1, max_width + 1), repeat=depth):
            for leaves in leaf_options:
                if leaves and depth >= len(calls_ahead) - 1:  # a leaf at step N is the sample: never evaluated
                    continue
                if Topology(widths).rows_per_round(leaves) - 1 <= budget:
                    best = min(best, calls_after(widths, leaves, accept, calls_ahead))
    return best


@pytest.mark.parametrize("leaf_options", [(False,), (True,), (False, True)])
@pytest.mark.parametrize("budget", [0, 3, 10, 30])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_programme_matches_brute_force(budget, seed, leaf_options):
    rng = np.random.default_rng(seed)
    table = {d: np.sort(rng.uniform(0.1, 0.95, size=4)) for d in range(1, 6)}  # wider keeps more
    accept = lambda d: tuple(table[d])
    # calls to go after landing at n + j, root output unknown / known (known: fewer)
    unknown = np.sort(rng.uniform(5, 20, size=6))[::-1]
    calls_ahead = np.stack([unknown, unknown - rng.uniform(0, 1.5, size=6)], 1)
    value, widths, leaves = _best_round(accept, calls_ahead, 5, budget, leaf_options)
    best = brute_force(accept, calls_ahead, 5, budget, 4, leaf_options)
    if not np.isfinite(best):  # nothing fits (leaves forced, no row to evaluate them)
        assert value == np.inf
        return
    assert leaves in leaf_options and Topology(widths).rows_per_round(leaves) - 1 <= budget
    assert value == pytest.approx(best, abs=1e-12)
    assert calls_after(widths, leaves, accept, calls_ahead) == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_priced_rows_and_network_levels_match_brute_force(seed):
    """The time objective: a round pays for its rows and for each level a draft network drafts (whatever
    the verdict, by every shape that reaches it); the programme's round minimises both plus the expected
    value after it over every shape of at most the budget's rows, equal rows and other depths included."""
    rng = np.random.default_rng(seed)
    table = {d: np.sort(rng.uniform(0.3, 0.97, size=4)) for d in range(1, 6)}
    accept = lambda d: tuple(table[d])
    unknown = np.sort(rng.uniform(5, 20, size=6))[::-1]
    calls_ahead = np.stack([unknown, unknown - rng.uniform(0, 1.5, size=6)], 1)
    network = rng.random(5) < 0.5  # the levels whose step the draft network drafts
    row_price, level_price = (lambda rows: 0.2 * rows), (lambda d: 1.5 * float(network[d - 1]))

    def total(widths, leaves):
        rows = Topology(widths).rows_per_round(leaves) - 1
        return (
            row_price(rows)
            + sum(level_price(d) for d in range(1, len(widths) + 1))
            + calls_after(widths, leaves, accept, calls_ahead)
        )

    shapes = [
        (widths, leaves)
        for depth in range(1, 6)
        for widths in itertools.product(range(1, 5), repeat=depth)
        for leaves in (False, True)
        if not (leaves and depth >= 5) and Topology(widths).rows_per_round(leaves) - 1 <= 12
    ]
    after, widths, leaves = _best_round(accept, calls_ahead, 5, 12, (False, True), row_price, level_price)
    assert total(widths, leaves) == pytest.approx(min(total(*shape) for shape in shapes), abs=1e-12)
    assert after == pytest.approx(calls_after(widths, leaves, accept, calls_ahead), abs=1e-12)  # level prices left out


@pytest.mark.parametrize("leaf_options", [(False,), (True,), (False, True)])
def test_ties_go_to_the_narrower_tree(leaf_options):
    accept = lambda d: (0.5,) * 4  # a wider level keeps no more: width only costs rows
    unknown = np.linspace(20, 5, 6)
    calls_ahead = np.stack([unknown, unknown - 1], 1)
    value, widths, leaves = _best_round(accept, calls_ahead, 5, 30, leaf_options)
    assert set(widths) == {1} and value == pytest.approx(brute_force(accept, calls_ahead, 5, 30, 4, leaf_options))


@pytest.mark.parametrize("leaf_options", [(True,), (False, True)])
def test_no_leaf_row_at_step_n(leaf_options):
    """A round that reaches step N ends at the sample itself: its leaves are never evaluated (the
    driver has no step N to call the network at), so the plan may not choose or count them there."""
    accept = lambda d: (0.95,) * 4  # every level is worth drafting: the plan goes to the horizon
    calls_ahead = np.stack([np.linspace(5, 0, 6), np.linspace(4, 0, 6)], 1)  # the last row is step N
    value, widths, leaves = _best_round(accept, calls_ahead, 5, 30, leaf_options)
    assert not (leaves and len(widths) == 5)
    assert value == pytest.approx(brute_force(accept, calls_ahead, 5, 30, 4, leaf_options), abs=1e-12)


def test_auto_plans_every_step_within_the_budget():
    problem = build(
        SamplerConfig(
            pilot=True,
            model="gm2d",
            steps=40,
            method="tree",
            tree="auto",
            budget=15,
            verifier="dgrs",
            freeze="out",
            prefetch="nearest",
            objective="calls",
            num_samples=8,
            device="cpu",
        )
    )
    plan = problem.tree
    assert len(plan.trees) == len(plan.known_trees) == 40
    assert all(t.rows_per_round() <= 15 for t in plan.trees if t.widths)
    assert all(t.rows_per_round() - 1 <= 15 for t in plan.known_trees if t.widths)  # a known root is no row
    assert not any(plan.leaves + plan.known_leaves)  # prefetch nearest: leaves never evaluated
    assert problem.pilot is not None and problem.pilot.target_calls > 0
    assert 0 < plan.expected_calls < 40


@pytest.mark.slow
def test_replanning_from_the_pilot_reproduces_the_plan_and_more_rows_never_cost_calls():
    problem = build(
        SamplerConfig(
            pilot=True,
            model="gm2d",
            steps=40,
            method="tree",
            tree="auto",
            budget=6,
            verifier="rank",
            freeze="out",
            prefetch="nearest",
            objective="calls",
            num_samples=8,
            device="cpu",
        )
    )
    again = plan_tree(problem, 6)
    assert again.trees == problem.tree.trees and again.known_trees == problem.tree.known_trees
    assert again.expected_calls == problem.tree.expected_calls
    wider = plan_tree(problem, 20)  # every plan within 6 rows is within 20: the best is no worse
    assert wider.expected_calls <= again.expected_calls and max(t.rows_per_round() for t in wider.trees) > 6
    assert max(t.rows_per_round() for t in wider.trees) <= 20
    fixed = build(
        SamplerConfig(pilot=True, model="gm2d", steps=40, method="tree", tree="2,2", num_samples=8, device="cpu")
    )
    with pytest.raises(SpecdemoError, match="pilot's deltas"):
        plan_tree(fixed, 6)


def test_prefetch_auto_chooses_leaf_evaluation_per_step_and_the_run_follows_the_plan():
    problem = build(
        SamplerConfig(
            pilot=True,
            model="gm2d",
            steps=60,
            method="tree",
            tree="auto",
            budget=10,
            verifier="rank",
            freeze="x0",
            prefetch="auto",
            objective="calls",
            num_samples=64,
            device="cpu",
            seed=3,
        )
    )
    plan = problem.tree
    assert any(plan.leaves) and not plan.leaves[59]  # no leaves where the horizon is 0 (the deterministic last step)
    # nor a leaf row at step N, which the driver would not evaluate: the plan must not count it
    assert all(
        n + plan.at(n, known).depth < 60 for n in range(60) for known in (False, True) if plan.leaves_at(n, known)
    )
    assert all(t.rows_per_round(ev) <= 10 for t, ev in zip(plan.trees, plan.leaves, strict=True) if t.widths)
    assert all(
        t.rows_per_round(ev) - 1 <= 10 for t, ev in zip(plan.known_trees, plan.known_leaves, strict=True) if t.widths
    )
    result = problem.run(trace=True, trace_states=False)
    known_rounds = 0
    for rt in result.trace:
        for i, (step, known, depth) in enumerate(zip(rt.step, rt.root_known, rt.depth, strict=True)):
            tree, leaves = plan.at(int(step), bool(known)), plan.leaves_at(int(step), bool(known))
            assert F.round_widths(rt)[:depth] == tree.widths[:depth]
            leaf_nodes = np.flatnonzero(rt.node_depth == depth)
            assert rt.evaluated[i, leaf_nodes].all() == leaves and rt.evaluated[i, leaf_nodes].any() == leaves
            if known:  # the frozen output is exact at the root: the first level is always kept
                known_rounds += 1
                assert rt.delta[i, 0] < 1e-3 and (rt.status[i, np.flatnonzero(rt.node_depth == 1)] == ACCEPTED).any()
                assert not rt.evaluated[i, 0]  # and the root is no row
    assert known_rounds > 64  # more than the warm-ups: committed evaluated leaves


def test_auto_alone_takes_the_fastest_measured_settings():
    """--tree auto with nothing else: the device's AUTO_DEFAULTS, a plan priced in seconds."""
    problem = build(
        SamplerConfig(pilot=True, model="gm2d", method="tree", tree="auto", steps=30, num_samples=4, device="cpu")
    )
    best = AUTO_DEFAULTS["cpu"]
    c = problem.config
    assert (c.freeze, c.prefetch, c.verifier, c.budget, c.objective) == (
        best["freeze"],
        best["prefetch"],
        best["verifier"],
        best["budget"],
        "time",
    )
    planned = problem.declined or problem  # the plan, whether or not plain sampling was expected faster (timing)
    assert planned.tree.objective == "time" and planned.tree.expected_s > 0 and planned.cost_model is not None
    with pytest.raises(SpecdemoError, match="budget"):
        build(SamplerConfig(pilot=True, model="gm2d", method="tree", tree="auto", budget=0, device="cpu"))


LAUNCH_BOUND_CALLS = CallCosts(rows=(1, 256), seconds=(1e-3, 1e-3), calls=0)
LAUNCH_BOUND_DRIVER = {"round_s": 1e-4, "level_s": 1e-5, "network_level_s": 0.0}


@pytest.mark.parametrize(
    "method,verifier,objective",
    [("tree", "rank", "calls"), ("chain", "block", "calls"), ("tree", "rank", "time"), ("tree", "block", "time")],
)
@pytest.mark.slow
@pytest.mark.statistical
def test_a_planned_run_is_exact(method, verifier, objective):
    """Priced by time, with prices of a launch-bound device (a call costs the same at any size): recorded, so
    the plan does not move with this machine's load."""
    base = dict(model="gm2d", steps=40, num_samples=10_000, device="cpu")
    plain = build(SamplerConfig(pilot=True, **base, method="target", seed=1)).run(keep_steps=[20])
    with recorded_prices(LAUNCH_BOUND_CALLS, LAUNCH_BOUND_DRIVER, plain_s=40 * 1.1e-3):
        problem = build(
            SamplerConfig(
                pilot=True,
                **base,
                method=method,
                tree="auto",
                budget=12,
                verifier=verifier,
                freeze="auto",
                prefetch="auto",
                draft_bias=1.0,
                objective=objective,
                seed=2,
            )
        )
    assert problem.declined is None
    leaves = problem.tree.leaves[:39]  # the stochastic steps
    assert objective == "time" or (any(leaves) and not all(leaves))  # leaves evaluated at some steps only
    # block plans fans (K, 1, ..., 1), chains on the chain method
    assert verifier != "block" or all(
        set(t.widths[1:]) <= {1} and (method == "tree" or t.is_chain) for t in problem.tree.topologies
    )
    auto = problem.run(keep_steps=[20])
    assert min_pvalue_bonferroni(auto.samples, plain.samples) > 1e-3
    assert min_pvalue_bonferroni(auto.states[20], plain.states[20]) > 1e-3
    assert auto.cost.speedup_total > 1.5


def test_prefetch_auto_needs_a_planned_topology():
    with pytest.raises(SpecdemoError, match="prefetch auto .* needs --tree auto"):
        build(SamplerConfig(pilot=True, model="gm2d", method="tree", tree="2,1", prefetch="auto", device="cpu"))


def test_delta_stats_leave_out_the_exact_first_level_of_a_known_root():
    nan = np.nan
    # a chain 0 -> 1 -> 2; two trajectories at step 5, the second with its root's output known
    rnd = SimpleNamespace(
        delta=np.array([[0.5, 0.7, nan], [0.0, 0.9, nan]]),
        node_depth=np.array([0, 1, 2]),
        root_known=np.array([False, True]),
        step=np.array([5, 5]),
    )
    stats = DeltaStats.from_traces([rnd], num_steps=10)
    assert stats.deltas == {(5, 1): [0.5], (6, 2): [0.7, 0.9]}


def test_the_programmes_pieces_each_do_their_part():
    """plan_topology's pieces, each on its own: the pricing of a round, a level's acceptance, the block
    plan's stop probabilities, and the round chosen at one step."""
    from specdemo.planning.programme import BLOCK_FAN_WIDTHS, BlockStops, LevelAcceptance, RoundPrice, best_round
    from specdemo.verifiers import BlockVerification, GreedyRejectionSampling

    calls = RoundPrice(None, None, 10)
    assert calls.at(3)(0, 1) == 0.0 and calls.at(3)(5, 2) == 1.0 and calls.seconds(3, 5, 2) == 0.0
    rng = np.random.default_rng(0)
    close = DeltaStats({(n, d): list(rng.uniform(0, 1e-3, 30)) for n in range(10) for d in (1, 2)}, 10)
    far = DeltaStats({(n, d): list(rng.uniform(2, 4, 30)) for n in range(10) for d in (1, 2)}, 10)
    exact, hard = (
        LevelAcceptance(close, GreedyRejectionSampling(), 4),
        LevelAcceptance(far, GreedyRejectionSampling(), 4),
    )
    assert min(exact(5, 1)) > 0.99 and exact.exact == (1.0,) * 4
    assert (
        all(a < b for a, b in zip(hard(5, 1), hard(5, 1)[1:], strict=False)) and hard(5, 1)[0] < 0.5
    )  # more children, more kept
    fans = BlockStops(far, 8)(2, 3, False)
    assert fans.shape == (BLOCK_FAN_WIDTHS, 3, 4) and np.allclose(fans.sum(2), 1.0)
    assert BlockStops(far, 8)(2, 3, True).shape == (1, 3, 4)  # an exact first level: one child is enough
    # at the last step a known root's exact level commits it for free; an unknown root pays a call
    value = np.zeros((11, 2))
    args = (1, 4, GreedyRejectionSampling(), hard, None, calls, (False,), True)
    free = best_round(9, 1, value, *args)
    assert (free.value, free.widths, free.rows) == (0.0, (1,), 0)
    paid = best_round(9, 0, value, *args)
    assert paid.value == 1.0 and paid.rows >= 1
    block = best_round(0, 0, value, 3, 4, BlockVerification(), hard, BlockStops(far, 8), calls, (False,), True)
    assert block.widths and all(w == 1 for w in block.widths[1:]) and block.rows <= 4  # a fan within the budget
