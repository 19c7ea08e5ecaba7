"""Kernels against their references: diffusers' own `scheduler.step` (DDPM, DDIM, Euler ancestral), the formulas of
algorithms.md section 1 (flow matching with churn, Langevin) and the kernel interface contract.

Every VP check runs a batch whose rows are each at a different step, as the sampler calls kernels.
The reference mean and scale come from the scheduler alone: `step` is affine in the noise it adds,
so two calls with known noises give the scale (their difference) and the mean (either call minus
its noise times that scale). The reference schedulers run in float64 on their own (float32) alphas:
in float32, 1 - abar_t / abar_prev loses about 4 digits near t = 0, which would hide real errors.

Tolerances: the kernels' means agree with the float64 reference to rounding, but their scales s_n are
taken from the scheduler's `_get_variance` evaluated in float32 (relative error up to 5e-5 at t = 1
with 1,000 steps), hence SCALE_RTOL; DDIM's c_n = sqrt(1 - abar_prev - s_n^2) inherits it, amplified
by 1 / sqrt(1 - abar_t) for sample prediction near t = 0, hence DDIM_MEAN_ATOL. A wrong formula is
off by orders of magnitude more.

Euler ancestral's state is the VP state y = x_sigma / sqrt(1 + sigma^2) (the network's input): its
reference is EulerAncestralDiscreteScheduler.step on x_sigma, which computes in float32 whatever it is
given, read back in y (divided by sqrt(1 + sigma_{n+1}^2)). Its float32 rounding is relative to the
largest term of the step, |x_sigma| or sigma |out| (up to 4096 |y| on a zero-terminal-SNR schedule),
hence EULER_RTOL of that size per row.
"""

import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerAncestralDiscreteScheduler, FlowMatchEulerDiscreteScheduler

from specdemo.errors import SpecdemoError
from specdemo.kernels import DDIMKernel, DDPMKernel, EulerAncestralKernel, FlowChurnKernel, LangevinKernel

DIM = 8
PREDICTIONS = ("epsilon", "v_prediction", "sample")
SCALE_RTOL = 1e-4
DDIM_MEAN_ATOL = 5e-4
EULER_RTOL = 1e-6


def scheduler_config(prediction, clip, variance_type="fixed_small"):
    return dict(
        num_train_timesteps=1000,
        beta_schedule="linear",
        prediction_type=prediction,
        clip_sample=clip,
        variance_type=variance_type,
    )


def rows_for(num_steps):
    """Step indices tested: every step for short schedules, a spread with both ends for N = 1000."""
    if num_steps <= 100:
        return torch.arange(num_steps)
    return torch.unique(torch.cat([torch.arange(0, num_steps, 37), torch.tensor([1, 2, num_steps - 2, num_steps - 1])]))


def inputs(n_rows, seed, prediction):
    g = torch.Generator().manual_seed(seed)
    x = 1.5 * torch.randn(n_rows, DIM, generator=g, dtype=torch.float64)
    # sample-prediction outputs spread past the clip range so that clipping matters
    out = (2.0 if prediction == "sample" else 1.0) * torch.randn(n_rows, DIM, generator=g, dtype=torch.float64)
    return x, out


