"""The fused round's operation count (benchmarks/launches.py): at most 52 ATen operations a round outside the
target network for a chain (RMC 1x5, block 1x9), 156 for a tree and for tree auto at 1 sample, and 160 at 16
samples (its plan is priced on the machine that runs it), on the digits model's 100 DDPM steps (the issue's goals;
the driver before it took 152, 359, 582, 449 and 649)."""

import dataclasses

import pytest
import torch

from benchmarks import launches
from benchmarks.launches_probe import count
from specdemo import SamplerConfig, build


@pytest.fixture(scope="module")
def auto_plan():
    """Tree auto's plan for one sample (shipped with the package: no pilot)."""
    problem = build(SamplerConfig(**launches.settings("auto, 1 sample")))
    assert problem.plan_source == "shipped"
    return problem


@pytest.mark.parametrize("name", list(launches.CELLS))
@pytest.mark.slow
def test_a_round_takes_few_operations(name, auto_plan, one_thread):
    settings = launches.settings(name)
    if settings["tree"] == "auto":  # the shipped plan; 16 samples run with it too (planning them would pilot)
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
