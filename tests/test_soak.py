"""Soak: the app server as a visitor's browser would meet it, session after session, keeps its memory.

The server runs in its own process (its resident memory is what a Space pays for); each session
goes through gradio_client: the small default-like run, a large run near the app's limits (4,096
gm2d samples), a round view and an export. A session keeps its last comparison summarised (the
trace of its first trajectories, within app.SESSION_BYTES), so sessions that end leave at most
that much each behind: the server's resident memory after every session must stay within
GROWTH_BOUND of what it held after the first one (which pays the allocators' one-time growth).
A session that kept its large run whole held 0.3-0.4 GB (issue 13).
"""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from gradio_client import Client

from .helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 5
GROWTH_BOUND = 150e6  # bytes: four more sessions than the first may add, all told
SMALL = dict(model="gm2d", custom_model="", draft="frozen", freeze="out", draft_bias=0, tree="2,1", budget=16,
             verifier="dgrs", kernel="default", steps=12, eta=1, churn=0.06, num_samples=8, class_label=0, seed=0,
             device="cpu", objective="time")
LARGE = {**SMALL, "tree": "1x3", "verifier": "rmc", "steps": 150, "num_samples": 4096}  # the gm2d samples' maximum


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    code = f"import app; app.launch(server_name='127.0.0.1', server_port={port}, quiet=True)"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, "the app exited"
                assert time.monotonic() < deadline, "the app did not start within 120 s"
                time.sleep(0.5)
        yield url, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def session(url: str, seed: int) -> None:
    client = Client(url, verbose=False)
    try:
        client.predict("gm2d", "default", api_name="/model_defaults")  # the samples slider's range, as in the page
        assert f"seed {seed}" in client.predict(*{**SMALL, "seed": seed}.values(), api_name="/run")[0]
        out = client.predict(*{**LARGE, "seed": seed}.values(), api_name="/run")
        assert "Two runs" in out[0]
        assert client.predict(0, 2, api_name="/tree_view")[0]["type"] == "plotly"
        assert Path(client.predict(api_name="/export")).stat().st_size > 0
    finally:
        client.close()


def test_sessions_leave_the_servers_memory_bounded(server):
    url, proc = server
    t0 = time.monotonic()
    session(url, 0)
    after_first = proc.memory_info().rss
    rss = []
    for seed in range(1, SESSIONS):
        session(url, seed)
        rss.append(proc.memory_info().rss)
    growth = rss[-1] - after_first
    print(f"soak: {SESSIONS} sessions in {time.monotonic() - t0:.0f} s; resident memory after the first "
          f"{after_first / 1e6:.0f} MB, then " + ", ".join(f"{r / 1e6:.0f}" for r in rss) + " MB")
    assert growth < GROWTH_BOUND, f"the server grew by {growth / 1e6:.0f} MB over {SESSIONS - 1} sessions"
