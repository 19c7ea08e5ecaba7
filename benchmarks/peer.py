"""The draft-tree authors' figures on gm512: the one table every peer figure of the report and of the
README is read from.

Source: docs/algorithms.md section 5 (tests/benchmarks/test_benchmarks.py checks that every figure here is there).
The authors' code is not on the machines the benchmarks run on, so these are not rerun: the report and
the README quote them with their source and date.
"""

from __future__ import annotations

from typing import NamedTuple

from specdemo.trees import Topology

THEIR_TABLE = "their table"
SIDE_BY_SIDE = "side by side"
SOURCES = {
    THEIR_TABLE: "the authors' code on this benchmark, nearest-sibling prefetch unless a row says otherwise, "
    "standard error about 0.006x (docs/algorithms.md section 5)",
    SIDE_BY_SIDE: "measured side by side with specdemo on 2026-12-01, runs alternated under the same load, one thread "
    "each (docs/algorithms.md section 5)",
}
SIDE_BY_SIDE_DATE = "2026-12-01"


class PeerRow(NamedTuple):
    source: str  # a key of SOURCES
    verifier: str
    k: int
    depth: int
    leaves: bool  # leaves evaluated
    prefetch: str
    trajectories: int
    speedup: float  # the authors' code: 28 / target calls per trajectory
    ms: float | None = None  # the authors' code: milliseconds per trajectory (side by side only)
    ours_speedup: float | None = None  # specdemo in the same side-by-side run
    ours_ms: float | None = None

    @property
    def key(self) -> tuple[str, int, int, bool]:
        return self.verifier, self.k, self.depth, self.leaves

    @property
    def rows_per_round(self) -> int:
        return Topology.uniform(self.k, self.depth).rows_per_round(self.leaves)


PEER = [
    PeerRow(THEIR_TABLE, "rmc", 1, 3, False, "nearest", 500, 1.78),
    PeerRow(THEIR_TABLE, "rmc", 1, 5, False, "nearest", 500, 1.93),
    PeerRow(THEIR_TABLE, "rmc", 1, 7, False, "nearest", 500, 1.92),
    PeerRow(THEIR_TABLE, "dgrs", 2, 3, False, "nearest", 500, 1.84),
    PeerRow(THEIR_TABLE, "dgrs", 2, 5, False, "nearest", 500, 2.01),
    PeerRow(THEIR_TABLE, "dgrs", 4, 3, False, "nearest", 500, 1.89),
    PeerRow(THEIR_TABLE, "dgrs", 4, 4, False, "nearest", 500, 2.03),
    PeerRow(THEIR_TABLE, "dgrs", 4, 3, True, "nearest", 500, 2.01),
    PeerRow(THEIR_TABLE, "dgrs", 4, 4, True, "nearest", 500, 2.09),
    PeerRow(THEIR_TABLE, "rank", 2, 5, False, "nearest", 500, 2.08),
    PeerRow(THEIR_TABLE, "rank", 4, 4, False, "nearest", 500, 2.10),
    PeerRow(THEIR_TABLE, "rank", 4, 4, True, "nearest", 500, 2.18),
    PeerRow(THEIR_TABLE, "rank", 4, 5, True, "nearest", 100, 2.20),
    # the chain L = 5 by prefetch: the parent's output, and the target re-evaluated at every root
    PeerRow(THEIR_TABLE, "rmc", 1, 5, False, "parent", 500, 1.28),
    PeerRow(THEIR_TABLE, "rmc", 1, 5, False, "none", 500, 1.12),
    PeerRow(SIDE_BY_SIDE, "rmc", 1, 5, False, "nearest", 300, 1.922, 65, 1.913, 7.1),
    PeerRow(SIDE_BY_SIDE, "dgrs", 4, 4, False, "nearest", 300, 2.049, 523, 2.046, 58),
    PeerRow(SIDE_BY_SIDE, "dgrs", 2, 5, False, "nearest", 300, 2.013, 142, 2.010, 22),
    PeerRow(SIDE_BY_SIDE, "rank", 4, 4, False, "nearest", 300, 2.111, 1155, 2.121, 43),
    PeerRow(SIDE_BY_SIDE, "dgrs", 4, 4, True, "nearest", 300, 2.109, 938, 2.108, 267),
    PeerRow(SIDE_BY_SIDE, "rank", 4, 4, True, "nearest", 300, 2.182, 1606, 2.202, 173),
]


def their_table() -> dict[tuple[str, int, int, bool], PeerRow]:
    """The authors' table (nearest-sibling prefetch), by (verifier, K, L, leaves)."""
    return {row.key: row for row in PEER if row.source == THEIR_TABLE and row.prefetch == "nearest"}


def side_by_side() -> dict[tuple[str, int, int, bool], PeerRow]:
    """The cells measured side by side, by (verifier, K, L, leaves)."""
    return {row.key: row for row in PEER if row.source == SIDE_BY_SIDE}


def chain_by_prefetch() -> dict[str, float]:
    """The authors' RMC chain L = 5, by prefetch policy."""
    return {row.prefetch: row.speedup for row in PEER if row.source == THEIR_TABLE and row.key == ("rmc", 1, 5, False)}


def best(rows, max_rows: int | None = None) -> PeerRow:
    """The row of highest speedup among `rows`, within `max_rows` target rows per round if given."""
    return max((r for r in rows if max_rows is None or r.rows_per_round <= max_rows), key=lambda r: r.speedup)
