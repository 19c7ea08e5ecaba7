"""The fused round's operation count (benchmarks/launches.py): at most 52 ATen operations a round outside the
target network for a chain (RMC 1x5, block 1x9), 156 for a tree and for tree auto at 1 and at 16 samples, on the
digits model's 100 DDPM steps (the issue's goals; the driver before it took 152, 359, 582, 449 and 649).

Tree auto's plan is priced with the prices below, recorded on a 2-core CPU (one thread), not with the prices the
test machine measures: its shape, and so its operations, would move with that machine's timing."""

import dataclasses

import pytest
import torch

from benchmarks import launches
from benchmarks.launches_probe import count
from specdemo import SamplerConfig, build
from specdemo.planning.costs import CallCosts

from ..helpers import recorded_prices

RECORDED_CALLS = CallCosts(
    rows=(1, 2, 3, 4, 6, 8, 12, 16, 20),
    seconds=(0.0041, 0.0063, 0.0079, 0.0098, 0.0131, 0.0162, 0.0229, 0.0271, 0.0330),
    calls=0,
)
RECORDED_DRIVER = {"round_s": 0.0014, "level_s": 2.8e-05, "network_level_s": 0.0}
RECORDED_PLAIN_S = 0.45


@pytest.fixture(scope="module")
def auto_plan():
    """Tree auto's plan for one sample, from the statistics shipped with the package (no pilot), priced with
    the recorded prices."""
    with recorded_prices(RECORDED_CALLS, RECORDED_DRIVER, RECORDED_PLAIN_S):
        problem = build(SamplerConfig(**launches.settings("auto, 1 sample")))
    assert problem.plan_source == "shipped" and problem.declined is None
    return problem


@pytest.mark.parametrize("name", list(launches.CELLS))
@pytest.mark.slow
def test_a_round_takes_few_operations(name, auto_plan, one_thread):
    settings = launches.settings(name)
    if settings["tree"] == "auto":  # the recorded plan; 16 samples run with it too
        samples = settings["num_samples"]
        problem = dataclasses.replace(
            auto_plan,
            config=dataclasses.replace(auto_plan.config, num_samples=samples),
            cond={k: v[:1].expand(samples, *v.shape[1:]) for k, v in auto_plan.cond.items()},
        )
    else:
        problem = build(SamplerConfig(**settings))
    counted = count(problem)
    assert counted["rounds"] > 5 and counted["network_ops_per_call"] > 50
    assert counted["ops_per_round"] <= launches.CELLS[name][1], counted


@pytest.mark.slow
def test_the_counter_counts_what_runs_outside_the_network(one_thread, monkeypatch):
    """A network with operations of its own leaves the count as it is; one more operation in every round's
    reduction (a planted waste) raises it by one."""
    from specdemo.sampling import round as fused

    problem = build(SamplerConfig(**launches.settings("chain 1x5 rmc")))
    plain = count(problem)["ops_per_round"]

    def busier(x, n, **cond):
        return problem.network(x, n, **cond) + torch.zeros_like(x)

    assert count(dataclasses.replace(problem, network=busier))["ops_per_round"] == pytest.approx(plain)
    reduce = fused.reduce
    monkeypatch.setattr(fused, "reduce", lambda ws: (reduce(ws), torch.zeros(1)))
    assert count(problem)["ops_per_round"] == pytest.approx(plain + 1, abs=0.1)
