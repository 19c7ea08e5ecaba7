"""Soak: the app server as a visitor's browser would meet it, session after session, keeps its memory.

The server runs in its own process (its resident memory is what a Space pays for); each session
goes through gradio_client: the small default-like run, a large run near the app's limits (4,096
gm2d samples), a round view and an export. A session keeps its last comparison summarised (the
trace of its first trajectories, within specdemo_app.gpu.SESSION_BYTES), so sessions that end leave at most
that much each behind: the server's resident memory after every session must stay within
GROWTH_BOUND of what it held after the first one (which pays the allocators' one-time growth).
A session that kept its large run whole held 0.3-0.4 GB (issue 13).
"""

import time
from pathlib import Path

import psutil
import pytest
from gradio_client import Client

from ..helpers import served_app

pytestmark = [pytest.mark.app, pytest.mark.slow]

SESSIONS = 5
GROWTH_BOUND = 150e6  # bytes: four more sessions than the first may add, all told
SMALL = dict(
    model="gm2d",
    custom_model="",
    draft="frozen",
    freeze="out",
    draft_bias=0,
    tree="2,1",
    budget=16,
    verifier="dgrs",
    kernel="default",
    steps=12,
    eta=1,
    churn=0.06,
    num_samples=8,
    class_label=0,
    seed=0,
    device="cpu",
    objective="time",
)
LARGE = {**SMALL, "tree": "1x3", "verifier": "rmc", "steps": 150, "num_samples": 4096}  # the gm2d samples' maximum


@pytest.fixture(scope="module")
def server():
    with served_app() as (url, proc):
        yield url, psutil.Process(proc.pid)


def session(url: str, seed: int) -> None:
    client = Client(url, verbose=False)
    try:
        client.predict("gm2d", "default", api_name="/model_defaults")  # the samples slider's range, as in the page
        assert f"seed {seed}" in client.predict(**{**SMALL, "seed": seed}, api_name="/run")[0]
        out = client.predict(**{**LARGE, "seed": seed}, api_name="/run")
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
    print(
        f"soak: {SESSIONS} sessions in {time.monotonic() - t0:.0f} s; resident memory after the first "
        f"{after_first / 1e6:.0f} MB, then " + ", ".join(f"{r / 1e6:.0f}" for r in rss) + " MB"
    )
    assert growth < GROWTH_BOUND, f"the server grew by {growth / 1e6:.0f} MB over {SESSIONS - 1} sessions"
