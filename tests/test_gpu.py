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
    cfg = SamplerConfig(
        model="gm16", steps=40, method="tree", tree="3,2,2", verifier="rank", num_samples=64, device="cuda"
    )
    a, b = build(cfg).run(), build(cfg).run()
    assert a.samples.device.type == "cuda" and torch.equal(a.samples, b.samples)


@pytest.mark.parametrize("tree,verifier", [("1x4", "rmc"), ("1x6", "block"), ("3,2,2", "dgrs"), ("3,2,2", "rank")])
@pytest.mark.statistical
def test_exact_on_cuda(tree, verifier):
    base = dict(model="gm16", steps=40, num_samples=10_000, device="cuda")
    plain = build(SamplerConfig(**base, method="target", seed=1)).run(keep_steps=[20])
    spec = build(
        SamplerConfig(
            **base,
            method="chain" if tree.startswith("1x") else "tree",
            tree=tree,
            verifier=verifier,
            draft_bias=1.0,
            seed=2,
        )
    ).run(keep_steps=[20])
    assert min_pvalue_bonferroni(spec.samples.cpu(), plain.samples.cpu()) > 1e-3
    assert min_pvalue_bonferroni(spec.states[20].cpu(), plain.states[20].cpu()) > 1e-3


@pytest.mark.statistical
def test_cpu_and_cuda_draw_the_same_law():
    base = dict(model="gm16", steps=40, method="tree", tree="3,2,2", num_samples=10_000)
    cpu = build(SamplerConfig(**base, device="cpu", seed=3)).run()
    gpu = build(SamplerConfig(**base, device="cuda", seed=4)).run()
    assert min_pvalue_bonferroni(cpu.samples, gpu.samples.cpu()) > 1e-3


@pytest.mark.parametrize("draft,freeze", [("frozen", None), ("digits-draft", None), ("digits-draft", "auto")])
def test_digits_fp16_on_cuda(draft, freeze):
    """The frozen draft, the draft network, and per step the corrected network or a frozen form."""
    result = build(
        SamplerConfig(
            model="digits",
            steps=100,
            method="tree",
            tree="2,2,1",
            verifier="rank",
            draft=draft,
            freeze=freeze,
            num_samples=16,
            class_label=3,
            device="cuda",
        )
    ).run()
    assert result.samples.shape == (16, 1, 16, 16) and torch.isfinite(result.samples).all()
    assert result.cost.speedup > 1.2


def test_a_graphed_network_gives_the_eager_networks_outputs_call_after_call():
    """The digits UNet replayed from CUDA graphs (launch graphs, the CUDA default): every call's outputs are
    the eager network's for that call's inputs (a replay that kept the first call's inputs would return its
    outputs again), at two call sizes; and a graphed run draws the eager run's samples."""
    eager = build(
        SamplerConfig(
            model="digits", method="target", steps=20, num_samples=4, device="cuda", launch="eager", class_label=3
        )
    )
    graphed = build(
        SamplerConfig(
            model="digits", method="target", steps=20, num_samples=4, device="cuda", launch="graphs", class_label=3
        )
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for rows in (4, 8, 4):
            x = torch.randn((rows, 1, 16, 16), generator=g, device="cuda", dtype=torch.float16)
            n = torch.randint(0, 20, (rows,), generator=g, device="cuda")
            labels = torch.full((rows,), 3, device="cuda")
            expected = eager.network(x, n, class_labels=labels).clone()
            got = graphed.network(x, n, class_labels=labels).clone()
            torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    a, b = eager.run().samples, graphed.run().samples
    torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
