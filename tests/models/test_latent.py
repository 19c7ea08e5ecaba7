"""Latent text-to-image targets (Stable Diffusion 1.x/2.x class) on a tiny random pipeline built here:
loading through the Hub code path, the guided network and kernels against diffusers' own pipeline and
scheduler, guidance rows in one UNet call, exactness of chains and trees (with a planted bug the same
test catches), draft networks and refusals; the same for the Euler ancestral kernel, on the tiny
pipeline with EulerAncestralDiscreteScheduler as its scheduler."""

from dataclasses import replace

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerAncestralDiscreteScheduler, StableDiffusionPipeline

from specdemo import SamplerConfig, build
from specdemo.errors import SpecdemoError
from specdemo.models import resolve_target

from ..helpers import (
    assert_exact_and_a_misaligned_guidance_fold_caught,
    denoiser_rows_per_call,
    planted_euler_ancestral_bug,
    tiny_pipeline_folder,
    tiny_sd_euler_ancestral_folder,
    tiny_sd_folder,
    two_sample_pvalue_with_norm,
    with_euler_ancestral_scheduler,
)

PROMPT, NEGATIVE = "a red circle", "blue"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-sd")
    return {
        "epsilon": tiny_sd_folder(root / "eps"),
        "v_prediction": tiny_sd_folder(root / "v", prediction="v_prediction"),
    }


@pytest.fixture(scope="module")
def target(folders):
    return resolve_target(folders["epsilon"])


def test_a_pipeline_folder_loads_like_a_hub_model_and_decodes(target, folders):
    assert type(target).__name__ == "LatentUNetTarget" and target.shape == (4, 8, 8)
    assert target.text_conditioned and target.kernels == ("ddpm", "ddim", "euler-ancestral")
    assert target.defaults["kernel"] == "ddpm"  # its scheduler is a DDIMScheduler
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    images = target.decode(latents)
    vae = target.pipeline.vae
    expected = vae.decode(latents / vae.config.scaling_factor).sample.clamp(-1, 1)
    assert images.shape == (2, 3, 16, 16) and torch.allclose(images, expected, atol=1e-6)


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_deterministic_ddim_follows_the_diffusers_pipeline_step_by_step(folders, prediction):
    """DDIM at eta = 0 with guidance: the adapter's m_n(x) = x_{n+1} at every step equals the latents
    StableDiffusionPipeline itself produces from the same start (prompt, negative prompt, guidance)."""
    folder = folders[prediction]
    problem = build(
        SamplerConfig(
            model=folder,
            kernel="ddim",
            eta=0.0,
            steps=6,
            method="target",
            num_samples=3,
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            guidance_scale=5.0,
            device="cpu",
        )
    )
    pipe = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    x = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    seen = []
    pipe(
        [PROMPT] * 3,
        negative_prompt=[NEGATIVE] * 3,
        guidance_scale=5.0,
        num_inference_steps=6,
        eta=0.0,
        latents=x,
        output_type="latent",
        callback_on_step_end=lambda p, i, t, kw: seen.append(kw["latents"]) or kw,
    )
    k, net, state = problem.kernel, problem.network, x
    assert torch.equal(k.timesteps, pipe.scheduler.timesteps)
    for n, expected in enumerate(seen):
        steps = torch.full((3,), n)
        state = k.mean(net(state, steps, **problem.cond), state, steps)
        assert torch.allclose(state, expected, atol=1e-5), n


