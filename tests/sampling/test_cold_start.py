"""A trajectory's first speculative round (--start): started cold, the frozen draft drafts it from x0-hat 0,
or from a deterministic first step's output, with no warm-up call and nothing its slot held for an earlier
trajectory; a corrected draft network starts with r_f = 0; and the start settings are checked."""

import numpy as np
import pytest
import torch

from specdemo.drafts import (
    CorrectedNetworkDraft,
    FrozenDraft,
    FrozenGaussian,
    FrozenOutput,
    FrozenX0,
    NetworkDraft,
    StepwiseDraft,
)
from specdemo.drafts.frozen import FORMS
from specdemo.drafts.stepwise import RESIDUAL
from specdemo.errors import SpecdemoError
from specdemo.kernels import DDPMKernel, FlowChurnKernel, default_ddpm_scheduler
from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling import sample
from specdemo.targets import GaussianMixture, gm2d, gm16
from specdemo.trees import Topology
from specdemo.verifiers import BlockVerification

from .common import row_by_row


def test_the_frozen_draft_started_cold_drafts_its_first_round_from_x0_hat_zero(monkeypatch):
    """DDPM speculates from the first step: started cold, each trajectory's first round is drafted from
    the output whose x0-hat is 0 at the root (no warm-up call; the round's call evaluates the root with
    the drafted nodes, so counted calls = speculative rounds), and later rounds draft from the target's
    outputs; started warm, the same seed spends a warm-up call a trajectory."""
    target, kernel = gm2d(), DDPMKernel(default_ddpm_scheduler(), 40)
    guesses = []
    cold_value = FrozenDraft.cold_value

    def recorded(draft, kernel, x, n, cond):
        value, calls = cold_value(draft, kernel, x, n, cond)
        guesses.append((x.clone(), n.clone(), value))
        return value, calls

    monkeypatch.setattr(FrozenDraft, "cold_value", recorded)
    runs = {
        start: sample(
            target.network(kernel),
            kernel,
            target.shape,
            16,
            tree=Topology.chain(4),
            verifier=BlockVerification(),
            draft=FrozenX0(start=start),
            seed=3,
            trace=True,
        )
        for start in ("warm", "cold")
    }
    assert runs["warm"].cost.warm_ups == 16 and runs["cold"].cost.warm_ups == 0
    ((x, n, value),) = guesses  # one call, for the 16 trajectories' first rounds, none started warm
    assert x.shape[0] == 16 and (n == 0).all()
    assert torch.allclose(value, torch.zeros_like(value), atol=1e-5)  # freeze x0 keeps x0-hat itself: 0
    cost = runs["cold"].cost
    for i in range(16):
        speculative = sum(1 for rt in runs["cold"].trace if i in rt.trajectories)
        assert cost.counted_calls[i] == speculative
    first = [rt for rt in runs["cold"].trace if rt.round == 0]
    assert len(first) == 1 and not first[0].root_known.any() and (first[0].step == 0).all()


@pytest.mark.parametrize("prefetch", ["nearest", "none"])
def test_the_frozen_draft_started_cold_keeps_a_deterministic_steps_output(monkeypatch, prefetch):
    """Flow matching's first step is deterministic (a plain step): started cold, a trajectory keeps that
    step's target output and drafts its first speculative round from it, never from the guess (under
    prefetch none too, whose later rounds spend warm-up calls), and spends no warm-up call before it;
    started warm, it spends one as the authors' code does."""
    target, kernel = gm16(), FlowChurnKernel(20, 0.5)
    net = target.network(kernel)
    assert kernel.scales[0] == 0
    monkeypatch.setattr(FrozenDraft, "cold_value", lambda *args: pytest.fail("drafted from the guess"))
    kept = []
    frozen_value = FrozenGaussian.frozen_value

    def recorded(draft, kernel, out, x, n, **history):
        if draft.cold_start and bool((n == 0).all()):
            kept.append((out.clone(), x.clone(), n.clone()))
        return frozen_value(draft, kernel, out, x, n, **history)

    monkeypatch.setattr(FrozenGaussian, "frozen_value", recorded)
    runs = {
        start: sample(
            net,
            kernel,
            target.shape,
            8,
            tree=Topology.chain(4),
            verifier=BlockVerification(),
            draft=FrozenGaussian(start=start),
            prefetch=prefetch,
            seed=1,
        )
        for start in ("warm", "cold")
    }
    ((out, x, n),) = kept  # the first step's output of the 8 trajectories, kept from the plain step's call
    assert x.shape[0] == 8 and torch.allclose(out, net(x, n))
    if prefetch == "nearest":
        assert runs["warm"].cost.warm_ups == 8 and runs["cold"].cost.warm_ups == 0
        assert runs["cold"].cost.counted_calls.mean() < runs["warm"].cost.counted_calls.mean()
    else:
        assert runs["cold"].cost.warm_ups < runs["warm"].cost.warm_ups


