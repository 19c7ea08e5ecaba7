"""A draft lists its parts (Draft.parts), so that planning finds a draft network or a stepwise table in a draft
without unwrapping it by type."""

from specdemo.drafts import BiasedDraft, CorrectedNetworkDraft, FrozenPerStep, NetworkDraft, StepwiseDraft
from specdemo.drafts.frozen import FORMS
from specdemo.drafts.stepwise import RESIDUAL


def network(x, n, **cond):
    return x


def test_a_wrapped_stepwise_draft_lists_its_network_and_its_frozen_draft():
    stepwise = StepwiseDraft(CorrectedNetworkDraft(network, "tiny"), (RESIDUAL, FORMS["x0"], RESIDUAL))
    biased = BiasedDraft(stepwise, 0.5)
    assert biased.parts()[:2] == (biased, stepwise)
    assert biased.part(StepwiseDraft) is stepwise
    assert biased.part(NetworkDraft) is stepwise.network and biased.part(FrozenPerStep) is stepwise.frozen


def test_a_frozen_draft_has_no_network():
    frozen = FrozenPerStep((FORMS["x0"],) * 3)
    assert frozen.parts() == (frozen,) and frozen.part(NetworkDraft) is None
    assert BiasedDraft(frozen, 1.0).part(FrozenPerStep) is frozen
