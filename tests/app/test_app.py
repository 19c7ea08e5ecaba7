"""The app's page (app.py) and what its events call (specdemo_app/), called directly (no server), and the
Space configuration."""

import ast
import functools
import json
import os
import subprocess
import sys
import time
import types
import warnings
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

import app
from specdemo import SamplerConfig, SpecdemoError, Topology, build
from specdemo import figures as F
from specdemo.config import PLANNED_VERIFIERS
from specdemo.figures.compare import short_label
from specdemo.planning.forms import priced_count
from specdemo_app import cancelling, controls, curated, gpu, labels, loading, progress, runner, work
from specdemo_app import handlers as H
from specdemo_app import settings as S
from specdemo_app.work import MAX_SAMPLES

from ..helpers import tiny_pipeline_folder, tiny_sd3_folder, tiny_sd_folder

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[2]
FOUR = {"accepted", "rejected", "corrected", "unvisited"}


def no_progress(*args, **kwargs):
    pass


def click(**change) -> dict:
    """A small click's settings, by name, as the Run button sends them (changed by `change`)."""
    d = dict(
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
        num_samples=6,
        class_label=0,
        seed=0,
        device="auto",
        objective="time",
    )
    d.update(change)
    return d


RUN_SETTINGS = next(fn for fn in app.demo.fns.values() if fn.api_name == "run").input_keyword_names


def page_defaults(model=S.DEFAULT_MODEL) -> dict:
    """The Run button's settings as the page opens on `model`."""
    values = S.page_values(model)
    return {name: values[name] for name in RUN_SETTINGS}


def spec(plot_data) -> dict:
    assert plot_data.type == "plotly"
    return json.loads(plot_data.plot)


def tree_statuses(plot_data) -> set[str]:
    return {
        tr["legendgroup"]
        for tr in spec(plot_data)["data"]
        if tr.get("mode") == "markers" and tr.get("legendgroup") in FOUR and any(v is not None for v in tr["x"])
    }


@pytest.fixture(scope="module")
def default_run():
    return H.run(**page_defaults(), progress=no_progress)


def test_the_page_is_wired_with_api_names_and_a_queue():
    assert isinstance(app.demo, gr.Blocks)
    names = {fn.api_name for fn in app.demo.fns.values()}
    assert {
        "run",
        "tree_view",
        "trajectory_view",
        "exactness",
        "export",
        "model_defaults",
        "kernel_options",
        "kernel_freeze",
        "topology_options",
        "draft_options",
    } <= names
    assert all(fn.api_name for fn in app.demo.fns.values())
    assert app.demo._queue.default_concurrency_limit == app.CONCURRENCY_LIMIT
    assert app.demo._queue.max_size >= 8


