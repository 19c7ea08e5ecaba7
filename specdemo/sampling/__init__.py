"""The sampling driver: one batched round loop for plain sampling, chains and trees.

driver.py (the round loop, batching, refill), phases.py (draft, the target call's rows, walk,
correct, commit over a RoundState), prefetch.py (which output starts the next round), rng.py
(per-trajectory streams), cost.py (calls, rows and time), record.py (RoundTrace).
"""

from .cost import Cost
from .driver import SampleResult, check_run, method_name, sample
from .prefetch import PREFETCH, Prefetch
from .record import ACCEPTED, CORRECTED, REJECTED, ROOT, STATUS_NAMES, UNVISITED, RoundTrace

__all__ = ["sample", "SampleResult", "Cost", "RoundTrace", "STATUS_NAMES", "PREFETCH", "Prefetch", "check_run",
           "method_name", "UNVISITED", "ACCEPTED", "REJECTED", "CORRECTED", "ROOT"]
