"""The batched driver `sample`, reproducible: the same seed gives the same samples, and a trajectory's draws
do not depend on its batch, its slot, the depths or plans of the trajectories beside it, or runs in other
threads. (The laws of the samples are tests/test_exactness.py's; the same across processes and through the
CLI, tests/test_reproducible.py's and tests/test_scale.py's.)"""

import concurrent.futures
import threading

import numpy as np
import pytest
import torch

from specdemo.drafts import BiasedDraft, FrozenOutput, FrozenX0
from specdemo.sampling import sample
from specdemo.sampling.driver import WorkspacePool
from specdemo.sampling.layout import Workspace, layout_for
from specdemo.trees import Topology, TopologyPlan
from specdemo.verifiers import BlockVerification, GreedyRejectionSampling, RankAwareSelection

from .common import gm16_ddpm, methods, row_by_row, run


@pytest.mark.parametrize("method", list(methods()))
def test_same_seed_same_samples(method):
    target, kernel, net = gm16_ddpm()
    a = run(net, kernel, target.shape, 6, method, seed=11)
    b = run(net, kernel, target.shape, 6, method, seed=11)
    assert torch.equal(a.samples, b.samples)
    assert a.cost.target_calls == b.cost.target_calls
    assert np.array_equal(a.cost.calls_per_trajectory, b.cost.calls_per_trajectory)
    c = run(net, kernel, target.shape, 6, method, seed=12)
    assert not torch.isclose(a.samples, c.samples).all(dim=1).any(), "another seed must give other samples"
    assert torch.isfinite(a.samples).all()


def test_runs_in_threads_at_once_get_their_own_buffers():
    """Round buffers kept between runs (the process's WorkspacePool) are never shared by runs in
    flight: four threads, each drawing with another seed while the others draw, get the samples that
    each run gets alone (a shared buffer would mix their drafted nodes), and a later run of the
    same settings takes the pooled buffers and still gets its own samples."""
    target, kernel, net = gm16_ddpm()
    alone = {seed: run(net, kernel, target.shape, 3, "tree-dgrs", seed=seed).samples for seed in range(4)}
    barrier = threading.Barrier(4)

    def in_thread(seed):
        barrier.wait()
        return run(net, kernel, target.shape, 3, "tree-dgrs", seed=seed).samples

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = dict(zip(range(4), pool.map(in_thread, range(4)), strict=True))
    for seed in range(4):
        assert torch.equal(together[seed], alone[seed])
    assert torch.equal(run(net, kernel, target.shape, 3, "tree-dgrs", seed=2).samples, alone[2])


def test_the_workspace_pool_hands_a_buffer_to_one_run_and_keeps_at_most_its_limit():
    layout = layout_for(Topology((2, 2)), torch.device("cpu"))
    spaces = [Workspace(layout, 4, (3,), torch.device("cpu"), torch.float32) for _ in range(3)]
    pool = WorkspacePool(limit_bytes=2 * spaces[0].nbytes)
    assert pool.take("k") is None
    for space in spaces:
        pool.put("k", space)  # the third put drops the least recently returned
    taken = [pool.take("k"), pool.take("k")]
    assert {id(t) for t in taken} == {id(spaces[1]), id(spaces[2])}
    assert pool.take("k") is None  # handed out: no second run gets it
    pool.put("other", spaces[0])
    assert pool.take("k") is None and pool.take("other") is spaces[0]


@pytest.mark.parametrize("method", list(methods()))
def test_trajectory_does_not_depend_on_its_batch_bitwise(method):
    """With a network whose rows are independent of each other, trajectory 7 alone and inside a batch
    of 12 (and in another order) gives the same samples bit for bit: every draw of a trajectory
    comes from its own stream."""
    target, kernel, net = gm16_ddpm(12)
    net = row_by_row(net)
    batch = run(net, kernel, target.shape, 12, method, seed=3)
    alone = run(net, kernel, target.shape, 1, method, seed=3, indices=[7])
    assert torch.equal(alone.samples[0], batch.samples[7])
    pair = run(net, kernel, target.shape, 2, method, seed=3, indices=[7, 2])
    assert torch.equal(pair.samples, batch.samples[[7, 2]])
    assert alone.cost.calls_per_trajectory[0] == batch.cost.calls_per_trajectory[7]


