"""One config behind every surface: a setting added to SamplerConfig is an option of `specdemo sample`
and a control of the app's page (a parameter of its /run endpoint, with a default), and the app passes
its value on to the run's config."""

import dataclasses
from pathlib import Path

import gradio as gr
import pytest

import app
from specdemo import SpecdemoError, cli, config
from specdemo_app import controls, settings

pytestmark = pytest.mark.app


@dataclasses.dataclass(frozen=True)
class Extended(config.SamplerConfig):
    temperature: float = config.setting(1.0, "a setting added for this test")
    passes: int | None = config.setting(None, "an optional setting added for this test (default: the model's)")


@pytest.fixture
def extended(monkeypatch):
    for module in (cli, controls, settings):
        monkeypatch.setattr(module, "SamplerConfig", Extended)


def run_endpoint(demo: gr.Blocks):
    return next(fn for fn in demo.fns.values() if fn.api_name == "run")


def component(demo: gr.Blocks, elem_id: str):
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def inside(block) -> list:
    """Every block laid out inside `block` (gradio wraps form controls in a Form of their own)."""
    return [b for child in getattr(block, "children", []) for b in (child, *inside(child))]


def small_click(demo: gr.Blocks, **change) -> dict:
    """The page's settings for gm2d (every control of `demo`'s /run), a small fixed topology."""
    values = settings.page_values("gm2d")
    return {
        **{name: values[name] for name in run_endpoint(demo).input_keyword_names},
        "tree": "2,1",
        "steps": 8,
        "num_samples": 4,
        **change,
    }


def test_a_new_config_field_is_an_option_and_a_control(extended):
    args = cli.build_parser().parse_args(["sample", "--temperature", "0.5", "--passes", "3"])
    assert (cli.sample_settings(args)["temperature"], cli.sample_settings(args)["passes"]) == (0.5, 3)
    demo = app.build_demo()
    temperature, passes = component(demo, "temperature"), component(demo, "passes")
    assert isinstance(temperature, gr.Number) and temperature.value == 1.0
    assert temperature.info == "a setting added for this test"
    assert isinstance(passes, gr.Textbox) and passes.value == ""  # blank: the default (None)
    advanced = next(b for b in demo.blocks.values() if isinstance(b, gr.Accordion) and b.label == "advanced")
    assert temperature in inside(advanced) and passes in inside(advanced)
    run = run_endpoint(demo)
    assert run.input_keyword_names[-2:] == ["temperature", "passes"]
    parameters = demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
    assert all(p["parameter_has_default"] for p in parameters)  # /run still runs with no arguments
    config_, *_ = settings.make_config(small_click(demo, temperature=0.25, passes="2"))
    assert isinstance(config_, Extended) and (config_.temperature, config_.passes) == (0.25, 2)
    config_, *_ = settings.make_config(small_click(demo))
    assert (config_.temperature, config_.passes) == (1.0, None)
    with pytest.raises(SpecdemoError, match="passes must be a whole number"):
        settings.make_config(small_click(demo, passes="2.5"))


def test_every_setting_is_a_control_or_left_out_for_a_reason():
    """The page as it is: every SamplerConfig field has its place in the layout or a reason not to be
    offered (so no "advanced" group), and /run takes the controls by name, each with a default."""
    names = {f.name for f in dataclasses.fields(config.SamplerConfig)}
    assert set(controls.NOT_OFFERED) <= names and controls.advanced_fields() == ()
    assert run_endpoint(app.demo).input_keyword_names == list(controls.control_names())
    assert set(controls.control_names()) == names - set(controls.NOT_OFFERED) | {"custom_model"}
    assert not any(isinstance(b, gr.Accordion) and b.label == "advanced" for b in app.demo.blocks.values())
    parameters = app.demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
    assert [p["parameter_name"] for p in parameters] == run_endpoint(app.demo).input_keyword_names
    assert all(p["parameter_has_default"] for p in parameters)
    # the controls' defaults and help are the fields' where the page has no words of its own
    assert component(app.demo, "seed").value == config.SamplerConfig().seed
    assert component(app.demo, "eta").info == next(
        f.metadata["help"] for f in dataclasses.fields(config.SamplerConfig) if f.name == "eta"
    )
    assert component(app.demo, "device").choices == [(c, c) for c in config.DEVICES]


def test_slider_spans_and_accepted_ranges_are_the_fields():
    """A slider's span is its field's (slider=, else range=); a field's range is checked by validate()
    (so by the CLI and the app alike), its slider span is not (the benchmarks' --budget 85 stays valid);
    the CLI's options carry only argparse's keys of the metadata."""
    meta = {f.name: f.metadata for f in dataclasses.fields(config.SamplerConfig)}
    for name, elem_id in (("draft_bias", "draft-bias"), ("budget", "budget"), ("churn", "churn"), ("eta", "eta")):
        lo, hi = meta[name].get("slider") or meta[name]["range"]
        control = component(app.demo, elem_id)
        assert (control.minimum, control.maximum) == (lo, hi), name
    assert meta["eta"]["range"] == (0.0, 1.0) and settings.BUDGET_RANGE == meta["budget"]["slider"] == (1, 64)
    with pytest.raises(SpecdemoError, match=r"eta must be in 0\.\.1, got 1\.5"):
        config.SamplerConfig(eta=1.5).validate()
    with pytest.raises(SpecdemoError, match="budget must be >= 1, got 0"):
        config.SamplerConfig(budget=0).validate()
    with pytest.raises(SpecdemoError, match="churn must be >= 0"):
        config.SamplerConfig(churn=-0.1).validate()
    config.SamplerConfig(budget=85, draft_bias=8.0, churn=2.0).validate()  # beyond the sliders: accepted
    for flag, options in cli.sample_options():
        assert set(options) <= set(config.ARGPARSE_KEYS) | {"default", "type", "action"}, flag
    code = cli.main(["sample", "--model", "gm2d", "--eta", "1.5", "--steps", "4", "--num-samples", "1"])
    assert code == 2
    # one reading of a field's type, shared by the CLI and the app
    budget = next(f for f in dataclasses.fields(config.SamplerConfig) if f.name == "budget")
    assert settings.field_kind(budget) is config.field_type(config.SamplerConfig, budget) is int


def test_the_raw_controls_write_no_stub_file():
    """gradio writes a .pyi beside the module of a component subclass as it is defined; the app's own
    (RawNumber, RawSlider) must leave the source tree, or site-packages, as they were."""
    assert issubclass(controls.RawNumber, gr.Number) and issubclass(controls.RawSlider, gr.Slider)
    assert not Path(controls.__file__).with_suffix(".pyi").exists()
