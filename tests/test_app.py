"""app.py's functions, called directly (no server), and the Space configuration."""

import functools
import importlib.util
import json
import os
import subprocess
import sys
import types
import warnings
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

import app
from specdemo import SpecdemoError, Topology
from specdemo import compare as C
from specdemo import figures as F
from specdemo.figures.compare import short_label
from .helpers import tiny_pipeline_folder

ROOT = Path(__file__).resolve().parents[1]
FOUR = {"accepted", "rejected", "corrected", "unvisited"}


def no_progress(*args, **kwargs):
    pass


def controls(**change):
    d = dict(model="gm2d", custom_model="", draft="frozen", freeze="out", draft_bias=0, tree="2,1", budget=16,
             verifier="dgrs", kernel="default", steps=12, eta=1, churn=0.06, num_samples=6, class_label=0, seed=0,
             device="auto", objective="time")
    d.update(change)
    return list(d.values())


def page_defaults(model=app.DEFAULT_MODEL):
    """The Run button's inputs as the page sets them for `model`."""
    d = app.UI_DEFAULTS[model]
    return dict(model=model, tree=d["tree"], budget=d["budget"], freeze=d["freeze"], steps=d["steps"],
                num_samples=d["samples"], class_label=app.DEFAULT_CLASS, verifier="default")


def spec(plot_data) -> dict:
    assert plot_data.type == "plotly"
    return json.loads(plot_data.plot)


def tree_statuses(plot_data) -> set[str]:
    return {tr["legendgroup"] for tr in spec(plot_data)["data"]
            if tr.get("mode") == "markers" and tr.get("legendgroup") in FOUR and any(v is not None for v in tr["x"])}


@pytest.fixture(scope="module")
def default_run():
    return app.run(*controls(**page_defaults()), progress=no_progress)


def test_the_page_is_wired_with_api_names_and_a_queue():
    assert isinstance(app.demo, gr.Blocks)
    names = {fn.api_name for fn in app.demo.fns.values()}
    assert {"run", "tree_view", "trajectory_view", "exactness", "export", "model_defaults", "kernel_options",
            "kernel_freeze", "topology_options", "draft_options"} <= names
    assert all(fn.api_name for fn in app.demo.fns.values())
    assert app.demo._queue.default_concurrency_limit == app.CONCURRENCY_LIMIT
    assert app.demo._queue.max_size >= 8


