"""Analytic targets: the Gaussian-mixture network is exact (its output is the one implied by the
score of the noised mixture, computed here by autograd of a log density written independently),
mixture files are checked, gm512 follows algorithms.md section 5, and the 2-D densities' scores are
the gradients of their log densities.
"""

import json
import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from specdemo.errors import SpecdemoError
from specdemo.kernels import DDIMKernel, DDPMKernel, FlowChurnKernel, LangevinKernel
from specdemo.targets import Banana, GaussianMixture, Ring, gm512
from specdemo.targets.mixture import MIXTURE_JSON_HELP

# unequal, unnormalised weights and unequal stds, so that normalisation and per-component
# variances matter
WEIGHTS = [1.0, 2.0, 0.5]
MEANS = [[1.0, -0.5, 0.3, 0.0], [-1.2, 0.8, 0.0, 0.4], [0.2, 0.2, -1.5, 1.0]]
STDS = [0.3, 0.6, 0.2]


def mixture():
    return GaussianMixture.from_arrays(WEIGHTS, MEANS, STDS)


def log_p_noised(x, alpha, sigma):
    """log density of x_t = alpha x0 + sigma xi, x0 ~ the mixture: a mixture of N(alpha mu_k, v_k I),
    v_k = alpha^2 tau_k^2 + sigma^2. Written from scratch (float64); alpha, sigma: (R,) per row."""
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    log_w = (w / w.sum()).log()
    mu = torch.tensor(MEANS, dtype=torch.float64)
    tau = torch.tensor(STDS, dtype=torch.float64)
    d = mu.shape[1]
    terms = []
    for k in range(len(WEIGHTS)):
        v = alpha**2 * tau[k] ** 2 + sigma**2  # (R,)
        sq = ((x - alpha[:, None] * mu[k]) ** 2).sum(-1)  # (R,)
        terms.append(log_w[k] - 0.5 * d * torch.log(2 * math.pi * v) - 0.5 * sq / v)
    return torch.logsumexp(torch.stack(terms, -1), -1)


def score_noised(x, alpha, sigma):
    """grad_x log p_t(x) by autograd; alpha, sigma (R,) per row."""
    x = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(log_p_noised(x, alpha, sigma).sum(), x)
    return grad


def clean(n_rows):
    """alpha = 1, sigma = 0: the clean mixture."""
    return torch.ones(n_rows, dtype=torch.float64), torch.zeros(n_rows, dtype=torch.float64)


def states(n_rows, seed):
    g = torch.Generator().manual_seed(seed)
    return 1.2 * torch.randn(n_rows, len(MEANS[0]), generator=g, dtype=torch.float64)


def vp_eps_from_output(out, x, abar, prediction):
    """eps-hat from a VP network output, by the usual identities (diffusers' conventions)."""
    a, b = abar.sqrt()[:, None], (1 - abar).sqrt()[:, None]
    if prediction == "epsilon":
        return out
    if prediction == "v_prediction":  # v = a eps - b x0
        return a * out + b * x
    return (x - a * out) / b  # out = x0


def vp_kernel(kind, prediction, num_steps):
    if kind == "ddpm":
        sched = DDPMScheduler(
            num_train_timesteps=1000, beta_schedule="linear", clip_sample=False, prediction_type=prediction
        )
        return DDPMKernel(sched, num_steps), sched
    sched = DDIMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", clip_sample=False, prediction_type=prediction
    )
    return DDIMKernel(sched, num_steps, 1.0), sched


@pytest.mark.parametrize(
    "kind,prediction",
    [("ddpm", "epsilon"), ("ddpm", "v_prediction"), ("ddpm", "sample"), ("ddim", "epsilon"), ("ddim", "sample")],
)
def test_vp_mixture_network_is_exact(kind, prediction):
    """eps-hat(x, t) = -sqrt(1 - abar_t) grad log p_t(x) for x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) xi."""
    num_steps = 40
    kernel, sched = vp_kernel(kind, prediction, num_steps)
    sched.set_timesteps(num_steps)
    net = mixture().network(kernel)
    steps = torch.arange(num_steps)
    x = states(num_steps, seed=1)
    abar = sched.alphas_cumprod.to(torch.float64)[sched.timesteps]
    out = net(x, steps)
    assert out.shape == x.shape and out.dtype == x.dtype
    eps = vp_eps_from_output(out, x, abar, prediction)
    alpha, sigma = abar.sqrt(), (1 - abar).sqrt()
    expected = -sigma[:, None] * score_noised(x, alpha, sigma)
    torch.testing.assert_close(eps, expected, rtol=1e-7, atol=1e-8)


def test_flow_mixture_network_is_exact():
    """For x_t = (1 - t) x0 + t xi the network returns v = (x - E[x0 | x]) / t; its eps-hat =
    (x - (1 - t) x0-hat) / t equals -t grad log p_t(x)."""
    num_steps = 30
    kernel = FlowChurnKernel(num_steps, 0.06)
    net = mixture().network(kernel)
    t = torch.tensor(np.linspace(1000.0, 1.0, num_steps) / 1000.0)
    x = states(num_steps, seed=2)
    v = net(x, torch.arange(num_steps))
    x0_hat = x - t[:, None] * v
    eps = (x - (1 - t[:, None]) * x0_hat) / t[:, None]
    expected = -t[:, None] * score_noised(x, 1 - t, t)
    # the kernel's t grid comes from the scheduler's float32 sigmas: compare to float32 precision
    torch.testing.assert_close(eps, expected, rtol=1e-5, atol=1e-5)


