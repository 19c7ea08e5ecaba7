"""Intermediate states (keep_steps): the states kept at the steps asked for, and evaluated leaves that stay
within the schedule's steps."""

import pytest
import torch

from specdemo.drafts import FrozenOutput
from specdemo.kernels import DDPMKernel, LangevinKernel, default_ddpm_scheduler
from specdemo.sampling import sample
from specdemo.targets import gm2d
from specdemo.trees import Topology
from specdemo.verifiers import GreedyRejectionSampling

from .common import gm16_ddpm, run


def test_keep_steps_of_plain_langevin_is_the_shorter_run():
    """Langevin is time-homogeneous: the state at step 10 of a 20-step run is the 10-step run's sample
    (same seed, same streams)."""
    target = gm2d()
    long_k, short_k = LangevinKernel(20, 0.01), LangevinKernel(10, 0.01)
    long = run(target.network(long_k), long_k, target.shape, 5, "plain", seed=9, keep_steps=[0, 10, 20])
    short = run(target.network(short_k), short_k, target.shape, 5, "plain", seed=9, keep_steps=[0])
    assert torch.equal(long.states[10], short.samples)
    assert torch.equal(long.states[0], short.states[0])
    assert torch.equal(long.states[20], long.samples)
    assert not torch.equal(long.states[10], long.samples)


@pytest.mark.parametrize("kernel", [LangevinKernel(12, 0.01), DDPMKernel(default_ddpm_scheduler(), 12)])
def test_evaluated_leaves_stay_within_the_steps(kernel):
    """With leaf evaluation, a round that reaches step N does not evaluate its leaves there: step N
    is the sample, and a network with per-step tables (0..N-1) would index out of range."""
    target = gm2d()
    net = target.network(kernel)
    steps = []

    def checked(x, n, **cond):
        steps.append(int(n.max()))
        return net(x, n, **cond)

    sample(
        checked,
        kernel,
        target.shape,
        64,
        tree=Topology.parse("2,2"),
        draft=FrozenOutput(),
        verifier=GreedyRejectionSampling(),
        prefetch="leaves",
        seed=0,
    )
    assert max(steps) == kernel.num_steps - 1


def test_keep_steps_in_a_tree_run():
    target, kernel, net = gm16_ddpm(20)
    result = run(net, kernel, target.shape, 5, "tree-dgrs", seed=6, keep_steps=[0, 7, 19, 20])
    assert sorted(result.states) == [0, 7, 19, 20]
    for step in (0, 7, 19):
        assert result.states[step].shape == result.samples.shape and torch.isfinite(result.states[step]).all()
    assert torch.equal(result.states[20], result.samples)
    assert not torch.equal(result.states[7], result.samples)
    # the samples do not depend on whether states are kept
    assert torch.equal(run(net, kernel, target.shape, 5, "tree-dgrs", seed=6).samples, result.samples)
