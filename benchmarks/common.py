"""What the sections share: running a configuration, the report's layout and plots, and the raw results
each section saves next to the report (bench_results/NAME.json), which the README's figures are read from.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
from pathlib import Path

import torch

from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling.cost import time_speedup
from specdemo.trees import TopologyPlan

# the sections that count calls plan for calls, as every planned setting did before plans were priced in time
BY_CALLS = {"objective": "calls", "prefetch": "nearest"}
NETWORK = {"draft": "digits-draft"}  # the small draft network trained for the digits model


def run_cell(config: SamplerConfig, repeats: int = 1, target=None, with_pilot: bool = False) -> dict:
    """Run a configuration: its summary, with the configuration as run (`config`, every setting, which
    runs are found by); timing figures are the median of `repeats` identical runs. target: config.model
    already loaded (loaded here by default); with_pilot: the pilot runs this build paid for are charged
    to the summary (pilot_calls, pilot_s, speedup_total), as the command line charges them."""
    problem = build(config, target)
    runs = [problem.run(with_pilot=with_pilot).cost for _ in range(repeats)]
    cost = runs[0]
    summary = cost.summary()
    summary["wall_s"] = statistics.median(c.wall_s for c in runs)
    summary["target_s"] = statistics.median(c.target_s for c in runs)
    summary["wall_ms_per_sample"] = 1e3 * summary["wall_s"] / config.num_samples
    summary["non_target_fraction"] = statistics.median(1 - c.target_s / c.wall_s for c in runs)
    summary["rows_per_round"] = (
        problem.tree.rows_per_round(problem.config.prefetch == "leaves") if problem.tree.widths else 1
    )
    plan = problem.tree if isinstance(problem.tree, TopologyPlan) else None
    summary["planned_calls"] = plan.expected_calls if plan is not None and plan.predicts else None  # online: none
    summary["verifier"] = problem.verifier.name if problem.verifier else None  # the planner's, under verifier auto
    summary["plan_source"] = problem.plan_source  # where an auto tree's plan came from (online, cache, pilot, ...)
    summary["config"] = config.to_dict()
    return summary


def image_config(
    model: str, steps: int, samples: int, device: str, class_label: int | None, **settings
) -> SamplerConfig:
    """A configuration of an image model's rows: seed 0, and an auto tree planned from pilots unless
    `settings` say otherwise."""
    return SamplerConfig(
        **{
            "pilot": True,
            "model": model,
            "steps": steps,
            "num_samples": samples,
            "device": device,
            "seed": 0,
            "class_label": class_label,
            **settings,
        }
    )


def image_rows(
    model: str,
    steps: int,
    samples: int,
    device: str,
    configs,
    class_label: int | None = 3,
    repeats: int = 1,
    target=None,
    with_pilot: bool = False,
) -> list[tuple[str, dict]]:
    """Markdown cells (from the method on) and the run's summary per configuration (display name,
    settings), each against the plain sampler run first, all in one process (target, with_pilot: as
    run_cell's). The first configuration, the plain sampler, also runs once untimed before the rows."""
    cfgs = [image_config(model, steps, samples, device, class_label, **settings) for _, settings in configs]
    # the first run of a model in a process pays the device's lazy set-up (on CUDA the context, the
    # kernels' loading and autotuning, the clocks' ramp): an untimed run keeps it out of every row
    run_cell(cfgs[0], 1, target)
    rows, plain = [], None
    for (name, _), cfg in zip(configs, cfgs, strict=True):
        s = run_cell(cfg, repeats, target, with_pilot)
        plain = plain or s
        acceptance = "" if s["acceptance"] is None else f"{s['acceptance']:.3f}"
        rows.append(
            (
                f"{name} | {s['speedup']:.2f} | {s['target_calls']} | {s['rows_per_call']:.1f} | {acceptance} | "
                f"{s['wall_s']:.2f} | {time_speedup(s['wall_s'], plain['wall_s']):.2f}x | {s['non_target_fraction']:.0%} |",
                s,
            )
        )
    return rows


def find(runs: list[dict], **settings) -> dict:
    """The one run (run_cell's summary) whose configuration has these settings: runs are paired by what
    they ran, never by their display names."""
    (run,) = [r for r in runs if settings.items() <= r["config"].items()]
    return run


def shown(run: dict) -> float:
    """A run's speedup as its table shows it; the margins the text quotes are between these."""
    return round(run["speedup"], 2)


def planned_gain(tree: dict, chain: dict) -> str:
    """What the planner, which picks the best tree shape within the rows by its model, expected."""
    return (
        f"the planner expected {100 * (chain['planned_calls'] / tree['planned_calls'] - 1):+.0f}%: "
        f"{tree['planned_calls']:.1f} against {chain['planned_calls']:.1f} calls per trajectory"
    )


def percent_gain(a: float, b: float) -> str:
    """a over b, as the report writes a margin: "+12%"."""
    return f"{100 * (a / b - 1):+.0f}%"


def cifar_sized_unet(folder: Path) -> str:
    """A random UNet2DModel of google/ddpm-cifar10-32's size, saved as a pipeline folder."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=2,
        block_out_channels=(128, 256, 256, 256),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    )
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(variance_type="fixed_large")).save_pretrained(
        folder, safe_serialization=True
    )
    return str(folder)


def plot(fig, name: str, report: Path) -> str:
    """Save a plotly figure as PNG next to the report (kaleido, with Debian's Chromium where no
    Chrome is set); return the markdown that shows it, or a note when no browser could render it."""
    os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")
    folder = report.parent / "plots"
    folder.mkdir(exist_ok=True)
    try:
        fig.write_image(folder / f"{name}.png", width=900, height=480, scale=2)
    except Exception as err:  # no kaleido or no browser on this machine: the tables stand alone
        return f"(plot {name} not drawn here: {type(err).__name__})"
    return f"![{name}](plots/{name}.png)"


def header() -> str:
    return (
        "# Benchmarks\n\n"
        "Written by `python -m benchmarks.run` from a checkout (or `python -m specdemo bench`; each section can be "
        "refreshed alone with `--sections`), with each section's raw results in bench_results/, from which the "
        "README's figures are written. Ratios are measured side by side in one run on the machine below; absolute "
        "times are noisy.\n"
    )


def machine() -> str:
    """The machine a section ran on, with its load (the 15-minute average when the section is written):
    wall-clock figures taken under load are distorted, calls are not."""
    return (
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"load {os.getloadavg()[2]:.1f}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"Python {platform.python_version()}"
    )


def command(name: str) -> str:
    """The command that writes a section."""
    return f"python -m benchmarks.run --sections {name}"


def section_line(machine_line: str, name: str) -> str:
    """A section's first line: its machine and date (as its results file records them) and its command."""
    return f"_{machine_line}; `{command(name)}`_"


def section_block(name: str, title: str, machine_line: str, body: str) -> str:
    """A section as the report lays it out: markers, heading, machine line and command, body."""
    return (
        f"<!-- section:{name} -->\n## {title}\n\n{section_line(machine_line, name)}\n\n{body}\n<!-- /section:{name} -->"
    )


def section_pattern(name: str) -> re.Pattern:
    """A section of the report, from its opening marker to its closing one."""
    return re.compile(rf"<!-- section:{re.escape(name)} -->.*?<!-- /section:{re.escape(name)} -->", re.S)


def write_section(path: Path, name: str, title: str, body: str, machine_line: str | None = None) -> None:
    """Write a section into the report (replacing it where it is), under machine_line (default: this machine
    now; a section rendered from its saved results passes the results' own line)."""
    text = path.read_text() if path.exists() else header()
    block = section_block(name, title, machine_line or machine(), body)
    pattern = section_pattern(name)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def results_path(report: Path, name: str) -> Path:
    """Where a section's raw results are kept: docs/bench_results/NAME.json for docs/benchmarks.md."""
    return report.parent / "bench_results" / f"{name}.json"


def save_results(report: Path, name: str, results: dict, settings: dict) -> None:
    """A section's raw results as JSON, with the machine and the runner's settings that produced them."""
    path = results_path(report, name)
    path.parent.mkdir(exist_ok=True)
    record = {"section": name, "machine": machine(), "settings": settings, "results": results}
    path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tiny_clip_tokenizer(folder: Path, max_length: int = 16):
    """A CLIP tokenizer over single letters (no merges) and `max_length` tokens, from files written into
    `folder` (where the pipeline's save_pretrained writes it again): no download."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {
        "<|startoftext|>": 0,
        "<|endoftext|>": 1,
        **{c: 2 + i for i, c in enumerate(LETTERS)},
        **{c + "</w>": 28 + i for i, c in enumerate(LETTERS)},
    }
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=max_length)


def tiny_vae(seed: int = 0, latent_channels: int = 4, **extra):
    """A random AutoencoderKL with a scale factor of 2 (16x16 images, 8x8 latents)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=(8, 16),
        in_channels=3,
        out_channels=3,
        latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4,
        sample_size=16,
        **extra,
    )
