"""app.py's functions, called directly (no server), and the Space configuration."""

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import gradio as gr
import pytest

import app
from specdemo import compare as C
from specdemo import figures as F

ROOT = Path(__file__).resolve().parents[1]
FOUR = {"accepted", "rejected", "corrected", "unvisited"}


def no_progress(*args, **kwargs):
    pass


def controls(**change):
    d = dict(model="gm2d", custom_model="", draft="frozen", draft_bias=0, tree="2,1", verifier="dgrs",
             kernel="default", steps=12, eta=1, churn=0.06, num_samples=6, class_label=0, seed=0, device="auto")
    d.update(change)
    return list(d.values())


def spec(plot_data) -> dict:
    assert plot_data.type == "plotly"
    return json.loads(plot_data.plot)


def tree_statuses(plot_data) -> set[str]:
    return {tr["legendgroup"] for tr in spec(plot_data)["data"]
            if tr.get("mode") == "markers" and tr.get("legendgroup") in FOUR and any(v is not None for v in tr["x"])}


def tiny_unet_folder(path, num_classes=10):
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 16), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       layers_per_block=1, add_attention=False, num_class_embeds=num_classes)
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000)).save_pretrained(
        str(path), safe_serialization=True)
    return str(path)


@pytest.fixture(scope="module")
def default_run():
    d = app.UI_DEFAULTS[app.DEFAULT_MODEL]
    return app.run(*controls(model=app.DEFAULT_MODEL, tree=d["tree"], steps=d["steps"], num_samples=d["samples"]),
                   progress=no_progress)


def test_the_page_is_wired_with_api_names_and_a_queue():
    assert isinstance(app.demo, gr.Blocks)
    names = {fn.api_name for fn in app.demo.fns.values()}
    assert {"run", "tree_view", "trajectory_view", "exactness", "export", "model_defaults", "kernel_options"} <= names
    assert all(fn.api_name for fn in app.demo.fns.values())
    assert app.demo._queue.default_concurrency_limit == app.CONCURRENCY_LIMIT
    assert app.demo._queue.max_size >= 8


def test_default_click(default_run):
    summary, tree, data, rounds, cost, accept, table, samples, comp, trajectory, round_k = default_run
    assert "fewer target calls than plain sampling" in summary and "exact" in summary
    assert tree_statuses(tree) == FOUR  # the page opens on a round that shows every status
    assert isinstance(comp, C.Comparison) and [r.key for r in comp.runs] == ["target", "chain", "tree"]
    assert len(table) == 3 and table[0][0] == "plain target"
    assert spec(tree)["config"]["toImageButtonOptions"]["filename"] == "specdemo-tree"
    for fig in (data, rounds, cost, accept, samples):
        assert spec(fig)["data"]
    t, k = trajectory.value, round_k.value
    assert (t, k) == F.pick_round(comp.trace)
    assert round_k.maximum == len(F.trajectory_rounds(comp.trace, t))


def test_round_and_trajectory_views(default_run):
    comp = default_run[8]
    tree, data, rounds = app.show_round(comp, 0, 2)
    assert "Round 2 of" in spec(tree)["layout"]["title"]["text"]
    tree, data, rounds, slider = app.show_trajectory(comp, 5)
    assert "trajectory 5" in spec(tree)["layout"]["title"]["text"] and slider.value == 1
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
    ({"model": "custom", "custom_model": "nobody-here/no-such-model"}, "cannot load model"),
    ({"model": "custom", "custom_model": "/no/such/folder"}, "unknown model"),
    ({"steps": 5000}, "out of range"),
    ({"steps": 2.5}, "whole number"),
    ({"eta": float("nan"), "kernel": "ddim"}, "finite"),
    ({"verifier": "rmc", "tree": "3,2,1"}, "one child per node"),
    ({"kernel": "flow-churn", "model": "banana"}, "langevin"),
    ({"device": "tpu"}, "unknown device"),
    ({"draft": "digits-draft"}, "only the frozen draft"),
])
def test_bad_inputs_are_readable_errors(change, message):
    with pytest.raises(gr.Error) as err:
        app.run(*controls(**change), progress=no_progress)
    assert message in err.value.message


def test_a_chain_the_langevin_densities_and_a_vector_target():
    out = app.run(*controls(tree="1x4", verifier="rmc"), progress=no_progress)
    assert [r.key for r in out[8].runs] == ["target", "chain"] and len(out[6]) == 2
    out = app.run(*controls(model="banana", steps=30, tree="2,1"), progress=no_progress)
    assert out[8].kind == "plane" and out[8].kernel_name == "langevin"
    out = app.run(*controls(model="gm16", tree="2,1"), progress=no_progress)
    assert "16 dimensions" in json.dumps(spec(out[2])["layout"]["annotations"])


def test_image_model_from_a_folder(tmp_path):
    folder = tiny_unet_folder(tmp_path / "unet")
    out = app.run(*controls(model="custom", custom_model=folder, steps=6, num_samples=2, class_label=7),
                  progress=no_progress)
    comp = out[8]
    assert comp.kind == "image" and comp.config.class_label == 7
    assert any(tr["type"] == "image" for tr in spec(out[2])["data"])  # the committed path's images
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
    path = app.export(default_run[8])
    data = json.loads(Path(path).read_text())
    assert Path(path).name.startswith("specdemo-run-gm2d-3_2_1-seed0")
    assert data["format"] == "specdemo-run/1" and len(data["methods"]) == 3
    assert data["trace"] and max(max(rt["trajectories"]) for rt in data["trace"]) < 64
    with pytest.raises(gr.Error, match="run the sampler first"):
        app.export(None)


def test_controls_follow_the_model():
    custom, steps, samples, tree, label, draft, eta, churn = app.model_changed("gm512", "default")
    assert steps.value == 30 and tree.value == "2x5" and churn.visible and not eta.visible and not custom.visible
    custom, steps, samples, tree, label, draft, eta, churn = app.model_changed("custom", "ddim")
    assert custom.visible and label.visible and eta.visible and samples.maximum == app.MAX_SAMPLES["image"]


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
    assert specdemo_imports == ["from specdemo import KERNEL_NAMES, PRESETS, SamplerConfig, SpecdemoError, Topology, __version__",
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
