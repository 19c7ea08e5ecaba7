"""The re-drafting measurement (docs/experiments/redraft.py): a node re-drafted from its own state is drafted by the
target's kernel itself (delta 0), and the nodes it pairs are a later round's verified nodes with an earlier
round's evaluated node of the same step."""

import numpy as np
import pytest

from benchmarks.experiment import load

redraft = load("redraft")


@pytest.mark.parametrize(
    "model, extra", [("gm512", {"freeze": "x0"}), ("digits", {"draft": "digits-draft", "freeze": "residual"})]
)
def test_a_node_redrafted_from_its_own_state_has_delta_zero(model, extra):
    problem = redraft._chain(model, 20, 3, extra)
    trace = problem.run(trace=True, trace_states=True).trace
    steps, trajectories, drafted, states, earlier = redraft._nodes(trace, 20)
    assert len(steps) > 10 and all(0 <= m < 20 for m in steps)
    own = redraft._redrafted_deltas(problem, steps, trajectories, states, states)
    assert np.abs(own).max() < 1e-3  # frozen at the node itself: m^p = m^q
    moved = redraft._redrafted_deltas(problem, steps, trajectories, states, earlier)
    assert (moved > 1e-3).mean() > 0.5  # another node's frozen value: a draft, not the target
    assert np.isfinite(drafted).all() and (np.asarray(drafted) >= 0).all()


def test_the_report_says_what_the_rows_show():
    row = {
        "model": "digits",
        "steps": 100,
        "draft": "d",
        "region": [0.0, 1.0],
        "nodes": 5,
        "median_delta": 0.1,
        "median_delta_redrafted": 0.2,
    }
    worse = redraft.render({"rows": [{**row, "acceptance": 0.9, "acceptance_redrafted": 0.8}], "reference": None})
    better = redraft.render({"rows": [{**row, "acceptance": 0.8, "acceptance_redrafted": 0.9}], "reference": None})
    assert "Not built" in worse and "1 of 1 rows" in worse
    assert "worth building there" in better and "digits 100 steps (d)" in better