@pytest.mark.parametrize("kernel", ["ddpm", "ddim"])
def test_stochastic_means_and_scales_equal_the_scheduler_step(folders, kernel):
    """m_n and s_n of ddpm and ddim (eta 0.7) against scheduler.step of that scheduler built from the
    pipeline's config, at the guided network output, noise removed."""
    folder = folders["v_prediction"]
    problem = build(
        SamplerConfig(
            model=folder, kernel=kernel, eta=0.7, steps=10, method="target", num_samples=4, prompt=PROMPT, device="cpu"
        )
    )
    k, net = problem.kernel, problem.network
    sched = (DDPMScheduler if kernel == "ddpm" else DDIMScheduler).from_pretrained(folder, subfolder="scheduler")
    sched.set_timesteps(10)
    x = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    for n in (0, 4, 8):
        steps = torch.full((4,), n)
        out, t = net(x, steps, **problem.cond), int(sched.timesteps[n])
        if kernel == "ddpm":
            noisy = sched.step(out, t, x, generator=torch.Generator().manual_seed(3)).prev_sample
            expected = noisy - k.scales[n].float() * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
        else:
            expected = sched.step(out, t, x, eta=0.7, variance_noise=torch.zeros_like(x)).prev_sample
            ones = sched.step(out, t, x, eta=0.7, variance_noise=torch.ones_like(x)).prev_sample
            assert float((ones - expected).mean()) == pytest.approx(float(k.scales[n]), rel=1e-4)
        assert k.scales[n] > 0 and torch.allclose(k.mean(out, x, steps), expected, atol=1e-5)


def test_guidance_rows_of_every_node_share_one_unet_call(target):
    """Each target call is one UNet call of 2R rows (unconditional, then conditional); w = 1 is R rows."""
    for guidance, rows_per_row in ((7.5, 2), (1.0, 1)):
        batches, cost = denoiser_rows_per_call(target, target.pipeline.unet, "sample", guidance, PROMPT)
        assert len(batches) == cost.target_calls
        assert sum(batches) == rows_per_row * (cost.rows_per_trajectory.sum() + cost.padded_rows)


@pytest.mark.slow
@pytest.mark.statistical
def test_chains_and_trees_are_exact_and_a_misaligned_guidance_fold_is_caught(target):
    """Latents of 1,200 trajectories each: plain sampling against a chain and a tree (frozen draft),
    by the same two-sample test that rejects the tree run with the planted guidance bug (p about 1e-5
    at 1,000 trajectories)."""
    assert_exact_and_a_misaligned_guidance_fold_caught(
        target, steps=10, num_samples=1200, prompt=PROMPT, guidance_scale=7.5
    )


def test_a_draft_network_of_the_same_latent_space_drafts(target, tmp_path):
    draft = tiny_sd_folder(tmp_path / "draft", seed=5)
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


@pytest.mark.parametrize(
    "variant, reason",
    [
        (dict(prediction="v_prediction"), "prediction_type"),
        (dict(latent_channels=3), "latent shape"),
    ],
)
def test_a_draft_of_another_process_is_refused_with_its_reason(target, tmp_path, variant, reason):
    draft = tiny_sd_folder(tmp_path / "draft", **variant)
    with pytest.raises(SpecdemoError, match=f"cannot draft for .*{reason}"):
        build(SamplerConfig(model=target.name, draft=draft, method="chain", prompt=PROMPT, device="cpu"), target)


def test_a_draft_with_another_vae_is_refused(target, tmp_path):
    from diffusers import AutoencoderKL

    draft = tiny_sd_folder(tmp_path / "draft")
    vae = AutoencoderKL.from_pretrained(draft, subfolder="vae")
    vae.register_to_config(scaling_factor=0.13025)
    vae.save_pretrained(f"{draft}/vae", safe_serialization=True)
    with pytest.raises(SpecdemoError, match="VAE's scaling_factor .* another latent space"):
        build(SamplerConfig(model=target.name, draft=draft, method="chain", prompt=PROMPT, device="cpu"), target)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(guidance_scale=0.5), "guidance scale must be a finite number >= 1"),
        (dict(guidance_scale=float("nan")), "guidance_scale must be a finite number"),
        (dict(negative_prompt="blue", guidance_scale=1.0), "negative prompt acts through guidance"),
        (dict(prompt="x" * 2001), "at most 2000 characters"),
    ],
)
def test_bad_prompt_settings_are_refused_in_one_line(target, settings, message):
    with pytest.raises(SpecdemoError, match=message) as err:
        build(SamplerConfig(model=target.name, method="target", device="cpu", **settings), target)
    assert "\n" not in str(err.value)


