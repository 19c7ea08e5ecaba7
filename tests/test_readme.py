"""The README's Python example runs as written, and says what it returns."""

import re
from pathlib import Path

import torch

from specdemo import RoundTrace

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs_as_written(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))  # an empty cache: the shipped plan, as a user gets it
    block = re.search(r"## Python\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    imports, first, second = block.split("\n\n")
    scope: dict = {}
    exec(imports + "\n" + first, scope)
    result = scope["result"]
    assert result.samples.shape == (16, 2) and torch.isfinite(result.samples).all()  # "(16, 2)", as commented
    summary = result.cost.summary()
    assert {"target_calls", "target_rows", "acceptance_per_depth", "speedup", "wall_s"} <= set(summary)
    assert isinstance(result.trace[0], RoundTrace)
    exec(second, scope)
    result, problem = scope["result"], scope["problem"]
    assert problem.plan_source == ("shipped" if problem.device.type == "cpu" else "pilot")  # shipped: the CPU's
    assert problem.tree.expected_s > 0 and result.cost.wall_s > 0
    assert result.samples.shape == (1, 1, 16, 16)