def noise(seed):
    """The noise DDPMScheduler.step draws from a CPU generator seeded with `seed` (randn_tensor)."""
    return torch.randn((1, DIM), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def in_float64(sched):
    """The scheduler computing in float64 from the same alphas_cumprod values."""
    sched.alphas_cumprod = sched.alphas_cumprod.to(torch.float64)
    for name in ("one", "final_alpha_cumprod"):
        if hasattr(sched, name):
            setattr(sched, name, torch.as_tensor(getattr(sched, name), dtype=torch.float64))
    return sched


def ddpm_reference(config, num_steps, steps, x, out):
    """(mean, std) per row from DDPMScheduler.step: called with two seeds, noise reconstructed."""
    sched = in_float64(DDPMScheduler(**config))
    sched.set_timesteps(num_steps)
    means, stds = [], []
    for i, n in enumerate(steps.tolist()):
        t = int(sched.timesteps[n])
        xi, oi = x[i : i + 1], out[i : i + 1]
        seeds = (1000 + 2 * i, 1001 + 2 * i)
        prev = [sched.step(oi, t, xi, generator=torch.Generator().manual_seed(s)).prev_sample for s in seeds]
        if t == 0:  # the scheduler adds no noise at t = 0
            assert torch.equal(prev[0], prev[1])
            means.append(prev[0][0])
            stds.append(0.0)
            continue
        d_noise = noise(seeds[0]) - noise(seeds[1])
        std = float(((prev[0] - prev[1]) * d_noise).sum() / (d_noise * d_noise).sum())
        # the difference is exactly std times the difference of the noises
        torch.testing.assert_close(prev[0] - prev[1], std * d_noise, rtol=1e-6, atol=1e-9)
        means.append((prev[0] - std * noise(seeds[0]))[0])
        stds.append(std)
    return torch.stack(means), torch.tensor(stds, dtype=torch.float64)


def ddim_reference(config, num_steps, eta, steps, x, out):
    """(mean, std) per row from DDIMScheduler.step with variance_noise zeros and ones."""
    sched = in_float64(DDIMScheduler(**{k: v for k, v in config.items() if k != "variance_type"}))
    sched.set_timesteps(num_steps)
    means, stds = [], []
    for i, n in enumerate(steps.tolist()):
        t = int(sched.timesteps[n])
        xi, oi = x[i : i + 1], out[i : i + 1]
        m = sched.step(oi, t, xi, eta=eta, variance_noise=torch.zeros_like(xi)).prev_sample
        m1 = sched.step(oi, t, xi, eta=eta, variance_noise=torch.ones_like(xi)).prev_sample
        means.append(m[0])
        stds.append(float((m1 - m).mean()))
    return torch.stack(means), torch.tensor(stds, dtype=torch.float64)


@pytest.mark.parametrize("num_steps", [1000, 50, 7])
@pytest.mark.parametrize("variance_type", ["fixed_small", "fixed_large"])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_ddpm_kernel_matches_scheduler_step(prediction, clip, variance_type, num_steps):
    config = scheduler_config(prediction, clip, variance_type)
    kernel = DDPMKernel(DDPMScheduler(**config), num_steps)
    assert kernel.num_steps == num_steps
    steps = rows_for(num_steps)
    x, out = inputs(len(steps), seed=num_steps + 7 * clip, prediction=prediction)
    x_before, out_before = x.clone(), out.clone()
    ref_mean, ref_std = ddpm_reference(config, num_steps, steps, x, out)
    mean = kernel.mean(out, x, steps)
    assert torch.equal(x, x_before) and torch.equal(out, out_before), "mean() must not modify its inputs"
    torch.testing.assert_close(mean, ref_mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(kernel.scales[steps], ref_std, rtol=SCALE_RTOL, atol=1e-12)
    # scale() broadcasts s_n against the state
    torch.testing.assert_close(
        kernel.scale(steps, x).expand_as(x), ref_std[:, None].expand_as(x), rtol=SCALE_RTOL, atol=1e-12
    )


@pytest.mark.parametrize("variance_type", ["fixed_small", "fixed_large"])
def test_ddpm_kernel_matches_algorithms_md_formula(variance_type):
    """Section 1, first row: m = (x - beta_t / sqrt(1 - abar_t) eps) / sqrt(alpha_t), s = sqrt(beta~_t) or
    sqrt(beta_t), with alpha_t = abar_t / abar_prev for a strided schedule; the final step is deterministic."""
    num_steps = 50
    sched = DDPMScheduler(**scheduler_config("epsilon", False, variance_type))
    kernel = DDPMKernel(sched, num_steps)
    sched.set_timesteps(num_steps)
    abar = sched.alphas_cumprod.to(torch.float64)
    ts = sched.timesteps.tolist()
    steps = torch.arange(num_steps)
    x, eps = inputs(num_steps, seed=3, prediction="epsilon")
    expected_mean, expected_std = [], []
    for i, t in enumerate(ts):
        a_t = abar[t]
        a_prev = abar[ts[i + 1]] if i + 1 < num_steps else torch.tensor(1.0, dtype=torch.float64)
        alpha = a_t / a_prev
        beta = 1 - alpha
        expected_mean.append((x[i] - beta / (1 - a_t).sqrt() * eps[i]) / alpha.sqrt())
        beta_tilde = (1 - a_prev) / (1 - a_t) * beta
        std = beta_tilde.sqrt() if variance_type == "fixed_small" else beta.sqrt()
        expected_std.append(std if t > 0 else torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(kernel.mean(eps, x, steps), torch.stack(expected_mean), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(kernel.scales, torch.stack(expected_std), rtol=SCALE_RTOL, atol=1e-12)
    assert kernel.scales[-1] == 0 and (kernel.scales[:-1] > 0).all()


def test_ddpm_fixed_large_log_scale_is_a_standard_deviation():
    """ "fixed_large_log" (GLIDE's max_log) stores the log variance log(beta_t): the std it stands for is
    sqrt(beta_t). A kernel must either refuse this variance type or use a non-negative scale, never the
    log itself (a negative s_n makes every step silently deterministic)."""
    config = scheduler_config("epsilon", False, "fixed_large_log")
    try:
        kernel = DDPMKernel(DDPMScheduler(**config), 50)
    except SpecdemoError:
        return
    assert (kernel.scales >= 0).all(), f"negative kernel scales: {kernel.scales[:3].tolist()} ..."
    large = DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", False, "fixed_large")), 50)
    torch.testing.assert_close(kernel.scales, large.scales)


def test_ddpm_fixed_small_log_matches_fixed_small():
    small = DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", False, "fixed_small")), 50)
    small_log = DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", False, "fixed_small_log")), 50)
    torch.testing.assert_close(small_log.scales, small.scales, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("variance_type", ["learned", "learned_range"])
def test_ddpm_learned_variance_refused(variance_type):
    with pytest.raises(SpecdemoError, match=variance_type):
        DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", False, variance_type)), 50)


def test_thresholding_refused():
    with pytest.raises(SpecdemoError, match="threshold"):
        DDPMKernel(DDPMScheduler(thresholding=True), 50)
    with pytest.raises(SpecdemoError, match="threshold"):
        DDIMKernel(DDIMScheduler(thresholding=True), 50, 1.0)


@pytest.mark.parametrize("num_steps", [50, 1000])
@pytest.mark.parametrize("eta", [0.5, 1.0])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_ddim_kernel_matches_scheduler_step(prediction, clip, eta, num_steps):
    config = scheduler_config(prediction, clip)
    kernel = DDIMKernel(DDIMScheduler(**{k: v for k, v in config.items() if k != "variance_type"}), num_steps, eta)
    steps = rows_for(num_steps)
    x, out = inputs(len(steps), seed=11 + num_steps + 3 * clip, prediction=prediction)
    ref_mean, ref_std = ddim_reference(config, num_steps, eta, steps, x, out)
    torch.testing.assert_close(kernel.mean(out, x, steps), ref_mean, rtol=1e-5, atol=DDIM_MEAN_ATOL)
    torch.testing.assert_close(kernel.scales[steps], ref_std, rtol=SCALE_RTOL, atol=1e-12)


def test_ddim_scale_matches_algorithms_md_formula():
    """s = eta sqrt((1 - abar_prev) / (1 - abar_t)) sqrt(1 - abar_t / abar_prev); the last step
    (abar_prev = 1 with set_alpha_to_one) has s = 0."""
    eta, num_steps = 0.5, 20
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    kernel = DDIMKernel(sched, num_steps, eta)
    sched.set_timesteps(num_steps)
    abar = sched.alphas_cumprod.to(torch.float64)
    expected = []
    for t in sched.timesteps.tolist():
        a_t = abar[t]
        a_prev = abar[t - 1000 // num_steps] if t - 1000 // num_steps >= 0 else torch.tensor(1.0, dtype=torch.float64)
        expected.append(eta * ((1 - a_prev) / (1 - a_t)).sqrt() * (1 - a_t / a_prev).sqrt())
    torch.testing.assert_close(kernel.scales, torch.stack(expected), rtol=SCALE_RTOL, atol=1e-12)
    assert kernel.scales[-1] == 0 and (kernel.scales[:-1] > 0).all()


def test_ddim_eta_zero_is_deterministic_and_bad_eta_refused():
    kernel = DDIMKernel(DDIMScheduler(clip_sample=False), 25, 0.0)
    assert (kernel.scales == 0).all()
    assert (kernel.stochastic_run_lengths() == 0).all()
    for eta in (-0.1, 1.5):
        with pytest.raises(SpecdemoError, match="eta"):
            DDIMKernel(DDIMScheduler(clip_sample=False), 25, eta)


# ---------------------------------------------------------------- Euler ancestral

SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
EULER_SCHEDULES = {  # timestep spacings as diffusers' configs give them
    "linspace": dict(timestep_spacing="linspace"),
    "leading-offset": dict(timestep_spacing="leading", steps_offset=1, **SD_BETAS),  # SD 1.x / 2.x
    "trailing": dict(timestep_spacing="trailing", **SD_BETAS),
    "trailing-zero-snr": dict(timestep_spacing="trailing", rescale_betas_zero_snr=True, **SD_BETAS),
}


def euler_reference(config, num_steps, x_sigma, out):
    """Per step n (row n: its own sigma-space state and network output), from two schedulers walked
    through the whole schedule with EulerAncestralDiscreteScheduler.step, noise drawn from seeded
    generators: (mean, std, x0-hat, network input) in sigma space, and the scheduler's sigmas."""
    walkers = [EulerAncestralDiscreteScheduler(**config) for _ in range(2)]
    for w in walkers:
        w.set_timesteps(num_steps)
    means, stds, x0s, inputs_ = [], [], [], []
    for n, t in enumerate(walkers[0].timesteps):
        xi, oi = x_sigma[n : n + 1].float(), out[n : n + 1].float()
        seeds = (2000 + 2 * n, 2001 + 2 * n)
        inputs_.append(walkers[0].scale_model_input(xi, t)[0].double())
        walkers[1].scale_model_input(xi, t)
        steps = [
            w.step(oi, t, xi, generator=torch.Generator().manual_seed(s)) for w, s in zip(walkers, seeds, strict=True)
        ]
        noises = [torch.randn((1, DIM), generator=torch.Generator().manual_seed(s)).double() for s in seeds]
        prev = [step.prev_sample.double() for step in steps]
        d_noise = noises[0] - noises[1]
        std = float(((prev[0] - prev[1]) * d_noise).sum() / (d_noise * d_noise).sum())
        torch.testing.assert_close(prev[0] - prev[1], std * d_noise, rtol=1e-4, atol=1e-5)
        means.append((prev[0] - std * noises[0])[0])
        stds.append(std)
        x0s.append(steps[0].pred_original_sample[0].double())
    return (
        torch.stack(means),
        torch.tensor(stds, dtype=torch.float64),
        torch.stack(x0s),
        torch.stack(inputs_),
        walkers[0].sigmas.double(),
    )


@pytest.mark.parametrize("num_steps", [7, 50, 1000])
@pytest.mark.parametrize("schedule", list(EULER_SCHEDULES))
@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_euler_ancestral_kernel_matches_scheduler_step(prediction, schedule, num_steps):
    """Step by step over the whole schedule, the kernel at y = x_sigma / sqrt(1 + sigma_n^2) against
    EulerAncestralDiscreteScheduler.step at x_sigma with the same network output and noise: the
    network input (scale_model_input) is y, the mean and scale are the step's read in y, and x0-hat is
    the step's pred_original_sample."""
    config = dict(prediction_type=prediction, **EULER_SCHEDULES[schedule])
    kernel = EulerAncestralKernel(EulerAncestralDiscreteScheduler(**config), num_steps)
    assert kernel.num_steps == num_steps and kernel.name == "euler-ancestral"
    steps = torch.arange(num_steps)
    y, out = inputs(num_steps, seed=23 + num_steps, prediction=prediction)
    sched = EulerAncestralDiscreteScheduler(**config)
    sched.set_timesteps(num_steps)
    assert torch.equal(kernel.timesteps, sched.timesteps)  # what the network is fed, fractional ones included
    k = (1 + sched.sigmas.double() ** 2).sqrt()
    x_sigma = y * k[:-1, None]
    ref_mean, ref_std, ref_x0, ref_input, sigmas = euler_reference(config, num_steps, x_sigma, out)
    # float32 rounding of the reference, per row in sigma space: relative to the step's largest term
    size = 1 + torch.maximum(x_sigma.abs().amax(1), sigmas[:-1] * out.abs().amax(1))
    k_to = k[1:]

    def assert_close_in_sigma_space(mine, reference, rtol=0.0):  # rows of steps
        bound = (EULER_RTOL * size).view(-1, *[1] * (mine.dim() - 1)) + rtol * reference.abs()
        assert ((mine - reference).abs() <= bound).all(), float(((mine - reference).abs() / bound).max())

    torch.testing.assert_close(ref_input, y, rtol=1e-6, atol=1e-6)  # the network's input is the state
    assert_close_in_sigma_space(kernel.mean(out, y, steps) * k_to[:, None], ref_mean)
    assert_close_in_sigma_space(kernel.scales * k_to, ref_std, SCALE_RTOL)  # float32 sigma_from^2 - sigma_to^2
    assert_close_in_sigma_space(kernel.denoised(out, y, steps), ref_x0)
    # every step is stochastic but the last (sigma_N = 0), which returns x0-hat itself, and a step whose
    # sigma does not decrease: leading spacing with steps_offset 1 at 1,000 steps asks for t = 1000, whose
    # sigma diffusers clamps to t = 999's, an identity step
    stochastic = (sigmas[1:] > 0) & (sigmas[1:] < sigmas[:-1])
    assert torch.equal(kernel.scales > 0, stochastic)
    assert kernel.scales[-1] == 0 and int(stochastic.sum()) >= num_steps - 2


@pytest.mark.parametrize("spacing", ["leading", "linspace"])
def test_euler_ancestral_matches_the_algorithms_md_step(spacing):
    """docs/algorithms.md, Euler ancestral: sigma_n^2 = (1 - abar_t)/abar_t, k_n = sqrt(1 + sigma_n^2),
    sigma_up = sigma_{n+1} sqrt(1 - sigma_{n+1}^2 / sigma_n^2), sigma_down = sigma_{n+1}^2 / sigma_n,
    m_n(y) = (k_n / k_{n+1}) y + ((sigma_down - sigma_n) / k_{n+1}) eps, s_n = sigma_up / k_{n+1},
    written from the training alphas in float64 (sigma interpolated linearly in t, as diffusers does,
    at linspace's fractional timesteps); the prior is diffusers' init_noise_sigma xi divided by k_0."""
    num_steps = 20
    sched = EulerAncestralDiscreteScheduler(timestep_spacing=spacing, steps_offset=1 if spacing == "leading" else 0)
    kernel = EulerAncestralKernel(sched, num_steps)
    train_sigma = ((1 - sched.alphas_cumprod.double()) / sched.alphas_cumprod.double()).sqrt().numpy()
    if spacing == "leading":
        t = np.arange(num_steps)[::-1] * (1000 // num_steps) + 1.0
    else:
        t = np.linspace(0, 999, num_steps)[::-1]
    sigma = torch.tensor(np.append(np.interp(t, np.arange(1000), train_sigma), 0.0))
    s, s_to = sigma[:-1], sigma[1:]
    k, k_to = (1 + s**2).sqrt(), (1 + s_to**2).sqrt()
    up, down = s_to * (1 - s_to**2 / s**2).sqrt(), s_to**2 / s
    y, eps = inputs(num_steps, seed=29, prediction="epsilon")
    expected = (k / k_to)[:, None] * y + ((down - s) / k_to)[:, None] * eps
    torch.testing.assert_close(kernel.mean(eps, y, torch.arange(num_steps)), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kernel.scales, up / k_to, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kernel.timesteps.double(), torch.tensor(t.copy()), rtol=0, atol=1e-3)
    init = s[0] if spacing == "linspace" else k[0]  # diffusers' init_noise_sigma
    y0 = kernel.prior((4, DIM), torch.Generator().manual_seed(3), "cpu", torch.float64)
    xi = torch.randn((4, DIM), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(y0, xi * float(init / k[0]), rtol=1e-6, atol=0)
    if spacing == "leading":
        assert torch.equal(y0, xi)  # init_noise_sigma = k_0: the VP prior is the standard normal itself


def test_euler_ancestral_refuses_sample_prediction_and_unknown_spacing():
    with pytest.raises(SpecdemoError, match="epsilon or v_prediction"):
        EulerAncestralKernel(EulerAncestralDiscreteScheduler(prediction_type="sample"), 20)
    with pytest.raises(SpecdemoError, match="spacing"):
        EulerAncestralKernel(EulerAncestralDiscreteScheduler(timestep_spacing="karras"), 20)


def test_euler_ancestral_config_names_the_kernel_and_its_scheduler():
    config = EulerAncestralKernel(EulerAncestralDiscreteScheduler(timestep_spacing="trailing"), 12).config()
    assert config["kernel"] == "euler-ancestral" and config["steps"] == 12
    assert config["scheduler"]["timestep_spacing"] == "trailing"
    assert not any(key.startswith("_") for key in config["scheduler"])


# ---------------------------------------------------------------- flow matching with churn


def flow_grid(num_steps):
    """algorithms.md section 1: t_n = linspace(1000, 1, T)[n] / 1000, then 0."""
    return np.append(np.linspace(1000.0, 1.0, num_steps) / 1000.0, 0.0)


@pytest.mark.parametrize("churn", [0.06, 0.5])
@pytest.mark.parametrize("num_steps", [30, 10])
def test_flow_churn_matches_algorithms_md(num_steps, churn):
    kernel = FlowChurnKernel(num_steps, churn)
    assert kernel.num_steps == num_steps
    grid = flow_grid(num_steps)
    t, dt = grid[:-1], np.diff(grid)
    steps = torch.arange(num_steps)
    x, v = inputs(num_steps, seed=5, prediction="v")
    expected_mean, expected_std = [], []
    for i in range(num_steps):
        if i == 0 or i == num_steps - 1:  # deterministic Euler endpoints
            expected_mean.append(x[i] + dt[i] * v[i])
            expected_std.append(0.0)
            continue
        g2 = 2 * t[i] / (1 - t[i])
        k = churn**2 * g2 / (2 * t[i])
        expected_mean.append(x[i] * (1 + dt[i] * k) + v[i] * dt[i] * (1 + k * (1 - t[i])))
        expected_std.append(churn * math.sqrt(g2) * math.sqrt(-dt[i]))
    torch.testing.assert_close(kernel.mean(v, x, steps), torch.stack(expected_mean), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kernel.scales, torch.tensor(expected_std, dtype=torch.float64), rtol=1e-5, atol=0.0)
    # the network's time input is 1000 t, as diffusers flow models take it
    torch.testing.assert_close(kernel.timesteps.double(), torch.tensor(1000 * t), rtol=1e-6, atol=1e-4)


def test_flow_churn_30_steps_has_28_stochastic_steps():
    kernel = FlowChurnKernel(30, 0.06)
    stochastic = kernel.scales > 0
    assert not stochastic[0] and not stochastic[-1]
    assert int(stochastic.sum()) == 28
    assert torch.isfinite(kernel.scales).all()


def test_flow_without_churn_is_the_schedulers_euler_step():
    num_steps = 12
    kernel = FlowChurnKernel(num_steps, 0.0)
    assert (kernel.scales == 0).all()
    x, v = inputs(num_steps, seed=8, prediction="v")
    expected = []
    for i in range(num_steps):
        sched = FlowMatchEulerDiscreteScheduler()
        sched.set_timesteps(num_steps)
        expected.append(sched.step(v[i : i + 1], sched.timesteps[i], x[i : i + 1]).prev_sample[0])
    torch.testing.assert_close(
        kernel.mean(v, x, torch.arange(num_steps)), torch.stack(expected).double(), rtol=1e-5, atol=1e-5
    )


def test_flow_negative_churn_refused():
    with pytest.raises(SpecdemoError, match="churn"):
        FlowChurnKernel(30, -0.1)


# ---------------------------------------------------------------- Langevin


def test_langevin_kernel():
    gamma = 0.03
    kernel = LangevinKernel(7, gamma, init_std=2.0)
    x, score = inputs(7, seed=9, prediction="score")
    steps = torch.arange(7).flip(0)
    torch.testing.assert_close(kernel.mean(score, x, steps), x + gamma * score)
    torch.testing.assert_close(kernel.scales, torch.full((7,), math.sqrt(2 * gamma), dtype=torch.float64))
    assert torch.equal(kernel.stochastic_run_lengths(), torch.tensor([7, 6, 5, 4, 3, 2, 1, 0]))
    y0 = kernel.prior((20000,), torch.Generator().manual_seed(0), "cpu", torch.float64)
    assert abs(float(y0.std()) - 2.0) < 0.05 and abs(float(y0.mean())) < 0.05
    assert not kernel.has_denoised
    for gamma in (0.0, -1.0):
        with pytest.raises(SpecdemoError, match="gamma"):
            LangevinKernel(7, gamma)


# ---------------------------------------------------------------- shared interface


def vp_and_flow_kernels():
    kernels = {f"ddpm-{p}": DDPMKernel(DDPMScheduler(**scheduler_config(p, False)), 50) for p in PREDICTIONS}
    kernels.update(
        {f"ddim-{p}": DDIMKernel(DDIMScheduler(clip_sample=False, prediction_type=p), 50, 1.0) for p in PREDICTIONS}
    )
    kernels.update(
        {
            f"euler-ancestral-{p}": EulerAncestralKernel(EulerAncestralDiscreteScheduler(prediction_type=p), 50)
            for p in ("epsilon", "v_prediction")
        }
    )
    kernels["flow-churn"] = FlowChurnKernel(30, 0.06)
    return kernels


@pytest.mark.parametrize("name", list(vp_and_flow_kernels()))
def test_denoised_and_output_from_denoised_are_inverses(name):
    kernel = vp_and_flow_kernels()[name]
    steps = torch.arange(kernel.num_steps)
    x, out = inputs(kernel.num_steps, seed=13, prediction="any")
    x0 = kernel.denoised(out, x, steps)
    torch.testing.assert_close(kernel.output_from_denoised(x0, x, steps), out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        kernel.denoised(kernel.output_from_denoised(out, x, steps), x, steps), out, rtol=1e-9, atol=1e-9
    )
    assert kernel.has_denoised


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_vp_denoised_is_the_schedulers_x0_estimate(prediction):
    num_steps = 50
    config = scheduler_config(prediction, False)
    kernel = DDPMKernel(DDPMScheduler(**config), num_steps)
    sched = in_float64(DDPMScheduler(**config))
    sched.set_timesteps(num_steps)
    steps = torch.arange(num_steps)
    x, out = inputs(num_steps, seed=17, prediction=prediction)
    expected = torch.stack(
        [
            sched.step(
                out[i : i + 1], int(sched.timesteps[i]), x[i : i + 1], generator=torch.Generator().manual_seed(0)
            ).pred_original_sample[0]
            for i in range(num_steps)
        ]
    )
    torch.testing.assert_close(kernel.denoised(out, x, steps), expected, rtol=1e-9, atol=1e-9)


def test_flow_denoised_is_x_minus_t_v():
    kernel = FlowChurnKernel(30, 0.06)
    t = torch.tensor(flow_grid(30)[:-1])
    x, v = inputs(30, seed=19, prediction="v")
    torch.testing.assert_close(kernel.denoised(v, x, torch.arange(30)), x - t[:, None] * v, rtol=1e-6, atol=1e-6)


def test_mean_broadcasts_over_rows_and_nodes():
    """Leading dimensions are the step tensor's: (rows, nodes) states with per-(row, node) steps."""
    kernel = DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", True)), 50)
    g = torch.Generator().manual_seed(21)
    x = torch.randn(3, 4, DIM, generator=g, dtype=torch.float64)
    out = torch.randn(3, 4, DIM, generator=g, dtype=torch.float64)
    steps = torch.randint(0, 50, (3, 4), generator=g)
    flat = kernel.mean(out.flatten(0, 1), x.flatten(0, 1), steps.flatten())
    torch.testing.assert_close(kernel.mean(out, x, steps), flat.view(3, 4, DIM))


def test_stochastic_run_lengths():
    ddpm = DDPMKernel(DDPMScheduler(**scheduler_config("epsilon", False)), 50)
    # every step stochastic except the last (t = 0): r[n] = 49 - n, then r[49] = r[50] = 0
    assert torch.equal(ddpm.stochastic_run_lengths(), torch.tensor(list(range(49, 0, -1)) + [0, 0]))
    flow = FlowChurnKernel(30, 0.06)
    # deterministic first and last steps: r = [0, 28, 27, ..., 1, 0, 0]
    assert torch.equal(flow.stochastic_run_lengths(), torch.tensor([0] + list(range(28, 0, -1)) + [0, 0]))
    ddim = DDIMKernel(DDIMScheduler(clip_sample=False), 10, 1.0)
    assert torch.equal(ddim.stochastic_run_lengths(), torch.tensor(list(range(9, 0, -1)) + [0, 0]))