@pytest.mark.parametrize("method", ["plain", "tree-dgrs", "tree-rank-x0-linear-leaves"])
def test_each_trajectory_gets_its_own_conditioning_through_continuous_batching(method):
    """Per-trajectory class labels reach the network with the trajectory's rows: with 3 slots for 9
    trajectories, a slot holds three trajectories in turn, and each is sampled as it is alone."""
    target, kernel, base = gm16_ddpm(12)
    base = row_by_row(base)

    def net(x, n, class_labels):  # the label shifts the prediction: a wrong row changes the sample
        return base(x, n) + 0.2 * class_labels.view(-1, *[1] * (x.dim() - 1)).to(x.dtype)

    labels = torch.arange(9)
    batched = run(net, kernel, target.shape, 9, method, seed=4, cond={"class_labels": labels}, max_batch=3)
    for i in (0, 4, 8):
        alone = run(net, kernel, target.shape, 1, method, seed=4, indices=[i], cond={"class_labels": labels[i : i + 1]})
        assert torch.equal(alone.samples[0], batched.samples[i]), i


def test_block_verified_trajectory_does_not_depend_on_the_depths_of_its_batch():
    """Near the end of the schedule a round holds chains cut short next to full ones: a trajectory's
    draws must not depend on the longest chain of its round."""
    target, kernel, net = gm16_ddpm(30)
    net = row_by_row(net)
    kwargs = dict(tree=Topology.chain(8), verifier=BlockVerification(), draft=BiasedDraft(FrozenOutput(), 1.0), seed=5)
    batch = sample(net, kernel, target.shape, 16, **kwargs)
    for i in (3, 11, 14):
        alone = sample(net, kernel, target.shape, 1, indices=[i], **kwargs)
        assert torch.equal(alone.samples[0], batch.samples[i])


@pytest.mark.parametrize(
    "verifier,trees",
    [
        (BlockVerification, [Topology.chain(3 + n % 4) for n in range(20)]),
        (GreedyRejectionSampling, [Topology((2, 2) if n % 2 else (2, 2, 2)) for n in range(20)]),
    ],
)
def test_a_planned_trajectory_does_not_depend_on_its_batch(verifier, trees):
    """A plan's trees differ by step, and near the horizon different trees are cut short to the same
    one: trajectories of one round at such steps share a topology, and must still each keep their own
    drafts (a second reader caught two such groups drafting into one buffer)."""
    target, kernel, net = gm16_ddpm(20)
    net = row_by_row(net)
    plan = TopologyPlan(tuple(trees), (False,) * 20, tuple(trees), (False,) * 20, expected_calls=0.0)
    kwargs = dict(tree=plan, verifier=verifier(), draft=BiasedDraft(FrozenOutput(), 1.0), seed=2)
    batch = sample(net, kernel, target.shape, 6, **kwargs)
    for i in range(6):
        alone = sample(net, kernel, target.shape, 1, indices=[i], **kwargs)
        assert torch.equal(alone.samples[0], batch.samples[i]), i


def test_known_roots_do_not_shift_a_trajectorys_stream():
    """Rank-aware trees with evaluated leaves and frozen x0-hat: after a committed evaluated leaf the
    root's output is known and the first level's delta is 0 up to rounding. A round draws a fixed
    number of uniforms for its topology whatever the deltas, so rounding that differs by batch
    cannot shift a trajectory's stream (the audit's batch-dependent divergence)."""
    target, kernel, net = gm16_ddpm(20)
    net = row_by_row(net)
    kwargs = dict(tree=Topology((2, 2)), verifier=RankAwareSelection(), draft=FrozenX0(), prefetch="leaves", seed=5)
    batch = sample(net, kernel, target.shape, 8, **kwargs)
    for i in (0, 3, 7):
        alone = sample(net, kernel, target.shape, 1, indices=[i], **kwargs)
        assert torch.equal(alone.samples[0], batch.samples[i]), i


@pytest.mark.parametrize("method", list(methods()))
def test_trajectory_does_not_depend_on_its_batch_mixture_network(method):
    """The same with the batched mixture network itself: equal up to float32 rounding (the network's
    matmul over the batch is not bitwise batch-invariant)."""
    target, kernel, net = gm16_ddpm(12)
    batch = run(net, kernel, target.shape, 12, method, seed=3)
    alone = run(net, kernel, target.shape, 1, method, seed=3, indices=[7])
    torch.testing.assert_close(alone.samples[0], batch.samples[7], rtol=1e-4, atol=1e-4)
