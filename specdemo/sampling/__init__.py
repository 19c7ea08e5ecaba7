"""The sampling driver: one batched round loop for plain sampling, chains and trees.

driver.py (the round loop, batching, refill, the host's walk), round.py (the round's device work:
draft, reduce, commit), layout.py (its buffers and views), union.py (the tree a round drafts for every
slot), prefetch.py (which output starts the next round), rng.py (per-trajectory streams), cost.py
(calls, rows and time), record.py (RoundTrace), graphs.py (a network call as one launch on CUDA), and
reference.py (the same sampler as plain loops over one trajectory, the tests' oracle).
"""

from .cost import Cost
from .driver import SampleResult, check_run, method_name, sample
from .prefetch import PREFETCH, Prefetch
from .record import ACCEPTED, CORRECTED, REJECTED, ROOT, STATUS_NAMES, UNVISITED, RoundTrace

__all__ = [
    "sample",
    "SampleResult",
    "Cost",
    "RoundTrace",
    "STATUS_NAMES",
    "PREFETCH",
    "Prefetch",
    "check_run",
    "method_name",
    "UNVISITED",
    "ACCEPTED",
    "REJECTED",
    "CORRECTED",
    "ROOT",
]
