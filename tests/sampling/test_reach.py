"""The online plan under the time objective: each trajectory cuts its chain by its own acceptance so far
(ReachRule). The rule's depths, replayed from a trace round by round; a trajectory's samples, the same in
any batch (a planted bug in scripts/mutations.py carries a slot's counts over to its next trajectory); and
rows saved where drafts are poor, none lost where they are good. The fused round against the reference
under the rule: test_round.py; the law: tests/planning/test_learning.py."""

import math

import numpy as np
import pytest
import torch

from specdemo.drafts import BiasedDraft, FrozenGaussian
from specdemo.sampling import sample
from specdemo.trees import ReachRule, Topology, TopologyPlan
from specdemo.verifiers import BlockVerification

from .common import gm16_ddpm, reach_chain, row_by_row


def test_the_rule_drafts_the_levels_reached_with_probability_at_least_reach():
    rule = ReachRule()
    rows = lambda accepted, examined, most=64: int(rule.rows(np.array([accepted]), np.array([examined]), most)[0])
    assert rows(0, 0) == 16 and 0.875**15 >= 1 / 8 > 0.875**16  # the prior alone: a^ = 7/8
    # a^ = (3 + 1.75) / (6 + 2) = 0.59375: levels 1 to 4 are reached with probability 1, a^, a^2, a^3 >= 1/8 > a^4
    assert rows(3, 6) == 4 and 0.59375**3 >= 1 / 8 > 0.59375**4
    assert rows(0, 30) == 1 and rows(500, 500) == 64 and rows(500, 500, most=16) == 16
    estimate = (40 + 1.75) / (50 + 2)
    assert rows(40, 50) == 1 + math.floor(math.log(1 / 8) / math.log(estimate))
    with pytest.raises(ValueError, match="0 < reach < 1"):
        ReachRule(reach=1.0)
    with pytest.raises(ValueError, match="a plan of chains"):
        TopologyPlan((Topology((2, 1)),), (False,), (Topology((2, 1)),), (False,), 0.0, rule=rule)


DRAFTS = {
    # gm16 with the fitted Gaussian moved by 1.5 sigma, started cold: rounds reject often and early
    "poor": lambda: BiasedDraft(FrozenGaussian(start="cold"), 1.5),
    # the fitted Gaussian started warm: known roots (after warm-ups), where its first level is exact
    "warm": lambda: FrozenGaussian(start="warm"),
}


def cut_run(num_samples: int, draft: str = "poor", tree=None, **kwargs):
    """gm16 over 20 DDPM steps, one of DRAFTS, and the online chain of 8 rows cut by ReachRule (or `tree`)."""
    target, kernel, net = gm16_ddpm(20)
    return (
        sample(
            row_by_row(net),
            kernel,
            target.shape,
            num_samples,
            tree=tree or reach_chain(8),
            verifier=BlockVerification(),
            draft=DRAFTS[draft](),
            seed=6,
            **kwargs,
        ),
        kernel,
    )


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_each_trajectory_cuts_its_chain_by_its_own_earlier_rounds(draft):
    """Replayed from the trace: every round's depth is the rule's rows for the levels that trajectory's
    earlier rounds accepted and examined (one level more at a known root, where an exact draft's first
    level counts in neither), cut at the horizon; through continuous batching (9 trajectories in 3 slots),
    so each trajectory counts from nothing."""
    (result, kernel), rule = cut_run(9, draft, max_batch=3, trace=True), ReachRule()
    given_at_known = DRAFTS[draft]().exact_at_known_root
    horizon = kernel.stochastic_run_lengths().numpy()
    counts = {t: [0, 0] for t in range(9)}  # accepted, examined
    depths, known_roots = set(), 0
    for record in sorted(result.trace, key=lambda r: r.round):
        for a, t in enumerate(record.trajectories.tolist()):
            accepted, examined = counts[t]
            known = bool(record.root_known[a])
            rows = int(rule.rows(np.array([accepted]), np.array([examined]), 8)[0])
            assert record.depth[a] == min(rows + known, horizon[record.step[a]]), (t, record.round)
            depths.add(int(record.depth[a]))
            known_roots += known
            given = int(known and given_at_known)
            committed, corrected = int(record.committed_steps[a]), int(record.corrected_parent[a] >= 0)
            counts[t] = [accepted + committed - corrected - given, examined + committed - given]
    if draft == "poor":
        assert {1, 2, 8} <= depths  # the poor draft shortens chains from the whole chain the prior starts on
    else:
        assert known_roots >= 9 and given_at_known  # every trajectory's first round is from a warm-up


def test_a_trajectory_cut_by_its_acceptance_does_not_depend_on_its_batch_bitwise():
    """9 trajectories through 3 slots, one at a time, and all at once: the same samples bit for bit (each
    trajectory's counts start from nothing, not from what its slot's earlier trajectory left)."""
    together, _ = cut_run(9)
    slots, _ = cut_run(9, max_batch=3)
    alone, _ = cut_run(9, max_batch=1)
    assert torch.equal(slots.samples, together.samples) and torch.equal(alone.samples, together.samples)
    assert np.array_equal(slots.cost.rows_per_trajectory, together.cost.rows_per_trajectory)


def test_the_cut_saves_rows_where_drafts_are_poor():
    """Against the whole chain of 8 rows, the same poor draft: fewer target rows a trajectory, and at most
    a call or two more."""
    cut, _ = cut_run(24)
    whole, _ = cut_run(24, tree=Topology.chain(8))
    assert cut.cost.rows_per_trajectory.mean() < 0.8 * whole.cost.rows_per_trajectory.mean()  # measured: 0.66
    assert cut.cost.calls_per_trajectory.mean() <= whole.cost.calls_per_trajectory.mean() + 2
