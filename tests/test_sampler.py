"""The batched driver `sample`: reproducibility, batch independence, cost accounting, the round
trace, intermediate states and refusals. (The laws of the samples are tests/test_exactness.py's.)
"""

import concurrent.futures
import threading

import numpy as np
import pytest
import torch

from specdemo import figures as F
from specdemo.drafts import (
    BiasedDraft,
    CorrectedNetworkDraft,
    FrozenDraft,
    FrozenGaussian,
    FrozenOutput,
    FrozenPerStep,
    FrozenX0,
    FrozenX0Linear,
    NetworkDraft,
    StepwiseDraft,
    frozen_draft,
)
from specdemo.drafts.frozen import FORMS
from specdemo.drafts.stepwise import RESIDUAL
from specdemo.errors import SpecdemoError
from specdemo.kernels import DDPMKernel, FlowChurnKernel, LangevinKernel, default_ddpm_scheduler
from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling import ACCEPTED, CORRECTED, REJECTED, ROOT, UNVISITED, sample
from specdemo.sampling.driver import WorkspacePool
from specdemo.sampling.layout import Workspace, layout_for
from specdemo.targets import GaussianMixture, gm2d, gm16, gm512
from specdemo.trees import Topology, TopologyPlan
from specdemo.verifiers import BlockVerification, GreedyRejectionSampling, RankAwareSelection, ReflectionMaximalCoupling

PLAIN = (Topology(()), None, None, "nearest")


def methods():
    """(tree, verifier, draft, prefetch) per method; fresh objects each time."""
    return {
        "plain": PLAIN,
        "chain-rmc": (Topology.chain(4), ReflectionMaximalCoupling(), FrozenOutput(), "nearest"),
        "chain-block": (Topology.chain(4), BlockVerification(), FrozenOutput(), "nearest"),
        "tree-dgrs": (Topology((3, 2, 2)), GreedyRejectionSampling(), FrozenOutput(), "nearest"),
        "tree-rank-leaves": (Topology((2, 2)), RankAwareSelection(), FrozenX0(), "leaves"),
        "chain-x0-linear": (Topology.chain(4), ReflectionMaximalCoupling(), FrozenX0Linear(), "nearest"),
        "tree-rank-x0-linear-leaves": (Topology((2, 2)), RankAwareSelection(), FrozenX0Linear(), "leaves"),
        "chain-block-gaussian-cold": (Topology.chain(4), BlockVerification(), FrozenGaussian(start="cold"), "nearest"),
    }


def gm16_ddpm(steps=20):
    target, kernel = gm16(), DDPMKernel(default_ddpm_scheduler(), steps)
    return target, kernel, target.network(kernel)


def gm512_flow():
    target, kernel = gm512(), FlowChurnKernel(30, 0.06)
    return target, kernel, target.network(kernel)


def run(network, kernel, shape, num_samples, method, **kwargs):
    tree, verifier, draft, prefetch = methods()[method]
    return sample(
        network, kernel, shape, num_samples, tree=tree, verifier=verifier, draft=draft, prefetch=prefetch, **kwargs
    )


def row_by_row(network):
    """The same network evaluated one row at a time: its output for a row cannot depend on the
    other rows of the call (a batched matmul may round differently for different batch sizes)."""

    def net(x, n, **cond):
        return torch.cat([network(x[i : i + 1], n[i : i + 1]) for i in range(x.shape[0])])

    return net


# ---------------------------------------------------------------- reproducibility


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


# ---------------------------------------------------------------- second-order freezing


def linear_x0_outputs(kernel, shape, seed=0):
    """A network output whose x0-hat at any state is x0(tau_n) = c + tau_n g, linear in the draft's clock."""
    from specdemo.drafts.frozen import clock

    g = torch.Generator().manual_seed(seed)
    c, grad = torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)
    tau = clock(kernel)

    def out(x, n):
        return kernel.output_from_denoised(c + tau[n].view(*n.shape, *[1] * len(shape)) * grad, x, n)

    return out


