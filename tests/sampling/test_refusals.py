"""What `sample` and `build` refuse, with a message that names the problem: a verifier against its tree, a
draft against its kernel, sizes past the memory, missing settings, bad configurations, and a network that
returns the wrong shape or NaN."""

import pytest

from specdemo.drafts import FrozenOutput, FrozenX0
from specdemo.errors import SpecdemoError
from specdemo.kernels import LangevinKernel
from specdemo.pipeline import SamplerConfig, build
from specdemo.sampling import sample
from specdemo.targets import gm2d
from specdemo.trees import Topology
from specdemo.verifiers import GreedyRejectionSampling, ReflectionMaximalCoupling

from .common import gm16_ddpm, gm512_flow, run


def test_rmc_with_a_tree_is_refused():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="rmc") as err:
        sample(
            net,
            kernel,
            target.shape,
            2,
            tree=Topology((2, 2)),
            draft=FrozenOutput(),
            verifier=ReflectionMaximalCoupling(),
        )
    assert "chain" in str(err.value)


def test_freeze_x0_with_langevin_is_refused():
    target, kernel = gm2d(), LangevinKernel(10, 0.01)
    with pytest.raises(SpecdemoError, match="x0") as err:
        sample(
            target.network(kernel),
            kernel,
            target.shape,
            2,
            tree=Topology.chain(3),
            draft=FrozenX0(),
            verifier=ReflectionMaximalCoupling(),
        )
    assert "langevin" in str(err.value)


def test_too_many_samples_times_nodes_is_refused_before_allocating():
    target, kernel, net = gm512_flow()
    with pytest.raises(SpecdemoError, match="GiB") as err:
        sample(
            net,
            kernel,
            target.shape,
            2000,
            tree=Topology.uniform(4, 5),
            draft=FrozenOutput(),
            verifier=GreedyRejectionSampling(),
        )
    assert "samples" in str(err.value)


def test_speculation_needs_a_draft_and_a_verifier():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="draft"):
        sample(net, kernel, target.shape, 2, tree=Topology.chain(3), verifier=ReflectionMaximalCoupling())
    with pytest.raises(SpecdemoError):
        sample(net, kernel, target.shape, 0)
    with pytest.raises(SpecdemoError, match="indices"):
        sample(net, kernel, target.shape, 2, indices=[0, 1, 2])


@pytest.mark.parametrize(
    "settings,words",
    [
        (dict(model="gm2d", steps=0), ["--steps", "0"]),
        (dict(model="gm2d", steps=1001), ["--steps", "1001"]),
        (dict(model="gm512", steps=1), ["--steps", "1"]),
        (dict(model="banana", steps=0), ["--steps", "0"]),
        (dict(model="gm2d", kernel="euler"), ["kernel", "euler"]),
        (dict(model="banana", kernel="ddpm"), ["langevin", "ddpm"]),
        (dict(model="gm2d", method="tree", verifier="magic"), ["verifier", "magic"]),
        (dict(model="no-such-model"), ["model", "no-such-model"]),
        (dict(model="gm2d", class_label=3), ["class"]),
        (dict(model="gm2d", method="tree", tree="2x2", verifier="rmc"), ["rmc"]),
        (dict(model="gm2d", method="chain", tree="2x2"), ["chain"]),
        (dict(model="gm2d", method="beam"), ["method", "beam"]),
        (dict(model="gm2d", num_samples=0), ["samples"]),
        (dict(model="gm2d", eta=float("nan")), ["eta"]),
        (dict(model="gm2d", kernel="ddim", eta=2.0), ["eta"]),
        (dict(model="gm2d", prefetch="soon"), ["prefetch", "soon"]),
    ],
)
def test_configuration_refusals(settings, words):
    """Refusals name the problem (and, for choices, what is accepted)."""
    config = SamplerConfig(num_samples=settings.pop("num_samples", 2), **settings)
    with pytest.raises(SpecdemoError) as err:
        problem = build(config)
        problem.run()  # some refusals (the verifier against the tree) come from the sampler
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_network_returning_the_wrong_shape_is_refused():
    target, kernel, net = gm16_ddpm()
    with pytest.raises(SpecdemoError, match="shape"):
        sample(lambda x, n: net(x, n)[:, :3], kernel, target.shape, 2)
    with pytest.raises(SpecdemoError, match="shape"):
        sample(
            lambda x, n: net(x, n)[:1],
            kernel,
            target.shape,
            2,
            tree=Topology((2, 2)),
            draft=FrozenOutput(),
            verifier=GreedyRejectionSampling(),
        )


@pytest.mark.parametrize("method", ["plain", "tree-dgrs", "tree-rank-leaves", "chain-block"])
def test_network_returning_nan_is_refused(method):
    """A NaN from the network must stop the run with a clear message, not yield NaN samples (nor hang)."""
    target, kernel, net = gm16_ddpm(10)
    calls = []

    def broken(x, n):
        out = net(x, n)
        calls.append(1)
        if len(calls) == 3:
            out[0, 0] = float("nan")
        return out

    with pytest.raises(SpecdemoError, match="(?i)nan|finite"):
        run(broken, kernel, target.shape, 3, method, seed=0)
    assert len(calls) <= 10 + 3  # stopped, not looping