def test_langevin_mixture_network_is_the_score():
    kernel = LangevinKernel(10, 0.01)
    net = mixture().network(kernel)
    x = states(16, seed=3)
    expected = score_noised(x, *clean(16))
    torch.testing.assert_close(net(x, torch.zeros(16, dtype=torch.long)), expected, rtol=1e-8, atol=1e-8)
    # and the clean log density, up to no constant (it is normalised)
    torch.testing.assert_close(mixture().log_density(x), log_p_noised(x, *clean(16)), rtol=1e-10, atol=1e-10)


def test_mixture_network_works_in_float32_and_far_from_the_data():
    """Far-away states must not give NaN (responsibilities computed in log space)."""
    kernel = LangevinKernel(10, 0.01)
    net = mixture().network(kernel)
    x = torch.tensor([[40.0, -40.0, 40.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = net(x, torch.zeros(2, dtype=torch.long))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


# ---------------------------------------------------------------- mixture files


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mixture_json_good_file(tmp_path):
    path = write(tmp_path, "good.json", json.dumps({"weights": WEIGHTS, "means": MEANS, "stds": STDS}))
    m = GaussianMixture.from_json(path)
    assert m.dim == 4 and m.shape == (4,)
    assert m.weights == tuple(WEIGHTS) and m.stds == tuple(STDS)
    assert m.means == tuple(tuple(r) for r in MEANS)
    # round trip
    assert GaussianMixture.from_json(write(tmp_path, "again.json", json.dumps(m.to_json()))) == m


@pytest.mark.parametrize(
    "spec,words",
    [
        ({"weights": [1.0], "means": [[0.0, 0.0]]}, ["stds"]),
        ({"means": [[0.0, 0.0]], "stds": [1.0]}, ["weights"]),
        ({"weights": [1.0, 1.0], "means": [[0.0, 0.0], [1.0]], "stds": [1.0, 1.0]}, ["mean"]),
        ({"weights": [1.0, 1.0], "means": [[0.0, 0.0], [1.0, 1.0]], "stds": [1.0, -0.5]}, ["std"]),
        ({"weights": [1.0, 1.0], "means": [[0.0, 0.0], [1.0, 1.0]], "stds": [1.0, 0.0]}, ["std"]),
        ({"weights": [1.0, 1.0], "means": [[0.0, float("nan")], [1.0, 1.0]], "stds": [1.0, 1.0]}, ["nan"]),
        ({"weights": [1.0, -1.0], "means": [[0.0, 0.0], [1.0, 1.0]], "stds": [1.0, 1.0]}, ["weight"]),
        ({"weights": [1.0], "means": [[0.0, 0.0], [1.0, 1.0]], "stds": [1.0, 1.0]}, ["weights", "means"]),
        ({"weights": [], "means": [], "stds": []}, ["mean"]),
    ],
    ids=[
        "missing-stds",
        "missing-weights",
        "ragged-means",
        "negative-std",
        "zero-std",
        "nan-mean",
        "negative-weight",
        "count-mismatch",
        "empty",
    ],
)
def test_mixture_json_malformed(tmp_path, spec, words):
    path = write(tmp_path, "bad.json", json.dumps(spec))  # json.dumps writes NaN as the NaN literal
    with pytest.raises(SpecdemoError) as err:
        GaussianMixture.from_json(path)
    # the path holds the test's name and the format help names every key: look at the rest
    message = str(err.value).replace(str(path), "<path>").replace(MIXTURE_JSON_HELP, "<help>").lower()
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert "traceback" not in message


def test_mixture_json_not_json_or_missing(tmp_path):
    with pytest.raises(SpecdemoError, match="bad.json"):
        GaussianMixture.from_json(write(tmp_path, "bad.json", "{weights: oops"))
    with pytest.raises(SpecdemoError, match="nowhere.json"):
        GaussianMixture.from_json(tmp_path / "nowhere.json")


# ---------------------------------------------------------------- presets and densities


def test_gm512_follows_the_recipe():
    """algorithms.md section 5: d = 512, 5 equal weights, means uniform [-2, 2] then stds uniform
    [0.10, 0.25], both from numpy's default_rng(20260714) in that order."""
    rng = np.random.default_rng(20260714)
    means = rng.uniform(-2.0, 2.0, size=(5, 512))
    stds = rng.uniform(0.10, 0.25, size=5)
    m = gm512()
    assert m.dim == 512
    np.testing.assert_array_equal(np.array(m.means), means)
    np.testing.assert_array_equal(np.array(m.stds), stds)
    w = np.array(m.weights)
    np.testing.assert_allclose(w / w.sum(), np.full(5, 0.2), rtol=1e-15)


def autograd_score(density, x):
    x = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(density.log_density(x).sum(), x)
    return grad


@pytest.mark.parametrize(
    "density",
    [Banana(), Banana(a=0.8, b=1.3), Ring(), Ring(radius=1.0, width=0.1)],
    ids=["banana", "banana-2", "ring", "ring-2"],
)
def test_density_score_is_the_gradient_of_its_log_density(density):
    x = 2.0 * torch.randn(200, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x = x[x.norm(dim=1) > 1e-3]  # the ring's log density has a kink at the origin
    torch.testing.assert_close(density.score(x), autograd_score(density, x), rtol=1e-10, atol=1e-10)


def test_densities_refuse_non_langevin_kernels():
    with pytest.raises(SpecdemoError, match="langevin"):
        Banana().network(FlowChurnKernel(30, 0.06))
    net = Ring().network(LangevinKernel(5, 0.01))
    x = torch.tensor([[2.0, 0.5], [0.1, -3.0]], dtype=torch.float64)
    torch.testing.assert_close(net(x, torch.zeros(2, dtype=torch.long)), Ring().score(x))
