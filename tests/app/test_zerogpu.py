"""The app under ZeroGPU's contract, kept by the stand-in tests/standins/spaces (fork, pickle in and out,
duration asked first): the served app's click, API, refusal, Stop, exactness and export paths, and the
GPU tasks called through the stand-in in this process. docs/space.md says what only a real ZeroGPU Space
can show."""

import importlib.util
import json
import os
import pickle
import threading
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr
import psutil
import pytest

import specdemo.errors as errors_module
from specdemo.errors import ModelLoadError, SettingError, SpecdemoError, WorkLimitError
from specdemo.limits import Cancel, Cancelled
from specdemo_app import gpu
from specdemo_app import handlers as H
from specdemo_app import settings as S
from specdemo_app.topology_text import is_auto

from ..helpers import served_app

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests" / "standins"
DEFAULT_CLICK_SECONDS = 20  # the most GPU time a default click may ask for


def standin():
    """The stand-in `spaces` module, loaded under another name: this process's app keeps running without it."""
    spec = importlib.util.spec_from_file_location("standin_spaces", STANDINS / "spaces" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------- what crosses by pickle
ERRORS = [
    SpecdemoError("unknown model 'x'; accepted: digits, gm2d"),
    SettingError("steps", 5000, "at most 1000", "--steps 5000 is over the limit of 1000 steps here"),
    ModelLoadError("org/name", "offline", "no file", "org/name is not cached and the Hub is offline"),
    WorkLimitError(69_632_000, 50_000_000, "this run could evaluate up to 69,632,000 target rows"),
    Cancelled("the run was cancelled"),
]


def test_every_error_class_of_specdemo_pickles_with_its_fields():
    classes = {type(err) for err in ERRORS}
    subclasses, todo = set(), [SpecdemoError]
    while todo:  # every subclass defined so far, so that a new one without a test fails here
        cls = todo.pop()
        subclasses.add(cls)
        todo += cls.__subclasses__()
    assert {c for c in subclasses if c.__module__.startswith("specdemo")} <= classes, vars(errors_module)
    for err in ERRORS:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err) and vars(copy) == vars(err)


def test_a_cancel_flag_is_shared_with_its_copies_in_other_processes():
    cancel = Cancel(seconds=60.0)
    copy = pickle.loads(pickle.dumps(cancel))
    assert not copy.cancelled and copy.seconds == 60.0
    cancel.cancel()
    assert copy.cancelled  # the original reaches the copy ...
    other = Cancel()
    pickle.loads(pickle.dumps(other)).cancel()
    assert other.cancelled  # ... and a copy the original
    gone = pickle.loads(pickle.dumps(Cancel()))  # the original collected: the copy is a flag of its own
    assert not gone.cancelled
    gone.cancel()
    assert gone.cancelled


def test_the_click_task_pickles_and_asks_for_the_clicks_own_seconds():
    config, target, _, limits = S.make_config(S.page_values())
    rows = __import__("specdemo_app.runner", fromlist=["click_rows"]).click_rows(config, target, limits)
    seconds = gpu.seconds_for(rows, limits, 1.0, plans=is_auto(config.tree))
    assert gpu.START_SECONDS < seconds <= DEFAULT_CLICK_SECONDS
    # a click that plans asks for its planning's seconds too
    assert gpu.seconds_for(rows, limits, 1.0, plans=True) == gpu.seconds_for(rows, limits, 1.0) + gpu.PLANNING_SECONDS
    task = gpu.ClickTask(config, limits, Cancel(limits.max_seconds), gpu.ProgressBoard(), seconds)
    copy = pickle.loads(pickle.dumps(task))
    assert copy.config == config and copy.limits == limits and copy.seconds == seconds
    copy.board.post(0.5, "round 3")
    assert task.board.read()[1:] == (0.5, "round 3")
    # the most a click may ask is the app's time limit
    assert gpu.seconds_for(limits.max_rows * 10, limits) == limits.max_seconds


