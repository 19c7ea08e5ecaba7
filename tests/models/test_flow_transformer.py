"""SD3-class flow transformer targets on a tiny random pipeline built here: loading through the Hub
code path, the guided transformer and the churn kernel against diffusers' own pipeline and scheduler,
guidance rows in one transformer call, exactness of chains and trees (with a planted bug the same
test catches), draft refusals."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

from specdemo import SamplerConfig, build
from specdemo.errors import SpecdemoError
from specdemo.models import resolve_target

from ..helpers import assert_exact_and_a_misaligned_guidance_fold_caught, denoiser_rows_per_call, tiny_sd3_folder

PROMPT, NEGATIVE = "a red circle", "blue"
pytestmark = pytest.mark.usefixtures("one_thread")
SEQUENCE = 8  # T5 tokens (zeros: the tiny pipeline has no T5), fewer than diffusers' 256 to keep the test short


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_sd3_folder(tmp_path_factory.mktemp("tiny-sd3") / "sd3")


@pytest.fixture(scope="module")
def target(folder):
    target = resolve_target(folder)
    target.max_sequence_length = SEQUENCE
    return target


def test_a_pipeline_folder_loads_like_a_hub_model_and_decodes(target):
    assert type(target).__name__ == "FlowTransformerTarget" and target.shape == (4, 8, 8)
    assert target.kernels == ("flow-churn",) and target.defaults["kernel"] == "flow-churn"
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    vae = target.pipeline.vae
    expected = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample.clamp(-1, 1)
    assert torch.allclose(target.decode(latents), expected, atol=1e-6)


def test_churn_free_steps_follow_the_diffusers_pipeline_step_by_step(target, folder):
    """At churn 0 the kernel is the scheduler's Euler step: m_n(x) equals the latents
    StableDiffusion3Pipeline produces from the same start, with guidance and a negative prompt, on the
    shifted t grid of its scheduler."""
    problem = build(
        SamplerConfig(
            model=folder,
            churn=0.0,
            steps=6,
            method="target",
            num_samples=3,
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            guidance_scale=5.0,
            device="cpu",
        ),
        target,
    )
    pipe = StableDiffusion3Pipeline.from_pretrained(folder, text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    x = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    seen = []
    pipe(
        [PROMPT] * 3,
        negative_prompt=[NEGATIVE] * 3,
        guidance_scale=5.0,
        num_inference_steps=6,
        latents=x,
        output_type="latent",
        max_sequence_length=SEQUENCE,
        callback_on_step_end=lambda p, i, t, kw: seen.append(kw["latents"]) or kw,
    )
    k, net, state = problem.kernel, problem.network, x
    assert torch.equal(k.timesteps, pipe.scheduler.timesteps) and pipe.scheduler.config.shift == 3.0
    assert len(seen) == 6 and float(k.scales.max()) == 0.0
    for n, expected in enumerate(seen):
        steps = torch.full((3,), n)
        state = k.mean(net(state, steps, **problem.cond), state, steps)
        assert torch.allclose(state, expected, atol=1e-5), n


def test_the_churn_kernel_takes_the_shifted_grid(target):
    """With churn c the kernel's t grid is the scheduler's shifted sigmas, and s_n = c g(t) sqrt(-dt)."""
    kernel = build(
        SamplerConfig(
            model=target.name, churn=0.3, steps=12, method="target", num_samples=1, prompt=PROMPT, device="cpu"
        ),
        target,
    ).kernel
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(target.scheduler_config)
    scheduler.set_timesteps(12)
    t = scheduler.sigmas.double()
    g = (2 * t[1:-2] / (1 - t[1:-2])).sqrt()
    assert torch.allclose(kernel.scales[1:-1], 0.3 * g * (t[1:-2] - t[2:-1]).sqrt())
    assert kernel.scales[0] == 0 and kernel.scales[-1] == 0


def test_guidance_rows_of_every_node_share_one_transformer_call(target):
    """Each target call is one transformer call of 2R rows (unconditional, then conditional); w = 1 is R rows."""
    for guidance, rows_per_row in ((7.0, 2), (1.0, 1)):
        batches, cost = denoiser_rows_per_call(target, target.pipeline.transformer, "hidden_states", guidance, PROMPT)
        assert len(batches) == cost.target_calls
        assert sum(batches) == rows_per_row * (cost.rows_per_trajectory.sum() + cost.padded_rows)


@pytest.mark.slow
@pytest.mark.statistical
def test_chains_and_trees_are_exact_and_a_misaligned_guidance_fold_is_caught(target):
    """Latents of 2,000 trajectories each under the churn kernel: plain sampling against a chain and a
    tree (frozen draft), by the same two-sample test that rejects the tree run with the planted bug."""
    assert_exact_and_a_misaligned_guidance_fold_caught(
        target, steps=10, churn=0.5, num_samples=2000, prompt=PROMPT, guidance_scale=7.0
    )


def test_a_draft_network_of_the_same_latent_space_drafts(target, tmp_path):
    draft = tiny_sd3_folder(tmp_path / "draft", seed=5)
    assert target.draft_mismatch(resolve_target(draft)) is None
    result = build(
        SamplerConfig(
            model=target.name,
            draft=draft,
            steps=10,
            method="chain",
            tree="1x3",
            num_samples=2,
            prompt=PROMPT,
            device="cpu",
        ),
        target,
    ).run()
    assert result.cost.draft_calls > 0 and torch.isfinite(result.samples).all()


def test_a_draft_with_another_shift_is_refused(target, tmp_path):
    draft = tiny_sd3_folder(tmp_path / "draft", shift=1.0)
    with pytest.raises(SpecdemoError, match="cannot draft for .*scheduler's shift is 1.0, the target's 3.0"):
        build(SamplerConfig(model=target.name, draft=draft, method="chain", prompt=PROMPT, device="cpu"), target)


def test_a_latent_unet_pipeline_cannot_draft_for_it(target, tmp_path):
    from ..helpers import tiny_sd_folder

    with pytest.raises(SpecdemoError, match="cannot draft for .*not a Stable Diffusion 3-class"):
        build(
            SamplerConfig(
                model=target.name, draft=tiny_sd_folder(tmp_path / "sd"), method="chain", prompt=PROMPT, device="cpu"
            ),
            target,
        )


def test_other_kernels_are_refused(target):
    with pytest.raises(SpecdemoError, match="runs with the flow-churn kernel, not 'ddpm'"):
        build(SamplerConfig(model=target.name, kernel="ddpm", method="target", prompt=PROMPT, device="cpu"), target)