def test_a_cold_trajectory_does_not_depend_on_its_slot_bitwise():
    """Started cold on a flow kernel, each trajectory keeps its deterministic first step's output with no
    history (not what its slot held for an earlier trajectory): 9 trajectories through 3 slots are
    sampled as each is alone, with the fitted Gaussian, which reads that history."""
    target, kernel = gm16(), FlowChurnKernel(12, 0.5)
    net = row_by_row(target.network(kernel))
    kwargs = dict(tree=Topology.chain(4), verifier=BlockVerification(), draft=FrozenGaussian(start="cold"), seed=4)
    batched = sample(net, kernel, target.shape, 9, max_batch=3, **kwargs)
    for i in (0, 4, 8):
        alone = sample(net, kernel, target.shape, 1, indices=[i], **kwargs)
        assert torch.equal(alone.samples[0], batched.samples[i]), i


def test_start_settings_are_checked():
    """--start warm spends a warm-up call on the frozen draft: a draft network drafts its first round
    itself; --start cold guesses x0-hat, which Langevin has not; the defaults follow."""
    with pytest.raises(SpecdemoError, match="--start warm .* drafts it itself"):
        build(SamplerConfig(model="digits", steps=10, draft="digits-draft", start="warm", num_samples=1))
    with pytest.raises(SpecdemoError, match="--start cold .* langevin kernel has not; use --start warm"):
        build(SamplerConfig(model="gm2d", kernel="langevin", start="cold", num_samples=1))
    with pytest.raises(SpecdemoError, match="unknown start 'hot'; the frozen draft takes cold, warm"):
        FrozenOutput(start="hot")
    assert build(SamplerConfig(model="gm2d", kernel="langevin", num_samples=1)).config.start == "warm"
    problem = build(SamplerConfig(model="gm2d", steps=10, num_samples=1))
    assert problem.config.start == "cold" and problem.draft.cold_start


