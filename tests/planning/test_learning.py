"""Plans learnt from runs: a setting with no plan samples with the online plan and pays no pilot; its runs
keep their deltas in the plan cache, and the run after pilot_samples trajectories plans from them.

End to end, the online run and the run planned from learnt deltas have the law of plain sampling
(two-sample KS tests as in test_exactness.py, shown to fail on a verifier that always accepts), and a
planned run draws from streams of its own, not the learning runs' (which a planted bug in
scripts/mutations.py removes).
"""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from specdemo import SamplerConfig, build, generate, planning
from specdemo.drafts.frozen import FORMS
from specdemo.planning import key_name, load_stats, plan_key
from specdemo.sampling import sample
from specdemo.trees import TopologyPlan

from ..test_exactness import ALPHA, min_pvalue_bonferroni
from ..verifiers.test_verifiers import AlwaysAccept

# a fixed form: these runs learn the deltas of their verified paths (--freeze auto's table: test_forms.py)
LEARN = dict(
    model="gm2d",
    kernel="ddpm",
    steps=30,
    method="tree",
    tree="auto",
    freeze="gaussian",
    budget=6,
    pilot_samples=8,
    num_samples=4,
    device="cpu",
    seed=3,
)


def test_a_first_run_pays_no_pilot_and_the_runs_deltas_plan_a_later_run(tmp_path):
    config = SamplerConfig(**LEARN, cache_dir=str(tmp_path))
    first_result, first = generate(config)
    # the online plan: a block-verified chain as deep as the budget, no pilot
    assert first.plan_source == "online" and first.pilot is None and first_result.cost.pilot_calls == 0
    assert isinstance(first.tree, TopologyPlan) and first.tree.at(0).widths == (1,) * 6
    assert first.tree.at(0, root_known=True).widths == (1,) * 7  # a known root's level costs no row
    assert first.verifier.name == "block" and first.draft.freeze == "gaussian"
    assert first_result.trace is None  # kept for learning, not handed back unasked
    stats, count = load_stats(plan_key(first), tmp_path)
    assert count == 4 and sum(len(v) for v in stats.deltas.values()) >= 30 * 4 // 6
    assert not (tmp_path / key_name(plan_key(first))).exists()  # no plan yet
    # 4 of 8 trajectories: the second run is online too, the same plan and seed giving the same samples (and
    # adding no trajectory: test_a_repeated_seed_adds_no_trajectory_twice); a run of another seed adds its own
    second_result, second = generate(config)
    assert second.plan_source == "online" and (second_result.samples == first_result.samples).all()
    assert load_stats(plan_key(first), tmp_path)[1] == 4
    assert generate(replace(config, seed=4))[1].plan_source == "online"
    assert load_stats(plan_key(first), tmp_path)[1] == 8
    # 8 trajectories measured: the third run plans from them (no pilot), stores the plan, and no longer learns
    third_result, third = generate(config)
    assert third.plan_source == "runs" and third.learnt and third.pilot is None and third.cost_model is not None
    # plain sampling may be expected faster than the plan (priced by timings: a loaded machine tips it)
    assert (third.declined or third).tree.name == "auto(6 rows)" and third_result.cost.pilot_calls == 0
    assert (tmp_path / key_name(plan_key(first))).exists()
    assert load_stats(plan_key(first), tmp_path)[1] == 8
    fourth_result, fourth = generate(config)
    assert fourth.plan_source == "cache" and fourth.learnt and fourth.tree == third.tree
    assert (fourth_result.samples == third_result.samples).all()
    # --replan learns anew: online again, the plan gone, the statistics this run's alone
    again_result, again = generate(replace(config, replan=True))
    assert again.plan_source == "online" and (again_result.samples == first_result.samples).all()
    assert not (tmp_path / key_name(plan_key(first))).exists() and load_stats(plan_key(first), tmp_path)[1] == 4


def test_a_planned_run_draws_from_streams_other_than_the_learning_runs(tmp_path):
    """The learning runs drew from seed 3's streams; a run planned from their deltas with seed 3 must not
    draw from them again (its plan would be a function of its own draws): the same plan sampled from seed 3's
    streams gives other samples than the planned run."""
    config = SamplerConfig(**{**LEARN, "num_samples": 8}, cache_dir=str(tmp_path))
    generate(config)
    planned_result, planned = generate(config)
    assert planned.plan_source == "runs" and planned.stream_seed != config.seed
    again = sample(
        planned.network,
        planned.kernel,
        planned.target.shape,
        8,
        tree=planned.tree,
        draft=planned.draft,
        verifier=planned.verifier,
        prefetch=planned.config.prefetch,
        seed=config.seed,
    )
    assert not torch.equal(again.samples, planned_result.samples)
    streams = sample(
        planned.network,
        planned.kernel,
        planned.target.shape,
        8,
        tree=planned.tree,
        draft=planned.draft,
        verifier=planned.verifier,
        prefetch=planned.config.prefetch,
        seed=planned.stream_seed,
    )
    assert torch.equal(streams.samples, planned_result.samples)


