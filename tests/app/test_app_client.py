"""The launched app through gradio_client: the main endpoint, bad inputs, and eight clients at once."""

import json
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

import app  # noqa: E402
from specdemo_app import cancelling, controls, curated, settings  # noqa: E402
from specdemo_app.work import MAX_SAMPLES  # noqa: E402

from ..helpers import free_port, tiny_sd3_folder, tiny_sd_folder  # noqa: E402

pytestmark = pytest.mark.app

FOUR = {"accepted", "rejected", "corrected", "unvisited"}
# the Run button's settings, by name (the endpoint's parameters), at the page's defaults
RUN_SETTINGS = next(fn for fn in app.demo.fns.values() if fn.api_name == "run").input_keyword_names
DEFAULTS = {name: settings.page_values()[name] for name in RUN_SETTINGS}
SMALL = {
    **DEFAULTS,
    "model": "gm2d",
    "freeze": "out",
    "tree": "2,1",
    "verifier": "dgrs",
    "steps": 12,
    "num_samples": 8,
    "class_label": 0,
}


@pytest.fixture(scope="module")
def url():
    port = free_port()
    app.demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.demo.close()


@pytest.fixture(scope="module")
def client(url):
    return Client(url, verbose=False)


def plot_spec(value) -> dict:
    """A gr.Plot output as the client receives it: the plotly JSON (data, layout, config)."""
    assert value["type"] == "plotly"
    return json.loads(value["plot"])


def statuses(spec: dict) -> set[str]:
    """Node statuses that have at least one marker in a tree figure."""
    out = set()
    for tr in spec["data"]:
        if (
            tr.get("mode") == "markers"
            and tr.get("legendgroup") in FOUR
            and any(v is not None for v in tr.get("x") or [])
        ):
            out.add(tr["legendgroup"])
    return out


