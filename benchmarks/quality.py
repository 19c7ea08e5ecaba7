"""The embedded target's quality: does it draw the digit asked for?"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from specdemo.pipeline import SamplerConfig, build

from .common import plot

TITLE = "The embedded digits model: quality"


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import plotly.graph_objects as go

    from specdemo.digits import NUM_CLASSES, DigitClassifier

    per_class = 10 if quick else 50
    classifier = DigitClassifier()
    lines = [
        f"{per_class} samples of each digit from the embedded target (100 DDPM steps, drawn by the "
        "library's plain sampler), read by an RBF SVM fitted on scikit-learn's 8x8 digits "
        f"({classifier.held_out_accuracy:.1%} on held-out real digits).",
        "",
        "| digit | " + " | ".join(map(str, range(NUM_CLASSES))) + " | all |",
        "|---" * (NUM_CLASSES + 2) + "|",
    ]
    problem = build(
        SamplerConfig(
            pilot=True, model="digits", steps=100, method="target", num_samples=per_class * NUM_CLASSES, device="cpu"
        )
    )
    labels = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
    predicted = classifier.predict(replace(problem, cond={"class_labels": labels}).run().samples)
    right = (predicted == labels).float()
    per_digit = right.view(NUM_CLASSES, per_class).mean(1)
    lines.append("| read as asked | " + " | ".join(f"{a:.0%}" for a in per_digit.tolist()) + f" | {right.mean():.1%} |")
    fig = go.Figure(
        go.Bar(
            x=[str(d) for d in range(NUM_CLASSES)],
            y=per_digit.tolist(),
            text=[f"{a:.0%}" for a in per_digit.tolist()],
            textposition="outside",
        )
    )
    fig.update_layout(
        title=f"digits: samples read as the digit asked for ({right.mean():.1%} of {len(labels)})",
        template="plotly_white",
        yaxis=dict(range=[0, 1.1], tickformat=".0%"),
        xaxis=dict(title="digit asked for"),
    )
    lines += ["", plot(fig, "digits_quality", report)]
    return "\n".join(lines), {
        "per_class": per_class,
        "held_out_accuracy": classifier.held_out_accuracy,
        "read_as_asked": per_digit.tolist(),
        "overall": float(right.mean()),
    }