def test_a_prompt_for_a_model_without_text_is_refused():
    with pytest.raises(SpecdemoError, match="gm2d is not a text-to-image model; leave out --prompt"):
        build(SamplerConfig(model="gm2d", prompt=PROMPT, method="target", device="cpu"))


# ---------------------------------------------------------------- Euler ancestral

EULER_SETTINGS = dict(
    kernel="euler-ancestral", steps=10, num_samples=800, prompt=PROMPT, guidance_scale=7.5, device="cpu"
)


@pytest.fixture(scope="module")
def euler_folders(tmp_path_factory):
    """SD 2.x's settings (leading spacing, steps_offset 1) for epsilon; trailing spacing for v_prediction."""
    root = tmp_path_factory.mktemp("tiny-sd-euler")
    return {
        "epsilon": tiny_sd_euler_ancestral_folder(root / "eps"),
        "v_prediction": tiny_sd_euler_ancestral_folder(
            root / "v", prediction="v_prediction", timestep_spacing="trailing", steps_offset=0
        ),
    }


@pytest.fixture(scope="module")
def euler_target(euler_folders):
    return resolve_target(euler_folders["epsilon"])


@pytest.fixture(scope="module")
def euler_plain(euler_target):
    """800 latents by plain sampling with the Euler ancestral kernel, and the problem that drew them."""
    problem = build(SamplerConfig(model=euler_target.name, method="target", seed=1, **EULER_SETTINGS), euler_target)
    return problem, problem.run().samples


