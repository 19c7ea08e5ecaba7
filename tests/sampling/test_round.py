"""The fused round (specdemo/sampling/round.py, driver.py) against the readable one (reference.py): the same
trajectories, draw for draw, up to floating-point rounding, for every verifier, draft form, prefetch and start;
and the same law where rounding moves paths (a draft exact to the last bits: delta at the rounding floor)."""

import numpy as np
import pytest
import torch
from scipy import stats

from specdemo.drafts import (
    BiasedDraft,
    CorrectedNetworkDraft,
    FrozenGaussian,
    FrozenOutput,
    FrozenPerStep,
    FrozenX0,
    FrozenX0Linear,
    NetworkDraft,
    StepwiseDraft,
)
from specdemo.kernels import DDPMKernel, FlowChurnKernel, LangevinKernel, default_ddpm_scheduler
from specdemo.sampling import sample
from specdemo.sampling.reference import sample_one
from specdemo.targets import GaussianMixture, gm16
from specdemo.trees import Topology, TopologyPlan
from specdemo.verifiers import BlockVerification, GreedyRejectionSampling, RankAwareSelection, ReflectionMaximalCoupling

from .common import reach_chain, row_by_row

TRAJECTORIES = 24


def shifted(kernel):
    """A draft network: the target with every mean moved by 0.3."""
    target = gm16()
    return GaussianMixture.from_arrays(target.weights, np.asarray(target.means) + 0.3, target.stds).network(kernel)


ddpm = lambda: DDPMKernel(default_ddpm_scheduler(), 30)


def mixed_plan(steps: int = 30) -> TopologyPlan:
    """Chains of 3 at even steps, fans (2, 1, 1) at odd ones, leaves evaluated at every third step: a batch
    whose trajectories stand at different steps drafts both in one round (two parts, union.py)."""
    trees = tuple(Topology.chain(3) if n % 2 == 0 else Topology((2, 1, 1)) for n in range(steps))
    leaves = tuple(n % 3 == 0 for n in range(steps))
    return TopologyPlan(trees, leaves, trees, leaves, expected_calls=0.0)


CASES = {
    "chain-rmc-out": (ddpm, Topology.chain(4), ReflectionMaximalCoupling, lambda k: FrozenOutput(), "nearest"),
    "chain-block-x0-leaves": (ddpm, Topology.chain(5), BlockVerification, lambda k: FrozenX0(), "leaves"),
    "tree-dgrs-x0-linear-flow": (
        lambda: FlowChurnKernel(30, 0.5),
        Topology((3, 2, 2)),
        GreedyRejectionSampling,
        lambda k: FrozenX0Linear(),
        "nearest",
    ),
    "tree-rank-biased-parent": (
        ddpm,
        Topology((2, 2, 1)),
        RankAwareSelection,
        lambda k: BiasedDraft(FrozenOutput(), 1.5),
        "parent",
    ),
    "fan-block-cold-leaves": (ddpm, Topology((3, 1, 1)), BlockVerification, lambda k: FrozenX0(start="cold"), "leaves"),
    "chain-block-langevin-none": (
        lambda: LangevinKernel(30, 0.005),
        Topology.chain(3),
        BlockVerification,
        lambda k: FrozenOutput(),
        "none",
    ),
    "chain-rmc-network": (
        ddpm,
        Topology.chain(3),
        ReflectionMaximalCoupling,
        lambda k: NetworkDraft(shifted(k)),
        "nearest",
    ),
    "tree-dgrs-corrected-network": (
        ddpm,
        Topology((2, 1, 1)),
        GreedyRejectionSampling,
        lambda k: CorrectedNetworkDraft(shifted(k), "shifted"),
        "nearest",
    ),
    # every frozen form by step, a plan of two parts, refills of three slots at a time
    "plan-block-auto-refills": (
        ddpm,
        mixed_plan(),
        BlockVerification,
        lambda k: FrozenPerStep([n % 4 for n in range(30)], start="cold"),
        "auto",
    ),
    "plan-rank-stepwise": (
        ddpm,
        mixed_plan(),
        RankAwareSelection,
        lambda k: StepwiseDraft(CorrectedNetworkDraft(shifted(k), "shifted"), [n % 5 for n in range(30)]),
        "auto",
    ),
    # each trajectory cuts its chain by its own acceptance (the online plan under the time objective)
    "online-reach-biased-refills": (
        ddpm,
        reach_chain(8),
        BlockVerification,
        lambda k: BiasedDraft(FrozenGaussian(start="cold"), 1.0),
        "nearest",
    ),
    # ... started warm: known roots, whose exact first level the counts leave out
    "online-reach-warm": (ddpm, reach_chain(8), BlockVerification, lambda k: FrozenGaussian(start="warm"), "nearest"),
}
MAX_BATCH = {"plan-block-auto-refills": 3, "online-reach-biased-refills": 5}


def both(case: str, trajectories: int, seed: int):
    """The batched driver's samples, and the reference's trajectory by trajectory, for `case`."""
    make_kernel, tree, verifier, make_draft, prefetch = CASES[case]
    kernel = make_kernel()
    target = gm16()
    net = row_by_row(target.network(kernel))
    draft = make_draft(kernel)
    fast = sample(
        net,
        kernel,
        target.shape,
        trajectories,
        tree=tree,
        verifier=verifier(),
        draft=draft,
        prefetch=prefetch,
        seed=seed,
        max_batch=MAX_BATCH.get(case),
    ).samples
    slow = torch.stack(
        [
            sample_one(
                net,
                kernel,
                target.shape,
                tree=tree,
                verifier=verifier(),
                draft=draft,
                prefetch=prefetch,
                seed=seed,
                index=i,
            )
            for i in range(trajectories)
        ]
    )
    return fast, slow


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_round_follows_the_reference_trajectory_by_trajectory(case):
    """Every trajectory ends where the reference's does, within float32 rounding carried through 30 steps
    (measured: at most 4e-5 apart)."""
    fast, slow = both(case, TRAJECTORIES, seed=5)
    apart = (fast - slow).abs().amax(1)
    assert (apart < 1e-4).all(), apart


@pytest.mark.slow
@pytest.mark.statistical
def test_where_rounding_moves_paths_the_law_is_the_same():
    """The fitted Gaussian draft on a Gaussian mixture is exact to the last bits late in the schedule: delta
    sits at the rounding floor there, u is rounding noise, and the two rounds pick siblings apart at a
    branching root in about half the trajectories. Both draw the target's law (independent seeds:
    a two-sample Kolmogorov-Smirnov test on fixed projections, Bonferroni-corrected)."""
    kernel = DDPMKernel(default_ddpm_scheduler(), 30)
    target = gm16()
    net = row_by_row(target.network(kernel))
    settings = dict(tree=Topology((3, 1, 1)), draft=FrozenGaussian(start="cold"), prefetch="nearest")
    fast = sample(net, kernel, target.shape, 400, verifier=BlockVerification(), seed=1, **settings).samples
    slow = torch.stack(
        [
            sample_one(net, kernel, target.shape, verifier=BlockVerification(), seed=2, index=i, **settings)
            for i in range(400)
        ]
    )
    directions = torch.randn(8, target.shape[0], generator=torch.Generator().manual_seed(0))
    pvalues = [stats.ks_2samp((fast @ d).numpy(), (slow @ d).numpy()).pvalue for d in directions]
    assert min(pvalues) * len(pvalues) > 1e-3
