"""The Stable-Diffusion-sized UNet section (benchmarks/sd_unet.py) in its quick form: a small UNet of the
same kind, built as a pipeline folder and loaded by the library's loader, sampled plain, by a chain and
by auto, and its section written by the runner."""

import inspect
import json
import re

import pytest
import torch

from benchmarks import sd_unet
from benchmarks.run import SECTIONS, main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_section_is_registered_before_the_gpu_section():
    assert SECTIONS.index("sd_unet") < SECTIONS.index("gpu")


def test_the_full_size_config_is_stable_diffusion_1_5s_unet():
    """Checked without building it (860M parameters): every key an argument of UNet2DConditionModel, each
    value diffusers' default but SD 1.5's sample size and text width; 50 steps."""
    from diffusers import UNet2DConditionModel

    arguments = inspect.signature(UNet2DConditionModel.__init__).parameters
    assert set(sd_unet.SD15_UNET) <= set(arguments)
    assert {k for k, v in sd_unet.SD15_UNET.items() if arguments[k].default != v} == {
        "sample_size",
        "cross_attention_dim",
    }
    assert (sd_unet.SD15_UNET["sample_size"], sd_unet.SD15_UNET["cross_attention_dim"], sd_unet.SD15_STEPS) == (
        64,
        768,
        50,
    )


@pytest.mark.slow
def test_the_quick_section_measures_plain_chain_and_autos_first_run(tmp_path):
    report = tmp_path / "docs" / "benchmarks.md"
    body, results = sd_unet.measure(1, True, report)
    runs = results["runs"]
    assert [r["name"] for r in runs] == [sd_unet.PLAIN, sd_unet.CHAIN, sd_unet.AUTO]
    plain, chain, auto = runs
    assert results["steps"] == sd_unet.QUICK_STEPS and results["parameters"] > 0
    assert all(r["num_samples"] == 1 and r["config"]["guidance_scale"] == sd_unet.GUIDANCE for r in runs)
    assert plain["config"]["method"] == "target" and round(plain["speedup"], 2) == 1.0
    assert plain["target_calls"] == sd_unet.QUICK_STEPS and plain["rows_per_call"] == 1.0
    assert chain["config"]["tree"] == "1x4" and chain["config"]["freeze"] is None  # the default: out
    assert 0 < chain["target_calls"] < plain["target_calls"] and chain["rows_per_call"] > 1
    # auto's first run: nothing cached, so the online plan, learnt from the run itself, and no pilot
    assert auto["config"]["tree"] == "auto" and auto["config"]["pilot"] is False
    assert auto["config"]["cache_dir"] not in (None, "off") and auto["plan_source"] == "online"
    assert auto["pilot_calls"] == 0 and auto["pilot_s"] == 0 and auto["learn_s"] > 0
    assert 0 < auto["target_calls"] <= plain["target_calls"] and auto["rows_per_call"] >= 1
    for r in (chain, auto):
        assert r["speedup"] == pytest.approx(r["stochastic_steps"] / r["counted_calls_per_sample"])
    # the rows: total = sampling + pilots and learning, each against plain sampling's and the chain's totals
    lines = [line for line in body.splitlines() if line.startswith(f"| {results['device']} |")]
    assert len(lines) == 3 and lines[0].split(" | ")[2:4] == [str(sd_unet.QUICK_STEPS), "1.00"]
    cells = lines[2].strip("| ").split(" | ")
    total = auto["wall_s"] + auto["learn_s"]
    assert cells[6:11] == [
        f"{auto['wall_s']:.2f}",
        f"{total - auto['wall_s']:.2f}",
        f"{total:.2f}",
        f"{plain['wall_s'] / total:.2f}x",
        f"{chain['wall_s'] / total:.2f}x",
    ]
    assert "random weights" in body and body == sd_unet.render(results)
    json.dumps(results, allow_nan=False)  # what the runner saves


def test_without_cuda_the_full_section_is_pending(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sd_unet.measure(1, False, tmp_path / "benchmarks.md") == (sd_unet.PENDING, None)


def test_the_runner_writes_the_quick_section_into_the_report(tmp_path, monkeypatch):
    measured = ("| CPU, fp32 | plain target | 10 | 1.00 | 1.0 |  | 1.00 | 1.00x |", {"runs": []})
    monkeypatch.setattr(sd_unet, "measure", lambda trajectories, quick, report: measured)
    report = tmp_path / "docs" / "benchmarks.md"
    assert main(["--sections", "sd_unet", "--quick", "--out", str(report)]) == 0
    section = re.search(
        r"<!-- section:sd_unet -->\n## (.*)\n\n_.*_\n\n(.*)\n<!-- /section:sd_unet -->", report.read_text(), re.S
    )
    assert section and section.group(1) == sd_unet.TITLE and section.group(2) == measured[0]
    assert not (tmp_path / "docs" / "bench_results").exists()  # a quick run keeps the full run's results