def component(elem_id: str):
    """The page's component with this elem_id (the page is built in app.build_demo)."""
    return next(b for b in app.demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def test_the_page_opens_on_the_embedded_digits_model():
    assert S.DEFAULT_MODEL == "digits" and S.DEFAULT_MODEL in S.MODEL_VALUES
    d = S.UI_DEFAULTS["digits"]
    assert d["tree"] == "auto" and d["freeze"] == "auto" and d["draft"] == "frozen"
    assert component("model").value == "digits" and component("topology").value == "auto"
    assert component("budget").visible and component("objective").visible
    assert component("class-label").visible and component("class-label").value == S.DEFAULT_CLASS
    # the control spans every model's samples (an API call of another model's defaults); the page narrows it
    assert component("freeze").value == "auto" and component("num-samples").maximum == controls.API_MAX_SAMPLES
    assert H.samples_range("digits")["maximum"] == MAX_SAMPLES["image"]
    assert component("verifier").value == "default" and component("objective").value == "time"


def test_the_topology_is_typed_and_presets_fill_it():
    """What is typed is what runs: a textbox (a dropdown with custom values ran its highlighted preset
    on Enter), with presets that fill it, each a topology the app accepts."""
    box = component("topology")
    assert isinstance(box, gr.Textbox) and box.max_lines == 1
    presets = next(b for b in app.demo.blocks.values() if isinstance(b, gr.Dataset))
    assert [row[0] for row in presets.raw_samples] == [value for value, _ in S.TREE_PRESETS]
    for value, _ in S.TREE_PRESETS:
        assert value == "auto" or Topology.parse(value).widths
    assert "Topology** `2,1` at every step" in H.run(**click(tree="2,1"), progress=no_progress)[1]
    with pytest.raises(gr.Error, match=r"positive integers, got \[0\]; accepted: .*3,2,1"):
        H.run(**click(tree="0"), progress=no_progress)


@pytest.mark.slow
def test_importing_the_app_runs_no_sampling_and_sets_no_threads():
    """Sampling, the thread setting and the warm-up happen when the server starts (app.launch)."""
    code = (
        "import torch, specdemo.pipeline as P\n"
        "def refuse(*a, **k): raise SystemExit('sampled at import')\n"
        "P.Problem.run = refuse; P.build = refuse\n"
        "threads = torch.get_num_threads(); torch.set_num_threads = lambda n: refuse()\n"
        "import app\n"
        "assert torch.get_num_threads() == threads and callable(app.launch) and app.demo is not None\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.slow
def test_importing_the_app_leaves_the_sampling_stack_to_the_server_start():
    """Building the page needs gradio and the settings, not the sampler, the models or the figures
    of a run (diffusers' networks and schedulers, scipy): importing app.py costs little more than
    importing torch and gradio, and the warm-up at launch pays for the rest."""
    heavy = (
        "specdemo.pipeline",
        "specdemo.sampling",
        "specdemo.kernels",
        "specdemo.models",
        "specdemo_app.runner",
        "specdemo.figures.tree",
        "diffusers.models",
        "scipy.stats",
    )
    code = f"import json, sys, app; print(json.dumps(sorted(m for m in sys.modules if m.startswith({heavy!r}))))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.slow
def test_default_click(default_run):
    summary, plan, tree, data, rounds, cost, accept, table, samples, comp, trajectory, round_k, tree_button = (
        default_run
    )
    # time first where time was saved, else calls (which the headline tests below check either way)
    assert "faster** than plain sampling" in summary or "fewer target calls than plain sampling" in summary
    assert "fewer target calls" in summary and "exact" in summary
    assert "pilot" in summary  # the calibration run is reported, not hidden
    assert "The plan expected" in summary and "measured" in summary
    assert tree_statuses(tree) == FOUR  # the page opens on a round that shows every status
    assert isinstance(comp, runner.Comparison) and [r.key for r in comp.runs] == ["target", "chain", "tree"]
    assert comp.kind == "image" and comp.config.class_label == S.DEFAULT_CLASS and comp.config.freeze == "auto"
    assert comp.config.objective == "time" and comp.config.verifier == "auto" and comp.plan.objective == "time"
    assert comp.chosen.verifier in PLANNED_VERIFIERS  # the planner's choice, reported with the run
    assert short_label(comp.chosen, " ").endswith(" block") == (comp.chosen.verifier == "block")
    assert f"{labels.VERIFIER_LABELS[comp.chosen.verifier]} (chosen by the planner) verifier" in plan
    # the planned topology: the matched chain has the plan's mean rows per round, rounded
    assert comp.plan is not None and comp.config.pilot_samples == S.PILOT_SAMPLES
    assert comp.runs[1].tree == f"1x{round(comp.plan.rows_per_round())}"
    assert plan.startswith("**Planned trees**") and "`1x" in plan
    # a plan of chains says so, and names the branching preset of about its rows a round
    branches = any(t.widths and not t.is_chain for t in comp.plan.trees)
    offered = labels.tree_at_rows(comp.chosen.rows_per_round)
    assert branches or f"run `{offered}` (about the same rows a round) with the same seed" in plan
    assert tree_button["visible"] is not branches
    assert branches or tree_button["value"] == f"Run the tree {offered} with the same seed"
    if branches:
        with pytest.raises(gr.Error, match="drafted trees: it offers none"):
            H.offer_tree(comp)
    else:  # the button sets the topology box, and the Run chain runs it with the same settings
        assert H.offer_tree(comp) == offered and Topology.parse(offered).widths and not Topology.parse(offered).is_chain
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
        return labels.headline(fake)

    for chain, chosen, words in (
        (5.0, 3.0, "does better"),
        (3.0, 5.0, "does less well"),
        (4.0, 4.05, "does about the same"),
    ):
        by_time = said(speedup_time=chosen, speedup_time_chain=chain, speedup=1.0, speedup_chain=9.0)
        assert words in by_time and f"**{chosen:.2f}× faster** than plain sampling" in by_time
        by_calls = said(speedup_time=0.5, time_chosen=2.0, time_plain=1.0, speedup=chosen, speedup_chain=chain)
        assert words in by_calls and f"**{chosen:.2f}×** fewer target calls than plain sampling" in by_calls
        assert "Wall-clock 2.00 s against 1.00 s plain" in by_calls
    fixed = types.SimpleNamespace(
        **{
            **vars(comp),
            "plan": None,
            "config": replace(comp.config, verifier="dgrs"),
            "headline": lambda: {**h, "speedup": 2.0, "speedup_chain": 4.0, "speedup_time": 1.0, "planned_s": None},
        }
    )
    fixed.chosen = comp.chosen
    assert "draft bias of 2 or more" in labels.headline(fixed)


def test_round_and_trajectory_views(default_run):
    comp = default_run[9]
    tree, data, rounds = H.show_round(comp, 0, 2)
    assert "Round 2 of" in spec(tree)["layout"]["title"]["text"]
    last = comp.config.num_samples - 1
    tree, data, rounds, slider = H.show_trajectory(comp, last)
    assert f"trajectory {last}" in spec(tree)["layout"]["title"]["text"] and slider.value == 1
    assert ": tree " in spec(tree)["layout"]["title"]["text"]  # the round's own tree, from the plan
    tree, *_ = H.show_round(comp, 10**6, 10**6)  # clamped, not an error
    assert spec(tree)["data"]
    with pytest.raises(gr.Error, match="run the sampler first"):
        H.show_round(None, 0, 1)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tree": "3,,x"}, "cannot read tree"),
        ({"tree": ""}, "no topology given"),
        ({"tree": "10x4"}, "over the limit of 4096"),
        ({"tree": "4x5", "num_samples": 4096, "steps": 2}, "more than this app runs at once"),  # within the rows
        ({"num_samples": 10**6}, "number of samples must be in 1..4096"),
        ({"model": "custom", "custom_model": ""}, "type a Hub id"),
        ({"model": "custom", "custom_model": "nobody-here/no-such-model"}, "not on this Space's list"),
        ({"model": "custom", "custom_model": "/no/such/folder"}, "local models are off on this Space"),
        ({"model": "custom", "custom_model": "x" * 10_000}, "local models are off on this Space"),
        ({"draft": "/etc"}, "local drafts are off on this Space"),
        ({"steps": 5000}, "steps: 5000 is not accepted here; accepted: at most 1000"),
        ({"steps": 0}, "steps: 0 is not accepted here; accepted: 1.."),
        ({"model": "digits", "tree": "1x5", "steps": 1000, "num_samples": 64}, "over the limit of 250,000"),
        ({"seed": -1}, "seed: -1 is not accepted here; accepted: 0..2**63 - 1"),
        ({"tree": "1x3000000000"}, "tree depth 3000000000 is over the limit of 128"),
        ({"steps": 2.5}, "steps must be a whole number, got 2.5"),
        ({"eta": float("nan"), "kernel": "ddim"}, "eta (DDIM) must be a finite number, got nan"),
        ({"verifier": "rmc", "tree": "3,2,1"}, "one child per node"),
        ({"kernel": "flow-churn", "model": "banana"}, "langevin"),
        ({"device": "tpu"}, "device: 'tpu' is not accepted here; accepted: auto, cpu, cuda"),
        ({"draft": "digits-draft"}, "only the frozen draft"),
        ({"tree": "auto", "budget": 0}, "rows per round of an auto topology must be in 1..64"),
        ({"model": "digits", "tree": "auto", "budget": 64, "num_samples": 64}, "auto topology of 64 rows"),
        ({"freeze": "sideways"}, "unknown freeze"),
        ({"model": "banana", "freeze": "x0"}, "accepted: out (the langevin kernel has no x0-hat)"),
    ],
)
def test_bad_inputs_are_readable_errors(change, message):
    with pytest.raises(gr.Error) as err:
        H.run(**click(**change), progress=no_progress)
    assert message in err.value.message
    assert "--" not in err.value.message  # the page's words, not the command line's options


def test_the_settings_check_includes_the_librarys_limits():
    """The page's check (an event with no outputs, so a refusal leaves the results on screen) refuses
    what the run would: the rows bound, a negative seed."""
    with pytest.raises(gr.Error, match="over the limit of 250,000"):
        H.check_inputs(**click(model="digits", tree="1x5", steps=1000, num_samples=64))
    with pytest.raises(gr.Error, match="seed: -1 is not accepted here"):
        H.check_inputs(**click(seed=-1))
    assert H.check_inputs(**click()) is None