def test_a_corrected_draft_network_starts_without_a_warm_up_call():
    """A trajectory's first round, before any target output of it exists: the corrected draft network
    drafts it with r_f = 0, the network as it is, so the round is the plain network's own, state for
    state (same seed); no warm-up call is spent (counted calls = rounds, the deterministic endpoint
    aside), and the rounds after it draft with r_f and differ. The stepwise draft's cold value freezes
    the network's own output at the root for its frozen forms, and r_f = 0 for the network's steps."""
    target, kernel = gm2d(), DDPMKernel(default_ddpm_scheduler(), 40)
    shifted = GaussianMixture.from_arrays(target.weights, np.asarray(target.means) + 0.3, target.stds).network(kernel)
    network = lambda x, n, **cond: shifted(x, n)
    runs = {
        name: sample(
            target.network(kernel),
            kernel,
            target.shape,
            16,
            tree=Topology.chain(4),
            verifier=BlockVerification(),
            draft=draft,
            seed=3,
            trace=True,
        )
        for name, draft in (("plain", NetworkDraft(network)), ("corrected", CorrectedNetworkDraft(network, "shifted")))
    }
    plain0, corrected0 = ([rt for rt in runs[name].trace if rt.round == 0] for name in ("plain", "corrected"))
    assert len(plain0) == len(corrected0) == 1 and not corrected0[0].root_known.any()
    for field in ("trajectories", "step", "status", "committed_steps", "states"):
        np.testing.assert_array_equal(getattr(plain0[0], field), getattr(corrected0[0], field))
    assert not np.array_equal(runs["plain"].samples.numpy(), runs["corrected"].samples.numpy())
    cost = runs["corrected"].cost
    assert cost.warm_ups == 0
    frozen = sample(
        target.network(kernel),
        kernel,
        target.shape,
        16,
        tree=Topology.chain(4),
        verifier=BlockVerification(),
        draft=FrozenOutput(),
        seed=3,
    )
    assert frozen.cost.warm_ups == 16  # the frozen draft started warm (its default): a warm-up call each
    for i in range(16):
        speculative = sum(1 for rt in runs["corrected"].trace if i in rt.trajectories)
        assert cost.counted_calls[i] == speculative  # every counted call a speculative round: no warm-up
        assert cost.calls_per_trajectory[i] == speculative + (kernel.scales == 0).sum().item()

    corrected = CorrectedNetworkDraft(network, "shifted")
    table = [RESIDUAL if n % 2 else FORMS["x0"] for n in range(40)]
    stepwise = StepwiseDraft(corrected, table)
    assert stepwise.cold_start and corrected.cold_start and not FrozenX0().cold_start
    g = torch.Generator().manual_seed(5)
    x, n = torch.randn((3, *target.shape), generator=g, dtype=torch.float64), torch.tensor([4, 9, 20])
    value, calls = stepwise.cold_value(kernel, x, n, {})
    assert calls == 1 and corrected.cold_value(kernel, x, n, {})[1] == 0
    steps = n[None] + torch.arange(4)[:, None]
    means = stepwise.for_round(kernel, steps, value, {})
    x0_means = FrozenX0().for_round(kernel, steps, kernel.denoised(shifted(x, n), x, n), {})
    plain = NetworkDraft(network).for_round(kernel, steps, None, {})
    for d in range(4):
        nodes = torch.randn((2, 3, *target.shape), generator=g, dtype=torch.float64)
        for i in range(3):
            expected = plain if table[int(steps[d, i])] == RESIDUAL else x0_means
            torch.testing.assert_close(means(d, nodes)[:, i], expected(d, nodes)[:, i])


class _ColdByLabel(CorrectedNetworkDraft):
    """A corrected draft whose cold value is the residual itself where the network is off the target by
    a constant per class label: its every round, the first included, drafts the target's own mean."""

    def __init__(self, network, offsets):
        super().__init__(network, "off by a constant per label")
        self.offsets = offsets

    def cold_value(self, kernel, x, n, cond):
        return self.offsets[cond["class_labels"]], 0


@pytest.mark.parametrize(
    "kernel",
    [DDPMKernel(default_ddpm_scheduler(), 24), FlowChurnKernel(24, 0.3)],
    ids=["ddpm", "flow, first step deterministic"],
)
@pytest.mark.parametrize("prefetch", ["nearest", "none"])
def test_the_cold_value_drafts_each_trajectorys_first_speculative_round(kernel, prefetch):
    """A network off the target by a constant per class label, and a cold value that is that constant:
    the draft is the target at every node, so every round commits its whole chain; a cold value lost,
    stale from a slot's earlier trajectory, or taken from another trajectory's label would not (9
    trajectories through 3 slots). Only the first speculative round starts cold, also after a deterministic
    first step: under prefetch none every later round spends a warm-up call."""
    target = gm2d()
    base = target.network(kernel)
    offsets = torch.randn((9, *target.shape), generator=torch.Generator().manual_seed(6))
    net = lambda x, n, class_labels: base(x, n)
    network = lambda x, n, class_labels: base(x, n) - offsets[class_labels]
    result = sample(
        net,
        kernel,
        target.shape,
        9,
        tree=Topology.chain(4),
        verifier=BlockVerification(),
        draft=_ColdByLabel(network, offsets),
        prefetch=prefetch,
        seed=2,
        max_batch=3,
        cond={"class_labels": torch.arange(9)},
        trace=True,
    )
    speculative = 0
    for rt in result.trace:
        assert (rt.committed_steps == rt.depth).all()
        speculative += len(rt.trajectories)
    first = int(kernel.scales[0] == 0)  # the first speculative step
    starts = [t for rt in result.trace for t, n in zip(rt.trajectories, rt.step, strict=True) if n == first]
    assert sorted(starts) == list(range(9))
    assert result.cost.warm_ups == (0 if prefetch == "nearest" else speculative - 9)
