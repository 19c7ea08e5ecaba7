"""The round trace (trace=True): each round's record of statuses, deltas, acceptance probabilities and states
agrees with the committed path, the kept states and the cost, and a tree cut short near the end is recorded
as the shorter tree."""

import numpy as np
import pytest
import torch

from specdemo import figures as F
from specdemo.sampling import ACCEPTED, CORRECTED, REJECTED, ROOT, UNVISITED

from .common import gm16_ddpm, methods, run


def check_round(rt, a, tree, verifier_name, leaves):
    """Invariants of one trajectory's row in one RoundTrace."""
    m = rt.status.shape[1] - 1  # the corrected slot
    status, depth, committed = rt.status[a], int(rt.depth[a]), int(rt.committed_steps[a])
    parent, node_depth = rt.parent, rt.node_depth
    assert status[0] == ROOT
    assert 1 <= depth <= tree.depth and 1 <= committed <= depth
    # accepted nodes: a path from the root, one per depth
    accepted = [i for i in range(1, m) if status[i] == ACCEPTED]
    assert [int(node_depth[i]) for i in accepted] == list(range(1, len(accepted) + 1))
    for prev, node in zip([0] + accepted, accepted, strict=False):
        assert parent[node] == prev
    corrected_slots = [i for i in range(m + 1) if status[i] == CORRECTED]
    assert corrected_slots in ([], [m])  # at most one corrected node, in its slot
    corrected = bool(corrected_slots)
    assert (rt.corrected_parent[a] >= 0) == corrected
    if corrected:
        assert rt.corrected_parent[a] == (accepted[-1] if accepted else 0)
        assert committed == len(accepted) + 1
    else:
        assert committed == len(accepted) == depth
    # verified nodes: the root and the accepted nodes that have children in this round's tree
    verified = [0] + [i for i in accepted if node_depth[i] < depth]
    off = [i for i in range(m + 1) if i not in verified]
    assert np.isfinite(rt.delta[a, verified]).all() and (rt.delta[a, verified] >= 0).all()
    assert np.isnan(rt.delta[a, off]).all(), "delta must be NaN off the verified path"
    acc = rt.node_accept_prob[a, verified]
    assert ((acc >= 0) & (acc <= 1)).all() and np.isnan(rt.node_accept_prob[a, off]).all()
    # examined children hang from verified nodes; nothing else is marked
    examined = [i for i in range(1, m) if status[i] in (ACCEPTED, REJECTED)]
    assert all(parent[i] in verified for i in examined)
    assert np.isfinite(rt.child_accept_prob[a, examined]).all()
    assert np.isnan(rt.child_accept_prob[a, [i for i in range(m + 1) if i not in examined]]).all()
    assert all(status[i] == UNVISITED for i in range(1, m) if i not in examined)
    if verifier_name in ("dgrs", "rmc", "block"):
        # sequence couplings examine children in drafting order: the rejected siblings of a kept
        # child precede it, and a correction follows the rejection of every child
        for u in verified:
            kids = [i for i in range(1, m) if parent[i] == u]
            kept = [i for i in kids if status[i] == ACCEPTED]
            if kept:
                assert all(status[i] == REJECTED for i in kids if i < kept[0])
                assert all(status[i] == UNVISITED for i in kids if i > kept[0])
            elif u == rt.corrected_parent[a]:
                assert all(status[i] == REJECTED for i in kids)
    # evaluated: within this row's tree; leaves only when leaves are evaluated
    ev = rt.evaluated[a]
    assert not ev[m]
    assert all(node_depth[i] <= depth for i in np.nonzero(ev)[0])
    if not leaves:
        assert all(node_depth[i] < depth for i in np.nonzero(ev)[0])
    return accepted, corrected, verified