def test_a_click_is_bounded_as_a_whole(monkeypatch):
    """A click runs the tree, the chain at its rows and plain sampling: each fits the 250,000-row limit
    alone (40 x 1,000 x 6 = 240,000 rows for the tree 2,1: 5 nodes and the warm-up's root row), the
    three together (480,000) do not; refused by the page's check and by the run, before any work."""
    monkeypatch.setattr(runner, "build", lambda *a, **k: pytest.fail("work started before the refusal"))
    settings = click(model="digits", tree="2,1", steps=1000, num_samples=40, verifier="dgrs")
    for handler in (H.check_inputs, lambda **c: H.run(**c, progress=no_progress)):
        with pytest.raises(gr.Error) as err:
            handler(**settings)
        message = err.value.message
        assert "3 runs of this click could evaluate up to 480,000 target rows together" in message, message
        assert "240,000 (tree 2,1) + 200,000 (chain 1x3) + 40,000 (plain target)" in message
        assert "over the limit of 250,000 a click; use fewer samples, fewer steps" in message
    # the exactness test's two runs are bounded together too: 1,000 x 12 x 6 = 72,000 rows and 12,000 plain
    monkeypatch.setenv("SPECDEMO_APP_MAX_ROWS", "80000")
    with pytest.raises(gr.Error, match=r"2 runs of this click could evaluate up to 84,000 .*\(plain target\)"):
        H.exactness(1000, **click(tree="2,1", steps=12), progress=no_progress)
    monkeypatch.undo()
    assert H.check_inputs(**click(model="digits", tree="2,1", steps=1000, num_samples=20, verifier="dgrs")) is None


def test_one_time_limit_covers_every_run_of_a_click(monkeypatch):
    """The seconds limit is the click's: its three runs, their timings again and the traced run for the views
    share one Cancel."""
    seen = []
    real_run = runner.Problem.run

    def run(self, *args, cancel=None, **kwargs):
        seen.append(cancel)
        return real_run(self, *args, cancel=cancel, **kwargs)

    monkeypatch.setattr(runner.Problem, "run", run)
    monkeypatch.setenv("SPECDEMO_APP_MAX_SECONDS", "77")
    H.run(**click(tree="3,2,1"), progress=no_progress)
    assert len(seen) >= 4 and len({id(c) for c in seen}) == 1 and seen[0].seconds == 77


def test_a_network_click_records_the_views_in_its_timed_run(tmp_path, monkeypatch):
    """A network's click, all of whose trajectories the views show, runs its setting once, traced (while that
    run also prices --freeze auto's forms): the views' rounds are the timed run's, the ones a traced run of
    the same trajectories records, with the states the views ask for and no priced outputs. An analytic
    target's click, and a network's whose views show some of its trajectories, time the run untraced and run
    the shown trajectories again, traced. The progress bar gives each run an equal share."""
    runs = []
    real_run = runner.Problem.run

    def run(self, *args, **kwargs):
        result = real_run(self, *args, **kwargs)
        runs.append((self.config.method, kwargs.get("trace", False), result))
        return result

    monkeypatch.setattr(runner.Problem, "run", run)
    monkeypatch.setenv("SPECDEMO_APP_TIMING_SECONDS", "0")  # one timing a run
    folder = tiny_pipeline_folder(tmp_path / "unet")
    config = SamplerConfig(
        model=folder, tree="2,1", freeze="auto", steps=8, num_samples=3, class_label=2, seed=0, cache_dir=str(tmp_path)
    )
    shares = []
    comp = runner.run_comparison(config, progress=lambda share, text: shares.append((share, text)))
    assert [(method, traced) for method, traced, _ in runs] == [("tree", True), ("chain", False), ("target", False)]
    rounds = [share for share, text in shares if "samples done" in text]  # three runs fill the bar, a third each
    assert rounds == sorted(rounds) and {1 / 3, 2 / 3, 1.0} <= set(rounds)
    problem = build(config)
    assert problem.learning_table and priced_count(problem) == 3  # the traced run priced the forms too
    assert comp.trace is runs[0][2].trace and comp.chosen.samples.equal(runs[0][2].samples)
    again = problem.run(trace=True, learn_deltas=False)
    assert len(comp.trace) == len(again.trace) > 0
    for shown, rerun in zip(comp.trace, again.trace, strict=True):
        assert shown.outputs is None and shown.states is not None
        assert np.array_equal(shown.status, rerun.status) and np.array_equal(shown.states, rerun.states, equal_nan=True)

    again_views = [("tree", False), ("chain", False), ("target", False), ("tree", True)]
    runs.clear()  # the views show 2 of a network's 3 trajectories: they run again
    runner.run_comparison(replace(config, cache_dir="off"), traced=2)
    assert [(method, traced) for method, traced, _ in runs] == again_views and runs[-1][2].samples.shape[0] == 2
    runs.clear()
    runner.run_comparison(SamplerConfig(model="gm2d", tree="2,1", steps=8, num_samples=3, seed=0, cache_dir="off"))
    assert [(method, traced) for method, traced, _ in runs] == again_views


def test_the_time_left_estimate():
    """The run in progress at its measured pace; the chain as many calls as the first run, plain
    sampling its own calls, both at the measured seconds per call; before a first round, the plan's
    expected seconds."""
    now = [100.0]
    clock = progress.TimeLeft([None, 100], expected_s=3.0, expected_calls=30)
    real = progress.time.perf_counter
    try:
        progress.time.perf_counter = lambda: now[0]
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
        progress.time.perf_counter = real
    assert progress.TimeLeft([None]).seconds(0.0, 0) is None  # a fixed topology before its first round: nothing tells
    assert progress.time_left_text(None) == "" and progress.time_left_text(0.2) == " · about 1 s left"
    assert progress.time_left_text(150) == " · about 2 min left"


def test_the_progress_bar_says_the_time_left(monkeypatch):
    # every update reaches the board, and the watcher relays it at once (the page gets at most five a second,
    # which a fast stage can fall between)
    monkeypatch.setattr(cancelling, "watched", functools.partial(cancelling.watched, every=0.0))
    monkeypatch.setattr(cancelling, "WATCH_SECONDS", 0.005)
    descs = []
    H.run(**click(tree="3,2,1", steps=30, num_samples=64), progress=lambda f, desc="": descs.append((f, desc)))
    stages = {desc.split(":")[0] for _, desc in descs if "s left" in desc}
    assert {"tree 3,2,1 · D-GRS", "chain 1x10 · RMC", "plain target"} <= stages, descs
    fractions = [f for f, _ in descs]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