def test_a_repeated_seed_adds_no_trajectory_twice(tmp_path):
    """A trajectory is its seed's stream of its index: a run repeated with the same seed draws the same deltas,
    which learnt again would weigh twice. It adds nothing; the same seed with more samples, or a process's
    share of them, adds the trajectories not learnt yet, the deltas those alone measured."""
    config = SamplerConfig(**{**LEARN, "pilot_samples": 64}, cache_dir=str(tmp_path))
    _, first = generate(config)
    kept = load_stats(plan_key(first), tmp_path)
    generate(config)
    assert load_stats(plan_key(first), tmp_path) == kept
    generate(replace(config, num_samples=6))
    first.run(indices=[5, 6, 7])  # a process's share: trajectory 5 is learnt already
    stats, count = load_stats(plan_key(first), tmp_path)
    assert count == 8
    at_once = tmp_path / "at_once"
    generate(replace(config, num_samples=8, cache_dir=str(at_once)))
    expected, _ = load_stats(plan_key(first), at_once)
    assert {cell: sorted(v) for cell, v in stats.deltas.items()} == {
        cell: sorted(v) for cell, v in expected.deltas.items()
    }
    generate(replace(config, seed=4))
    assert load_stats(plan_key(first), tmp_path)[1] == 12


def test_replan_where_statistics_ship_learns_anew_and_the_later_runs_plan_from_what_it_learnt(tmp_path, monkeypatch):
    """--replan of a setting whose statistics ship with the package samples with the online plan and learns; the
    runs after it go on learning and plan from their deltas, not from the shipped ones (shipped statistics
    plan a setting whose runs have kept none in the cache). --pilot pilots whatever ships."""
    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    config = SamplerConfig(**LEARN, cache_dir=str(cache))
    generate(replace(config, cache_dir=str(shipped), num_samples=8))  # what scripts/ship_plans.py does
    monkeypatch.setattr(planning, "SHIPPED_PLANS", shipped)
    assert build(replace(config, cache_dir="off", pilot=True)).plan_source == "pilot"
    assert build(config).plan_source == "shipped"
    assert generate(replace(config, replan=True))[1].plan_source == "online"
    assert generate(replace(config, seed=4))[1].plan_source == "online"
    planned = build(config)
    assert planned.plan_source == "runs" and planned.learnt
    assert build(config).plan_source == "cache"


@pytest.mark.slow
def test_the_cli_reports_a_first_run_without_a_pilot_and_a_planned_second(tmp_path):
    args = [
        sys.executable,
        "-m",
        "specdemo",
        "sample",
        "--model",
        "gm2d",
        "--steps",
        "30",
        "--tree",
        "auto",
        "--budget",
        "6",
        "--num-samples",
        "8",
        "--pilot-samples",
        "8",
        "--cache-dir",
        str(tmp_path),
    ]
    first, second = [
        json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        for _ in range(2)
    ]
    assert first["plan_source"] == "online" and first["pilot_calls"] == 0 and first["planned_calls"] is None
    assert first["tree"] == "online(6 rows)" and first["verifier"] == "block"
    assert second["plan_source"] == "runs" and second["pilot_calls"] == 0 and second["planned_calls"] > 0
    # on a model this cheap, plain sampling may be expected faster than the plan: the run then says so (the
    # runs' measured seconds decline a plan only once MEASURED_MIN runs measured it: not yet here)
    assert second["declined"] == (second["tree"] == "none") == (second["plain_s"] <= second["planned_s"])


def test_a_fixed_tree_with_freeze_auto_pays_no_pilot(tmp_path):
    problem = build(
        SamplerConfig(**{**LEARN, "tree": "3,2,1", "verifier": "dgrs", "freeze": "auto"}, cache_dir=str(tmp_path))
    )
    assert problem.plan_source == "default" and problem.pilot is None
    assert set(problem.draft.forms.tolist()) == {FORMS["gaussian"]} and list(tmp_path.iterdir()) == []  # no run yet


