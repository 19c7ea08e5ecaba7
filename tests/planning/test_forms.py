"""--freeze auto's table learnt from runs (specdemo/planning/forms.py): each form priced along the paths a run
committed, with no target call; a fixed tree and --tree auto plan from them once config.pilot_samples
trajectories were priced.

The pricing is held to the driver's own deltas: under the parent prefetch, where a round's root was not known,
the driver verified each node against the draft frozen one step above the root, which is what the pricing
computes there."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from specdemo import SamplerConfig, build, generate, planning
from specdemo.drafts import frozen_draft
from specdemo.drafts.frozen import FORMS, FrozenPerStep
from specdemo.drafts.stepwise import RESIDUAL, StepwiseDraft
from specdemo.planning import forms, key_name, plan_key
from specdemo.planning.forms import as_stats, committed_paths, form_deltas, load_forms
from specdemo.sampling import ACCEPTED, sample
from specdemo.trees import Topology
from specdemo.verifiers import get_verifier

from ..test_exactness import ALPHA, min_pvalue_bonferroni

FIXED = dict(
    model="gm2d",
    kernel="ddpm",
    steps=30,
    method="tree",
    tree="3,2,1",
    verifier="dgrs",
    freeze="auto",
    pilot_samples=8,
    num_samples=4,
    device="cpu",
    seed=3,
)


@pytest.fixture(scope="module")
def gm2d():
    return build(SamplerConfig(model="gm2d", kernel="ddpm", steps=40, device="cpu", cache_dir="off"))


@pytest.mark.parametrize("form", ["out", "x0", "x0-linear", "gaussian"])
def test_the_priced_deltas_are_the_drivers_where_the_draft_froze_the_step_above_the_root(gm2d, form):
    """Under the parent prefetch the driver freezes the node one step above the next root. The forms with a
    second point (x0-linear, gaussian) take it from the same call, the frozen node's parent, where the frozen
    node was not its round's root (its round committed two steps or more); the pricing takes the step above
    along the path, which is the same node there."""
    draft = frozen_draft(form, start="warm")
    kernel = gm2d.kernel
    run = sample(
        gm2d.network,
        kernel,
        gm2d.target.shape,
        6,
        tree=Topology.chain(4),
        draft=draft,
        verifier=get_verifier("rmc"),
        prefetch="parent",
        seed=5,
        trace=True,
        trace_outputs=True,
    )
    compared = 0
    for trajectory in range(6):
        states, outputs = committed_paths(run.trace, [trajectory], kernel.num_steps, gm2d.target.shape)
        [(_, cells)] = form_deltas(kernel, [(FORMS[form], draft)], states, outputs, {}, "cpu", torch.float32)
        priced = as_stats(cells, kernel.num_steps)
        rounds = [r.restricted(r.trajectories == trajectory) for r in run.trace]
        rounds = [r for r in rounds if r.trajectories.size]
        for before, rnd in zip(rounds, rounds[1:], strict=False):  # the first round froze the warm-up's output
            if rnd.root_known[0] or (draft.frozen_history and before.committed_steps[0] < 2):
                continue
            for node in np.flatnonzero(~np.isnan(rnd.delta[0])):
                depth = int(rnd.node_depth[node])
                cell = (int(rnd.step[0]) + depth, depth + 1)
                # delta is the means' gap over s_m: float32 roundoff in the gap (a few 1e-7 apart, in the order
                # this CPU's vector units sum in) is 1e-5 apart in delta where s_m is 0.01
                tolerance = 1e-6 / float(kernel.scales[cell[0]])
                assert priced.deltas[cell] == pytest.approx([rnd.delta[0, node]], rel=1e-4, abs=tolerance)
                compared += 1
    assert compared >= 25


def test_an_accepted_leaf_at_the_last_step_is_no_step_of_the_path(gm2d):
    """A round may keep a leaf at step N, the sample itself (a kernel whose last step is stochastic); the path
    ends at step N - 1."""
    kernel = gm2d.kernel
    run = sample(
        gm2d.network,
        kernel,
        gm2d.target.shape,
        4,
        tree=Topology.chain(3),
        draft=frozen_draft("x0"),
        verifier=get_verifier("rmc"),
        seed=1,
        trace=True,
        trace_outputs=True,
    )
    rnd = next(r for r in run.trace if (r.status[:, 2] == ACCEPTED).any())
    last = replace(rnd, step=np.full_like(rnd.step, kernel.num_steps - 2))  # node 2 at step N
    states, outputs = committed_paths([last], rnd.trajectories.tolist(), kernel.num_steps, gm2d.target.shape)
    assert np.isfinite(states[:, -2]).all() and states.shape[1] == kernel.num_steps


def test_a_fixed_tree_learns_its_table_from_its_runs_and_plans_it_without_a_pilot(tmp_path):
    config = SamplerConfig(**FIXED, cache_dir=str(tmp_path))
    first_result, first = generate(config)
    # nothing learnt: the fitted Gaussian at every step, no pilot; the run prices the forms along its paths
    assert first.plan_source == "default" and first.learning_table and first.pilot is None
    assert set(first.draft.forms.tolist()) == {FORMS["gaussian"]} and first_result.trace is None
    assert first_result.cost.learn_s > 0 and first_result.cost.summary()["learn_s"] == first_result.cost.learn_s
    measured, count = load_forms(first)
    assert count == 4 and [form for form, _ in measured] == [FORMS[f] for f in ("out", "x0", "x0-linear", "gaussian")]
    assert all(sum(map(len, stats.deltas.values())) >= 30 for _, stats in measured)
    generate(replace(config, seed=4))
    assert load_forms(first)[1] == 8
    # 8 trajectories priced: the next run takes the table they choose, from streams of its own
    planned_result, planned = generate(config)
    assert planned.plan_source == "runs" and planned.learnt and not planned.learning_table
    assert planned.stream_seed != config.seed and planned.pilot is None and planned_result.cost.pilot_calls == 0
    assert isinstance(planned.draft, FrozenPerStep)
    expected = forms.options(planned, load_forms(first)[0])[0][1].forms
    assert torch.equal(planned.draft.forms, expected) and len(set(expected.tolist())) > 1
    # kept as the setting's plan: the next run takes it from the cache and draws the same samples
    cached_result, cached = generate(config)
    assert cached.plan_source == "cache" and cached.learnt and torch.equal(cached.draft.forms, expected)
    assert torch.equal(cached_result.samples, planned_result.samples)
    assert load_forms(first)[1] == 8  # no run learns once the table is planned


def test_a_traced_learning_run_hands_its_caller_the_trace_it_asked_for(tmp_path):
    """A run traced by its caller that also prices the forms prices every trajectory, and its trace holds what
    the caller asked for: trace_only's trajectories, no states where trace_states is False, no outputs; the
    same rounds and statuses as a run of the same seed that learns nothing."""
    problem = build(SamplerConfig(**FIXED, cache_dir=str(tmp_path)))
    result = problem.run(trace=True, trace_states=False, trace_only=[1, 2])
    assert load_forms(problem)[1] == 4  # all four priced
    plain = build(SamplerConfig(**FIXED, cache_dir="off")).run(trace=True, trace_states=False, trace_only=[1, 2])
    assert len(result.trace) == len(plain.trace) > 0
    for got, want in zip(result.trace, plain.trace, strict=True):
        assert set(got.trajectories.tolist()) <= {1, 2} and got.states is None and got.outputs is None
        assert np.array_equal(got.trajectories, want.trajectories) and np.array_equal(got.status, want.status)


def test_every_topology_of_a_model_learns_one_table(tmp_path):
    """The forms do not depend on the tree or the verifier: a fixed tree's runs plan --tree auto's table too."""
    config = SamplerConfig(**{**FIXED, "num_samples": 8}, cache_dir=str(tmp_path))
    generate(config)
    auto = build(replace(config, tree="auto", verifier="auto", budget=6))
    assert auto.plan_source == "runs" and auto.learnt
    auto = auto.declined or auto  # the table is the plan's, whether or not plain sampling was expected faster
    assert isinstance(auto.draft, FrozenPerStep)
    other = build(replace(config, tree="2,2", verifier="rmc"))
    assert other.plan_source == "runs" and torch.equal(other.draft.forms, auto.draft.forms)


def test_a_repeated_seed_prices_no_trajectory_twice_and_replan_starts_again(tmp_path):
    config = SamplerConfig(**{**FIXED, "pilot_samples": 64}, cache_dir=str(tmp_path))
    _, first = generate(config)
    kept = load_forms(first)
    generate(config)
    assert load_forms(first) == kept
    first.run(indices=[2, 3, 4, 5])  # a process's share: 2 and 3 are priced already
    assert load_forms(first)[1] == 6
    again = generate(replace(config, replan=True))[1]
    assert again.learning_table and load_forms(first)[1] == 4
    assert not (tmp_path / key_name(plan_key(first))).exists()


def test_the_table_is_not_learnt_without_a_writable_cache_or_once_planned(tmp_path):
    assert not build(SamplerConfig(**FIXED, cache_dir="off")).learning_table
    config = SamplerConfig(**{**FIXED, "num_samples": 8}, cache_dir=str(tmp_path))
    generate(config)
    assert not build(config).learning_table


# ---------------------------------------------------------------------------------------------- the law
@pytest.mark.slow
@pytest.mark.statistical
def test_a_run_under_a_learnt_table_is_exact(tmp_path):
    """10,000 trajectories under a table priced from a run of seed 2, drawn with seed 2 again (its streams are
    learnt_seed's), against plain sampling; the same test fails on a run that accepts every draft
    (test_learning.py). Only 2,000 trajectories share the learning run's indices, too few for this test to
    see shared streams: the stream seed is checked in test_a_fixed_tree_learns_its_table..."""
    law = dict(FIXED, steps=40, num_samples=10_000, pilot_samples=2_000, seed=2)
    config = SamplerConfig(**law, cache_dir=str(tmp_path))
    generate(replace(config, num_samples=2_000))
    result, planned = generate(config)
    assert planned.plan_source == "runs" and len(set(planned.draft.forms.tolist())) > 1
    plain = build(
        SamplerConfig(**{**law, "method": "target", "tree": None, "freeze": None, "verifier": None, "seed": 1})
    )
    assert min_pvalue_bonferroni(result.samples, plain.run().samples) > ALPHA


def test_a_draft_network_setting_learns_per_step_between_the_network_and_the_frozen_forms(tmp_path):
    """With --draft NETWORK --freeze auto the runs price the corrected draft network too (one draft call a
    priced step, no target call), and the learnt table gives it some steps and the frozen forms others, as
    the pilots do on this model (test_calibration.py)."""
    config = SamplerConfig(
        model="digits",
        steps=20,
        method="tree",
        tree="2,1",
        verifier="dgrs",
        draft="digits-draft",
        freeze="auto",
        pilot_samples=8,
        num_samples=8,
        class_label=3,
        device="cpu",
        seed=0,
        cache_dir=str(tmp_path),
    )
    first_result, first = generate(config)
    assert first.learning_table and set(first.draft.forms.tolist()) == {RESIDUAL}
    measured, count = load_forms(first)
    assert count == 8 and RESIDUAL in [form for form, _ in measured]
    planned = build(config)
    assert planned.plan_source == "runs" and isinstance(planned.draft, StepwiseDraft)
    table = planned.draft.forms
    assert (table == RESIDUAL).any() and (table != RESIDUAL).any()


def test_shipped_statistics_plan_until_the_settings_own_replan(tmp_path, monkeypatch):
    """The statistics shipped for --tree auto plan it where the cache holds none of its own (priced here, then
    kept), and the freeze table of every topology of the model; --replan of that setting learns anew, and the
    runs after it plan from what they priced."""
    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    auto = SamplerConfig(**{**FIXED, "tree": "auto", "verifier": "auto", "budget": 6}, cache_dir=str(cache))
    generate(replace(auto, cache_dir=str(shipped), num_samples=8))  # what scripts/ship_plans.py does
    monkeypatch.setattr(planning, "SHIPPED_PLANS", shipped)
    from_shipped = build(replace(auto, cache_dir=str(tmp_path / "fresh")))
    assert from_shipped.plan_source == "shipped" and from_shipped.learnt and from_shipped.cost_model is not None
    assert build(replace(auto, cache_dir=str(tmp_path / "fresh"))).plan_source == "cache"  # priced once, then kept
    preset = generate(SamplerConfig(**{**FIXED, "num_samples": 8}, cache_dir=str(cache)))[1]
    assert preset.plan_source == "shipped" and not preset.learning_table  # the shipped table serves a preset too
    assert build(auto).plan_source == "shipped"
    relearnt = generate(replace(auto, replan=True))[1]
    assert relearnt.plan_source == "online" and relearnt.learning_table
    assert build(auto).plan_source == "online"  # 4 of 8 trajectories priced since the replan
    generate(replace(auto, seed=4))
    assert build(auto).plan_source == "runs"
    # another setting's --replan starts the forms again, and keeps this one's plan
    generate(SamplerConfig(**FIXED, cache_dir=str(cache), replan=True))
    assert forms.replanned(relearnt) and build(auto).plan_source == "cache"