# ------------------------------------------------------------------- the GPU tasks through the stand-in
@pytest.fixture(scope="module")
def zero():
    """gpu.run_click, gpu.run_exactness and gpu.decode_path as ZeroGPU wraps them (the stand-in)."""
    spaces = standin()
    H.warm_up()  # the server's start-up: the worker forks from a warm process
    return spaces, {
        name: spaces.GPU(duration=duration)(getattr(gpu, name))
        for name, duration in (("run_click", gpu._asked), ("run_exactness", gpu._asked))
    }


def small_task(seconds=30.0, **change) -> gpu.ClickTask:
    values = {**S.page_values("gm2d"), "tree": "2,1", "steps": 12, "num_samples": 8, **change}
    config, _, _, limits = S.make_config(values)
    return gpu.ClickTask(config, limits, Cancel(limits.max_seconds), gpu.ProgressBoard(), seconds)


def test_a_click_runs_in_a_forked_worker_and_asks_its_duration_first(zero):
    spaces, tasks = zero
    here = gpu.call(gpu.run_click, small_task())
    there = gpu.call(tasks["run_click"], small_task(seconds=12.5))
    assert spaces.REQUESTS[-1]["task"] == "run_click" and spaces.REQUESTS[-1]["seconds"] == 12.5
    assert [r.summary()["target_calls"] for r in there.runs] == [r.summary()["target_calls"] for r in here.runs]
    assert all((a.samples == b.samples).all() for a, b in zip(here.runs, there.runs, strict=True))
    assert there.log_density is None and there.trace  # the server gives the log density back
    # a worker is reused: its second call is the same (its buffers were not moved under it)
    again = gpu.call(tasks["run_click"], small_task())
    assert all((a.samples == b.samples).all() for a, b in zip(here.runs, again.runs, strict=True))


def test_a_refusal_in_the_worker_reaches_the_page_as_without_zerogpu(zero):
    _, tasks = zero
    over = small_task()
    over = replace(over, limits=replace(over.limits, max_rows=100))  # past the server's check: refused inside
    with pytest.raises(gr.Error) as here:
        gpu.call(gpu.run_click, over)
    with pytest.raises(gr.Error) as there:
        gpu.call(tasks["run_click"], replace(over, cancel=Cancel()))
    assert there.value.message == here.value.message and "over the limit of 100" in there.value.message
    assert there.value.title == here.value.title == "Cannot run this"


def test_the_quota_is_checked_before_the_task(zero, monkeypatch):
    spaces, tasks = zero
    monkeypatch.setenv("SPACES_STANDIN_QUOTA", "10")
    with pytest.raises(gr.Error, match=r"exceeded your ZeroGPU quota \(15s requested vs. 10s left\)"):
        gpu.call(tasks["run_click"], small_task(seconds=15.0))
    gpu.call(tasks["run_click"], small_task(seconds=9.0))


def test_stop_reaches_the_worker_within_two_seconds(zero):
    """The server's flag, set while the worker computes, ends its work between rounds."""
    _, tasks = zero
    task = small_task(model="gm512", steps=1000, num_samples=1024, tree="3,2,1", verifier="dgrs")
    outcome = {}

    def click():
        try:
            gpu.call(tasks["run_click"], task)
        except gr.Error as err:
            outcome["error"] = err
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=click)
    thread.start()
    deadline = time.monotonic() + 60
    while task.board.read()[0] == 0 and time.monotonic() < deadline:  # sampling has started in the worker
        time.sleep(0.05)
    assert task.board.read()[0] > 0
    stopped = time.monotonic()
    task.cancel.cancel()
    thread.join(30)
    assert outcome["error"].title == "Stopped" and "cancelled" in str(outcome["error"])
    assert outcome["at"] - stopped < 2.0


def test_exactness_runs_in_the_worker(zero):
    _, tasks = zero
    values = {**S.page_values("gm2d"), "tree": "2,1", "steps": 12}
    config, _, _, limits = S.make_config({**values, "num_samples": 1})
    task = gpu.ExactnessTask(config, 200, limits, Cancel(), gpu.ProgressBoard(), 20.0)
    report = gpu.call(tasks["run_exactness"], task)
    assert 0 <= report.p_value <= 1 and report.plain.shape == report.speculative.shape == (200, 2)