def test_euler_ancestral_is_the_default_where_the_pipeline_schedules_with_it(euler_target, tmp_path):
    assert euler_target.kernels == ("ddpm", "ddim", "euler-ancestral")
    assert euler_target.defaults["kernel"] == "euler-ancestral"
    problem = build(
        SamplerConfig(model=euler_target.name, steps=4, method="target", num_samples=1, prompt=PROMPT, device="cpu"),
        euler_target,
    )
    assert problem.kernel.name == "euler-ancestral" and problem.kernel.config()["scheduler"]["steps_offset"] == 1
    # a pixel UNet2DModel pipeline too; with its DDPM scheduler it stays on ddpm
    pixel = tiny_pipeline_folder(tmp_path / "pixel")
    assert resolve_target(pixel).defaults["kernel"] == "ddpm"
    pixel_target = resolve_target(with_euler_ancestral_scheduler(pixel))
    assert pixel_target.defaults["kernel"] == "euler-ancestral" and "euler-ancestral" in pixel_target.kernels
    result = build(
        SamplerConfig(model=pixel, method="chain", tree="1x3", steps=8, num_samples=2, device="cpu"), pixel_target
    ).run()
    assert result.cost.steps == 8 and torch.isfinite(result.samples).all()


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_euler_ancestral_follows_the_diffusers_pipeline_step_by_step(euler_folders, prediction):
    """StableDiffusionPipeline with its EulerAncestralDiscreteScheduler, guidance and a negative prompt,
    from the same start noise and with the same step noises (its generator's draws): the adapter's
    state after every step, y_{n+1} = m_n(y_n) + s_n xi_n, is the pipeline's latent divided by
    sqrt(1 + sigma_{n+1}^2), and the last one is the pipeline's latent itself."""
    folder, steps = euler_folders[prediction], 6
    problem = build(
        SamplerConfig(
            model=folder,
            steps=steps,
            method="target",
            num_samples=3,
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            guidance_scale=5.0,
            device="cpu",
        )
    )
    pipe = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe.scheduler, EulerAncestralDiscreteScheduler)
    shape = (3, 4, 8, 8)
    xi = torch.randn(shape, generator=torch.Generator().manual_seed(1))  # the pipeline scales it by init_noise_sigma
    seen = []
    pipe(
        [PROMPT] * 3,
        negative_prompt=[NEGATIVE] * 3,
        guidance_scale=5.0,
        num_inference_steps=steps,
        latents=xi,
        generator=torch.Generator().manual_seed(4),
        output_type="latent",
        callback_on_step_end=lambda p, i, t, kw: seen.append(kw["latents"]) or kw,
    )
    k, net = problem.kernel, problem.network
    assert k.name == "euler-ancestral" and torch.equal(k.timesteps, pipe.scheduler.timesteps)
    state = k.prior(shape, torch.Generator().manual_seed(1), "cpu", torch.float32)
    sigmas = pipe.scheduler.sigmas.double()
    torch.testing.assert_close(
        state.double() * (1 + sigmas[0] ** 2).sqrt(), xi.double() * float(pipe.scheduler.init_noise_sigma)
    )
    noise = torch.Generator().manual_seed(4)
    for n, expected in enumerate(seen):
        rows = torch.full((3,), n)
        xi_n = torch.randn(shape, generator=noise)  # the scheduler's draw at this step
        state = k.mean(net(state, rows, **problem.cond), state, rows) + k.scale(rows, state) * xi_n
        expected = (expected.double() / (1 + sigmas[n + 1] ** 2).sqrt()).float()
        assert torch.allclose(state, expected, rtol=1e-4, atol=1e-4), (n, float((state - expected).abs().max()))
    assert sigmas[-1] == 0 and torch.allclose(state, seen[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.statistical
def test_euler_ancestral_chains_and_trees_are_exact(euler_target, euler_plain):
    """800 latents each: plain sampling against a chain (1x4) and a D-GRS tree (2,2) with the frozen
    draft, by two_sample_pvalue's summaries and the squared norm (two_sample_pvalue_with_norm), the
    test that catches the planted kernel bugs below."""
    _, plain = euler_plain
    for method, tree, verifier, seed in (("chain", "1x4", None, 2), ("tree", "2,2", "dgrs", 3)):
        result = build(
            SamplerConfig(
                model=euler_target.name, method=method, tree=tree, verifier=verifier, seed=seed, **EULER_SETTINGS
            ),
            euler_target,
        ).run()
        assert result.cost.speedup > 1  # fewer calls than steps: speculation took place
        pvalue = two_sample_pvalue_with_norm(plain, result.samples)
        assert pvalue > 1e-3, (method, pvalue)


@pytest.mark.parametrize("bug", ["rolled-sigma", "sigma-up-mean"])
@pytest.mark.slow
@pytest.mark.statistical
def test_a_planted_euler_ancestral_kernel_bug_is_caught(euler_target, euler_plain, bug):
    """The tree run of the exactness test with a wrong Euler ancestral kernel (planted_euler_ancestral_bug):
    each row's mean read at its neighbour's sigma index, which leaves plain sampling unchanged bit for
    bit and breaks only speculation; or the mean moved by sigma_up - sigma_n instead of sigma_down - sigma_n.
    The same test rejects both (measured: p about 1e-29 and 7e-8; two_sample_pvalue alone: 0.26 and 0.30)."""
    problem, plain = euler_plain
    tree_problem = build(
        SamplerConfig(model=euler_target.name, method="tree", tree="2,2", verifier="dgrs", seed=3, **EULER_SETTINGS),
        euler_target,
    )
    buggy = planted_euler_ancestral_bug(tree_problem.kernel, bug)
    if bug == "rolled-sigma":
        assert torch.equal(replace(problem, kernel=buggy).run().samples, plain)
    pvalue = two_sample_pvalue_with_norm(plain, replace(tree_problem, kernel=buggy).run().samples)
    assert pvalue < 1e-3, pvalue