@pytest.mark.slow
def test_main_endpoint_with_default_inputs(client):
    out = client.predict(**DEFAULTS, api_name="/run")
    summary, plan, tree, data, rounds, cost, accept, table, samples, trajectory, round_k = out
    assert "fewer target calls" in summary and (
        "faster** than plain sampling" in summary or "fewer target calls than plain sampling" in summary
    )
    assert plan.startswith("**Planned trees**")
    # the tree figure: the page opens on a round with all four statuses, else the run shows them elsewhere
    spec = plot_spec(tree)
    assert spec["config"]["toImageButtonOptions"]["format"] == "png"
    seen = statuses(spec)
    for t in range(DEFAULTS["num_samples"]):
        for k in range(1, 60):
            if seen == FOUR:
                break
            walked = plot_spec(client.predict(t, k, api_name="/tree_view")[0])
            if f"Round {k} of" not in walked["layout"]["title"]["text"]:
                break  # past the trajectory's last round
            seen |= statuses(walked)
    assert seen == FOUR
    # the comparison: figures and a table of the three samplers, the chain at the plan's mean rows per round
    labels = [r[0] for r in table["data"]]
    assert labels[0] == "plain target" and labels[1].startswith("chain 1x") and labels[1].endswith("· RMC")
    assert labels[2] == "tree auto(16 rows) · block"
    assert len(plot_spec(cost)["data"]) == 5 and plot_spec(accept)["data"]
    # the samples, side by side: a grid of the requested digit per sampler
    images = [tr for tr in plot_spec(samples)["data"] if tr["type"] == "image"]
    assert len(images) == 3
    assert any(tr["type"] == "image" for tr in plot_spec(data)["data"]) and plot_spec(rounds)["data"]
    # each round's title words its tree as the plan line does: "1x15, leaves evaluated" (it read
    # "tree 1x16" for that), and says when its root's output was known (a plan's tree for a known root)
    # (whether the plan evaluates leaves is this machine's pricing: the plan is made here from shipped statistics)
    assert "root output known" in plan
    rounds_json = json.loads(open(client.predict(api_name="/export")).read())["trace"]
    expected = []
    for rt in rounds_json:
        if 0 in rt["trajectories"]:
            row, depth = rt["trajectories"].index(0), rt["node_depth"]
            leaves = [i for i, d in enumerate(depth) if d == max(depth)]
            widths = [depth.count(d) // max(depth.count(d - 1), 1) for d in range(1, max(depth) + 1)]
            text = f"{widths[0]}x{len(widths)}" if len(set(widths)) == 1 else ",".join(map(str, widths))
            expected.append(
                (
                    text + (", leaves evaluated" if all(rt["evaluated"][row][i] for i in leaves) else ""),
                    rt["root_known"][row],
                )
            )
    assert expected
    for k, (text, known) in enumerate(expected, start=1):
        title = plot_spec(client.predict(0, k, api_name="/tree_view")[0])["layout"]["title"]["text"]
        assert f": tree {text}" in title and ("root output known" in title) == known, (title, text, known)
    # the sliders move to the round shown, within the run's range
    assert 0 <= trajectory["value"] <= DEFAULTS["num_samples"] - 1
    assert trajectory["maximum"] == max(DEFAULTS["num_samples"] - 1, 1)  # a slider needs a range
    assert 1 <= round_k["value"] <= round_k["maximum"]


@pytest.mark.slow
def test_tree_view_walks_the_rounds_of_the_run(client):
    client.predict(**SMALL, api_name="/run")
    seen = set()
    for k in range(1, 6):
        tree, data, rounds = client.predict(0, k, api_name="/tree_view")
        seen |= statuses(plot_spec(tree))
        assert f"Round {k} of" in plot_spec(tree)["layout"]["title"]["text"]
    assert {"accepted", "unvisited"} <= seen
    tree, data, rounds, round_k = client.predict(3, api_name="/trajectory_view")
    assert "trajectory 3" in plot_spec(tree)["layout"]["title"]["text"]


def test_export_and_exactness_endpoints(client):
    client.predict(**SMALL, api_name="/run")
    path = client.predict(api_name="/export")
    data = json.loads(open(path).read())
    assert data["config"]["tree"] == "2,1" and len(data["samples"]) == 8 and data["trace"]
    text, fig = client.predict(test_samples=200, **SMALL, api_name="/exactness")
    assert "p = " in text and plot_spec(fig)["data"]


BAD = [
    ({"tree": "3,,x"}, "cannot read tree"),
    ({"tree": "0"}, "positive integers, got [0]; accepted"),  # typed, not swapped for a preset
    # each run fits 250,000 rows alone, the click's three runs together do not
    (
        {"model": "digits", "tree": "2,1", "steps": 1000, "num_samples": 40},
        "3 runs of this click could evaluate up to 480,000 target rows together",
    ),
    ({"tree": "10x4"}, "over the limit"),
    ({"tree": "4x5", "num_samples": 4096, "steps": 2}, "fewer samples or a smaller tree"),
    ({"model": "custom", "custom_model": "nobody-here/no-such-model"}, "not on this Space's list"),
    ({"steps": 5000}, "steps: 5000 is not accepted here; accepted: at most 1000"),
    ({"steps": 0}, "steps: 0 is not accepted here"),
    ({"verifier": "rmc", "tree": "3,2,1"}, "one child per node"),
    ({"model": "no-such-choice"}, "not in the list of choices"),  # gradio refuses it before the app
]


@pytest.mark.slow
def test_bad_inputs_give_readable_errors_and_the_server_keeps_serving(client):
    # picking gm2d raises the samples slider's maximum for this session, as it does in the page
    assert client.predict("gm2d", "default", api_name="/model_defaults")[3]["maximum"] == MAX_SAMPLES["other"]
    for change, message in BAD:
        with pytest.raises(AppError) as err:
            client.predict(**{**SMALL, **change}, api_name="/run")
        assert message in str(err.value), (change, str(err.value))
    out = client.predict(**SMALL, api_name="/run")
    assert "fewer target calls" in out[0]


@pytest.mark.slow
def test_eight_clients_at_once(url):
    def one(seed):
        c = Client(url, verbose=False)
        out = c.predict(**{**SMALL, "seed": seed}, api_name="/run")
        return seed, out[0], out[7]["data"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert sorted(seed for seed, _, _ in results) == list(range(8))
    for seed, summary, table in results:
        assert f"seed {seed}" in summary and len(table) == 3


LONG = {
    **SMALL,
    "model": "gm512",
    "freeze": "out",
    "tree": "1x5",
    "verifier": "rmc",
    "steps": 1000,
    "num_samples": 4096,
}


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_cancelled_job_stops_its_work(client):
    # about a minute of work uncancelled (gm512, 1,000 steps, 4,096 samples); gradio_client's cancel
    # must stop the worker between rounds, not only free the queue's slot
    client.predict("gm512", "default", api_name="/model_defaults")  # the samples slider's range, as in the page
    job = client.submit(**LONG, api_name="/run")
    assert _wait(lambda: any(cancelling.RUNNING.values()), 30), "the run never started"
    job.cancel()
    assert _wait(lambda: not any(cancelling.RUNNING.values()), 2), "the run kept working after its job was cancelled"
    out = client.predict(**SMALL, api_name="/run")  # the server serves the next run
    assert "fewer target calls" in out[0]


def test_the_stop_endpoint_stops_the_sessions_run(url):
    c = Client(url, verbose=False)
    c.predict("gm512", "default", api_name="/model_defaults")
    job = c.submit(**LONG, api_name="/run")
    assert _wait(lambda: any(cancelling.RUNNING.values()), 30), "the run never started"
    c.predict(api_name="/stop")
    assert _wait(lambda: not any(cancelling.RUNNING.values()), 2), "the run kept working after Stop"
    with pytest.raises((CancelledError, AppError)):
        job.result(timeout=10)


@pytest.mark.slow
def test_endpoints_need_only_their_own_arguments(client):
    """/run with no arguments runs the page's defaults; the other endpoints take what they name."""
    out = client.predict(api_name="/run")
    assert "fewer target calls" in out[0] and "tree auto(16 rows)" in out[0]
    assert client.predict(api_name="/check") == ()  # no outputs: the settings passed
    assert client.predict(api_name="/stop") == ()
    assert len(client.predict(api_name="/topology_options")) == 2
    assert client.predict("3,2,1", api_name="/topology_options")[0]["visible"] is False


def test_the_topology_is_a_textbox_with_presets(client):
    """What is typed runs: the topology box is a textbox (a dropdown with custom values ran its
    highlighted preset on Enter), and the presets fill it."""
    components = {c.get("props", {}).get("elem_id"): c for c in client.config["components"]}
    assert components["topology"]["type"] == "textbox"
    presets = [c for c in client.config["components"] if c["type"] == "dataset"]
    assert [row[0] for row in presets[0]["props"]["samples"]] == [v for v, _ in settings.TREE_PRESETS]
    out = client.predict(**{**SMALL, "tree": "2,1"}, api_name="/run")
    assert "Topology** `2,1` at every step" in out[1]


@pytest.mark.slow
def test_the_progress_bar_says_the_time_left(client):
    job = client.submit(**{**SMALL, "tree": "3,2,1", "steps": 60, "num_samples": 2000}, api_name="/run")
    said = set()
    while not job.done():
        for unit in job.status().progress_data or []:
            if unit.desc and "s left" in unit.desc:
                said.add(unit.desc.split(":")[0])
        time.sleep(0.05)
    job.result()
    assert {"tree 3,2,1 · D-GRS", "plain target"} & said, said


def test_a_refusal_is_one_log_line_without_a_traceback(client, capfd, caplog):
    caplog.set_level("INFO", logger="specdemo.app")
    with pytest.raises(AppError, match="characters long"):
        client.predict(**{**SMALL, "tree": "3,,x" + "9" * 5000}, api_name="/run")
    err = capfd.readouterr().err
    assert "Traceback" not in err
    refusals = [r.getMessage() for r in caplog.records if "characters long" in r.getMessage()]
    assert len(refusals) == 1 and len(refusals[0]) < 700  # the 5,000-character input is not echoed whole


@pytest.fixture(scope="module")
def text_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-text-to-image")
    return {"sd": tiny_sd_folder(root / "sd"), "sd3": tiny_sd3_folder(root / "sd3")}


def image_channels(value) -> list[int]:
    """The channels of every image of a figure as the client receives it."""
    return [
        int(str(tr["z"]["shape"]).split(",")[-1]) if isinstance(tr["z"], dict) else len(tr["z"][0][0])
        for tr in plot_spec(value)["data"]
        if tr["type"] == "image"
    ]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", ["sd", "sd3"])
def test_run_endpoint_with_a_prompt_on_a_text_to_image_model(client, text_folders, family, monkeypatch):
    """The owner's switch opens local folders; /run takes the prompt, negative prompt and guidance scale
    by name and answers with the usual table and decoded RGB images."""
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")
    out = client.predict(
        **{
            **SMALL,
            "model": "custom",
            "custom_model": text_folders[family],
            "prompt": "a red circle",
            "negative_prompt": "blue",
            "guidance_scale": "3",
            "tree": "2,1",
            "steps": 8,
            "num_samples": 3,
        },
        api_name="/run",
    )
    summary, plan, tree, data, rounds, cost, accept, table, samples, trajectory, round_k = out
    assert "fewer target calls" in summary and plan.startswith("**Topology** `2,1`")
    labels = [r[0] for r in table["data"]]
    assert labels[0] == "plain target" and labels[1].startswith("chain 1x") and labels[2].startswith("tree 2,1")
    assert image_channels(samples) == [3, 3, 3]  # a grid of decoded images per sampler
    path = image_channels(data)
    assert path and set(path) == {3}  # the committed path, decoded
    exported = json.loads(open(client.predict(api_name="/export")).read())
    assert exported["config"]["prompt"] == "a red circle" and exported["config"]["guidance_scale"] == 3.0


def test_the_prompt_controls_follow_the_model(client):
    names = controls.PROMPT_FIELDS
    sd = client.predict("stable-diffusion-v1-5/stable-diffusion-v1-5", "default", api_name="/model_defaults")
    assert [u["visible"] for u in sd[-len(names) :]] == [True] * len(names)
    assert sd[7]["value"] == "nota-ai/bk-sdm-tiny"  # the draft network it pairs with
    digits = client.predict("digits", "default", api_name="/model_defaults")
    assert [u["visible"] for u in digits[-len(names) :]] == [False] * len(names)
    components = {c.get("props", {}).get("elem_id"): c for c in client.config["components"]}
    assert components["prompt"]["props"]["visible"] is False  # the page opens on digits
    choices = [v for _, v in components["model"]["props"]["choices"]]
    assert all(c.repo in choices for c in curated.CURATED)


@pytest.mark.parametrize("entry", curated.CURATED, ids=lambda c: c.name)
def test_a_listed_model_not_here_is_answered_at_once(client, entry):
    """HF_HUB_OFFLINE=1 here and no model in the cache: picking one answers in one line naming it and how
    to fetch it, and Run refuses with the same line, each in well under the 50 s of the downloads' retries."""
    t0 = time.perf_counter()
    status = client.predict(entry.repo, api_name="/model_status")
    seconds = time.perf_counter() - t0
    line = status if isinstance(status, str) else status.get("value", "")
    assert entry.repo in line and f"hf download {entry.repo}" in line and "offline" in line
    t0 = time.perf_counter()
    with pytest.raises(AppError) as err:
        client.predict(
            **{**SMALL, "model": entry.repo, "tree": "1x3", "verifier": "rmc", "num_samples": 1}, api_name="/run"
        )
    seconds = max(seconds, time.perf_counter() - t0)
    assert entry.repo in str(err.value) and f"hf download {entry.repo}" in str(err.value)
    assert seconds < 5, seconds
    print(f"{entry.repo}: answered through gradio_client in {seconds * 1000:.0f} ms")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"steps": 2.5}, "steps must be a whole number, got 2.5"),  # refused, not rounded by the control
        ({"seed": 1.5}, "seed must be a whole number, got 1.5"),
        # text in a number field reaches the app as sent (controls.RawNumber, RawSlider), which names the control
        ({"steps": "abc"}, "steps must be a whole number, got 'abc'"),
        ({"num_samples": "many"}, "samples must be a whole number, got 'many'"),
        ({"draft_bias": "x"}, "draft bias must be a number, got 'x'"),
        ({"eta": "nan"}, "eta (DDIM) must be a finite number, got 'nan'"),
        ({"tree": "<b>bold</b>"}, "&lt;b>bold&lt;/b>"),  # the pop-up renders HTML: a typed tag is shown as text
    ],
)
def test_numbers_pass_as_sent_and_html_is_shown_as_text(client, change, message):
    with pytest.raises(AppError) as err:
        client.predict(**{**SMALL, **change}, api_name="/run")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_api_call_takes_another_models_page_defaults_without_opening_its_page(url):
    """gm2d's page default of 256 samples runs through a fresh client that never asked for /model_defaults
    (the control spans every model's range; the model's own limit is the library's check)."""
    c = Client(url, verbose=False)
    out = c.predict(**{**SMALL, "num_samples": settings.UI_DEFAULTS["gm2d"]["num_samples"]}, api_name="/run")
    assert "fewer target calls" in out[0]
    with pytest.raises(AppError, match="number of samples must be in 1..64"):  # the digits model's own limit
        c.predict(**{**DEFAULTS, "num_samples": 256}, api_name="/run")


def test_the_sample_endpoint_takes_each_models_page_defaults(client):
    """/sample: an omitted setting is the page's value for the model asked for, not the default model's."""
    gm2d = client.predict(model="gm2d", steps=12, api_name="/sample")
    assert [r["num_samples"] for r in gm2d["runs"]] == [settings.UI_DEFAULTS["gm2d"]["num_samples"]] * 3
    assert [r["label"] for r in gm2d["runs"]][0] == "plain target" and gm2d["runs"][0]["target_calls"] == 12
    assert "fewer target calls" in gm2d["headline"]
    digits = client.predict(model="digits", steps=6, tree="1x2", api_name="/sample")
    # a chain runs against plain sampling alone
    assert [r["num_samples"] for r in digits["runs"]] == [settings.UI_DEFAULTS["digits"]["num_samples"]] * 2
    assert digits["runs"][-1]["tree"] == "1x2"
    with pytest.raises(AppError, match="steps must be a whole number, got 'abc'"):
        client.predict(model="gm2d", steps="abc", api_name="/sample")