@pytest.mark.parametrize("kernel", [FlowChurnKernel(30, 0.3), DDPMKernel(default_ddpm_scheduler(), 40)])
def test_x0_linear_extrapolates_x0_hat_through_the_last_two_outputs(kernel):
    """Where x0-hat moves linearly in the draft's clock, the line through the outputs at steps n - 1 and
    n drafts every later step exactly (the target's mean at any state), its affine form is the level's,
    and at step n it is freeze x0's draft; without a second output it is freeze x0 at every depth."""
    shape, a, depth, n = (5,), 3, 4, 9
    out = linear_x0_outputs(kernel, shape)
    g = torch.Generator().manual_seed(1)
    x1, x0s = (torch.randn((a, *shape), generator=g, dtype=torch.float64) for _ in range(2))
    steps1, steps0 = torch.full((a,), n), torch.full((a,), n - 1)
    draft = FrozenX0Linear()
    assert draft.frozen_history and draft.frozen_shape(shape) == (2, *shape)
    frozen = draft.frozen_value(
        kernel, out(x1, steps1), x1, steps1, previous=None, earlier=(out(x0s, steps0), x0s, steps0)
    )
    steps = steps1[None] + torch.arange(depth)[:, None]
    means = draft.for_round(kernel, steps, frozen, {})
    alpha, beta = means.a, means.b
    x0_means = FrozenX0().for_round(kernel, steps, kernel.denoised(out(x1, steps1), x1, steps1), {})
    for d in range(depth):
        x = torch.randn((2, a, *shape), generator=g, dtype=torch.float64)
        nd = steps[d][None].expand(2, a)
        target = kernel.mean(out(x, nd), x, nd)
        torch.testing.assert_close(means(d, x), target)
        torch.testing.assert_close(alpha[d, None, :, None] * x + beta[d], target)
        assert torch.allclose(x0_means(d, x), target) == (d == 0)
    # no earlier output and nothing held: slope 0, freeze x0; an earlier output at the same step keeps the slope held
    flat = draft.frozen_value(kernel, out(x1, steps1), x1, steps1)
    assert not flat[:, 1].any()
    kept = draft.frozen_value(
        kernel, out(x1, steps1), x1, steps1, previous=frozen, earlier=(out(x1, steps1), x1, steps1)
    )
    torch.testing.assert_close(kept, frozen)


def gaussian_outputs(kernel, shape, lam, seed=0):
    """A network output whose x0-hat is that of data ~ N(mu, lam I): (b^2 mu + lam a x) / (a^2 lam + b^2)."""
    mu = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def out(x, n):
        a, b = (t[n].view(*n.shape, *[1] * len(shape)) for t in (kernel.signal, kernel.noise))
        return kernel.output_from_denoised((b * b * mu + lam * a * x) / (a * a * lam + b * b), x, n)

    return out


@pytest.mark.parametrize("kernel", [FlowChurnKernel(30, 0.3), DDPMKernel(default_ddpm_scheduler(), 40)])
def test_freeze_gaussian_fits_a_gaussian_data_law(kernel):
    """Where the data law is N(mu, lambda I), the fit to the outputs at steps n - 1 and n recovers lambda
    and the draft is the target's mean at every later step and any state (its affine form too, where the
    kernel does not clip), which freeze x0 is not; without a second output it is freeze x0 (lambda 0),
    and an earlier output at the same step keeps the lambda held."""
    shape, a, depth, n, lam = (5,), 3, 4, 9, 0.1
    out = gaussian_outputs(kernel, shape, lam)
    g = torch.Generator().manual_seed(1)
    x1, x0s = (torch.randn((a, *shape), generator=g, dtype=torch.float64) for _ in range(2))
    s1, s0 = torch.full((a,), n), torch.full((a,), n - 1)
    draft = FrozenGaussian()
    assert draft.frozen_history and draft.frozen_shape(shape) == (2, *shape)
    frozen = draft.frozen_value(kernel, out(x1, s1), x1, s1, earlier=(out(x0s, s0), x0s, s0))
    torch.testing.assert_close(frozen[:, 1], torch.full((a, *shape), lam, dtype=torch.float64))
    steps = s1[None] + torch.arange(depth)[:, None]
    means = draft.for_round(kernel, steps, frozen, {})
    assert (means.g is not None) == (kernel.clip_range is not None)
    x0_means = FrozenX0().for_round(kernel, steps, kernel.denoised(out(x1, s1), x1, s1), {})
    for d in range(depth):
        x = torch.randn((2, a, *shape), generator=g, dtype=torch.float64)
        nd = steps[d][None].expand(2, a)
        target = kernel.mean(out(x, nd), x, nd)
        torch.testing.assert_close(means(d, x), target)
        if means.g is None:
            torch.testing.assert_close(means.a[d, None, :, None] * x + means.b[d], target)
        assert not torch.allclose(x0_means(d, x), target)
    flat = draft.frozen_value(kernel, out(x1, s1), x1, s1)
    assert not flat[:, 1].any()
    torch.testing.assert_close(draft.for_round(kernel, steps, flat, {})(2, x), x0_means(2, x))
    kept = draft.frozen_value(kernel, out(x1, s1), x1, s1, previous=frozen, earlier=(out(x1, s1), x1, s1))
    torch.testing.assert_close(kept, frozen)


