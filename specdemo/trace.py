"""What a run records: the cost accounting of algorithms.md section 4 and, optionally, every round.

Figures are drawn from these records alone (numpy arrays, JSON-serialisable through `to_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

# node status in a round's tree
UNVISITED, ACCEPTED, REJECTED, CORRECTED, ROOT = range(5)
STATUS_NAMES = ("unvisited", "accepted", "rejected", "corrected", "root")


@dataclass
class Cost:
    """Cost of one run of B trajectories.

    target_calls counts sequential batched calls (the batch moves at its slowest member's pace);
    calls_per_trajectory counts, per trajectory, the calls that had a row of it. counted_calls
    leaves out calls spent on deterministic steps whose output no draft uses (the endpoint steps
    of section 5), and keeps a warm-up call. speedup = stochastic steps / mean counted calls, as
    the table of section 5 counts; speedup_total = all steps / mean calls, everything counted.
    """

    method: str
    steps: int
    stochastic_steps: int
    calls_per_trajectory: np.ndarray
    counted_calls: np.ndarray
    rows_per_trajectory: np.ndarray
    target_calls: int = 0
    draft_calls: int = 0
    rounds: int = 0
    wall_s: float = 0.0
    target_s: float = 0.0  # in target calls
    draft_s: float = 0.0  # drafting: noise and draft means, draft-network calls included
    verify_s: float = 0.0  # walking the trees: verification, commits, prefetch
    examined_per_depth: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)

    @property
    def num_trajectories(self) -> int:
        return len(self.calls_per_trajectory)

    @property
    def speedup(self) -> float:
        return self.stochastic_steps / float(np.mean(self.counted_calls))

    @property
    def speedup_total(self) -> float:
        return self.steps / float(np.mean(self.calls_per_trajectory))

    @property
    def acceptance_per_depth(self) -> list[float | None]:
        """Fraction of verified nodes at each depth that kept a drafted child (None: never reached)."""
        return [a / e if e else None for a, e in zip(self.accepted_per_depth, self.examined_per_depth)]

    @property
    def acceptance(self) -> float | None:
        examined = sum(self.examined_per_depth)
        return sum(self.accepted_per_depth) / examined if examined else None

    @property
    def rows_per_call(self) -> float:
        """Mean target rows per target call, per trajectory."""
        return float(np.mean(self.rows_per_trajectory / np.maximum(self.calls_per_trajectory, 1)))

    def summary(self) -> dict:
        """The figures the CLI prints and the benchmarks tabulate (strict JSON: None, never NaN)."""
        b = self.num_trajectories
        return {
            "method": self.method,
            "steps": self.steps,
            "stochastic_steps": self.stochastic_steps,
            "num_samples": b,
            "target_calls": self.target_calls,
            "target_calls_per_sample": float(np.mean(self.calls_per_trajectory)),
            "counted_calls_per_sample": float(np.mean(self.counted_calls)),
            "target_rows": int(np.sum(self.rows_per_trajectory)),
            "target_rows_per_sample": float(np.mean(self.rows_per_trajectory)),
            "rows_per_call": self.rows_per_call,
            "draft_calls": self.draft_calls,
            "rounds": self.rounds,
            "speedup": self.speedup,
            "speedup_total": self.speedup_total,
            "acceptance": self.acceptance,
            "acceptance_per_depth": self.acceptance_per_depth,
            "wall_s": self.wall_s,
            "wall_s_per_sample": self.wall_s / b,
            "target_s": self.target_s,
            "non_target_fraction": 1 - self.target_s / self.wall_s if self.wall_s else None,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


@dataclass
class RoundTrace:
    """One round of the trajectories that shared a topology in it (round: the batch's round index;
    a topology plan can give one round several records), padded to the largest tree among them.

    Node M (the last slot) holds the corrected sample, if the round drew one.
    trajectories (A,): the trajectories that speculated in the round (direct target steps are not
    recorded); step (A,): n at the root; root_known (A,): its target output was known when the
    round began (a warm-up or an evaluated leaf; the first level is then exact); depth (A,):
    speculated depth L_b; parent (M + 1,), node_depth (M + 1,): the shared topology, the
    corrected slot's parent per trajectory in corrected_parent (A,), -1 when none;
    states (A, M + 1, *shape) or None; status (A, M + 1) codes of STATUS_NAMES;
    evaluated (A, M + 1) bool: the target was called there; delta (A, M + 1) at verified nodes
    (NaN elsewhere); node_accept_prob (A, M + 1) the verifier's closed-form acceptance at verified
    nodes; child_accept_prob (A, M + 1): the probability each examined child was accepted with
    (under block verification both hold P(eta >= i | the drafted chain) at node i and its parent:
    the chain is weighed as a whole); committed_steps (A,).
    """

    round: int
    trajectories: np.ndarray
    step: np.ndarray
    root_known: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    node_depth: np.ndarray
    corrected_parent: np.ndarray
    status: np.ndarray
    evaluated: np.ndarray
    delta: np.ndarray
    node_accept_prob: np.ndarray
    child_accept_prob: np.ndarray
    committed_steps: np.ndarray
    states: np.ndarray | None = None

    def to_json(self) -> dict:
        # NaN is not JSON: unverified nodes' values become null
        out = {k: (np.where(np.isnan(v), None, v).tolist() if v.dtype.kind == "f" else v.tolist())
               if isinstance(v, np.ndarray) else v for k, v in asdict(self).items()}
        out["status_names"] = list(STATUS_NAMES)
        return out