def component(elem_id: str):
    """The page's component with this elem_id (the page is built in app.build_demo)."""
    return next(b for b in app.demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def test_the_page_opens_on_the_embedded_digits_model():
    assert C.embedded_available("digits") and app.DEFAULT_MODEL == "digits"
    d = app.UI_DEFAULTS["digits"]
    assert d["tree"] == "auto" and d["freeze"] == "auto" and d["draft"] == "frozen"
    assert component("model").value == "digits" and component("topology").value == "auto"
    assert component("budget").visible and component("objective").visible
    assert component("class-label").visible and component("class-label").value == app.DEFAULT_CLASS
    assert component("freeze").value == "auto" and component("num-samples").maximum == app.MAX_SAMPLES["image"]
    assert component("verifier").value == "default" and component("objective").value == "time"


def test_the_topology_is_typed_and_presets_fill_it():
    """What is typed is what runs: a textbox (a dropdown with custom values ran its highlighted preset
    on Enter), with presets that fill it, each a topology the app accepts."""
    box = component("topology")
    assert isinstance(box, gr.Textbox) and box.max_lines == 1
    presets = next(b for b in app.demo.blocks.values() if isinstance(b, gr.Dataset))
    assert [row[0] for row in presets.raw_samples] == [value for value, _ in app.TREE_PRESETS]
    for value, _ in app.TREE_PRESETS:
        assert value == "auto" or Topology.parse(value).widths
    assert "Topology** `2,1` at every step" in app.run(*controls(tree="2,1"), progress=no_progress)[1]
    with pytest.raises(gr.Error, match=r"positive integers, got \[0\]; accepted: .*3,2,1"):
        app.run(*controls(tree="0"), progress=no_progress)


def test_importing_the_app_runs_no_sampling_and_sets_no_threads():
    """Sampling, the thread setting and the warm-up happen when the server starts (app.launch)."""
    code = ("import torch, specdemo.pipeline as P\n"
            "def refuse(*a, **k): raise SystemExit('sampled at import')\n"
            "P.Problem.run = refuse; P.build = refuse\n"
            "threads = torch.get_num_threads(); torch.set_num_threads = lambda n: refuse()\n"
            "import app\n"
            "assert torch.get_num_threads() == threads and callable(app.launch) and app.demo is not None\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_default_click(default_run):
    summary, plan, tree, data, rounds, cost, accept, table, samples, comp, trajectory, round_k = default_run
    # time first where time was saved, else calls (which the headline tests below check either way)
    assert ("faster** than plain sampling" in summary or "fewer target calls than plain sampling" in summary)
    assert "fewer target calls" in summary and "exact" in summary
    assert "pilot" in summary  # the calibration run is reported, not hidden
    assert "The plan expected" in summary and "measured" in summary
    assert tree_statuses(tree) == FOUR  # the page opens on a round that shows every status
    assert isinstance(comp, C.Comparison) and [r.key for r in comp.runs] == ["target", "chain", "tree"]
    assert comp.kind == "image" and comp.config.class_label == app.DEFAULT_CLASS and comp.config.freeze == "auto"
    assert comp.config.objective == "time" and comp.config.verifier == "block" and comp.plan.objective == "time"
    # the planned topology: the matched chain has the plan's mean rows per round, rounded
    assert comp.plan is not None and comp.config.pilot_samples == app.PILOT_SAMPLES
    assert comp.runs[1].tree == f"1x{round(comp.plan.rows_per_round())}"
    assert plan.startswith("**Planned trees**") and "`1x" in plan
    assert len(table) == 3 and table[0][0] == "plain target" and table[2][0].startswith("tree auto(16 rows)")
    assert spec(tree)["config"]["toImageButtonOptions"]["filename"] == "specdemo-tree"
    assert any(tr["type"] == "image" for tr in spec(data)["data"])  # the committed path's images
    assert sum(tr["type"] == "image" for tr in spec(samples)["data"]) == 3  # a grid of the digit per sampler
    for fig in (data, rounds, cost, accept, samples):
        assert spec(fig)["data"]
    t, k = trajectory.value, round_k.value
    assert (t, k) == F.pick_round(comp.trace)
    assert round_k.maximum == len(F.trajectory_rounds(comp.trace, t))


def test_headline_says_which_of_tree_and_chain_won(default_run):
    """Time first where the chosen run saved time, calls otherwise; the chain compared in the same
    unit, whichever won."""
    comp = default_run[9]
    h = comp.headline()

    def said(**change):
        fake = types.SimpleNamespace(**{**vars(comp), "headline": lambda: {**h, **change}})
        fake.chosen = comp.chosen
        return app.headline(fake)

    for chain, chosen, words in ((5.0, 3.0, "does better"), (3.0, 5.0, "does less well"), (4.0, 4.05, "does about the same")):
        by_time = said(speedup_time=chosen, speedup_time_chain=chain, speedup=1.0, speedup_chain=9.0)
        assert words in by_time and f"**{chosen:.2f}× faster** than plain sampling" in by_time
        by_calls = said(speedup_time=0.5, time_chosen=2.0, time_plain=1.0, speedup=chosen, speedup_chain=chain)
        assert words in by_calls and f"**{chosen:.2f}×** fewer target calls than plain sampling" in by_calls
        assert "Wall-clock 2.00 s against 1.00 s plain" in by_calls
    fixed = types.SimpleNamespace(**{**vars(comp), "plan": None, "config": replace(comp.config, verifier="dgrs"),
                                     "headline": lambda: {**h, "speedup": 2.0, "speedup_chain": 4.0, "speedup_time": 1.0,
                                                          "planned_s": None}})
    fixed.chosen = comp.chosen
    assert "draft bias of 2 or more" in app.headline(fixed)


def test_round_and_trajectory_views(default_run):
    comp = default_run[9]
    tree, data, rounds = app.show_round(comp, 0, 2)
    assert "Round 2 of" in spec(tree)["layout"]["title"]["text"]
    last = comp.config.num_samples - 1
    tree, data, rounds, slider = app.show_trajectory(comp, last)
    assert f"trajectory {last}" in spec(tree)["layout"]["title"]["text"] and slider.value == 1
    assert ": tree " in spec(tree)["layout"]["title"]["text"]  # the round's own tree, from the plan
    tree, *_ = app.show_round(comp, 10**6, 10**6)  # clamped, not an error
    assert spec(tree)["data"]
    with pytest.raises(gr.Error, match="run the sampler first"):
        app.show_round(None, 0, 1)


@pytest.mark.parametrize("change, message", [
    ({"tree": "3,,x"}, "cannot read tree"),
    ({"tree": ""}, "no topology given"),
    ({"tree": "10x4"}, "over the limit of 4096"),
    ({"tree": "4x5", "num_samples": 4096}, "more than this app runs at once"),
    ({"num_samples": 10**6}, "number of samples must be in 1..4096"),
    ({"model": "custom", "custom_model": ""}, "type a Hub id"),
    ({"model": "custom", "custom_model": "nobody-here/no-such-model"}, "not on this Space's list"),
    ({"model": "custom", "custom_model": "/no/such/folder"}, "local models are off on this Space"),
    ({"model": "custom", "custom_model": "x" * 10_000}, "local models are off on this Space"),
    ({"draft": "/etc"}, "local drafts are off on this Space"),
    ({"steps": 5000}, "--steps 5000 is over the limit of 1000 steps here"),
    ({"steps": 0}, "--steps 0 is out of range"),
    ({"model": "digits", "tree": "1x5", "steps": 1000, "num_samples": 64}, "over the limit of 250,000"),
    ({"seed": -1}, "seed must be in 0..2**63 - 1"),
    ({"tree": "1x3000000000"}, "tree depth 3000000000 is over the limit of 128"),
    ({"steps": 2.5}, "whole number"),
    ({"eta": float("nan"), "kernel": "ddim"}, "finite"),
    ({"verifier": "rmc", "tree": "3,2,1"}, "one child per node"),
    ({"kernel": "flow-churn", "model": "banana"}, "langevin"),
    ({"device": "tpu"}, "unknown device"),
    ({"draft": "digits-draft"}, "only the frozen draft"),
    ({"tree": "auto", "budget": 0}, "rows per round of an auto topology must be in 1..64"),
    ({"model": "digits", "tree": "auto", "budget": 64, "num_samples": 64}, "auto topology of 64 rows"),
    ({"freeze": "sideways"}, "unknown freeze"),
    ({"model": "banana", "freeze": "x0"}, "set freeze to the network output"),
])
def test_bad_inputs_are_readable_errors(change, message):
    with pytest.raises(gr.Error) as err:
        app.run(*controls(**change), progress=no_progress)
    assert message in err.value.message


def test_the_settings_check_includes_the_librarys_limits():
    """The page's check (an event with no outputs, so a refusal leaves the results on screen) refuses
    what the run would: the rows bound, a negative seed."""
    with pytest.raises(gr.Error, match="over the limit of 250,000"):
        app.check_inputs(*controls(model="digits", tree="1x5", steps=1000, num_samples=64))
    with pytest.raises(gr.Error, match="seed must be in"):
        app.check_inputs(*controls(seed=-1))
    assert app.check_inputs(*controls()) is None


def test_a_click_is_bounded_as_a_whole(monkeypatch):
    """A click runs the tree, the chain at its rows and plain sampling: each fits the 250,000-row limit
    alone (40 x 1,000 x 6 = 240,000 rows for the tree 2,1: 5 nodes and the warm-up's root row), the
    three together (480,000) do not; refused by the page's check and by the run, before any work."""
    monkeypatch.setattr(C, "build", lambda *a, **k: pytest.fail("work started before the refusal"))
    click = controls(model="digits", tree="2,1", steps=1000, num_samples=40, verifier="dgrs")
    for handler in (app.check_inputs, lambda *c: app.run(*c, progress=no_progress)):
        with pytest.raises(gr.Error) as err:
            handler(*click)
        message = err.value.message
        assert "3 runs of this click could evaluate up to 480,000 target rows together" in message, message
        assert "240,000 (tree 2,1) + 200,000 (chain 1x3) + 40,000 (plain target)" in message
        assert "over the limit of 250,000 a click; use fewer samples, fewer steps" in message
    # the exactness test's two runs are bounded together too: 1,000 x 12 x 6 = 72,000 rows and 12,000 plain
    monkeypatch.setenv("SPECDEMO_APP_MAX_ROWS", "80000")
    with pytest.raises(gr.Error, match=r"2 runs of this click could evaluate up to 84,000 .*\(plain target\)"):
        app.exactness(*controls(tree="2,1", steps=12), 1000, progress=no_progress)
    monkeypatch.undo()
    assert app.check_inputs(*controls(model="digits", tree="2,1", steps=1000, num_samples=20, verifier="dgrs")) is None


def test_one_time_limit_covers_every_run_of_a_click(monkeypatch):
    """The seconds limit is the click's: its three runs and the pilot share one Cancel."""
    seen = []
    real_run = C.Problem.run

    def run(self, *args, cancel=None, **kwargs):
        seen.append(cancel)
        return real_run(self, *args, cancel=cancel, **kwargs)

    monkeypatch.setattr(C.Problem, "run", run)
    monkeypatch.setenv("SPECDEMO_APP_MAX_SECONDS", "77")
    app.run(*controls(tree="3,2,1"), progress=no_progress)
    assert len(seen) == 3 and len({id(c) for c in seen}) == 1 and seen[0].seconds == 77


def test_the_time_left_estimate():
    """The run in progress at its measured pace; the chain as many calls as the first run, plain
    sampling its own calls, both at the measured seconds per call; before a first round, the plan's
    expected seconds."""
    now = [100.0]
    clock = C.TimeLeft([None, 100], expected_s=3.0, expected_calls=30)
    real = C.time.perf_counter
    try:
        C.time.perf_counter = lambda: now[0]
        clock.next_stage()
        # before a round: the plan's 3 s, and 30 + 100 calls later at its 0.1 s a call
        assert clock.seconds(0.0, 0) == pytest.approx(3.0 + 30 * 0.1 + 100 * 0.1)
        now[0] += 2.0
        # half done in 2 s and 10 calls: 2 s more, then the chain's 20 calls and plain's 100 at 0.2 s a call
        assert clock.seconds(0.5, 10) == pytest.approx(2.0 + 20 * 0.2 + 100 * 0.2)
        clock.next_stage()
        now[0] += 1.0
        assert clock.seconds(0.25, 5) == pytest.approx(3.0 + 100 * 0.2)
        clock.next_stage()
        now[0] += 4.0
        assert clock.seconds(0.5, 50) == pytest.approx(4.0)
    finally:
        C.time.perf_counter = real
    assert C.TimeLeft([None]).seconds(0.0, 0) is None  # a fixed topology before its first round: nothing tells
    assert C.time_left_text(None) == "" and C.time_left_text(0.2) == " · about 1 s left"
    assert C.time_left_text(150) == " · about 2 min left"


def test_the_progress_bar_says_the_time_left(monkeypatch):
    # every update reaches the bar (the page gets at most ten a second, which a fast stage can fall between)
    monkeypatch.setattr(app, "watched", functools.partial(app.watched, every=0.0))
    descs = []
    app.run(*controls(tree="3,2,1", steps=30, num_samples=64), progress=lambda f, desc="": descs.append((f, desc)))
    stages = {desc.split(":")[0] for _, desc in descs if "s left" in desc}
    assert {"tree 3,2,1 · D-GRS", "chain 1x10 · RMC", "plain target"} <= stages, descs
    fractions = [f for f, _ in descs]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_round_titles_word_the_tree_as_the_plan_does(default_run):
    """One wording everywhere: "1x15, leaves evaluated" in the plan line and in the round view (which
    read "tree 1x16" for it), and a round from a known root says so (its tree is the plan's for a
    known root)."""
    comp, plan_line = default_run[9], default_run[1]
    assert "+leaves" not in plan_line and "(leaves evaluated)" not in plan_line
    assert any(comp.plan.leaves) and ", leaves evaluated`" in plan_line and "root output known" in plan_line
    words = set()
    for t in range(comp.traced_trajectories):
        for k, (r, row) in enumerate(F.trajectory_rounds(comp.trace, t), start=1):
            rt = comp.trace[r]
            leaves = bool(rt.evaluated[row, rt.node_depth == rt.node_depth.max()].all())
            expected = Topology(F.round_widths(rt)).text(leaves)
            title = spec(app.show_round(comp, t, k)[0])["layout"]["title"]["text"]
            assert title.split(": tree ")[1].split(", cut to")[0].split(", root output")[0] == expected, title
            assert ("root output known" in title) == bool(rt.root_known[row])
            words.add((leaves, bool(rt.root_known[row])))
    assert (True, False) in words or (True, True) in words  # a round with evaluated leaves was shown


def test_a_chain_the_langevin_densities_and_a_vector_target():
    out = app.run(*controls(tree="1x4", verifier="rmc", freeze="x0"), progress=no_progress)
    assert [r.key for r in out[9].runs] == ["target", "chain"] and len(out[7]) == 2
    assert "Two runs" in out[0] and out[1].startswith("**Topology** `1x4` at every step") and "x0-hat" in out[1]
    out = app.run(*controls(model="banana", steps=30, tree="2,1"), progress=no_progress)
    assert out[9].kind == "plane" and out[9].kernel_name == "langevin"
    out = app.run(*controls(model="gm16", tree="2,1"), progress=no_progress)
    assert "16 dimensions" in json.dumps(spec(out[3])["layout"]["annotations"])


def test_a_block_verified_chain_next_to_the_same_chain_under_rmc():
    out = app.run(*controls(tree="1x6", verifier="block"), progress=no_progress)
    comp = out[9]
    assert [r.key for r in comp.runs] == ["target", "chain", "chain"]
    assert [r.config.verifier for r in comp.runs[1:]] == ["rmc", "block"]
    assert comp.runs[1].tree == comp.runs[2].tree == "1x6"
    assert "verified node by node" in out[0]
    assert [short_label(r, " ") for r in comp.runs[1:]] == ["chain 1x6", "chain 1x6 block"]
    with pytest.raises(gr.Error, match="one child per node"):
        app.run(*controls(tree="3,2,1", verifier="block"), progress=no_progress)


def test_auto_topology_on_a_2d_target_with_freeze_auto():
    out = app.run(*controls(tree="auto", budget=6, freeze="auto", steps=16, num_samples=8), progress=no_progress)
    comp = out[9]
    assert comp.plan is not None and comp.config.freeze == "auto" and comp.chosen.pilot is not None
    assert comp.runs[1].tree == f"1x{round(comp.plan.rows_per_round())}"
    assert comp.chosen.rows_per_round == pytest.approx(comp.plan.rows_per_round())
    assert "the network output or x0-hat" in out[1] and "pilot" in out[0]
    assert all(t.rows_per_round() <= 6 for t in comp.plan.trees if t.widths)


def test_local_models_are_off_whatever_the_path_names(tmp_path):
    """A visitor learns nothing about the server's disk: a folder, a file, a missing path and the
    home folder get the same answer."""
    folder = tiny_pipeline_folder(tmp_path / "unet")
    (tmp_path / "mixture.json").write_text("{}")
    answers = set()
    for path in (folder, str(tmp_path / "mixture.json"), str(tmp_path / "missing"), "~", "/etc", "../.."):
        with pytest.raises(gr.Error) as err:
            app.run(*controls(model="custom", custom_model=path), progress=no_progress)
        answers.add(err.value.message)
    assert len(answers) == 1 and "local models are off" in answers.pop()


def test_a_hub_id_shaped_path_never_reads_the_disk(monkeypatch):
    """With any Hub id open ("*"), names that are also relative paths stay Hub ids: never loaded from
    the disk, and a draft that names a local folder is refused like an unlisted id."""
    monkeypatch.setenv("SPECDEMO_APP_HUB_MODELS", "*")
    monkeypatch.chdir(Path(app.__file__).parent)  # where docs/plots and specdemo/.. exist
    for path in ("specdemo/..", "tests/x.json"):
        with pytest.raises(gr.Error, match="local models are off"):
            app.run(*controls(model="custom", custom_model=path), progress=no_progress)
    with pytest.raises(gr.Error, match="cannot load model 'docs/plots'.*Hub is offline"):
        app.run(*controls(model="custom", custom_model="docs/plots"), progress=no_progress)
    with pytest.raises(gr.Error, match="the Hub draft 'docs/plots' is not on this Space's list"):
        app.run(*controls(draft="docs/plots"), progress=no_progress)


def test_the_owner_opens_hub_ids_and_local_models(monkeypatch):
    monkeypatch.setenv("SPECDEMO_APP_HUB_MODELS", "nobody-here/no-such-model, google/ddpm-cifar10-32")
    with pytest.raises(gr.Error, match="cannot load model 'nobody-here/no-such-model'"):  # listed: loading is tried
        app.run(*controls(model="custom", custom_model="nobody-here/no-such-model"), progress=no_progress)
    with pytest.raises(gr.Error, match="accepted: nobody-here/no-such-model, google/ddpm-cifar10-32"):
        app.run(*controls(model="custom", custom_model="someone/else"), progress=no_progress)
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")
    with pytest.raises(gr.Error, match="unknown model"):
        app.run(*controls(model="custom", custom_model="/no/such/folder"), progress=no_progress)


def test_image_model_from_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")  # the owner's switch; off by default
    folder = tiny_pipeline_folder(tmp_path / "unet")
    out = app.run(*controls(model="custom", custom_model=folder, steps=6, num_samples=2, class_label=7),
                  progress=no_progress)
    comp = out[9]
    assert comp.kind == "image" and comp.config.class_label == 7
    assert any(tr["type"] == "image" for tr in spec(out[3])["data"])  # the committed path's images
    with pytest.raises(gr.Error, match="out of range"):
        app.run(*controls(model="custom", custom_model=folder, steps=6, num_samples=2, class_label=12),
                progress=no_progress)
    with pytest.raises(gr.Error, match="1..64"):
        app.run(*controls(model="custom", custom_model=folder, num_samples=65), progress=no_progress)
    with pytest.raises(gr.Error, match="analytic targets"):
        app.exactness(*controls(model="custom", custom_model=folder), 100, progress=no_progress)


def test_exactness_button():
    text, fig = app.exactness(*controls(draft_bias=2.0), 200, progress=no_progress)
    assert text.startswith("### p = ") and "uniform" in text
    assert sum(tr["type"] == "histogram" for tr in spec(fig)["data"]) == 4
    with pytest.raises(gr.Error, match="20..2000"):
        app.exactness(*controls(), 5000, progress=no_progress)


def test_export_writes_the_run_as_json(default_run):
    path = app.export(default_run[9])
    data = json.loads(Path(path).read_text())
    assert Path(path).name.startswith("specdemo-run-digits-auto16-seed0")
    assert data["format"] == "specdemo-run/1" and len(data["methods"]) == 3
    assert data["config"]["tree"] == "auto" and data["config"]["budget"] == 16 and data["plan"]
    # the app's default setting ships its plan: no pilot is paid, and the export says where the plan came from
    tree_run = data["methods"][2]
    if default_run[9].config.device == "cpu":  # the shipped plans are the CPU's
        assert tree_run["plan_source"] == "shipped" and tree_run["pilot_target_calls"] is None
    assert data["trace"] and max(max(rt["trajectories"]) for rt in data["trace"]) < 64
    with pytest.raises(gr.Error, match="run the sampler first"):
        app.export(None)


def test_a_session_keeps_a_bounded_result():
    """What gradio keeps per session is the comparison: its trace and paths cover the first 64
    trajectories whatever the number of samples (a 2,000-sample run of 2-D paths kept whole held
    0.3 GB a session)."""
    out = app.run(*controls(num_samples=2000, steps=60, tree="1x3", verifier="rmc"), progress=no_progress)
    comp, trajectory_slider = out[9], out[10]
    assert comp.traced_trajectories == 64 and comp.paths.shape[0] == 64 and comp.chosen.samples.shape[0] == 2000
    kept = sum(v.nbytes for rt in comp.trace for v in vars(rt).values() if isinstance(v, np.ndarray))
    assert kept + comp.paths.nbytes < 2_000_000, kept  # bytes
    assert trajectory_slider.maximum == 63
    assert app.show_trajectory(comp, 500)[3].maximum >= 1  # a trajectory past the kept ones shows the last kept


def test_a_session_keeps_what_fits_its_byte_budget(monkeypatch):
    """An image model's node states are large: a session keeps as many trajectories as fit."""
    monkeypatch.setattr(app, "SESSION_BYTES", 400_000)
    out = app.run(*controls(model="digits", tree="1x4", verifier="rmc", freeze="x0", steps=30, num_samples=12,
                            class_label=3), progress=no_progress)
    comp, trajectory_slider = out[9], out[10]
    assert 1 <= comp.traced_trajectories < 12 and comp.trace_bytes() <= 400_000
    assert trajectory_slider.maximum == max(comp.traced_trajectories - 1, 1)


def test_old_exports_are_removed(default_run, monkeypatch):
    first = Path(app.export(default_run[9]))
    os.utime(first, (0, 0))
    os.utime(first.parent, (0, 0))  # as if written long ago
    second = Path(app.export(default_run[9]))
    assert second.exists() and not first.exists() and first.parent.parent == second.parent.parent


def test_controls_follow_the_model():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "value not in the list of choices" from a fresh gr.Dropdown
        kernel, custom, steps, samples, tree, budget, label, draft, freeze, eta, churn = app.model_changed("gm512", "default")
        assert [v for _, v in kernel["choices"]] == ["default", "ddpm", "ddim", "flow-churn", "langevin"]
        assert steps["value"] == 30 and tree["value"] == "auto" and budget["visible"] and freeze["value"] == "x0"
        assert churn["visible"] and not eta["visible"] and not custom["visible"] and not label["visible"]
        kernel, custom, steps, samples, tree, budget, label, draft, freeze, eta, churn = app.model_changed("custom", "ddim")
        assert custom["visible"] and label["visible"] and eta["visible"] and kernel["value"] == "ddim"
        # the digits UNet offers only its own kernels; a kernel it lacks falls back to its default
        kernel, *_, freeze, eta, churn = app.model_changed("digits", "langevin")
        assert [v for _, v in kernel["choices"]] == ["default", "ddpm", "ddim"] and kernel["value"] == "default"
        assert freeze["value"] == "auto" and not churn["visible"]
        assert samples["maximum"] == app.MAX_SAMPLES["image"]
        *_, freeze, eta, churn = app.model_changed("banana", "default")  # Langevin: no x0-hat to freeze
        assert freeze["value"] == "out"
        assert app.freeze_follows_kernel("gm2d", "langevin", "x0")["value"] == "out"
        assert app.freeze_follows_kernel("gm2d", "ddim", "x0")["value"] == "x0"
        # back from Langevin, where it had to be the output, freeze returns to the model's default
        assert app.freeze_follows_kernel("digits", "default", "out")["value"] == app.UI_DEFAULTS["digits"]["freeze"]
        assert all(u["visible"] for u in app.tree_changed("auto"))
        # the two-sample test is offered where it can run, and says where in place elsewhere
        assert app.exactness_offered("gm2d")["interactive"]
        offered = app.exactness_offered("digits")
        assert not offered["interactive"] and "analytic targets only" in offered["value"]
        assert not any(u["visible"] for u in app.tree_changed("3,2,1"))
        assert app.draft_changed("frozen")["visible"] and not app.draft_changed("digits-draft")["visible"]


def test_zerogpu_decorator_is_used_when_spaces_is_present(monkeypatch):
    if importlib.util.find_spec("spaces") is None:  # absent here: the decorator is skipped
        assert app.gpu(no_progress) is no_progress
    decorated = []

    def GPU(*args, **kwargs):
        def deco(fn):
            decorated.append(fn.__name__)
            return fn
        return deco

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    spec_ = importlib.util.spec_from_file_location("app_on_zerogpu", ROOT / "app.py")
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    assert decorated == ["_compute", "_exactness"]
    assert module.run(*controls(), progress=no_progress)[0]


def test_app_uses_the_public_api_only():
    src = (ROOT / "app.py").read_text()
    imports = [line.strip() for line in src.splitlines() if line.strip().startswith(("import ", "from "))]
    specdemo_imports = [line for line in imports if "specdemo" in line]
    assert specdemo_imports == ["from specdemo import (KERNEL_NAMES, PRESETS, Cancel, Cancelled, Limits, SamplerConfig, SpecdemoError, Topology,",
                                "from specdemo import compare as C", "from specdemo import figures as F"]


def test_space_config_front_matter_and_dry_run(tmp_path):
    sys.path.insert(0, str(ROOT / "space_config"))
    try:
        import deploy
    finally:
        sys.path.pop(0)
    meta = deploy.front_matter()
    for key in ("title", "sdk", "sdk_version", "app_file", "python_version", "suggested_hardware"):
        assert meta[key]
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gr.__version__ and meta["app_file"] == "app.py"
    deploy.check(meta)
    reqs = (ROOT / "space_config" / "requirements.txt").read_text()
    assert "torch==" in reqs and "spaces" in reqs
    out = subprocess.run([sys.executable, str(ROOT / "space_config" / "deploy.py"), "--repo-id", "someone/specdemo",
                          "--dry-run", "--out", str(tmp_path / "space")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["dry_run"] and {"app.py", "README.md", "requirements.txt", "specdemo"} <= set(plan["top_level"])
    staged = tmp_path / "space"
    assert (staged / "README.md").read_text().startswith("---\ntitle:")
    assert (staged / "specdemo" / "figures" / "tree.py").is_file()
    assert not list(staged.rglob("__pycache__"))
    bad = subprocess.run([sys.executable, str(ROOT / "space_config" / "deploy.py"), "--repo-id", "not a repo",
                          "--dry-run"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "USER/NAME" in bad.stderr


def test_a_draft_network_loads_under_the_spaces_policy(monkeypatch):
    """The draft model a visitor names is loaded as the target is: from the Hub only (or embedded),
    under the download cap, and once (cached); the runs of the click use that load."""
    calls, real = [], app.C.cached_target
    monkeypatch.setattr(app.C, "cached_target", lambda spec, **kw: calls.append((spec, kw)) or real(spec, **kw))
    config, target, draft_target, _ = app.make_config(*controls(model="digits", draft="digits-draft", tree="1x3"))
    policy = {"hub_only": True, "max_download_bytes": app.max_download_bytes()}
    assert ("digits", policy) in calls and ("digits-draft", policy) in calls
    assert draft_target is real("digits-draft", **policy)
    monkeypatch.setenv("SPECDEMO_APP_MAX_DOWNLOAD_GB", "0.5")
    assert app.max_download_bytes() == 500_000_000
    monkeypatch.setenv("SPECDEMO_APP_MAX_DOWNLOAD_GB", "lots")
    with pytest.raises(SpecdemoError, match="SPECDEMO_APP_MAX_DOWNLOAD_GB must be a number"):
        app.max_download_bytes()
