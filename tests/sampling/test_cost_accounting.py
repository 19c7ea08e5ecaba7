"""The cost a run reports: target calls, counted calls and rows per trajectory, a batch's sequential calls,
processes merged into one run, counted calls that leave out deterministic steps, and the speedups of the
authors' gm512 table."""

import numpy as np
import pytest

from specdemo.drafts import FrozenOutput, FrozenX0
from specdemo.sampling import sample
from specdemo.trees import Topology
from specdemo.verifiers import GreedyRejectionSampling, ReflectionMaximalCoupling

from .common import gm16_ddpm, gm512_flow, run


def test_plain_sampling_costs_one_call_per_step():
    target, kernel, net = gm16_ddpm(20)
    result = run(net, kernel, target.shape, 5, "plain", seed=0)
    cost = result.cost
    assert cost.method == "target"
    assert cost.target_calls == 20 and cost.rounds == 20
    assert (cost.calls_per_trajectory == 20).all() and (cost.rows_per_trajectory == 20).all()
    # the final DDPM step (t = 0) is deterministic: on neither side of the speedup
    assert cost.stochastic_steps == 19 and (cost.counted_calls == 19).all()
    assert cost.speedup == 1.0 and cost.speedup_total == 1.0
    assert cost.draft_calls == 0 and cost.acceptance is None


def test_plain_sampling_gm512_flow():
    target, kernel, net = gm512_flow()
    cost = run(net, kernel, target.shape, 3, "plain", seed=0).cost
    assert cost.target_calls == 30 and (cost.calls_per_trajectory == 30).all()
    assert cost.stochastic_steps == 28 and (cost.counted_calls == 28).all()
    assert cost.speedup == 1.0 and cost.speedup_total == 1.0
    summary = cost.summary()
    assert summary["target_calls"] == 30 and summary["target_rows"] == 90 and summary["speedup"] == 1.0


def rounds_of(trace, trajectory):
    """[(step, depth, committed_steps, evaluated row, status row)] of one trajectory, in order."""
    out = []
    for rt in trace:
        hit = np.nonzero(rt.trajectories == trajectory)[0]
        if hit.size:
            a = int(hit[0])
            out.append(
                (
                    int(rt.step[a]),
                    int(rt.depth[a]),
                    int(rt.committed_steps[a]),
                    rt.evaluated[a],
                    rt.status[a],
                    rt.node_depth,
                )
            )
    return out


@pytest.mark.parametrize("length", [5, 3])
def test_chain_accounting_on_gm512(length):
    """gm512, flow churn c = 0.06, T = 30: steps 0 and 29 are deterministic direct steps, the 28 others
    are covered by speculative rounds; per trajectory, calls = warm-up + rounds + 2 endpoint calls,
    counted calls = warm-up + rounds, rows = what the rounds evaluated + warm-up + endpoints."""
    target, kernel, net = gm512_flow()
    tree = Topology.chain(length)
    b = 6
    result = sample(
        net,
        kernel,
        target.shape,
        b,
        tree=tree,
        draft=FrozenOutput(),
        verifier=ReflectionMaximalCoupling(),
        seed=5,
        trace=True,
        trace_states=False,
    )
    cost = result.cost
    assert cost.method == "chain" and cost.steps == 30 and cost.stochastic_steps == 28
    internal = tree.rows_per_round()
    assert internal == length
    for i in range(b):
        rounds = rounds_of(result.trace, i)
        # the committed steps tile 1..28 without gap or overlap
        assert rounds[0][0] == 1
        for (s0, _, c0, *_), (s1, *_) in zip(rounds, rounds[1:], strict=False):
            assert s1 == s0 + c0
        assert rounds[-1][0] + rounds[-1][2] == 29
        assert sum(r[2] for r in rounds) == 28
        rows = 0
        for k, (step, depth, committed, evaluated, _status, node_depth) in enumerate(rounds):
            assert depth == min(length, 29 - step) and 1 <= committed <= depth
            internal_nodes = np.nonzero(node_depth[: len(evaluated) - 1] < depth)[0]
            # every internal node of the (truncated) chain is evaluated, the root possibly by the
            # warm-up call just before the first round; no leaf is evaluated
            assert set(np.nonzero(evaluated)[0]) | ({0} if k == 0 else set()) == set(internal_nodes)
            if k > 0 and depth == length:
                assert evaluated.sum() == internal  # a full tree: its internal nodes, one call
            rows += int(evaluated.sum())
        warm_up = 1
        assert cost.calls_per_trajectory[i] == warm_up + len(rounds) + 2
        assert cost.counted_calls[i] == warm_up + len(rounds)  # deterministic endpoints not counted
        assert cost.rows_per_trajectory[i] == rows + warm_up + 2
    assert cost.target_calls >= cost.calls_per_trajectory.max()
    assert cost.speedup == pytest.approx(28 / cost.counted_calls.mean())
    assert cost.speedup_total == pytest.approx(30 / cost.calls_per_trajectory.mean())
    assert cost.draft_calls == 0  # the frozen draft calls no network
    assert cost.rounds >= len({rt.round for rt in result.trace}) + 2


