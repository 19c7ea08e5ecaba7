"""A draft network distilled from the target: the digits draft architecture trained on the target's outputs
(digits-draft-distilled) against the same architecture trained on the data's noise (digits-draft), how far
each misses the target by noise level, and the planned runs of the drafts section side by side (target
calls, hardware-free)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from diffusers import UNet2DModel

from specdemo.digits import load_digits_images
from specdemo.models.diffusers_unet import EMBEDDED
from specdemo.pipeline import SamplerConfig
from specdemo.train import IMAGE_SIZE, make_scheduler

from .common import find, percent_gain, run_cell

TITLE = "Beyond the papers: a draft network distilled from the target"
DRAFTS = ("digits-draft", "digits-draft-distilled")
# (steps, samples, seeds): the drafts section's planned network cells, with 64 samples on two seeds (its 16 and
# 32 samples leave standard errors as large as the difference this section measures)
CELLS = [(100, 64, (0, 1)), (1000, 64, (0, 1))]
QUICK_CELLS = [(100, 4, (0,))]
BUDGET = 48  # the rows per round
BANDS = ((0, 5), (5, 20), (20, 50), (50, 100), (100, 200), (200, 400), (400, 1000))  # training timesteps t
IMAGES = 256


def config(draft: str, steps: int, samples: int, seed: int) -> SamplerConfig:
    return SamplerConfig(
        pilot=True,
        model="digits",
        steps=steps,
        num_samples=samples,
        device="cpu",
        seed=seed,
        class_label=3,
        method="tree",
        tree="auto",
        budget=BUDGET,
        verifier="block",
        freeze="auto",
        objective="calls",
        draft=draft,
    )


def _planned(cfg: SamplerConfig) -> dict:
    torch.set_num_threads(1)  # two cells at once on the two cores
    return run_cell(cfg, with_pilot=True)


def misses(images: int) -> list[dict]:
    """Mean squared difference between each draft's output and the target's, (1/d) E||out_draft - out_target||^2,
    at x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps over digits x_0 and timesteps t uniform in each band."""
    generator = torch.Generator().manual_seed(0)
    data, labels = load_digits_images(IMAGE_SIZE)
    chosen = torch.randperm(len(data), generator=generator)[:images]
    x0, labels = data[chosen], labels[chosen]
    target = UNet2DModel.from_pretrained(EMBEDDED["digits"] / "unet").eval()
    drafts = {name: UNet2DModel.from_pretrained(EMBEDDED[name] / "unet").eval() for name in DRAFTS}
    scheduler, rows = make_scheduler(), []
    for low, high in BANDS:
        t = torch.randint(low, high, (images,), generator=generator)
        x_t = scheduler.add_noise(x0, torch.randn(x0.shape, generator=generator), t)
        row = {"band": [low, high]}
        with torch.no_grad():
            wanted = target(x_t, t, class_labels=labels).sample
            for name, draft in drafts.items():
                row[name] = float((draft(x_t, t, class_labels=labels).sample - wanted).square().mean())
        rows.append(row)
    return rows


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    configs = [
        config(draft, steps, samples, seed)
        for steps, samples, seeds in (QUICK_CELLS if quick else CELLS)
        for seed in seeds
        for draft in DRAFTS
    ]
    # calls do not depend on the machine's load: the cells run two at a time
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(_planned, configs))
    results = {"misses": misses(32 if quick else IMAGES), "runs": runs}
    return _text(results), results


def _text(results: dict) -> str:
    lines = [
        "Both drafts are the same small UNet, trained by `python -m specdemo.train --which draft` with the same "
        "seed, steps and optimiser: `digits-draft` on the noise that made x_t (the DDPM loss), "
        "`digits-draft-distilled` on the target's output at the same x_t (`--teacher specdemo/models/embedded/digits`).",
        "",
        f"### How far each draft misses the target ({len(results['misses'])} bands of training timesteps t)",
        "",
        "Mean over pixels of (out_draft - out_target)^2, on scikit-learn's digits noised to x_t "
        f"({IMAGES} images in a full run, the same x_t for both drafts).",
        "",
        "| t | " + " | ".join(DRAFTS) + " | distilled / trained on the noise |",
        "|---|---|---|---|",
    ]
    for row in results["misses"]:
        low, high = row["band"]
        lines.append(
            f"| {low}-{high - 1} | "
            + " | ".join(f"{row[name]:.5f}" for name in DRAFTS)
            + f" | {row[DRAFTS[1]] / row[DRAFTS[0]]:.2f} |"
        )
    lines += [
        "",
        "### Planned runs (the drafts section's network cells)",
        "",
        f"`--draft NAME --freeze auto --tree auto --budget {BUDGET} --objective calls`, block verification, the "
        f"defaults otherwise, class 3 ({sum(r['warm_ups'] for r in results['runs'])} warm-up calls). Pilot calls "
        "are not in the speedup (last columns).",
        "",
        "| steps | samples | seed | " + " | ".join(DRAFTS) + " | distilled vs trained on the noise | calls / sample "
        "| planned calls | pilot calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    runs = results["runs"]
    for steps, samples, seed in sorted(
        {(r["config"]["steps"], r["config"]["num_samples"], r["config"]["seed"]) for r in runs}
    ):
        pair = [find(runs, steps=steps, num_samples=samples, seed=seed, draft=name) for name in DRAFTS]
        lines.append(
            f"| {steps} | {samples} | {seed} | "
            + " | ".join(f"{s['speedup']:.2f}" for s in pair)
            + f" | {percent_gain(pair[1]['speedup'], pair[0]['speedup'])} | "
            + " / ".join(f"{s['target_calls_per_sample']:.2f}" for s in pair)
            + " | "
            + " / ".join(f"{s['planned_calls']:.2f}" for s in pair)
            + " | "
            + " / ".join(str(s["pilot_calls"]) for s in pair)
            + " |"
        )
    return "\n".join(lines)
