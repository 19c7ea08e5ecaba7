"""What a round costs in seconds, for the planner's time objective (planning/programme.py).

A round of a batch of A trajectories that each evaluate R target rows costs

    t(R, L_net) = call(A R) + round_s + level_s R + network_level_s L_net,

call being the target's measured wall-clock for a call of that many rows (a few row counts,
interpolated linearly, extrapolated with the last slope), round_s the driver's own cost per round
and level_s its cost per drafted level (a draft network's call included where every level calls
it). A level has at least one row, so pricing the driver per row bounds a tree's drafting from above
and is exact for a chain. The stepwise draft (drafts/stepwise.py) calls its network only at the
levels whose step its table gives to the network: level_s is then the frozen draft's cost of a level,
and network_level_s what a level that calls the network costs beyond it, paid by the round's L_net
such levels (planning/programme.py counts them from the table).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..sampling.padding import call_size


@dataclass(frozen=True)
class CostModel:
    rows: tuple[int, ...]  # row counts of the measured calls, increasing
    call_s: tuple[float, ...]  # seconds of a call of that many rows
    round_s: float
    level_s: float
    network_level_s: float  # a level that calls the stepwise draft's network, beyond level_s (else 0)
    batch: int  # trajectories per round the plan is for (A)

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.call_s) or not self.rows or list(self.rows) != sorted(set(self.rows)):
            raise ValueError("a cost model needs increasing row counts, one time each")

    def call(self, rows: int) -> float:
        """Seconds of one target call of `rows` rows (padded as the driver pads it)."""
        rows = call_size(rows)
        r, s = np.asarray(self.rows, dtype=float), np.asarray(self.call_s)
        if rows <= r[-1] or len(r) == 1:
            return float(np.interp(rows, r, s))
        slope = (s[-1] - s[-2]) / (r[-1] - r[-2])
        return float(s[-1] + slope * (rows - r[-1]))

    def round_time(self, rows: int, network_levels: int = 0) -> float:
        """Seconds of a round in which every trajectory evaluates `rows` target rows (0: no call) and
        `network_levels` levels call the stepwise draft's network."""
        return (
            (self.call(self.batch * rows) if rows else 0.0)
            + self.round_s
            + self.level_s * max(rows, 1)
            + self.network_level_s * network_levels
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(
            rows=tuple(int(r) for r in d["rows"]),
            call_s=tuple(float(s) for s in d["call_s"]),
            round_s=float(d["round_s"]),
            level_s=float(d["level_s"]),
            network_level_s=float(d["network_level_s"]),
            batch=int(d["batch"]),
        )