@pytest.mark.parametrize(
    "method,verifier_name,leaves",
    [
        ("tree-dgrs", "dgrs", False),
        ("chain-rmc", "rmc", False),
        ("chain-block", "block", False),
        ("tree-rank-leaves", "rank", True),
    ],
)
def test_trace_sanity(method, verifier_name, leaves):
    target, kernel, net = gm16_ddpm(20)
    b = 8
    tree = methods()[method][0]
    result = run(net, kernel, target.shape, b, method, seed=4, trace=True, keep_steps=range(21))
    assert result.trace
    examined = np.zeros(tree.depth, dtype=int)
    accepted_at = np.zeros(tree.depth, dtype=int)
    committed_total = np.zeros(b, dtype=int)
    next_root = {}
    for rt in result.trace:
        assert rt.states is not None and rt.states.shape[:2] == rt.status.shape
        for a, traj in enumerate(rt.trajectories.tolist()):
            accepted, corrected, verified = check_round(rt, a, tree, verifier_name, leaves)
            committed_total[traj] += rt.committed_steps[a]
            step, committed = int(rt.step[a]), int(rt.committed_steps[a])
            # the root is the state committed by this trajectory's previous round (when there was one)
            if traj in next_root and next_root[traj][0] == step:
                assert np.array_equal(rt.states[a, 0], next_root[traj][1])
            assert np.array_equal(rt.states[a, 0], result.states[step][traj].numpy())
            # the committed states are the accepted nodes, then the corrected draw
            path = accepted + ([rt.status.shape[1] - 1] if corrected else [])
            for j, node in enumerate(path, start=1):
                assert np.array_equal(rt.states[a, node], result.states[step + j][traj].numpy())
            next_root[traj] = (step + committed, rt.states[a, path[-1]])
            # the verified node at depth d kept a child iff an accepted node sits at depth d + 1
            for d in range(len(verified)):
                examined[d] += 1
                accepted_at[d] += d < len(accepted)
    # every step accounted for: speculative rounds cover the 19 stochastic steps, the final
    # deterministic step is a direct target step
    assert (committed_total == 19).all()
    assert result.cost.examined_per_depth == examined.tolist()
    assert result.cost.accepted_per_depth == accepted_at.tolist()
    assert torch.equal(result.states[20], result.samples)


def test_a_tree_cut_short_near_the_end_is_recorded_as_the_shorter_tree():
    """Rounds whose tree is truncated near the end of the schedule are recorded with the truncated
    topology (a prefix of the widths): every node of a record lies within its rows' depth and holds a
    state (every node is drafted before the call), and the slot of the corrected draw holds one only
    where the round drew it."""
    target, kernel, net = gm16_ddpm(20)
    result = run(net, kernel, target.shape, 6, "tree-dgrs", seed=0, trace=True)
    truncated = 0
    for rt in result.trace:
        depth = rt.node_depth[:-1].max()
        assert (rt.depth == depth).all()
        assert F.round_widths(rt) == (3, 2, 2)[:depth]
        nodes = np.flatnonzero(rt.node_depth >= 0)
        assert np.isfinite(rt.states[:, nodes]).all()
        corrected = rt.status[:, -1] == CORRECTED
        assert np.isfinite(rt.states[corrected, -1]).all() and np.isnan(rt.states[~corrected, -1]).all()
        truncated += int(depth < 3) * len(rt.trajectories)
    assert truncated > 0


def test_traced_outputs_are_the_targets_at_the_nodes_the_round_knew_and_trace_only_keeps_those_named():
    """trace_outputs: the target's output at every evaluated node and at a known root (a prefetched leaf's),
    NaN elsewhere; trace_only records the named trajectories alone, as the whole trace holds them (slots taken
    by other trajectories in turn: max_batch), and leaves the samples as they were."""
    target, kernel, net = gm16_ddpm(20)
    options = dict(seed=2, trace=True, trace_outputs=True, max_batch=4)
    whole = run(net, kernel, target.shape, 8, "tree-dgrs", **options)
    named = run(net, kernel, target.shape, 8, "tree-dgrs", **options, trace_only=[1, 6])
    assert torch.equal(whole.samples, named.samples)
    assert {t for rt in named.trace for t in rt.trajectories.tolist()} == {1, 6}
    kept = [rt.restricted(np.isin(rt.trajectories, [1, 6])) for rt in whole.trace]
    kept = [rt for rt in kept if rt.trajectories.size]
    assert len(kept) == len(named.trace)
    held = 0
    for expected, rt in zip(kept, named.trace, strict=True):
        for name in ("trajectories", "step", "status", "delta", "states", "outputs"):
            assert np.array_equal(getattr(rt, name), getattr(expected, name), equal_nan=name != "trajectories")
        known = np.isfinite(rt.outputs).all(axis=tuple(range(2, rt.outputs.ndim)))
        assert np.array_equal(known, rt.evaluated | (np.arange(known.shape[1]) == 0)[None])
        a, node = np.nonzero(known)
        steps = torch.from_numpy(rt.step[a] + rt.node_depth[node])
        outputs = net(torch.from_numpy(rt.states[a, node]), steps)
        assert torch.allclose(torch.from_numpy(rt.outputs[a, node]), outputs, rtol=1e-4, atol=1e-5)
        held += len(a)
    assert held > 20