def test_a_draft_network_corrected_by_the_residual_is_exact_where_the_residual_is_constant():
    """A draft network off the target by a constant output c: the residual kept at the frozen node is c,
    and the corrected draft is the target's mean at every level, state and step (the plain network is
    not); freeze residual needs a draft network, and says so."""
    kernel, shape, a, depth = DDPMKernel(default_ddpm_scheduler(), 40), (5,), 3, 4
    g = torch.Generator().manual_seed(2)
    offset = torch.randn(shape, generator=g, dtype=torch.float64)
    target = lambda x, n: torch.tanh(x) * (1 + n.view(-1, *[1] * len(shape)) / 40)
    network = lambda x, n: target(x, n) - offset
    draft = CorrectedNetworkDraft(network, "off by a constant")
    assert draft.uses_frozen and draft.calls_network and not draft.frozen_history
    x1, s1 = torch.randn((a, *shape), generator=g, dtype=torch.float64), torch.full((a,), 9)
    frozen = draft.frozen_value(kernel, target(x1, s1), x1, s1, cond={})
    torch.testing.assert_close(frozen, offset.expand(a, *shape))
    steps = s1[None] + torch.arange(depth)[:, None]
    means, plain_means = (
        draft.for_round(kernel, steps, frozen, {}),
        NetworkDraft(network).for_round(kernel, steps, None, {}),
    )
    for d in range(depth):
        x = torch.randn((2, a, *shape), generator=g, dtype=torch.float64)
        rows, nd = x.flatten(0, 1), steps[d].repeat(2)
        expected = kernel.mean(target(rows, nd), rows, nd).view_as(x)
        torch.testing.assert_close(means(d, x), expected)
        assert not torch.allclose(plain_means(d, x), expected)
    with pytest.raises(SpecdemoError, match="--draft NETWORK"):
        build(SamplerConfig(model="gm2d", method="chain", freeze="residual"))
    with pytest.raises(SpecdemoError, match="a form of the frozen draft.*out .*residual .*auto"):
        build(SamplerConfig(model="digits", draft="digits-draft", method="chain", freeze="x0"))


def test_freeze_auto_drafts_each_step_with_its_form():
    """An auto table of out (0), x0 (1), x0-linear (2) and gaussian (3): each step drafted as that freeze
    drafts it. A table of out and x0 only keeps the two-output frozen value and no history, as before."""
    kernel, shape, a = FlowChurnKernel(30, 0.3), (5,), 2
    table = [n % 4 for n in range(30)]
    auto = FrozenPerStep(table)
    assert auto.frozen_history and auto.frozen_shape(shape) == (6, *shape)
    assert FrozenPerStep([n % 3 for n in range(30)]).frozen_shape(shape) == (4, *shape)
    old = FrozenPerStep([bool(n % 2) for n in range(30)])
    assert not old.frozen_history and old.frozen_shape(shape) == (2, *shape)
    assert not FrozenX0().frozen_history and not FrozenOutput().frozen_history
    assert not BiasedDraft(FrozenX0(), 1.0).frozen_history and BiasedDraft(FrozenX0Linear(), 1.0).frozen_history
    g = torch.Generator().manual_seed(3)
    x1, x0s, o1, o0 = (torch.randn((a, *shape), generator=g, dtype=torch.float64) for _ in range(4))
    s1, s0 = torch.full((a,), 7), torch.full((a,), 6)
    frozen = auto.frozen_value(kernel, o1, x1, s1, earlier=(o0, x0s, s0))
    singles = {
        form: (frozen_draft(form), frozen_draft(form).frozen_value(kernel, o1, x1, s1, earlier=(o0, x0s, s0)))
        for form in ("out", "x0")
    }
    for form in ("x0-linear", "gaussian"):
        single = frozen_draft(form)
        singles[form] = (single, single.frozen_value(kernel, o1, x1, s1, earlier=(o0, x0s, s0)))
    steps = s1[None] + torch.arange(6)[:, None]
    means = auto.for_round(kernel, steps, frozen, {})
    for d in range(6):
        x = torch.randn((2, a, *shape), generator=g, dtype=torch.float64)
        draft, value = singles[("out", "x0", "x0-linear", "gaussian")[table[7 + d]]]
        torch.testing.assert_close(means(d, x), draft.for_round(kernel, steps, value, {})(d, x))


