"""Small things several test modules build: tiny diffusers pipelines saved as safetensors, free ports,
the app served in its own process."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from benchmarks.common import tiny_clip_tokenizer, tiny_vae  # shared with the SD-sized benchmark

ROOT = Path(__file__).resolve().parents[1]


def tiny_unet(prediction: str = "epsilon", classes: int | None = None, channels: int = 1, seed: int = 0) -> UNet2DModel:
    """A random 8x8 UNet2DModel (two levels, no attention); prediction is recorded by the scheduler."""
    torch.manual_seed(seed)
    return UNet2DModel(
        sample_size=8,
        in_channels=channels,
        out_channels=channels,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        num_class_embeds=classes,
    )


def tiny_pipeline_folder(path, classes: int | None = 10, seed: int = 0, **scheduler) -> str:
    """A tiny UNet and its DDPMScheduler saved as a diffusers pipeline folder (the Hub layout)."""
    DDPMPipeline(unet=tiny_unet(classes=classes, seed=seed), scheduler=DDPMScheduler(**scheduler)).save_pretrained(
        str(path), safe_serialization=True
    )
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_clip_config(**extra):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_hidden_layers=2,
        **extra,
    )


def tiny_sd_folder(path, seed: int = 0, prediction: str = "epsilon", latent_channels: int = 4) -> str:
    """A tiny random StableDiffusionPipeline (UNet2DConditionModel on 8x8 latents, AutoencoderKL, CLIP
    text encoder and tokenizer) with SD 2.x's DDIMScheduler config, saved as safetensors."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    tokenizer = tiny_clip_tokenizer(path / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=latent_channels,
        out_channels=latent_channels,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
    )
    with torch.no_grad():  # at random init the output barely depends on t; a timestep bug must show
        unet.time_embedding.linear_2.weight.mul_(10)
    text_encoder = CLIPTextModel(tiny_clip_config())
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type=prediction,
    )
    pipeline = StableDiffusionPipeline(
        vae=tiny_vae(latent_channels=latent_channels),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def tiny_sd3_folder(path, seed: int = 0, shift: float = 3.0) -> str:
    """A tiny random StableDiffusion3Pipeline (SD3Transformer2DModel on 8x8 latents, AutoencoderKL with
    SD3's scaling and shift, two CLIP text encoders, no T5) with FlowMatchEulerDiscreteScheduler(shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    tokenizer = tiny_clip_tokenizer(path / "tokenizer")
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        caption_projection_dim=16,
        joint_attention_dim=32,
        pooled_projection_dim=32,
    )
    with torch.no_grad():  # at random init the output barely depends on t; a timestep bug must show
        transformer.time_text_embed.timestep_embedder.linear_2.weight.mul_(10)
    encoders = [CLIPTextModelWithProjection(tiny_clip_config(projection_dim=16)) for _ in range(2)]
    vae = tiny_vae(seed, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=1.5305, shift_factor=0.0609)
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        vae=vae,
        text_encoder=encoders[0],
        tokenizer=tokenizer,
        text_encoder_2=encoders[1],
        tokenizer_2=tokenizer,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipeline.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def two_sample_pvalue(a: torch.Tensor, b: torch.Tensor, coordinates=(0, 37, 101)) -> float:
    """Bonferroni-corrected KS p-value that samples a and b (B, ...) share one law, over low-dimensional
    summaries: each sample's mean, a fixed random projection, and a few coordinates."""
    from scipy import stats

    a, b = a.flatten(1).double(), b.flatten(1).double()
    direction = torch.randn(a.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    summaries = [lambda s: s.mean(1), lambda s: s @ direction] + [lambda s, i=i: s[:, i] for i in coordinates]
    pvalues = [stats.ks_2samp(f(a).numpy(), f(b).numpy()).pvalue for f in summaries]
    return min(1.0, min(pvalues) * len(pvalues))


def misaligned_unconditional_timesteps(network):
    """A planted bug in the guidance fold: the unconditional half of the rows takes the timestep of
    the row before it. Every row of a plain sampling call is at the same step, so plain sampling is
    unchanged; a speculative call mixes steps, so its guided outputs are wrong."""
    denoiser = network.denoiser

    def buggy(timestep, **kwargs):
        unconditional, conditional = timestep.chunk(2)
        return denoiser(timestep=torch.cat((unconditional.roll(1), conditional)), **kwargs)

    network.denoiser = buggy
    return network


@contextmanager
def served_app(folder=ROOT, env: dict | None = None, python: str = sys.executable, start_s: float = 120):
    """The app served by app.launch (what `python app.py` and the Space run) in its own process on a
    free port: `python` in `folder`, with `env` (default: this process's, offline). Yields (its address, its
    process). Its log goes to a file, read when it fails to start."""
    port = free_port()
    env = env or {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    code = f"import app; app.launch(server_name='127.0.0.1', server_port={port}, quiet=True)"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [python, "-c", code],
            cwd=folder,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        address = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + start_s
            while True:
                try:
                    urllib.request.urlopen(address, timeout=2).read()
                    break
                except OSError:
                    if proc.poll() is not None:
                        log.seek(0)
                        pytest.fail(f"the app exited: {log.read()[-2000:]}")
                    if time.monotonic() > deadline:
                        log.seek(0)
                        pytest.fail(f"the app did not start within {start_s:g} s: {log.read()[-2000:]}")
                    time.sleep(0.5)
            yield address, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def denoiser_rows_per_call(
    target, denoiser, state_argument: str, guidance: float, prompt: str
) -> tuple[list[int], object]:
    """A (2,2) tree run of a text-to-image target at this guidance weight: the rows of every call of its
    denoiser (a forward hook reads the batch of `state_argument`), and the run's cost."""
    from specdemo import SamplerConfig, build

    rows = []
    hook = denoiser.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(kwargs[state_argument].shape[0]), with_kwargs=True
    )
    try:
        problem = build(
            SamplerConfig(
                model=target.name,
                steps=12,
                method="tree",
                tree="2,2",
                num_samples=3,
                prompt=prompt,
                guidance_scale=guidance,
                device="cpu",
            ),
            target,
        )
        rows.clear()  # the build's warm-up calls
        return rows, problem.run().cost
    finally:
        hook.remove()


def assert_exact_and_a_misaligned_guidance_fold_caught(target, **settings) -> None:
    """Plain sampling against a chain (1x4) and a D-GRS tree (2,2) of a text-to-image target, both with
    the frozen draft, by a two-sample test on the latents; the same test rejects the tree run whose
    guidance fold gives the unconditional rows their neighbour's step (misaligned_unconditional_timesteps)."""
    from dataclasses import replace

    from specdemo import SamplerConfig, build

    base = dict(model=target.name, device="cpu", **settings)
    plain = build(SamplerConfig(**base, method="target", seed=1), target).run().samples
    chain = build(SamplerConfig(**base, method="chain", tree="1x4", seed=2), target).run()
    tree_problem = build(SamplerConfig(**base, method="tree", tree="2,2", verifier="dgrs", seed=3), target)
    tree = tree_problem.run()
    assert chain.cost.speedup > 1 and tree.cost.speedup > 1  # fewer calls than steps: speculation took place
    assert two_sample_pvalue(plain, chain.samples) > 1e-3
    assert two_sample_pvalue(plain, tree.samples) > 1e-3
    network = misaligned_unconditional_timesteps(target.network(tree_problem.kernel))
    assert two_sample_pvalue(plain, replace(tree_problem, network=network).run().samples) < 1e-3


def with_euler_ancestral_scheduler(folder: str, **overrides) -> str:
    """A pipeline folder's scheduler replaced by EulerAncestralDiscreteScheduler, read from the folder's
    scheduler config as diffusers' from_config reads it (spacing, steps_offset, betas and prediction type
    kept), `overrides` on top; model_index.json names the new scheduler."""
    from diffusers import EulerAncestralDiscreteScheduler

    config = EulerAncestralDiscreteScheduler.load_config(folder, subfolder="scheduler")
    EulerAncestralDiscreteScheduler.from_config({**config, **overrides}).save_pretrained(f"{folder}/scheduler")
    index_path = Path(folder) / "model_index.json"
    index = json.loads(index_path.read_text())
    index["scheduler"] = ["diffusers", "EulerAncestralDiscreteScheduler"]
    index_path.write_text(json.dumps(index, indent=2))
    return folder


def tiny_sd_euler_ancestral_folder(path, prediction: str = "epsilon", **scheduler) -> str:
    """tiny_sd_folder with EulerAncestralDiscreteScheduler as its scheduler: SD 2.x's settings (leading
    spacing, steps_offset 1) unless `scheduler` overrides them."""
    return with_euler_ancestral_scheduler(tiny_sd_folder(path, prediction=prediction), **scheduler)


def two_sample_pvalue_with_norm(a: torch.Tensor, b: torch.Tensor) -> float:
    """two_sample_pvalue's summaries and each sample's squared norm, Bonferroni-corrected over the six.
    The squared norm sees a wrong spread, which the location summaries miss: a wrong Euler ancestral
    step mostly changes how much of the noise survives, not where the samples lie."""
    from scipy import stats

    norms = [s.flatten(1).double().square().sum(1).numpy() for s in (a, b)]
    return min(1.0, 6 / 5 * two_sample_pvalue(a, b), 6 * stats.ks_2samp(*norms).pvalue)


def planted_euler_ancestral_bug(kernel, bug: str):
    """A copy of an EulerAncestralKernel with a planted bug, for power tests:

    - "rolled-sigma": each row of a mean reads the sigma index (the step's coefficients) of the row
      before it. Every row of a plain sampling step is at the same step, so plain sampling is
      unchanged bit for bit; a speculative verification mixes steps, so its target means are wrong.
    - "sigma-up-mean": the mean moves by sigma_up - sigma instead of sigma_down - sigma (the scales are
      right): every run with it samples another chain.
    """
    import copy

    from specdemo.kernels.vp import VPKernel

    buggy = copy.copy(kernel)
    if bug == "rolled-sigma":  # both ways a mean's coefficients are gathered: per call, and a round's at once

        def mean(out, x, n):
            return kernel.mean_with(kernel.coefficients(n.flatten().roll(1).view_as(n), x), out, x)

        def round_rows(n, out):
            return kernel.round_rows(n.roll(1), out)

        buggy.mean, buggy.round_rows = mean, round_rows
    elif bug == "sigma-up-mean":
        sigma, sigma_to = kernel.sigmas[:-1], kernel.sigmas[1:]
        k, k_to = (1 + sigma**2).sqrt(), (1 + sigma_to**2).sqrt()
        VPKernel.__init__(
            buggy,
            timesteps=kernel.timesteps,
            a=torch.zeros_like(sigma),
            b=k / k_to,
            c=(kernel.sigma_up - sigma) / k_to,
            scales=kernel.scales,
            alphas_cumprod_t=1 / k**2,
            prediction_type=kernel.prediction_type,
        )
    else:
        raise ValueError(bug)
    return buggy


@contextmanager
def recorded_prices(calls, driver: dict, plain_s: float):
    """Plans priced by time with recorded prices (`calls`: costs.CallCosts; `driver`: costs.driver_costs's;
    `plain_s`: plain sampling's expected seconds) instead of this machine's: a plan's shape then depends on
    the statistics alone, not on how loaded the machine is while the test runs."""
    from specdemo import planning
    from specdemo.planning import planner

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "call_costs", lambda problem, check, on_size: calls)
        patch.setattr(planner, "driver_costs", lambda problem, check: dict(driver))
        patch.setattr(planning, "plain_seconds", lambda problem, check: plain_s)
        patch.setattr(planning, "PRICED", {})
        yield
