"""On a CUDA GPU (scripts/gpu_check.sh runs these with -m gpu): the same engine, exact and
reproducible there too, and the image models in fp16."""

import pytest
import torch

from specdemo import SamplerConfig, build

from .test_exactness import min_pvalue_bonferroni

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def needs_cuda():
    assert torch.cuda.is_available(), "these tests run on a CUDA machine (scripts/gpu_check.sh)"


def test_same_seed_same_samples_on_cuda():
    cfg = SamplerConfig(model="gm16", steps=40, method="tree", tree="3,2,2", verifier="rank", num_samples=64,
                        device="cuda")
    a, b = build(cfg).run(), build(cfg).run()
    assert a.samples.device.type == "cuda" and torch.equal(a.samples, b.samples)


@pytest.mark.parametrize("tree,verifier", [("1x4", "rmc"), ("1x6", "block"), ("3,2,2", "dgrs"), ("3,2,2", "rank")])
def test_exact_on_cuda(tree, verifier):
    base = dict(model="gm16", steps=40, num_samples=10_000, device="cuda")
    plain = build(SamplerConfig(**base, method="target", seed=1)).run(keep_steps=[20])
    spec = build(SamplerConfig(**base, method="chain" if tree.startswith("1x") else "tree", tree=tree,
                               verifier=verifier, draft_bias=1.0, seed=2)).run(keep_steps=[20])
    assert min_pvalue_bonferroni(spec.samples.cpu(), plain.samples.cpu()) > 1e-3
    assert min_pvalue_bonferroni(spec.states[20].cpu(), plain.states[20].cpu()) > 1e-3


def test_cpu_and_cuda_draw_the_same_law():
    base = dict(model="gm16", steps=40, method="tree", tree="3,2,2", num_samples=10_000)
    cpu = build(SamplerConfig(**base, device="cpu", seed=3)).run()
    gpu = build(SamplerConfig(**base, device="cuda", seed=4)).run()
    assert min_pvalue_bonferroni(cpu.samples, gpu.samples.cpu()) > 1e-3


@pytest.mark.parametrize("draft,freeze", [("frozen", None), ("digits-draft", None), ("digits-draft", "auto")])
def test_digits_fp16_on_cuda(draft, freeze):
    """The frozen draft, the draft network, and per step the corrected network or a frozen form."""
    result = build(SamplerConfig(model="digits", steps=100, method="tree", tree="2,2,1", verifier="rank", draft=draft,
                                 freeze=freeze, num_samples=16, class_label=3, device="cuda")).run()
    assert result.samples.shape == (16, 1, 16, 16) and torch.isfinite(result.samples).all()
    assert result.cost.speedup > 1.2