def test_the_stepwise_draft_drafts_each_step_with_its_table():
    """A per-step table of the frozen draft's four forms (0..3) and the corrected draft network (RESIDUAL):
    in rounds whose levels and trajectories cross from one to the other (and levels the network drafts
    for every trajectory), each node is drafted as the table's draft for its step drafts it alone; the
    draft network is called only for
    the rows of steps it drafts, and the round counts those levels' calls; a table outside 0..RESIDUAL is
    refused."""
    kernel, shape, depth = DDPMKernel(default_ddpm_scheduler(), 40), (5,), 6
    table = [n % 5 for n in range(40)]
    g = torch.Generator().manual_seed(4)
    offset = torch.randn(shape, generator=g, dtype=torch.float64)
    target = lambda x, n: torch.tanh(x) * (1 + n.view(-1, *[1] * len(shape)) / 40)
    seen = []

    def network(x, n):
        seen.append(n.clone())
        return target(x, n) - offset

    corrected = CorrectedNetworkDraft(network, "off by a constant")
    draft = StepwiseDraft(corrected, table)
    assert draft.uses_frozen and draft.calls_network and draft.frozen_history
    assert draft.frozen_shape(shape) == (FrozenPerStep([n % 4 for n in range(40)]).frozen_shape(shape)[0] + 1, *shape)
    for s1 in (torch.tensor([7, 8, 10]), torch.tensor([9, 14, 19])):  # mixed levels; then levels of one draft each
        s0, a = s1 - 1, s1.numel()
        x1, x0s = (torch.randn((a, *shape), generator=g, dtype=torch.float64) for _ in range(2))
        o1, o0 = target(x1, s1), target(x0s, s0)
        frozen = draft.frozen_value(kernel, o1, x1, s1, earlier=(o0, x0s, s0), cond={})
        singles = {RESIDUAL: (corrected, corrected.frozen_value(kernel, o1, x1, s1, cond={}))}
        for form in ("out", "x0", "x0-linear", "gaussian"):
            single = frozen_draft(form)
            singles[FORMS[form]] = (single, single.frozen_value(kernel, o1, x1, s1, earlier=(o0, x0s, s0)))
        steps = s1[None] + torch.arange(depth)[:, None]
        means = draft.for_round(kernel, steps, frozen, {})
        assert means.network_levels == sum(any(table[int(n)] == RESIDUAL for n in steps[d]) for d in range(depth))
        for d in range(depth):
            x = torch.randn((2, a, *shape), generator=g, dtype=torch.float64)
            seen.clear()
            got = means(d, x)
            called = sorted(torch.cat(seen).tolist()) if seen else []
            for i in range(a):
                single, value = singles[table[int(steps[d, i])]]
                torch.testing.assert_close(
                    got[:, i],
                    single.for_round(kernel, steps[:, i : i + 1], value[i : i + 1], {})(d, x[:, i : i + 1])[:, 0],
                )
            on = [int(n) for n in steps[d] if table[int(n)] == RESIDUAL]
            assert called == sorted(on * 2)  # two nodes a trajectory
    with pytest.raises(SpecdemoError, match="per-step draft table"):
        StepwiseDraft(corrected, [5] * 40)


def test_a_runs_draft_calls_are_the_draft_networks_calls():
    """The cost's draft calls are the calls the draft network received: a level's call where the stepwise
    draft's table drafts by the network (none elsewhere), and one a commit for the residual r_f."""
    target, kernel = gm2d(), DDPMKernel(default_ddpm_scheduler(), 40)
    shifted = GaussianMixture.from_arrays(target.weights, np.asarray(target.means) + 0.3, target.stds).network(kernel)
    calls = []

    def network(x, n, **cond):
        calls.append(1)
        return shifted(x, n)

    for forms in ([n % 5 for n in range(40)], [RESIDUAL] * 40):
        calls.clear()
        result = sample(
            target.network(kernel),
            kernel,
            target.shape,
            64,
            tree=Topology.chain(4),
            verifier=BlockVerification(),
            draft=StepwiseDraft(CorrectedNetworkDraft(network, "shifted"), forms),
            seed=0,
        )
        assert result.cost.draft_calls == len(calls) > 0


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


# ---------------------------------------------------------------- cost accounting


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


# ---------------------------------------------------------------- the round trace


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


# ---------------------------------------------------------------- intermediate states


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