@pytest.mark.slow
def test_round_titles_word_the_tree_as_the_plan_does(default_run):
    """One wording everywhere: "1x15, leaves evaluated" in the plan line and in the round view (which
    read "tree 1x16" for it), a round from a known root says so (its tree is the plan's for a known root),
    and a round's leaves are evaluated where the plan says so."""
    comp, plan_line = default_run[9], default_run[1]
    assert "+leaves" not in plan_line and "(leaves evaluated)" not in plan_line
    # whether the plan evaluates leaves is this machine's pricing (planned here from shipped statistics), and the
    # plan line names its first segments only
    leafy = any(comp.plan.leaves) or any(comp.plan.known_leaves)
    assert (", leaves evaluated`" not in plan_line or leafy) and "root output known" in plan_line
    shown = 0
    for t in range(comp.traced_trajectories):
        for k, (r, row) in enumerate(F.trajectory_rounds(comp.trace, t), start=1):
            rt = comp.trace[r]
            leaves = bool(rt.evaluated[row, rt.node_depth == rt.node_depth.max()].all())
            expected = Topology(F.round_widths(rt)).text(leaves)
            title = spec(H.show_round(comp, t, k)[0])["layout"]["title"]["text"]
            assert title.split(": tree ")[1].split(", cut to")[0].split(", root output")[0] == expected, title
            assert ("root output known" in title) == bool(rt.root_known[row])
            # and its leaves are evaluated where the plan says so for its step and root
            assert leaves == comp.plan.leaves_at(int(rt.step[row]), bool(rt.root_known[row])), title
            shown += 1
    assert shown > 5


def test_a_chain_the_langevin_densities_and_a_vector_target():
    out = H.run(**click(tree="1x4", verifier="rmc", freeze="x0"), progress=no_progress)
    assert [r.key for r in out[9].runs] == ["target", "chain"] and len(out[7]) == 2
    assert "Two runs" in out[0] and out[1].startswith("**Topology** `1x4` at every step") and "x0-hat" in out[1]
    out = H.run(**click(model="banana", steps=30, tree="2,1"), progress=no_progress)
    assert out[9].kind == "plane" and out[9].kernel_name == "langevin"
    out = H.run(**click(model="gm16", tree="2,1"), progress=no_progress)
    assert "16 dimensions" in json.dumps(spec(out[3])["layout"]["annotations"])


def test_a_block_verified_chain_next_to_the_same_chain_under_rmc():
    out = H.run(**click(tree="1x6", verifier="block"), progress=no_progress)
    comp = out[9]
    assert [r.key for r in comp.runs] == ["target", "chain", "chain"]
    assert [r.config.verifier for r in comp.runs[1:]] == ["rmc", "block"]
    assert comp.runs[1].tree == comp.runs[2].tree == "1x6"
    assert "verified node by node" in out[0]
    assert [short_label(r, " ") for r in comp.runs[1:]] == ["chain 1x6", "chain 1x6 block"]
    with pytest.raises(gr.Error, match="one child per node"):
        H.run(**click(tree="3,2,1", verifier="rmc"), progress=no_progress)


def test_auto_topology_on_a_2d_target_with_freeze_auto():
    out = H.run(**click(tree="auto", budget=6, freeze="auto", steps=16, num_samples=8), progress=no_progress)
    comp = out[9]
    # no plan yet: the online plan, no pilot; the run's deltas plan a later click of the same settings
    assert comp.plan is not None and comp.config.freeze == "auto" and comp.chosen.pilot is None
    assert comp.chosen.plan_source == "online" and "No plan yet" in out[1] and "no plan yet" in out[0]
    assert comp.runs[1].tree == f"1x{round(comp.plan.rows_per_round())}"
    assert comp.chosen.rows_per_round == pytest.approx(comp.plan.rows_per_round())
    assert "the fitted Gaussian until runs of these settings have priced each form" in out[1]
    assert all(t.rows_per_round() <= 6 for t in comp.plan.trees if t.widths)


