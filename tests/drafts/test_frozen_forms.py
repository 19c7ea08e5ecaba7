"""The frozen draft's second-order forms and the draft network's: x0-hat extrapolated in time (x0-linear),
the fitted Gaussian, the draft network corrected by its residual, the per-step auto table and the stepwise
draft, each drafting the target's mean where it is exact, and the draft network's calls a run counts."""

import numpy as np
import pytest
import torch

from specdemo.drafts import (
    BiasedDraft,
    CorrectedNetworkDraft,
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
from specdemo.kernels import DDPMKernel, FlowChurnKernel, default_ddpm_scheduler
from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling import sample
from specdemo.targets import GaussianMixture, gm2d
from specdemo.trees import Topology
from specdemo.verifiers import BlockVerification


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


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("form", ["out", "x0", "x0-linear", "gaussian", "auto table"])
def test_every_level_at_once_is_each_level_in_turn(form, clip):
    """AffineLevels.at_levels (how planning.forms prices a draft along a path) gives at x[d] what calling the
    draft at depth d gives, for each form, with and without the kernel's clipping."""
    kernel = DDPMKernel(
        default_ddpm_scheduler(**({"clip_sample": True, "clip_sample_range": clip} if clip else {})), 40
    )
    shape, a, depth = (5,), 3, 6
    g = torch.Generator().manual_seed(2)
    table = (FORMS["x0"], FORMS["gaussian"], FORMS["out"], FORMS["x0-linear"]) * 10  # a form a step, in turn
    draft = FrozenPerStep(table) if form == "auto table" else frozen_draft(form)
    state = lambda *lead: torch.randn((*lead, *shape), generator=g, dtype=torch.float64)
    x1, x0s = state(a), state(a)
    s1 = torch.tensor([3, 9, 20])
    out = lambda x, n: 0.5 * x + torch.randn(x.shape, generator=g, dtype=torch.float64)
    frozen = draft.frozen_value(kernel, out(x1, s1), x1, s1, earlier=(out(x0s, s1 - 1), x0s, s1 - 1))
    steps = s1[None] + torch.arange(depth)[:, None]
    means = draft.for_round(kernel, steps, frozen, {})
    x = state(depth, a)
    at_once = means.at_levels(x)
    assert at_once.shape == x.shape
    for d in range(depth):
        torch.testing.assert_close(at_once[d], means(d, x[d][None])[0], rtol=1e-12, atol=1e-12)


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
