"""The embedded digits models: they load offline, sample, and the target draws the digits it is asked for."""

from dataclasses import replace

import pytest
import torch

from specdemo import SamplerConfig, build
from specdemo.digits import NUM_CLASSES, DigitClassifier

PER_CLASS = 50


def test_embedded_models_load_offline_and_describe_themselves():
    problem = build(
        SamplerConfig(
            model="digits", draft="digits-draft", method="chain", steps=10, num_samples=2, class_label=7, device="cpu"
        )
    )
    assert problem.target.shape == (1, 16, 16) and problem.target.num_classes == NUM_CLASSES
    result = problem.run()
    assert result.samples.shape == (2, 1, 16, 16) and result.cost.draft_calls > 0


@pytest.mark.slow
def test_samples_show_the_requested_digit():
    """500 class-conditional samples (50 per digit, 100 DDPM steps): a classifier trained on
    scikit-learn's digits labels at least 90% as the requested class, and every digit is told apart
    (its own label is the most frequent for its samples, at 70% or more)."""
    problem = build(
        SamplerConfig(
            model="digits", steps=100, method="target", num_samples=PER_CLASS * NUM_CLASSES, seed=0, device="cpu"
        )
    )
    labels = torch.arange(NUM_CLASSES).repeat_interleave(PER_CLASS)
    samples = replace(problem, cond={"class_labels": labels}).run().samples
    classifier = DigitClassifier()
    assert classifier.held_out_accuracy > 0.97
    predicted = classifier.predict(samples)
    assert (predicted == labels).double().mean() >= 0.90
    confusion = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    confusion.index_put_((labels, predicted), torch.ones_like(labels), accumulate=True)
    per_class = confusion.diag() / PER_CLASS
    assert (per_class >= 0.70).all(), per_class
    assert (confusion.argmax(1) == torch.arange(NUM_CLASSES)).all()


def test_the_distilled_draft_misses_the_target_less_than_the_one_trained_on_the_noise():
    """digits-draft-distilled learnt the target's outputs, digits-draft the noise: on the same noised digits
    the distilled one is closer to the target at every noise level (benchmarks/distilled.py measures it)."""
    from benchmarks.distilled import misses

    for row in misses(64):
        assert row["digits-draft-distilled"] < 0.95 * row["digits-draft"], row