def test_a_clicks_deltas_plan_the_next_click_of_the_same_settings(monkeypatch, tmp_path):
    """With a plan cache, the first click of an unplanned setting samples with the online plan and keeps the
    deltas of its own run alone (not its chain baseline's); the next click plans from them, with no pilot."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    settings = click(tree="auto", budget=6, freeze="auto", steps=16, num_samples=S.PILOT_SAMPLES)
    first = H.run(**settings, progress=no_progress)[9]
    assert first.chosen.plan_source == "online" and first.chosen.pilot is None
    kept = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    # under --freeze auto the run prices its forms along its paths (planning/forms.py), the chain's none
    assert [r["trajectories"] for r in kept if r["key"].get("record") == "forms"] == [S.PILOT_SAMPLES]
    second = H.run(**settings, progress=no_progress)[9]
    assert second.chosen.plan_source == "runs" and second.chosen.pilot is None
    planned = second.plan or second.declined  # plain sampling may be expected faster than the plan here
    assert any(t.depth > 1 for t in planned.trees)


def test_local_models_are_off_whatever_the_path_names(tmp_path):
    """A visitor learns nothing about the server's disk: a folder, a file, a missing path and the
    home folder get the same answer."""
    folder = tiny_pipeline_folder(tmp_path / "unet")
    (tmp_path / "mixture.json").write_text("{}")
    answers = set()
    for path in (folder, str(tmp_path / "mixture.json"), str(tmp_path / "missing"), "~", "/etc", "../.."):
        with pytest.raises(gr.Error) as err:
            H.run(**click(model="custom", custom_model=path), progress=no_progress)
        answers.add(err.value.message)
    assert len(answers) == 1 and "local models are off" in answers.pop()


def test_a_hub_id_shaped_path_never_reads_the_disk(monkeypatch):
    """With any Hub id open ("*"), names that are also relative paths stay Hub ids: never loaded from
    the disk, and a draft that names a local folder is refused like an unlisted id."""
    monkeypatch.setenv("SPECDEMO_APP_HUB_MODELS", "*")
    monkeypatch.chdir(Path(app.__file__).parent)  # where docs/plots and specdemo/.. exist
    for path in ("specdemo/..", "tests/x.json"):
        with pytest.raises(gr.Error, match="local models are off"):
            H.run(**click(model="custom", custom_model=path), progress=no_progress)
    with pytest.raises(gr.Error, match="docs/plots is not on this server and the Hub is offline"):
        H.run(**click(model="custom", custom_model="docs/plots"), progress=no_progress)
    with pytest.raises(gr.Error, match="the Hub draft 'docs/plots' is not on this Space's list"):
        H.run(**click(draft="docs/plots"), progress=no_progress)


def test_the_owner_opens_hub_ids_and_local_models(monkeypatch):
    monkeypatch.setenv("SPECDEMO_APP_HUB_MODELS", "nobody-here/no-such-model, google/ddpm-cifar10-32")
    # listed: its loading is tried (offline here: answered at once, with how to fetch it)
    with pytest.raises(gr.Error, match="nobody-here/no-such-model is not on this server .*hf download"):
        H.run(**click(model="custom", custom_model="nobody-here/no-such-model"), progress=no_progress)
    with pytest.raises(gr.Error, match="accepted: nobody-here/no-such-model, google/ddpm-cifar10-32"):
        H.run(**click(model="custom", custom_model="someone/else"), progress=no_progress)
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")
    with pytest.raises(gr.Error, match="unknown model"):
        H.run(**click(model="custom", custom_model="/no/such/folder"), progress=no_progress)


def test_image_model_from_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")  # the owner's switch; off by default
    folder = tiny_pipeline_folder(tmp_path / "unet")
    out = H.run(
        **click(model="custom", custom_model=folder, steps=6, num_samples=2, class_label=7), progress=no_progress
    )
    comp = out[9]
    assert comp.kind == "image" and comp.config.class_label == 7
    assert any(tr["type"] == "image" for tr in spec(out[3])["data"])  # the committed path's images
    with pytest.raises(gr.Error, match="class label: 12 is not accepted here"):
        H.run(
            **click(model="custom", custom_model=folder, steps=6, num_samples=2, class_label=12), progress=no_progress
        )
    with pytest.raises(gr.Error, match="1..64"):
        H.run(**click(model="custom", custom_model=folder, num_samples=65), progress=no_progress)
    with pytest.raises(gr.Error, match="analytic targets"):
        H.exactness(100, **click(model="custom", custom_model=folder), progress=no_progress)


def test_exactness_button():
    text, fig = H.exactness(200, **click(draft_bias=2.0), progress=no_progress)
    assert text.startswith("### p = ") and "uniform" in text
    assert sum(tr["type"] == "histogram" for tr in spec(fig)["data"]) == 4
    with pytest.raises(gr.Error, match="20..2000"):
        H.exactness(5000, **click(), progress=no_progress)


def test_export_writes_the_run_as_json(default_run):
    path = H.export(default_run[9])
    data = json.loads(Path(path).read_text())
    assert Path(path).name.startswith("specdemo-run-digits-auto16-seed0")
    assert data["format"] == "specdemo-run/1" and len(data["methods"]) == 3
    assert data["config"]["tree"] == "auto" and data["config"]["budget"] == 16 and data["plan"]
    # the app's default setting ships its plan: no pilot is paid, and the export says where the plan came from
    tree_run = data["methods"][2]
    # planned here from the statistics shipped for the defaults (kept per process: the tests' cache is off)
    assert tree_run["plan_source"] == "shipped" and tree_run["pilot_target_calls"] is None
    assert data["trace"] and max(max(rt["trajectories"]) for rt in data["trace"]) < 64
    with pytest.raises(gr.Error, match="run the sampler first"):
        H.export(None)


def test_a_session_keeps_a_bounded_result():
    """What gradio keeps per session is the comparison: its trace and paths cover the first 64
    trajectories whatever the number of samples (a 2,000-sample run of 2-D paths kept whole held
    0.3 GB a session)."""
    out = H.run(**click(num_samples=2000, steps=60, tree="1x3", verifier="rmc"), progress=no_progress)
    comp, trajectory_slider = out[9], out[10]
    assert comp.traced_trajectories == 64 and comp.paths.shape[0] == 64 and comp.chosen.samples.shape[0] == 2000
    kept = sum(v.nbytes for rt in comp.trace for v in vars(rt).values() if isinstance(v, np.ndarray))
    assert kept + comp.paths.nbytes < 2_000_000, kept  # bytes
    assert trajectory_slider.maximum == 63
    assert H.show_trajectory(comp, 500)[3].maximum >= 1  # a trajectory past the kept ones shows the last kept


@pytest.mark.slow
def test_a_session_keeps_what_fits_its_byte_budget(monkeypatch):
    """An image model's node states are large: a session keeps as many trajectories as fit."""
    monkeypatch.setattr(gpu, "SESSION_BYTES", 400_000)
    out = H.run(
        **click(model="digits", tree="1x4", verifier="rmc", freeze="x0", steps=30, num_samples=12, class_label=3),
        progress=no_progress,
    )
    comp, trajectory_slider = out[9], out[10]
    assert 1 <= comp.traced_trajectories < 12 and comp.trace_bytes() <= 400_000
    assert trajectory_slider.maximum == max(comp.traced_trajectories - 1, 1)


def test_the_sessions_kept_runs_are_bounded_in_all(monkeypatch):
    """The server keeps the last run of at most app.SESSIONS sessions (gradio drops the least recently used),
    each within SESSION_BYTES: about 1 GB in all, whatever the number of visitors."""
    launched = {}
    monkeypatch.setattr(app.demo, "launch", lambda **kwargs: launched.update(kwargs))
    monkeypatch.setattr(H, "warm_up", lambda: None)
    threads = torch.get_num_threads()
    try:
        app.launch(prevent_thread_lock=True)
    finally:
        torch.set_num_threads(threads)
    assert launched["state_session_capacity"] == app.SESSIONS
    assert app.SESSIONS * gpu.SESSION_BYTES <= 1.1e9


def test_old_exports_are_removed(default_run, monkeypatch):
    first = Path(H.export(default_run[9]))
    os.utime(first, (0, 0))
    os.utime(first.parent, (0, 0))  # as if written long ago
    second = Path(H.export(default_run[9]))
    assert second.exists() and not first.exists() and first.parent.parent == second.parent.parent