# --------------------------------------------------------------------------------- the served app
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app served as a Space serves it (app.launch: warm-up, then the server), with the stand-in as
    its `spaces`: (url, the log of durations asked, the server's process)."""
    log = tmp_path_factory.mktemp("zerogpu") / "durations.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STANDINS), str(ROOT)]),
        "SPACES_STANDIN_LOG": str(log),
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    with served_app(env=env, start_s=240) as (url, process):
        yield url, log, psutil.Process(process.pid)


def asked(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def client(served):
    from gradio_client import Client

    return Client(served[0], verbose=False)


@pytest.mark.slow
def test_a_default_click_works_and_asks_at_most_20_s(served, client):
    from .test_app_client import DEFAULTS

    _, log, _ = served
    before = len(asked(log))
    headline = client.predict(**DEFAULTS, api_name="/run")[0]
    request = asked(log)[before:]
    assert [r["task"] for r in request] == ["run_click"] and request[0]["seconds"] <= DEFAULT_CLICK_SECONDS
    assert f"ZeroGPU time: {request[0]['seconds']:g} s asked for" in headline and "s used" in headline


@pytest.mark.slow
def test_a_default_sample_call_works_and_asks_at_most_20_s(served, client):
    _, log, _ = served
    before = len(asked(log))
    out = client.predict(api_name="/sample")
    request = asked(log)[before:]
    assert [r["task"] for r in request] == ["run_click"] and request[0]["seconds"] <= DEFAULT_CLICK_SECONDS
    assert out["gpu"]["asked_s"] == request[0]["seconds"] and 0 < out["gpu"]["used_s"] < out["gpu"]["asked_s"]
    assert out["seed"] == S.page_values()["seed"] and out["runs"][0]["label"] == "plain target"


@pytest.mark.slow
def test_refusals_export_and_exactness_through_the_worker(served, client):
    from gradio_client.exceptions import AppError

    from .test_app_client import SMALL

    with pytest.raises(AppError, match="steps: 5000 is not accepted here; accepted: at most 1000"):
        client.predict(**{**SMALL, "steps": 5000}, api_name="/run")
    client.predict(**SMALL, api_name="/run")
    data = json.loads(open(client.predict(api_name="/export")).read())
    assert data["config"]["tree"] == "2,1" and len(data["samples"]) == 8
    text, _ = client.predict(test_samples=200, **SMALL, api_name="/exactness")
    assert "p = " in text


def cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds of a process and its children (the workers) so far."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.mark.slow
@pytest.mark.parametrize("how", ["job.cancel()", "Stop"])
def test_stopping_a_long_run_ends_the_workers_work(served, how):
    """gm512, 1,000 steps, 1,024 samples: a minute of work. Cancelled once the worker computes, the server
    and its workers use under 0.2 core 5 to 10 s after the cancel (the issue's measure; the worker's own stop
    within 2 s is test_stop_reaches_the_worker_within_two_seconds's)."""
    from gradio_client import Client

    from .test_app_client import DEFAULTS

    url, _, server = served
    client = Client(url, verbose=False)
    long = {**DEFAULTS, "model": "gm512", "steps": 1000, "num_samples": 1024, "tree": "3,2,1", "verifier": "dgrs"}
    job = client.submit(**long, api_name="/run")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # until a worker computes: its CPU moves
        start = cpu_seconds(server)
        time.sleep(1.0)
        if len(server.children()) and cpu_seconds(server) - start > 0.5:
            break
    else:
        pytest.fail("the long run did not start")
    if how == "Stop":
        client.predict(api_name="/stop")
    else:
        job.cancel()
    time.sleep(5.0)
    start, t0 = cpu_seconds(server), time.monotonic()
    time.sleep(5.0)
    cores = (cpu_seconds(server) - start) / (time.monotonic() - t0)
    assert cores < 0.2, f"{cores:.2f} cores used 5 to 10 s after {how}"