def test_a_run_of_an_unwritable_cache_still_samples(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    result, problem = generate(SamplerConfig(**LEARN, cache_dir=str(blocked)))
    assert problem.plan_source == "online" and result.samples.shape == (4, 2)


# ---------------------------------------------------------------------------------------------- the law
EXACT = dict(
    model="gm2d",
    kernel="ddpm",
    steps=40,
    method="tree",
    tree="auto",
    budget=6,
    objective="calls",
    num_samples=10_000,
    pilot_samples=10_000,
    device="cpu",
)


@pytest.fixture(scope="module")
def plain_samples():
    return build(SamplerConfig(**{**EXACT, "method": "target", "tree": None}, seed=1)).run().samples


@pytest.fixture(scope="module")
def learnt(tmp_path_factory):
    """The online run (10,000 trajectories, seed 2) and the run planned from its deltas (seed 2 again)."""
    config = SamplerConfig(**EXACT, seed=2, cache_dir=str(tmp_path_factory.mktemp("cache")))
    online = generate(config)
    planned = generate(config)
    assert online[1].plan_source == "online" and planned[1].plan_source == "runs"
    return online, planned


@pytest.mark.slow
@pytest.mark.statistical
def test_the_online_run_and_the_run_planned_from_it_are_exact(learnt, plain_samples):
    (online_result, _), (planned_result, planned) = learnt
    assert any(t.depth > 1 for t in planned.tree.trees)  # it speculates
    for result in (online_result, planned_result):
        assert result.cost.speedup_total > 2.0
        assert min_pvalue_bonferroni(result.samples, plain_samples) > ALPHA


@pytest.mark.slow
@pytest.mark.statistical
def test_the_online_run_whose_trajectories_cut_their_chains_is_exact(plain_samples):
    """Under the time objective each trajectory cuts the online chain by its own acceptance so far
    (ReachRule): the chain of a round depends on the trajectory's earlier rounds, never on its own draws. The
    draft is moved by one sigma, so that chains are cut: 4.7 rows a call against 5.3 for the whole chains the
    calls objective takes (measured)."""
    config = SamplerConfig(**{**EXACT, "objective": "time", "draft_bias": 1.0}, seed=4, cache_dir="off")
    result, problem = generate(config)
    whole, _ = generate(replace(config, objective="calls"))
    assert problem.plan_source == "online" and problem.tree.rule is not None
    assert result.cost.rows_per_call < 0.95 * whole.cost.rows_per_call
    assert result.cost.speedup_total > 2.0
    assert min_pvalue_bonferroni(result.samples, plain_samples) > ALPHA


@pytest.mark.slow
@pytest.mark.statistical
def test_the_law_test_catches_an_online_run_that_accepts_every_draft(monkeypatch, tmp_path, plain_samples):
    online_problem = planning.online_problem
    monkeypatch.setattr(
        planning, "online_problem", lambda *args: replace(online_problem(*args), verifier=AlwaysAccept())
    )
    result, problem = generate(SamplerConfig(**EXACT, seed=2, cache_dir="off"))
    assert problem.plan_source == "online" and isinstance(problem.verifier, AlwaysAccept)
    assert min_pvalue_bonferroni(result.samples, plain_samples) < ALPHA


def test_learning_keeps_no_node_states_and_pools_the_batch_sizes(tmp_path, monkeypatch):
    """A learning run asks the driver for its deltas alone (no node states on the host) unless the caller
    traces; runs of one setting at other batch sizes (planned apart under the time objective) learn together."""
    import specdemo.pipeline as pipeline

    asked = []
    monkeypatch.setattr(pipeline, "sample", lambda *args, **kwargs: asked.append(kwargs) or sample(*args, **kwargs))
    config = SamplerConfig(**{**LEARN, "pilot_samples": 16}, cache_dir=str(tmp_path))
    _, first = generate(config)
    assert asked[-1]["trace"] and asked[-1]["trace_states"] is False
    _, second = generate(replace(config, max_batch=2, seed=4))  # another seed: seed 3's trajectories are kept
    assert plan_key(first) != plan_key(second)  # a plan priced by time is kept per batch
    assert load_stats(plan_key(first), tmp_path)[1] == load_stats(plan_key(second), tmp_path)[1] == 8
    first.run(trace=True)
    assert asked[-1]["trace"] and "trace_states" not in asked[-1]  # the caller's trace, node states and all