def test_controls_follow_the_model():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "value not in the list of choices" from a fresh gr.Dropdown
        kernel, custom, steps, samples, tree, budget, label, draft, freeze, eta, churn, *prompt = H.model_changed(
            "gm512", "default"
        )
        assert [v for _, v in kernel["choices"]] == ["default", "ddpm", "ddim", "flow-churn", "langevin"]
        assert steps["value"] == 30 and tree["value"] == "auto" and budget["visible"] and freeze["value"] == "x0"
        assert churn["visible"] and not eta["visible"] and not custom["visible"] and not label["visible"]
        kernel, custom, steps, samples, tree, budget, label, draft, freeze, eta, churn, *prompt = H.model_changed(
            "custom", "ddim"
        )
        assert custom["visible"] and label["visible"] and eta["visible"] and kernel["value"] == "ddim"
        # the digits UNet offers only its own kernels; a kernel it lacks falls back to its default
        kernel, *_, freeze, eta, churn, _, _, _ = H.model_changed("digits", "langevin")
        assert [v for _, v in kernel["choices"]] == ["default", "ddpm", "ddim", "euler-ancestral"] and kernel[
            "value"
        ] == "default"
        assert freeze["value"] == "auto" and not churn["visible"]
        assert samples["maximum"] == MAX_SAMPLES["image"]
        *_, freeze, eta, churn, _, _, _ = H.model_changed("banana", "default")  # Langevin: no x0-hat to freeze
        assert freeze["value"] == "out"
        assert H.freeze_follows_kernel("gm2d", "langevin", "x0")["value"] == "out"
        assert H.freeze_follows_kernel("gm2d", "ddim", "x0")["value"] == "x0"
        # back from Langevin, where it had to be the output, freeze returns to the model's default
        assert H.freeze_follows_kernel("digits", "default", "out")["value"] == S.UI_DEFAULTS["digits"]["freeze"]
        assert all(u["visible"] for u in H.tree_changed("auto"))
        # the two-sample test is offered where it can run, and says where in place elsewhere
        assert H.exactness_offered("gm2d")["interactive"]
        offered = H.exactness_offered("digits")
        assert not offered["interactive"] and "analytic targets only" in offered["value"]
        assert not any(u["visible"] for u in H.tree_changed("3,2,1"))
        assert H.draft_changed("frozen")["visible"] and not H.draft_changed("digits-draft")["visible"]


def top_level_imports(path: Path) -> set[str]:
    """The packages a file imports (absolute imports only)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_the_library_never_imports_the_app_and_only_the_pages_modules_import_gradio():
    for path in (ROOT / "specdemo").rglob("*.py"):
        assert not {"gradio", "specdemo_app", "app"} & top_level_imports(path), path
    pages = {"controls.py", "views.py", "handlers.py", "style.py", "cancelling.py", "api.py", "refusals.py"}
    for path in (ROOT / "specdemo_app").glob("*.py"):
        assert ("gradio" in top_level_imports(path)) == (path.name in pages), path


def test_a_draft_network_loads_under_the_spaces_policy(monkeypatch):
    """The draft model a visitor names is loaded as the target is: from the Hub only (or embedded),
    under the download cap, and once (cached); the runs of the click use that load."""
    calls, real = [], loading.cached_target
    monkeypatch.setattr(loading, "cached_target", lambda spec, **kw: calls.append((spec, kw)) or real(spec, **kw))
    config, target, draft_target, _ = S.make_config(click(model="digits", draft="digits-draft", tree="1x3"))
    policy = {"hub_only": True, "max_download_bytes": loading.max_download_bytes()}
    assert ("digits", policy) in calls and ("digits-draft", policy) in calls
    assert draft_target is real("digits-draft", **policy)
    monkeypatch.setenv("SPECDEMO_APP_MAX_DOWNLOAD_GB", "0.5")
    assert loading.max_download_bytes() == 500_000_000
    monkeypatch.setenv("SPECDEMO_APP_MAX_DOWNLOAD_GB", "lots")
    with pytest.raises(SpecdemoError, match="SPECDEMO_APP_MAX_DOWNLOAD_GB must be a number"):
        loading.max_download_bytes()


# ---------------------------------------------------------------------------------------- text-to-image
@pytest.fixture(scope="module")
def text_folders(tmp_path_factory):
    """A tiny Stable Diffusion pipeline and a tiny SD3-class one, made here as the library's tests make them."""
    root = tmp_path_factory.mktemp("tiny-text-to-image")
    return {"sd": tiny_sd_folder(root / "sd"), "sd3": tiny_sd3_folder(root / "sd3")}


