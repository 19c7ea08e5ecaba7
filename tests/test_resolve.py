"""specdemo.resolve: one function turns a SamplerConfig into typed settings, and every rule between
settings refuses there, by type, naming the setting and what is accepted."""

import pytest

from specdemo import SamplerConfig, SettingError
from specdemo.drafts import FrozenGaussian, FrozenOutput, FrozenPerStep, FrozenX0, FrozenX0Linear, frozen_draft
from specdemo.pipeline import prepare
from specdemo.resolve import AUTO_FORMS, PILOT_DEPTH, Freeze, Method, Prefetch, Start, method_of, resolve
from specdemo.trees import Topology


def test_settings_come_back_typed_with_every_default_filled():
    s = resolve(SamplerConfig(model="gm2d", method="chain", steps=20, num_samples=4, device="cpu"))
    assert s.method is Method.CHAIN and s.topology == Topology.chain(5) and s.verifier == "rmc"
    assert (s.freeze, s.start, s.prefetch) == (Freeze.OUT, Start.COLD, Prefetch.NEAREST) and s.plan is None
    assert (
        s.config.tree == "1x5" and s.round_nodes == 6 and s.rows_per_round == 7 and s.pilot_rows == 0
    )  # the root counted
    auto = resolve(SamplerConfig(model="digits", steps=30, num_samples=2, device="cpu"))
    assert auto.method is Method.TREE and auto.topology is None and auto.verifier is None  # the planner's
    assert auto.plan.tree and auto.plan.freeze and auto.plan.verifier and auto.plan.budget == 16
    assert auto.prefetch is Prefetch.AUTO and auto.rows_per_round == 17 and auto.round_nodes == 33
    plain = resolve(SamplerConfig(model="gm2d", method="target", steps=20, device="cpu"))
    assert plain.topology == Topology(()) and plain.plan is None and plain.rows_per_round == 1


def test_pilots_are_counted_where_asked_for():
    c = SamplerConfig(
        model="digits", draft="digits-draft", freeze="auto", steps=20, num_samples=2, pilot_samples=8, device="cpu"
    )
    assert resolve(c).pilot_rows == 0  # learnt from runs: no pilot
    piloted = resolve(SamplerConfig(**{**c.to_dict(), "pilot": True}))
    assert piloted.pilot_runs == len(AUTO_FORMS) + 1  # a pilot per frozen form, and the corrected network's
    assert piloted.pilot_rows == piloted.pilot_runs * 8 * 20 * (PILOT_DEPTH + 1)


REFUSALS = {  # a rule between settings: (config, the setting refused, words of what is accepted)
    "verifier auto on a fixed tree": (dict(model="gm2d", tree="3,2,1", verifier="auto"), "verifier", "dgrs"),
    "a chain with branches": (dict(model="gm2d", method="chain", tree="3,2,1"), "tree", "1xL"),
    "prefetch auto on a fixed tree": (dict(model="gm2d", tree="1x4", prefetch="auto"), "prefetch", "leaves"),
    "residual with the frozen draft": (dict(model="gm2d", tree="1x4", freeze="residual"), "freeze", "frozen draft"),
    "a frozen form with a network": (
        dict(model="digits", tree="1x4", draft="digits-draft", freeze="x0"),
        "freeze",
        "residual",
    ),
    "x0 under Langevin": (dict(model="banana", tree="1x4", freeze="x0"), "freeze", "out"),
    "freeze auto under Langevin": (dict(model="banana", tree="auto", freeze="auto"), "freeze", "out"),
    "cold start under Langevin": (dict(model="banana", tree="1x4", start="cold"), "start", "warm"),
    "warm start with a network": (
        dict(model="digits", tree="1x4", draft="digits-draft", start="warm"),
        "start",
        "cold",
    ),
    "a draft network for a mixture": (dict(model="gm2d", tree="1x4", draft="digits-draft"), "draft", "frozen"),
    "a class for a mixture": (dict(model="gm2d", tree="1x4", class_label=2), "class_label", "none"),
    "a class out of range": (dict(model="digits", tree="1x4", class_label=12), "class_label", "0..9"),
    "an unknown kernel": (dict(model="gm2d", kernel="heun"), "kernel", "ddpm"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_each_rule_refuses_by_type_before_any_work(case):
    settings, name, accepted = REFUSALS[case]
    with pytest.raises(SettingError) as err:
        resolve(SamplerConfig(steps=20, num_samples=2, device="cpu", **settings))
    assert err.value.setting == name and accepted in err.value.accepted, (err.value.setting, err.value.accepted)


def test_a_typed_topology_names_its_method():
    assert method_of("auto") is Method.TREE and method_of(" AUTO ") is Method.TREE
    assert method_of("1x5") is Method.CHAIN and method_of("3,2,1") is Method.TREE


@pytest.mark.parametrize(
    "name, form", [("out", FrozenOutput), ("x0", FrozenX0), ("x0-linear", FrozenX0Linear), ("gaussian", FrozenGaussian)]
)
def test_each_frozen_form_is_a_class(name, form):
    draft = frozen_draft(name, start="cold")
    assert type(draft) is form and draft.freeze == name and draft.config()["freeze"] == name and draft.cold_start
    assert type(frozen_draft("auto", (0, 1, 2, 3))) is FrozenPerStep


def test_the_problem_carries_the_plan_request_and_the_drafts_form():
    problem = prepare(SamplerConfig(model="gm2d", tree="2,1", freeze="x0-linear", steps=20, device="cpu"))
    assert type(problem.draft) is FrozenX0Linear and problem.request is None
    planned = prepare(SamplerConfig(model="gm2d", tree="auto", steps=20, device="cpu"))
    assert planned.tree is None and planned.request.tree and planned.request.budget == 16
