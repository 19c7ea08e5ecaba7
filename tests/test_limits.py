"""Work limits checked before any work, topologies parsed without building absurd sizes, and runs
that stop between rounds when cancelled or past their time limit."""

import tracemalloc

import pytest
import torch

from specdemo import (
    Cancel,
    Cancelled,
    Limits,
    ReflectionMaximalCoupling,
    SamplerConfig,
    SpecdemoError,
    Topology,
    build,
    sample,
)
from specdemo.drafts import FrozenOutput
from specdemo.kernels import DDPMKernel
from specdemo.planning import stats


def test_limits_name_the_bound_and_what_to_lower():
    limits = Limits(max_steps=100, max_samples=10, max_rows=1000)
    limits.check(steps=100, num_samples=10, rows_per_round=1)  # 1,000 rows: at the limit, accepted
    with pytest.raises(SpecdemoError, match="--steps 101 is over the limit of 100"):
        limits.check(steps=101, num_samples=1, rows_per_round=1)
    with pytest.raises(SpecdemoError, match=r"samples must be in 1\.\.10, got 11"):
        limits.check(steps=1, num_samples=11, rows_per_round=1)
    with pytest.raises(
        SpecdemoError,
        match=r"up to 1,001 target rows \(1 samples x 1 steps x 1 rows a round, plus "
        r"1,000 for the pilot\).*fewer samples, fewer steps",
    ):
        limits.check(steps=1, num_samples=1, rows_per_round=1, pilot_runs=1, pilot_samples=1000, pilot_rows_per_round=1)


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEMO_APP_MAX_STEPS", "50")
    monkeypatch.setenv("SPECDEMO_APP_MAX_SECONDS", "2.5")
    limits = Limits.from_env("SPECDEMO_APP_", max_steps=1000, max_rows=77)
    assert (limits.max_steps, limits.max_rows, limits.max_seconds) == (50, 77, 2.5)
    monkeypatch.setenv("SPECDEMO_APP_MAX_ROWS", "lots")
    with pytest.raises(SpecdemoError, match="SPECDEMO_APP_MAX_ROWS must be a number"):
        Limits.from_env("SPECDEMO_APP_")
    monkeypatch.setenv("SPECDEMO_APP_MAX_ROWS", "-5")
    with pytest.raises(SpecdemoError, match="must be positive"):
        Limits.from_env("SPECDEMO_APP_")


def test_build_refuses_before_any_work(monkeypatch):
    """Over the row bound, build refuses before a pilot or the network runs."""

    def no_pilot(*args, **kwargs):
        raise AssertionError("a pilot ran before the limits were checked")

    monkeypatch.setattr(stats, "_pilot", no_pilot)
    config = SamplerConfig(
        pilot=True,
        model="gm2d",
        method="tree",
        tree="auto",
        budget=16,
        steps=100,
        num_samples=100,
        device="cpu",
        replan=True,
    )
    # the run's own rows are 100 x 100 x 16 = 160,000; the pilot's 32 x 100 x 13 per pilot run on top
    with pytest.raises(SpecdemoError, match="plus .* for the pilot"):
        build(config, limits=Limits(max_rows=200_000))
    with pytest.raises(SpecdemoError, match="over the limit of 10 steps"):
        build(config, limits=Limits(max_steps=10))
    with pytest.raises(SpecdemoError, match=r"0\.\.2\*\*63 - 1, got -3"):
        build(SamplerConfig(model="gm2d", seed=-3, device="cpu"))