def image_shapes(plot_data) -> list[list[int]]:
    """The (H, W, channels) of every image of a figure."""
    return [
        [int(v) for v in str(tr["z"]["shape"]).split(",")]
        if isinstance(tr["z"], dict)  # plotly's typed array
        else list(np.asarray(tr["z"]).shape)
        for tr in spec(plot_data)["data"]
        if tr["type"] == "image"
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", ["sd", "sd3"])
def test_a_text_to_image_model_runs_with_a_prompt_and_shows_decoded_images(family, text_folders, monkeypatch):
    """The owner's switch opens local folders; the prompt, negative prompt and guidance scale reach the run,
    and the page shows images the VAE decoded: only those it shows (the samples panel's first
    SHOWN_IMAGES of each run, the committed path of the round on screen), each round's path once."""
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")
    folder = text_folders[family]
    target = loading.load_for_visitors(folder)
    decoded, real_decode = [], target.decode
    monkeypatch.setattr(target, "decode", lambda latents: decoded.append(len(latents)) or real_decode(latents))
    samples = runner.SHOWN_IMAGES + 2
    out = H.run(
        **click(
            model="custom",
            custom_model=folder,
            prompt="a red circle",
            negative_prompt="blue",
            guidance_scale=3.0,
            tree="2,1",
            steps=8,
            num_samples=samples,
            class_label=0,
        ),
        progress=no_progress,
    )
    summary, plan, tree, data, rounds, cost, accept, table, samples_plot, comp, trajectory, round_k, tree_button = out
    assert tree_button["visible"] is False  # a fixed topology offers no tree
    with pytest.raises(gr.Error, match="it offers none"):
        H.offer_tree(comp)
    assert comp.latent and comp.kind == "image" and comp.config.class_label is None
    assert (comp.config.prompt, comp.config.negative_prompt, comp.config.guidance_scale) == (
        "a red circle",
        "blue",
        3.0,
    )
    assert (
        [r.key for r in comp.runs] == ["target", "chain", "tree"]
        and len(table) == 3
        and "fewer target calls" in summary
    )
    assert [r.samples.shape[0] for r in comp.runs] == [samples] * 3 and comp.runs[0].samples.shape[1] == 4  # latents
    # the samples panel: one grid of RGB images per run, of the first SHOWN_IMAGES samples decoded
    shapes = image_shapes(samples_plot)
    assert len(shapes) == 3 and all(s[-1] == 3 for s in shapes)
    assert all(r.images.shape[0] == runner.SHOWN_IMAGES and r.images.shape[1] == 3 for r in comp.runs)
    # the committed path of the round on screen: RGB images, decoded with the run
    path = list(image_shapes(data))
    assert path and all(s == [16, 16, 3] for s in path)
    assert sum(decoded) == 3 * runner.SHOWN_IMAGES + len(path) and len(comp.decoded_paths) == 1
    # another round's path is decoded when it is shown, once
    t, k = trajectory.value, round_k.value
    other = 1 if k != 1 else 2
    before = sum(decoded)
    views = H.show_round(comp, t, other)
    shown = image_shapes(views[1])
    assert shown and sum(decoded) == before + len(shown) <= before + runner.PATH_IMAGES
    H.show_round(comp, t, other)
    assert sum(decoded) == before + len(shown) and len(comp.decoded_paths) == 2
    # what the exported run holds is the latents
    data_json = json.loads(Path(H.export(comp)).read_text())
    assert data_json["config"]["prompt"] == "a red circle" and np.asarray(data_json["samples"]).shape[1] == 4


def test_the_prompt_controls_are_shown_for_text_models_only():
    """The page opens on digits with the prompt, negative prompt and guidance scale hidden; a listed
    text-to-image model shows them (and picks its paired draft network), a pixel model hides them;
    a custom model may be either, so they show (a model without text leaves them out of its run)."""
    for name in ("prompt", "negative-prompt", "guidance-scale"):
        assert not component(name).visible
    names = list(controls.PROMPT_FIELDS)

    def changed(model):
        return dict(
            zip(
                [
                    "kernel",
                    "custom",
                    "steps",
                    "samples",
                    "tree",
                    "budget",
                    "label",
                    "draft",
                    "freeze",
                    "eta",
                    "churn",
                    *names,
                ],
                H.model_changed(model, "default"),
                strict=True,
            )
        )

    sd = changed("stable-diffusion-v1-5/stable-diffusion-v1-5")
    assert all(sd[name]["visible"] for name in names) and sd["draft"]["value"] == "nota-ai/bk-sdm-tiny"
    assert not sd["label"]["visible"] and not sd["freeze"]["visible"] and sd["steps"]["value"] == 25
    flow = changed("stabilityai/stable-diffusion-3.5-medium")
    assert all(flow[name]["visible"] for name in names) and flow["churn"]["visible"]
    assert [v for _, v in flow["kernel"]["choices"]] == ["default", "flow-churn"] and flow["draft"]["value"] == "frozen"
    for model in ("digits", "gm2d", "google/ddpm-cifar10-32"):
        assert not any(changed(model)[name]["visible"] for name in names), model
    assert all(changed("custom")[name]["visible"] for name in names)
    # what a hidden prompt holds does not reach a model without text
    config, *_ = S.make_config(click(prompt="left over", guidance_scale=4))
    assert (config.prompt, config.guidance_scale) == ("", None)


@pytest.mark.parametrize("entry", curated.CURATED, ids=lambda c: c.name)
def test_a_listed_model_not_on_this_server_is_answered_at_once_in_one_line(entry, monkeypatch):
    """Offline (HF_HUB_OFFLINE=1, as here) a listed model the cache lacks is answered before anything
    is loaded or requested: in one line that names it and says how to fetch it, on the page (the line
    under the model choice) and by Run."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "cached_target", lambda *a, **k: pytest.fail("the library was asked to load it"))
    t0 = time.perf_counter()
    shown = H.model_status_shown(entry.repo)
    seconds = time.perf_counter() - t0
    assert shown["visible"] and entry.repo in shown["value"] and f"hf download {entry.repo}" in shown["value"]
    assert "offline" in shown["value"] and entry.size in shown["value"] and "\n" not in shown["value"]
    t0 = time.perf_counter()
    with pytest.raises(gr.Error) as err:
        H.run(**click(model=entry.repo, tree="1x3", verifier="rmc", steps=10, num_samples=1), progress=no_progress)
    seconds = max(seconds, time.perf_counter() - t0)
    message = err.value.message
    assert message.startswith(entry.repo) and f"hf download {entry.repo}" in message and "\n" not in message
    assert seconds < 3, seconds
    print(f"{entry.repo}: answered offline in {seconds * 1000:.0f} ms")


def test_the_curated_list_is_shown_with_sizes_and_is_the_default_allow_list(monkeypatch):
    monkeypatch.delenv("SPECDEMO_APP_HUB_MODELS", raising=False)
    repos = [c.repo for c in curated.CURATED]
    assert loading.hub_list() == repos
    for c in curated.CURATED:  # each listed model (and each listed draft) may be loaded
        loading.allowed_model(c.repo)
        if c.draft:
            loading.allowed_model(c.draft, "draft")
            assert curated.curated(c.draft) is not None  # a draft the list pairs is on the list
    with pytest.raises(SpecdemoError, match="not on this Space's list; accepted: " + ", ".join(repos)):
        loading.allowed_model("someone/else")
    # the dropdown: each listed model with its size (and its draft), between the presets and "custom"
    choices = {value: label for label, value in component("model").choices}
    for c in curated.CURATED:
        assert c.size in choices[c.repo] and (not c.draft or c.draft.split("/")[-1] in choices[c.repo])
        assert ("gated" in choices[c.repo]) == c.gated
    assert list(choices)[-1] == S.CUSTOM and list(choices)[0] == S.DEFAULT_MODEL
    assert "nota-ai/bk-sdm-tiny" in [v for _, v in component("draft").choices]
    # an owner's list replaces it: the dropdown offers the listed models it keeps
    monkeypatch.setenv("SPECDEMO_APP_HUB_MODELS", "google/ddpm-cifar10-32")
    offered = [v for _, v in controls.offered_models()]
    assert "google/ddpm-cifar10-32" in offered and "stable-diffusion-v1-5/stable-diffusion-v1-5" not in offered
    with pytest.raises(SpecdemoError, match="not on this Space's list"):
        loading.allowed_model("stable-diffusion-v1-5/stable-diffusion-v1-5")


def test_a_listed_model_over_the_download_cap_or_gated_is_refused_before_any_request(monkeypatch):
    """Online, the list's sizes are checked against the owner's cap, and a gated model without a token
    says what the owner must do; neither makes a request."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(loading, "hub_token", lambda: False)
    ok, line = loading.hub_status("stabilityai/stable-diffusion-3.5-medium")
    assert not ok and "gated" in line and "HF_TOKEN" in line
    monkeypatch.setattr(loading, "hub_token", lambda: True)
    ok, line = loading.hub_status("stabilityai/stable-diffusion-3.5-medium")  # 16.3 GB, over the 12 GB cap
    assert not ok and "16.3 GB fp16" in line and "SPECDEMO_APP_MAX_DOWNLOAD_GB" in line
    ok, line = loading.hub_status("stable-diffusion-v1-5/stable-diffusion-v1-5")
    assert ok and "downloaded from the Hub when first run (4.3 GB fp32)" in line


def sd15_sized(target):
    """`target` as if its denoiser were Stable Diffusion 1.5's UNet at 64x64 latents (built on the meta
    device: no memory, no download) and its VAE SD's: the work estimate's inputs."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
        vae = AutoencoderKL(
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            layers_per_block=2,
        )
    assert sum(p.numel() for p in unet.parameters()) == 859_520_964  # Stable Diffusion 1.5's UNet
    return types.SimpleNamespace(
        name="sd15-sized",
        shape=(4, 64, 64),
        denoiser=unet,
        text_conditioned=True,
        defaults=target.defaults,
        pipeline=types.SimpleNamespace(vae=vae),
    )


@pytest.mark.usefixtures("one_thread")
def test_the_work_estimate_weighs_a_row_by_its_model(text_folders, monkeypatch):
    """A Stable Diffusion 1.5 row with guidance is about 43,000 digits rows of work: a CPU click gets a
    handful of them, and the page's check refuses a one-sample run with the reason and what to change;
    a GPU gets a thousand times a CPU's work for such rows (16 times for the digits model's); the
    digits model's limit is the Space's figure."""
    digits = loading.cached_target("digits")
    assert work.row_cost(digits) == 1 and work.click_limits(digits, "cpu").max_rows == work.MAX_ROWS["image"]
    tiny = loading.cached_target(text_folders["sd"])
    big = sd15_sized(tiny)
    guided, plain = work.row_cost(big), work.row_cost(big, guidance_scale=1.0)
    assert 40_000 < guided < 46_000 and guided == pytest.approx(2 * plain)
    assert work.click_limits(big, "cpu").max_rows == int(work.MAX_ROWS["image"] / guided) < 10
    monkeypatch.setattr(work, "on_gpu", lambda device: True)
    assert work.click_limits(big, "auto").max_rows == int(work.MAX_ROWS["image"] * work.GPU_COMPUTE_SCALE / guided)
    assert work.click_limits(digits, "auto").max_rows == work.MAX_ROWS["image"] * work.GPU_SCALE
    monkeypatch.undo()
    # the page refuses such a model on this CPU before any work, saying why
    monkeypatch.setenv("SPECDEMO_APP_LOCAL_MODELS", "1")
    real_work = work.denoiser_work
    monkeypatch.setattr(work, "denoiser_work", lambda target: real_work(big))
    monkeypatch.setattr(runner, "build", lambda *a, **k: pytest.fail("work started before the refusal"))
    with pytest.raises(gr.Error) as err:
        H.check_inputs(
            **click(
                model="custom",
                custom_model=text_folders["sd"],
                prompt="a red circle",
                tree="1x3",
                verifier="rmc",
                steps=25,
                num_samples=1,
                device="cpu",
            )
        )
    message = err.value.message
    assert "over the limit of 5;" in message and "costs about 43," in message and "a GPU runs far more" in message
    # the decoding for display is counted too
    assert work.decode_cost(big) > 1000


def test_a_clicks_bound_counts_the_draft_networks_pilot():
    """--freeze auto with a draft network pilots each frozen form and the corrected network: five runs of
    P trajectories, as the run's own limit counts them (specdemo.resolve)."""
    from specdemo.planning import AUTO_FORMS, PILOT_DEPTH
    from specdemo.resolve import resolve

    checked = resolve(
        SamplerConfig(
            model="digits",
            draft="digits-draft",
            tree="auto",
            freeze="auto",
            steps=50,
            num_samples=2,
            pilot_samples=8,
            device="cpu",
            pilot=True,
        )
    )
    c = checked.config
    pilots = (len(AUTO_FORMS) + 1) * c.pilot_samples * 50 * (PILOT_DEPTH + 1)
    assert runner.click_work(checked, chain=False, plain=False)[0][1] == 2 * 50 * (c.budget + 1) + pilots


