"""Section equal_rows' ceiling (benchmarks/equal_rows.py): a chain planned with its first level never lost
expects fewer calls than the planned fan and the planned chain of the same rows."""

import numpy as np

from benchmarks.equal_rows import first_level_kept
from specdemo.planning.programme import DeltaStats, plan_topology
from specdemo.verifiers import get_verifier

STEPS = 16


def test_a_chain_that_keeps_its_first_level_bounds_every_fan():
    # a missed first level (an unknown root's delta) and deltas that grow with depth, as the frozen draft's
    stats = DeltaStats({(s, d): [1.2 if d == 1 else 0.1 * d] * 30 for s in range(STEPS) for d in range(1, 20)}, STEPS)
    kept = first_level_kept(stats)
    assert kept.deltas[(3, 1)] == [0.0] * 30 and kept.deltas[(3, 2)] == stats.deltas[(3, 2)]
    run_lengths = np.arange(STEPS + 1)[::-1]
    block = get_verifier("block")
    for budget in (4, 8, 16):
        planned = {
            name: plan_topology(s, block, budget, run_lengths, max_width=width, warm_up=False).expected_calls
            for name, s, width in (("chain", stats, 1), ("fan", stats, 8), ("kept", kept, 1))
        }
        assert planned["kept"] < min(planned["fan"], planned["chain"]), (budget, planned)