# ---------------------------------------------------------------- refusals


def test_rmc_with_a_tree_is_refused():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="rmc") as err:
        sample(
            net,
            kernel,
            target.shape,
            2,
            tree=Topology((2, 2)),
            draft=FrozenOutput(),
            verifier=ReflectionMaximalCoupling(),
        )
    assert "chain" in str(err.value)


def test_freeze_x0_with_langevin_is_refused():
    target, kernel = gm2d(), LangevinKernel(10, 0.01)
    with pytest.raises(SpecdemoError, match="x0") as err:
        sample(
            target.network(kernel),
            kernel,
            target.shape,
            2,
            tree=Topology.chain(3),
            draft=FrozenX0(),
            verifier=ReflectionMaximalCoupling(),
        )
    assert "langevin" in str(err.value)


def test_too_many_samples_times_nodes_is_refused_before_allocating():
    target, kernel, net = gm512_flow()
    with pytest.raises(SpecdemoError, match="GiB") as err:
        sample(
            net,
            kernel,
            target.shape,
            2000,
            tree=Topology.uniform(4, 5),
            draft=FrozenOutput(),
            verifier=GreedyRejectionSampling(),
        )
    assert "samples" in str(err.value)


def test_speculation_needs_a_draft_and_a_verifier():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="draft"):
        sample(net, kernel, target.shape, 2, tree=Topology.chain(3), verifier=ReflectionMaximalCoupling())
    with pytest.raises(SpecdemoError):
        sample(net, kernel, target.shape, 0)
    with pytest.raises(SpecdemoError, match="indices"):
        sample(net, kernel, target.shape, 2, indices=[0, 1, 2])


@pytest.mark.parametrize(
    "settings,words",
    [
        (dict(model="gm2d", steps=0), ["--steps", "0"]),
        (dict(model="gm2d", steps=1001), ["--steps", "1001"]),
        (dict(model="gm512", steps=1), ["--steps", "1"]),
        (dict(model="banana", steps=0), ["--steps", "0"]),
        (dict(model="gm2d", kernel="euler"), ["kernel", "euler"]),
        (dict(model="banana", kernel="ddpm"), ["langevin", "ddpm"]),
        (dict(model="gm2d", method="tree", verifier="magic"), ["verifier", "magic"]),
        (dict(model="no-such-model"), ["model", "no-such-model"]),
        (dict(model="gm2d", class_label=3), ["class"]),
        (dict(model="gm2d", method="tree", tree="2x2", verifier="rmc"), ["rmc"]),
        (dict(model="gm2d", method="chain", tree="2x2"), ["chain"]),
        (dict(model="gm2d", method="beam"), ["method", "beam"]),
        (dict(model="gm2d", num_samples=0), ["samples"]),
        (dict(model="gm2d", eta=float("nan")), ["eta"]),
        (dict(model="gm2d", kernel="ddim", eta=2.0), ["eta"]),
        (dict(model="gm2d", prefetch="soon"), ["prefetch", "soon"]),
    ],
)
def test_configuration_refusals(settings, words):
    """Refusals name the problem (and, for choices, what is accepted)."""
    config = SamplerConfig(num_samples=settings.pop("num_samples", 2), **settings)
    with pytest.raises(SpecdemoError) as err:
        problem = build(config)
        problem.run()  # some refusals (the verifier against the tree) come from the sampler
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_network_returning_the_wrong_shape_is_refused():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="shape"):
        sample(lambda x, n: net(x, n)[:, :3], kernel, target.shape, 2)
    with pytest.raises(SpecdemoError, match="shape"):
        sample(
            lambda x, n: net(x, n)[:1],
            kernel,
            target.shape,
            2,
            tree=Topology((2, 2)),
            draft=FrozenOutput(),
            verifier=GreedyRejectionSampling(),
        )


@pytest.mark.parametrize("method", ["plain", "tree-dgrs", "tree-rank-leaves", "chain-block"])
def test_network_returning_nan_is_refused(method):
    """A NaN from the network must stop the run with a clear message, not yield NaN samples (nor hang)."""
    target, kernel, net = gm16_ddpm(10)
    calls = []

    def broken(x, n):
        out = net(x, n)
        calls.append(1)
        if len(calls) == 3:
            out[0, 0] = float("nan")
        return out

    with pytest.raises(SpecdemoError, match="(?i)nan|finite"):
        run(broken, kernel, target.shape, 3, method, seed=0)
    assert len(calls) <= 10 + 3  # stopped, not looping


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