def test_a_clicks_runs_are_timed_again_and_the_least_timing_kept(monkeypatch):
    """Within the timing budget each run is timed up to TIMING_RUNS times, in turn, and its wall-clock is the
    least of them (the headline says so); with no budget, once."""
    timed = []
    real_run = runner.Problem.run

    def run(self, *args, **kwargs):
        result = real_run(self, *args, **kwargs)
        if not kwargs.get("trace"):
            timed.append((self.config.method, result.cost.wall_s))
        return result

    monkeypatch.setattr(runner.Problem, "run", run)
    monkeypatch.setenv("SPECDEMO_APP_TIMING_SECONDS", "30")
    comp = H.run(**click(tree="2,1", steps=12), progress=no_progress)[9]
    assert all(r.timings == runner.TIMING_RUNS for r in comp.runs)
    for r in comp.runs:
        assert r.cost.wall_s == min(s for method, s in timed if method == r.config.method)
    assert f"the least of {runner.TIMING_RUNS} timings" in labels.headline(comp)
    monkeypatch.setenv("SPECDEMO_APP_TIMING_SECONDS", "0")
    assert all(r.timings == 1 for r in H.run(**click(tree="2,1", steps=12), progress=no_progress)[9].runs)


def test_the_tree_offered_for_a_plan_of_chains_has_about_its_rows():
    assert labels.tree_at_rows(9.2) == "2,2,1" and labels.tree_at_rows(15.3) == "3,2,1"  # 10 and 15 rows a round


def test_a_dropped_event_stops_its_run_in_any_phase_within_a_second():
    """The watcher thread sets the run's flag once gradio drops its event, with no progress update needed
    (planning and decoding send none); and a run holds a work slot until it returns, so a cancelled run still
    computing counts against the runs at a time."""
    from types import SimpleNamespace

    from gradio.context import LocalContext

    from specdemo_app import cancelling

    event = SimpleNamespace(_id="event-1")
    queue = SimpleNamespace(active_jobs=[[event]])
    blocks, event_id = LocalContext.blocks.set(SimpleNamespace(_queue=queue)), LocalContext.event_id.set("event-1")
    try:
        with cancelling.cancellable(None, None) as (cancel, _):
            time.sleep(3 * cancelling.WATCH_SECONDS)
            assert not cancel.cancelled  # the event runs
            assert cancelling.WORK_SLOTS._value == cancelling.RUNS_AT_ONCE - 1  # a slot held while it runs
            queue.active_jobs = [None]  # gradio dropped it (job.cancel(), a closed page)
            t0 = time.monotonic()
            while not cancel.cancelled and time.monotonic() - t0 < 5:
                time.sleep(0.01)
            assert cancel.cancelled and time.monotonic() - t0 < 1.0
        assert cancelling.WORK_SLOTS._value == cancelling.RUNS_AT_ONCE  # given back when the run returned
    finally:
        LocalContext.blocks.reset(blocks)
        LocalContext.event_id.reset(event_id)
