"""What the tests of the batched driver share: the methods they run (tree, verifier, draft, prefetch), two
small targets with their kernels and networks, and a network evaluated one row at a time."""

import torch

from specdemo.drafts import FrozenGaussian, FrozenOutput, FrozenX0, FrozenX0Linear
from specdemo.kernels import DDPMKernel, FlowChurnKernel, default_ddpm_scheduler
from specdemo.sampling import sample
from specdemo.targets import gm16, gm512
from specdemo.trees import ReachRule, Topology, TopologyPlan
from specdemo.verifiers import BlockVerification, GreedyRejectionSampling, RankAwareSelection, ReflectionMaximalCoupling

PLAIN = (Topology(()), None, None, "nearest")


def methods():
    """(tree, verifier, draft, prefetch) per method; fresh objects each time."""
    return {
        "plain": PLAIN,
        "chain-rmc": (Topology.chain(4), ReflectionMaximalCoupling(), FrozenOutput(), "nearest"),
        "chain-block": (Topology.chain(4), BlockVerification(), FrozenOutput(), "nearest"),
        "tree-dgrs": (Topology((3, 2, 2)), GreedyRejectionSampling(), FrozenOutput(), "nearest"),
        "tree-rank-leaves": (Topology((2, 2)), RankAwareSelection(), FrozenX0(), "leaves"),
        "chain-x0-linear": (Topology.chain(4), ReflectionMaximalCoupling(), FrozenX0Linear(), "nearest"),
        "tree-rank-x0-linear-leaves": (Topology((2, 2)), RankAwareSelection(), FrozenX0Linear(), "leaves"),
        "chain-block-gaussian-cold": (Topology.chain(4), BlockVerification(), FrozenGaussian(start="cold"), "nearest"),
        "online-reach": (reach_chain(8), BlockVerification(), FrozenGaussian(start="cold"), "nearest"),
    }


def reach_chain(rows: int) -> TopologyPlan:
    """The online plan's shape under the time objective: a chain of `rows` target rows at every step (a plan
    of one step holds for every step), each trajectory cutting it by its own acceptance (ReachRule)."""
    chain, known = Topology.chain(rows), Topology.chain(rows + 1)
    return TopologyPlan((chain,), (False,), (known,), (False,), expected_calls=float("nan"), rule=ReachRule())


def gm16_ddpm(steps=20):
    target, kernel = gm16(), DDPMKernel(default_ddpm_scheduler(), steps)
    return target, kernel, target.network(kernel)


def gm512_flow():
    target, kernel = gm512(), FlowChurnKernel(30, 0.06)
    return target, kernel, target.network(kernel)


def run(network, kernel, shape, num_samples, method, **kwargs):
    tree, verifier, draft, prefetch = methods()[method]
    return sample(
        network, kernel, shape, num_samples, tree=tree, verifier=verifier, draft=draft, prefetch=prefetch, **kwargs
    )


def row_by_row(network):
    """The same network evaluated one row at a time: its output for a row cannot depend on the
    other rows of the call (a batched matmul may round differently for different batch sizes)."""

    def net(x, n, **cond):
        return torch.cat([network(x[i : i + 1], n[i : i + 1]) for i in range(x.shape[0])])

    return net
