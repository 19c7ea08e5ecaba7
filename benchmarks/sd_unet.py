"""A Stable-Diffusion-sized UNet: target calls and wall-clock of plain sampling, a chain and auto, at
batch 1 and 50 steps, on a random UNet2DConditionModel of Stable Diffusion 1.5's configuration (the
issue "Model families").

The pipeline folder is built here and loaded by specdemo's own loader (models/latent.py): the UNet is
SD 1.5's (860M parameters, 4x64x64 latents), the scheduler config SD 1.5's; the text encoder,
tokenizer and VAE are tiny (the encoder as wide as SD's text embeddings, 768), since only the UNet is
called while sampling. The section is a GPU run (scripts/gpu_check.sh): on a CPU a UNet of this size
takes seconds a row. Without CUDA it says "pending";
`quick` runs a small UNet of the same kind on the CPU, for a smoke test.

The pipeline folder holds SD 1.5's scheduler config (PNDMScheduler, scaled-linear betas 0.00085 to 0.012); the
library samples it with its DDPM kernel. Rows: plain target sampling; a chain of 4 drafts by the frozen network
output (the default freeze), verified by RMC; and the first run of `tree="auto"` with the device's defaults: no
plan cached (each run built anew with an empty plan cache), so it samples with the online plan and learns from
its own rounds, no pilot (docs/algorithms.md, section 6). Speedup is the calls ratio against plain sampling
(stochastic steps over the target calls spent on them); wall-clock is the sampling, and the total adds what
planning and learning took (pilot_s and learn_s: everything counted but loading and the kernels' set-up, which
plain sampling pays too), each row against the plain sampler and the chain in the same process (on CUDA the
median of 3 runs). With random weights, acceptance follows how the network's output moves from step to step,
which training changes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from specdemo.models import resolve_target
from specdemo.sampling.cost import time_speedup

from .common import image_config, image_rows, run_cell, tiny_clip_tokenizer, tiny_vae

TITLE = "A Stable-Diffusion-sized UNet: calls and wall-clock"
PENDING = (
    "Pending: this section is a GPU run (scripts/gpu_check.sh), and no CUDA device was lent to the machine "
    "that wrote this file. On a CPU a UNet of this size takes seconds a row."
)
PROMPT = "a photograph of an astronaut riding a horse"
GUIDANCE = 7.5  # SD 1.x's default: each target call is one UNet call of twice its rows
PROMPTED = {"prompt": PROMPT, "guidance_scale": GUIDANCE}  # every row's text conditioning
PLAIN, CHAIN, AUTO = "plain target", "chain 1x4 rmc (freeze out)", "auto's first run, the defaults (empty plan cache)"
CONFIGS = [
    (PLAIN, {"method": "target"}),
    (CHAIN, {"method": "chain", "tree": "1x4", "verifier": "rmc"}),
]
AUTO_SETTINGS = {"method": "tree", "tree": "auto", "pilot": False}  # a plan learnt from the run, never piloted

# Stable Diffusion 1.5's unet/config.json (stable-diffusion-v1-5/stable-diffusion-v1-5), written out: the
# values diffusers' UNet2DConditionModel defaults to, with SD 1.5's sample size and CLIP ViT-L/14 width
SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=768,
    attention_head_dim=8,
    norm_num_groups=32,
    act_fn="silu",
    flip_sin_to_cos=True,
    freq_shift=0,
    downsample_padding=1,
    mid_block_scale_factor=1,
    norm_eps=1e-5,
    center_input_sample=False,
)
# quick: the same shape of network, two levels, 4x16x16 latents
QUICK_UNET = dict(
    SD15_UNET,
    sample_size=16,
    layers_per_block=1,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    norm_num_groups=8,
)
# Stable Diffusion 1.5's scheduler/scheduler_config.json (clip_sample is no PNDMScheduler argument: from_config
# keeps it in the config, which the library's ddpm kernel, its kernel for this scheduler, is built from)
SD15_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    trained_betas=None,
    skip_prk_steps=True,
    set_alpha_to_one=False,
    steps_offset=1,
    clip_sample=False,
)
SD15_STEPS, QUICK_STEPS = 50, 10


def sd_sized_pipeline(folder: Path, quick: bool = False) -> str:
    """A StableDiffusionPipeline folder (safetensors) with a random UNet of SD 1.5's configuration (seed 0)
    and SD 1.5's scheduler config (PNDMScheduler); its text encoder (one layer, as wide as the UNet's
    cross-attention), tokenizer and VAE are tiny: sampling calls the UNet alone. quick: QUICK_UNET."""
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    config = QUICK_UNET if quick else SD15_UNET
    tokenizer = tiny_clip_tokenizer(folder / "tokenizer", max_length=77)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**config)
    width = config["cross_attention_dim"]
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            vocab_size=64,
            hidden_size=width,
            intermediate_size=64,
            num_attention_heads=8,
            num_hidden_layers=1,
            max_position_embeddings=77,
        )
    )
    vae = tiny_vae()
    StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=PNDMScheduler.from_config(SD15_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    ).save_pretrained(str(folder), safe_serialization=True)
    return str(folder)


def rows_on(device: str, folder: str, target, steps: int, repeats: int) -> list[dict]:
    """Every row's summary on `device`, in one process: the plain sampler and the chain as image_rows runs
    them, and `repeats` first runs of auto."""
    configs = [(name, {**settings, **PROMPTED}) for name, settings in CONFIGS]
    rows = image_rows(folder, steps, 1, device, configs, class_label=None, repeats=repeats, target=target)
    named = [{**summary, "name": name} for (name, _), (_, summary) in zip(configs, rows, strict=True)]
    return [*named, {**first_run(device, folder, target, steps, repeats), "name": AUTO}]


def total_s(run: dict) -> float:
    """A row's seconds, everything counted: sampling, pilots and learning (results from before learning
    after a run existed, 2026-12-04, have no learn_s: those runs learnt nothing after sampling)."""
    return run["wall_s"] + run["pilot_s"] + run.get("learn_s", 0.0)


def first_run(device: str, folder: str, target, steps: int, repeats: int) -> dict:
    """auto's first run `repeats` times, each built anew with an empty plan cache: the summary of the run
    of median total_s (the lower of the middle two for an even count)."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            settings = {**AUTO_SETTINGS, **PROMPTED, "cache_dir": cache}
            runs.append(run_cell(image_config(folder, steps, 1, device, None, **settings), 1, target, with_pilot=True))
    return sorted(runs, key=total_s)[(repeats - 1) // 2]


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict | None]:
    """trajectories: unused (batch 1). On CUDA, fp16; without it, "pending" (quick: QUICK_UNET at
    QUICK_STEPS steps on the CPU, for a smoke test)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not quick:
        return PENDING, None
    steps = QUICK_STEPS if quick else SD15_STEPS
    with tempfile.TemporaryDirectory() as tmp:
        folder = sd_sized_pipeline(Path(tmp) / "sd-sized", quick)
        target = resolve_target(folder)
        parameters = sum(p.numel() for p in target.pipeline.unet.parameters())
        runs = rows_on(device, folder, target, steps, 3 if device == "cuda" else 1)
    name = torch.cuda.get_device_name() + ", fp16" if device == "cuda" else "CPU, fp32"
    results = {"device": name, "parameters": parameters, "steps": steps, "runs": runs}
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone."""
    config = QUICK_UNET if results["steps"] == QUICK_STEPS else SD15_UNET
    size = config["sample_size"]
    device, runs = results["device"], results["runs"]
    lines = [
        "A UNet2DConditionModel of Stable Diffusion 1.5's configuration"
        + (" (a small one, for a smoke run)" if config is QUICK_UNET else "")
        + ", with **random weights**: the calls ratio shows the engine at this size, not trained SD 1.5 weights.",
        "",
        "| parameters | blocks | cross-attention | latents | scheduler | steps | batch | prompt | guidance | "
        "wall-clock |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {results['parameters'] / 1e6:.{0 if config is SD15_UNET else 2}f}M | "
        f"{', '.join(map(str, config['block_out_channels']))}, {config['layers_per_block']} layers a block | "
        f"{config['cross_attention_dim']}-wide text embeddings | {config['in_channels']}x{size}x{size}"
        + (f" ({8 * size}x{8 * size} images)" if config is SD15_UNET else "")
        + " | SD 1.5's PNDMScheduler config (scaled-linear betas "
        f"{SD15_SCHEDULER['beta_start']} to {SD15_SCHEDULER['beta_end']}), the library's DDPM kernel "
        f"| {results['steps']} | 1 | {PROMPT} | {GUIDANCE} (each target call one UNet call of twice its rows) | "
        + ("median of 3 runs" if device.endswith("fp16") else "one run")
        + " |",
        "",
        "| device | method | target calls | speedup | rows/call | acceptance | sampling s | pilots and learning s | "
        "total s | total vs plain | total vs chain | pilot calls | speedup_total |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain, chain = total_s(runs[0]), total_s(runs[1])
    for r in runs:
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        total = total_s(r)
        lines.append(
            f"| {device} | {r['name']} | {r['target_calls']} | {r['speedup']:.2f} | {r['rows_per_call']:.1f} | "
            f"{acceptance} | {r['wall_s']:.2f} | {total - r['wall_s']:.2f} | {total:.2f} | "
            f"{time_speedup(total, plain):.2f}x | {time_speedup(total, chain):.2f}x | {r['pilot_calls']} | "
            f"{r['speedup_total']:.2f} |"
        )
    return "\n".join(lines)