def test_single_trajectory_batch_calls_equal_its_calls():
    target, kernel, net = gm512_flow()
    cost = sample(
        net,
        kernel,
        target.shape,
        1,
        tree=Topology((2, 2, 2)),
        draft=FrozenOutput(),
        verifier=GreedyRejectionSampling(),
        seed=1,
    ).cost
    assert cost.target_calls == cost.calls_per_trajectory[0] == cost.counted_calls[0] + 2


def test_a_batch_reports_its_sequential_speedup_next_to_the_per_trajectory_one():
    """A batch moves at its slowest trajectory's pace: its sequential calls are at least any one
    trajectory's, so speedup_batch (steps over them) is at most the per-trajectory figures."""
    target, kernel, net = gm512_flow()
    cost = sample(
        net,
        kernel,
        target.shape,
        30,
        tree=Topology.chain(5),
        draft=FrozenOutput(),
        verifier=ReflectionMaximalCoupling(),
        seed=1,
    ).cost
    assert cost.target_calls >= cost.calls_per_trajectory.max()
    assert cost.speedup_batch == kernel.num_steps / cost.target_calls
    assert cost.speedup_batch < cost.speedup_total <= cost.speedup
    summary = cost.summary()
    assert summary["speedup_batch"] == cost.speedup_batch and summary["total_target_calls"] == cost.target_calls


def test_processes_merge_into_one_run():
    """Two processes side by side: trajectory figures in trajectory order, sequential calls of the
    slower process, and every process's calls in total_target_calls."""
    from specdemo.parallel import merge_costs

    target, kernel, net = gm512_flow()
    runs = [
        sample(
            net,
            kernel,
            target.shape,
            2,
            tree=Topology.chain(3),
            draft=FrozenOutput(),
            verifier=ReflectionMaximalCoupling(),
            seed=1,
            indices=indices,
        ).cost
        for indices in ([0, 2], [1, 3])
    ]
    merged = merge_costs(runs, np.argsort([0, 2, 1, 3]))
    alone = sample(
        net,
        kernel,
        target.shape,
        4,
        tree=Topology.chain(3),
        draft=FrozenOutput(),
        verifier=ReflectionMaximalCoupling(),
        seed=1,
    ).cost
    assert np.array_equal(merged.calls_per_trajectory, alone.calls_per_trajectory)
    assert merged.target_calls == max(r.target_calls for r in runs)
    assert merged.total_target_calls == sum(r.target_calls for r in runs) > merged.target_calls


@pytest.mark.parametrize(
    "tree,verifier,expected",
    [
        (Topology.chain(5), ReflectionMaximalCoupling, 1.93),
        (Topology((2, 2, 2)), GreedyRejectionSampling, 1.84),
    ],
)
@pytest.mark.statistical
def test_gm512_speedup_matches_the_authors_table(tree, verifier, expected):
    """algorithms.md section 5 (500 trajectories, standard error about 0.006x); 200 here (about 0.01x)."""
    target, kernel, net = gm512_flow()
    cost = sample(net, kernel, target.shape, 200, tree=tree, draft=FrozenOutput(), verifier=verifier(), seed=2).cost
    assert abs(cost.speedup - expected) < 0.06, cost.speedup


@pytest.mark.parametrize("tree", ["1x1", "3"])
def test_calls_counted_are_the_calls_with_a_stochastic_row(tree):
    """Counted calls (the speedup's denominator) leave out the calls that serve deterministic steps
    only, as plain sampling's calls there are not counted: with leaves evaluated under flow matching a
    call can hold only leaves at the last step, which is deterministic."""
    target, kernel, net = gm512_flow()
    stochastic = (kernel.scales > 0).tolist()
    leaf_only = 0
    for seed in range(6):
        steps_of_calls = []

        def recording(x, n, **cond):
            steps_of_calls.append(set(n.tolist()))  # noqa: B023  (sampled with in this iteration)
            return net(x, n, **cond)

        result = sample(
            recording,
            kernel,
            target.shape,
            1,
            tree=Topology.parse(tree),
            draft=FrozenX0(),
            verifier=GreedyRejectionSampling(),
            prefetch="leaves",
            seed=seed,
            trace=True,
            trace_states=False,
        )
        cost = result.cost
        assert cost.calls_per_trajectory[0] == len(steps_of_calls)
        assert cost.counted_calls[0] == sum(any(stochastic[n] for n in steps) for steps in steps_of_calls)
        # rounds whose one row was a leaf at the last step: a known root one step before it
        leaf_only += sum(
            int(rt.step[0]) + int(rt.depth[0]) == kernel.num_steps - 1
            and bool(rt.root_known[0])
            and int(rt.depth[0]) == 1
            for rt in result.trace
        )
    assert leaf_only  # the case the rule is for happened