def test_absurd_topologies_are_refused_without_building_them():
    tracemalloc.start()
    # sizes a broken guard would still survive here (240 MB each), refused at once by a working one
    for text in ("1x30000000", "chain:30000000", "99999999999x2", "1," * 5000 + "1"):
        with pytest.raises(SpecdemoError, match="over the limit|characters long"):
            Topology.parse(text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000  # bytes; "1x3000000000" built as a tuple would take 24 GB


def _ddpm(steps=50):
    from diffusers import DDPMScheduler

    return DDPMKernel(DDPMScheduler(num_train_timesteps=1000), steps)


CHAIN = dict(tree=Topology.parse("1x2"), draft=FrozenOutput(), verifier=ReflectionMaximalCoupling())


def test_a_cancelled_run_stops_between_rounds():
    kernel = _ddpm()
    net = lambda x, n: 0.1 * x
    cancel = Cancel()
    rounds = []

    def after_round(info):
        rounds.append(info["round"])
        if info["round"] == 3:
            cancel.cancel()

    with pytest.raises(Cancelled, match="cancelled"):
        sample(net, kernel, (2,), 4, **CHAIN, seed=0, callback=after_round, cancel=cancel)
    assert rounds == [1, 2, 3]  # no round after the flag was set
    # a flag that is never set changes nothing: the same samples as without one
    a = sample(net, kernel, (2,), 4, **CHAIN, seed=0, cancel=Cancel())
    b = sample(net, kernel, (2,), 4, **CHAIN, seed=0)
    assert torch.equal(a.samples, b.samples)


def test_a_run_past_its_time_limit_stops():
    with pytest.raises(Cancelled, match="longer than its limit of 0 s"):
        sample(lambda x, n: 0.1 * x, _ddpm(), (2,), 4, **CHAIN, cancel=Cancel(seconds=0.0))


def test_build_passes_the_flag_to_the_pilots():
    cancel = Cancel()
    cancel.cancel()
    config = SamplerConfig(
        pilot=True,
        model="gm2d",
        method="tree",
        tree="auto",
        budget=8,
        steps=20,
        num_samples=2,
        device="cpu",
        replan=True,
    )
    with pytest.raises(Cancelled):
        build(config, cancel=cancel)


def test_a_cancel_flag_travels_to_another_process_as_its_time_left():
    """ZeroGPU pickles a function's arguments into a forked worker: the copy keeps the deadline."""
    import pickle

    copy = pickle.loads(pickle.dumps(Cancel(seconds=60.0)))
    assert 59.0 < copy.seconds <= 60.0 and not copy.cancelled
    copy.check()  # not past its time
    assert pickle.loads(pickle.dumps(Cancel())).seconds is None


def test_the_cli_stops_past_specdemo_max_seconds(monkeypatch, capsys):
    from specdemo.cli import main

    monkeypatch.setenv("SPECDEMO_MAX_SECONDS", "0.000001")
    code = main(["sample", "--model", "gm2d", "--steps", "50", "--num-samples", "4", "--method", "chain"])
    err = capsys.readouterr().err
    assert code == 2 and "longer than its limit" in err and len(err.strip().splitlines()) == 1


def test_refusals_are_typed_with_the_setting_its_value_and_what_is_accepted():
    """A refused setting carries its fields (the app words them with its own labels); the library's and the
    command line's message is unchanged; a run over the work limit carries its rows and the limit."""
    from specdemo import SettingError, WorkLimitError

    with pytest.raises(SettingError, match="eta must be in 0..1, got 2") as err:
        SamplerConfig(eta=2.0).validate()
    assert (err.value.setting, err.value.value, err.value.accepted) == ("eta", 2.0, "in 0..1")
    with pytest.raises(SettingError) as err:
        SamplerConfig(verifier="best").validate()
    assert (err.value.setting, err.value.value) == ("verifier", "best") and "block" in err.value.accepted
    with pytest.raises(SettingError, match="--steps 50 is over the limit of 10 steps here") as err:
        Limits(max_steps=10).check(steps=50, num_samples=1, rows_per_round=1)
    assert (err.value.setting, err.value.value, err.value.accepted) == ("steps", 50, "at most 10")
    with pytest.raises(WorkLimitError, match="over the limit of 1,000") as err:
        Limits(max_rows=1000).check(steps=100, num_samples=4, rows_per_round=5)
    assert (err.value.rows, err.value.limit) == (2000, 1000)
    with pytest.raises(SettingError) as err:
        build(SamplerConfig(model="digits", class_label=12, device="cpu"))
    assert (err.value.setting, err.value.value, err.value.accepted) == ("class_label", 12, "0..9")
