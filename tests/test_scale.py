"""Scale: continuous batching and several processes give each trajectory the samples one batch does."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from specdemo import SamplerConfig, build

from .helpers import free_port

BASE = dict(model="gm2d", steps=30, method="tree", tree="3,2", verifier="dgrs", num_samples=24, seed=5, device="cpu")


def test_continuous_batching_gives_every_trajectory_the_same_samples():
    whole = build(SamplerConfig(**BASE)).run(keep_steps=[10])
    slots = build(SamplerConfig(**BASE, max_batch=5)).run(keep_steps=[10])
    assert torch.equal(whole.samples, slots.samples)  # an analytic target's rows do not depend on the batch
    assert torch.equal(whole.states[10], slots.states[10])
    # each trajectory spent the same calls and rows; the batch as a whole took more sequential calls
    assert (whole.cost.calls_per_trajectory == slots.cost.calls_per_trajectory).all()
    assert (whole.cost.rows_per_trajectory == slots.cost.rows_per_trajectory).all()
    assert slots.cost.target_calls > whole.cost.target_calls


def test_progress_reaches_one_with_continuous_batching():
    seen = []
    build(SamplerConfig(**BASE, max_batch=7)).run(callback=seen.append)
    assert seen[-1]["progress"] == 1.0 and seen[-1]["finished"] == BASE["num_samples"]
    assert all(a["progress"] <= b["progress"] for a, b in zip(seen, seen[1:], strict=False))


def cli(*args, launcher=()):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [*launcher, "-m", "specdemo", "sample", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    args = [
        "--model",
        "gm2d",
        "--steps",
        "30",
        "--method",
        "tree",
        "--tree",
        "3,2",
        "--num-samples",
        "24",
        "--seed",
        "5",
    ]
    one = cli(*args, "--out", str(tmp_path / "one.npz"), launcher=[sys.executable])
    two = cli(*args, "--out", str(tmp_path / "two.npz"), launcher=accelerate_launcher())
    assert two["processes"] == 2 and one["processes"] == 1
    a, b = np.load(tmp_path / "one.npz")["samples"], np.load(tmp_path / "two.npz")["samples"]
    assert a.shape == b.shape == (24, 2)
    np.testing.assert_array_equal(a, b)
    assert one["target_rows"] == two["target_rows"] and one["speedup"] == two["speedup"]


@pytest.mark.slow
def test_two_processes_sample_with_the_main_processes_plan(tmp_path):
    """--tree auto priced by time: the main process plans, the others take its plan (each would price
    rounds with its own measurements), so the gathered samples are those one process draws with that
    plan (here from the plan cache the main process wrote). The plan is learnt from a first, online run's
    deltas: every process draws from the learnt plan's streams (Problem.stream_seed)."""
    args = [
        "--model",
        "gm2d",
        "--steps",
        "30",
        "--method",
        "tree",
        "--tree",
        "auto",
        "--budget",
        "6",
        "--num-samples",
        "24",
        "--pilot-samples",
        "8",
        "--seed",
        "5",
        "--cache-dir",
        str(tmp_path / "plans"),
    ]
    first = cli(*args, "--out", str(tmp_path / "first.npz"), launcher=[sys.executable])
    two = cli(*args, "--out", str(tmp_path / "two.npz"), launcher=accelerate_launcher())
    one = cli(*args, "--out", str(tmp_path / "one.npz"), launcher=[sys.executable])
    assert first["plan_source"] == "online" and first["pilot_calls"] == 0
    assert two["processes"] == 2 and two["plan_source"] == "runs" and one["plan_source"] == "cache"
    # planning weighs the plan against plain sampling with seconds measured while the two processes ran (a
    # loaded machine may decline it): whichever it chose, the record holds it, and the single process takes it
    assert (one["tree"], one["planned_s"], one["objective"]) == (two["tree"], two["planned_s"], two["objective"])
    a, b = np.load(tmp_path / "one.npz")["samples"], np.load(tmp_path / "two.npz")["samples"]
    np.testing.assert_array_equal(a, b)
    assert one["target_rows"] == two["target_rows"]


def accelerate_launcher() -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]


@pytest.mark.slow
def test_accelerate_cpu_launching_one_process_says_so():
    """`accelerate launch --cpu --num_processes 2` starts one process and tells nobody (accelerate
    1.x); the run goes on as one process and says so, naming the launch that runs P CPU processes."""
    accelerate = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    done = subprocess.run(
        [
            *accelerate,
            "-m",
            "specdemo",
            "sample",
            "--model",
            "gm2d",
            "--steps",
            "10",
            "--method",
            "chain",
            "--tree",
            "1x2",
            "--num-samples",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["processes"] == 1
    assert "accelerate started one process" in done.stderr and "--multi_gpu --num_processes P" in done.stderr
