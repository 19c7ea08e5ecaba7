"""Planning in bounded time at any batch: what it samples and calls is bounded, its seconds and calls are
charged to the run that paid for them, and it stops when its run is cancelled."""

import pytest

from specdemo import SamplerConfig, build, generate
from specdemo.limits import Cancel, Cancelled
from specdemo.planning import costs

BIG = dict(model="gm2d", tree="auto", steps=20, num_samples=2048, device="cpu", seed=3)


@pytest.fixture(scope="module")
def learnt(tmp_path_factory):
    """A cache in which a first run of BIG learnt its deltas (the online plan): the next build plans."""
    folder = tmp_path_factory.mktemp("cache")
    first, problem = generate(SamplerConfig(**BIG, cache_dir=str(folder)))
    assert problem.plan_source == "online" and first.cost.planning_s == 0 and first.cost.planning_calls == 0
    return folder


def test_planning_a_large_batch_samples_and_calls_a_bounded_amount(learnt, monkeypatch, tmp_path):
    sampled, called, real_sample, real_call = [], [], costs.sample, costs.call_seconds

    def counted(*args, callback, **kwargs):
        rounds = [0]

        def each(info):
            rounds[0] += 1
            callback(info)

        try:
            return real_sample(*args, callback=each, **kwargs)
        finally:
            sampled.append((args[3], rounds[0]))

    monkeypatch.setattr(costs, "sample", counted)
    monkeypatch.setattr(
        costs, "call_seconds", lambda p, rows, *a, **k: called.append(rows) or real_call(p, rows, *a, **k)
    )
    import shutil

    shutil.copytree(learnt, tmp_path / "cache")
    result, problem = generate(SamplerConfig(**BIG, cache_dir=str(tmp_path / "cache")))
    assert (problem.declined or problem).plan_source == "runs"
    assert sampled and max(b for b, _ in sampled) <= costs.MEASURED_BATCHES[-1]
    assert max(r for _, r in sampled) <= costs.WARM_ROUNDS + costs.TIMED_ROUNDS + 1
    assert max(called) <= costs.MOST_ROWS
    summary = result.cost.summary()
    assert summary["planning_s"] > 0 and summary["planning_calls"] == (problem.declined or problem).planning_calls > 0
    calls = summary["target_calls_per_sample"] + summary["pilot_calls"] + summary["planning_calls"]
    assert summary["speedup_total"] == pytest.approx(summary["steps"] / calls)


def test_planning_stops_when_its_run_is_cancelled(learnt, tmp_path):
    import shutil

    shutil.copytree(learnt, tmp_path / "cache")
    cancel = Cancel()
    cancel.cancel()
    with pytest.raises(Cancelled):
        build(SamplerConfig(**BIG, cache_dir=str(tmp_path / "cache")), cancel=cancel)


def test_planning_reports_its_progress_and_a_cancel_midway_stops_it(learnt, tmp_path):
    """Each measurement is reported with a share that grows to 1 (the page's bar); a cancel set while the
    driver is being timed stops planning before its next measurement."""
    import shutil

    shutil.copytree(learnt, tmp_path / "cache")
    config = SamplerConfig(**BIG, cache_dir=str(tmp_path / "cache"), replan=False)
    heard: list[tuple[float, str]] = []
    build(config, report=lambda done, what: heard.append((done, what)))
    shares = [done for done, _ in heard]
    assert len(heard) >= 4 and shares == sorted(shares) and shares[0] == 0 and shares[-1] == 1
    assert any("calls" in what for _, what in heard) and any("driver" in what for _, what in heard)

    shutil.rmtree(tmp_path / "cache")
    shutil.copytree(learnt, tmp_path / "cache")
    cancel, after = Cancel(), []

    def stop_at_the_driver(done: float, what: str) -> None:
        if cancel.cancelled:
            after.append(what)
        elif "driver" in what:
            cancel.cancel()

    with pytest.raises(Cancelled):
        build(config, cancel=cancel, report=stop_at_the_driver)
    assert cancel.cancelled and after == []


def test_call_costs_time_the_sizes_in_turns_and_never_price_more_rows_lower(monkeypatch):
    """Each size is timed once a turn (a burst of load falls on every size alike), and a size timed faster
    than a smaller one (here 8 rows, as noise makes it) is not priced below it."""
    problem = build(SamplerConfig(**{**BIG, "num_samples": 1, "budget": 16}))
    order: list[int] = []
    noisy = {8: 0.5}

    def seconds(p, rows, repeats, warm=True):
        order.append(rows)
        return [noisy.get(rows, 1.0) * rows * 1e-3] * repeats

    monkeypatch.setattr(costs, "call_seconds", seconds)
    measured = costs.call_costs(problem)
    sizes = len(measured.rows)
    assert order[:sizes] == order[sizes : 2 * sizes] == list(measured.rows)  # set up, then a turn of every size
    assert list(measured.seconds) == sorted(measured.seconds)
    at = dict(zip(measured.rows, measured.seconds, strict=True))
    assert at[8] >= at[6] and measured.calls == len(order)
