"""What a run records of its rounds, when asked for a trace: one RoundTrace per round and topology.

Figures are drawn from these records alone (numpy arrays, JSON-serialisable through `to_json`).
The driver builds them from a round's walks after its commit (`round_trace`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..trees import Topology
from ..trees.tables import tables
from ..verifiers import Walk
from .layout import Workspace

if TYPE_CHECKING:  # the driver imports this module
    from .driver import _Batch

# node status in a round's tree
UNVISITED, ACCEPTED, REJECTED, CORRECTED, ROOT = range(5)
STATUS_NAMES = ("unvisited", "accepted", "rejected", "corrected", "root")


@dataclass
class RoundTrace:
    """One round of the trajectories that shared a topology in it (round: the batch's round index;
    a round has one record per topology it used: a plan's trees, and trees cut short near the end
    of the schedule, which are topologies of their own).

    Node M (the last slot) holds the corrected sample, if the round drew one.
    trajectories (A,): the trajectories that speculated in the round (direct target steps are not
    recorded); step (A,): n at the root; root_known (A,): its target output was known when the
    round began (a warm-up or an evaluated leaf; the first level is then exact); depth (A,):
    speculated depth L_b; parent (M + 1,), node_depth (M + 1,): the shared topology, the
    corrected slot's parent per trajectory in corrected_parent (A,), -1 when none;
    states (A, M + 1, *shape) or None; outputs (A, M + 1, *shape) or None: the target's output at the
    nodes where the round knew it (evaluated, or a known root), NaN elsewhere; status (A, M + 1) codes of
    STATUS_NAMES;
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
    outputs: np.ndarray | None = None

    def restricted(self, keep: np.ndarray) -> RoundTrace:
        """The record of the trajectories selected by keep (A,) bool."""
        per_trajectory = {
            f.name: getattr(self, f.name)[keep]
            for f in fields(self)
            if f.name not in ("round", "parent", "node_depth", "states", "outputs")
        }
        pick = lambda values: None if values is None else values[keep]
        return replace(self, **per_trajectory, states=pick(self.states), outputs=pick(self.outputs))

    def to_json(self) -> dict:
        # NaN is not JSON: unverified nodes' values become null
        out = {
            k: (np.where(np.isnan(v), np.array(None), v).tolist() if v.dtype.kind == "f" else v.tolist())
            if isinstance(v, np.ndarray)
            else v
            for k, v in asdict(self).items()
        }
        out["status_names"] = list(STATUS_NAMES)
        return out


def round_trace(run: _Batch, ws: Workspace, slots: np.ndarray, tree: Topology, leaves: bool, walk: Walk) -> RoundTrace:
    """The RoundTrace of the trajectories in `slots` that shared `tree` in a committed round: the
    walk's record (verifiers/base.py WalkTrace), with the nodes' states and target outputs read from the
    workspace where the run keeps them (trace_states, trace_outputs); of the trajectories in trace_only alone
    where the run names some."""
    t = tables(tree)
    a, full = slots.size, t.num_nodes  # node `full`: the corrected draw's slot
    corrected, ends = walk.corrected, walk.end_depth
    extend = lambda v, fill: np.concatenate([v, np.full((a, 1), fill, dtype=v.dtype)], 1)
    w = walk.trace
    assert w is not None  # a run that keeps a trace walks with trace=True
    status = np.full((a, full), UNVISITED, dtype=np.int8)
    status[w.rejected] = REJECTED
    status[w.accepted] = ACCEPTED
    status[:, 0] = ROOT
    status = extend(status, UNVISITED)
    status[corrected, full] = CORRECTED
    n0 = run.n[slots] - ends
    known = run.root_known_before[slots]
    evaluated = np.zeros((a, full + 1), dtype=bool)
    evaluated[:, :full] = t.node_depth[None] <= (t.depth if leaves else t.depth - 1)
    evaluated[:, 0] = ~known
    record = RoundTrace(
        round=run.cost.rounds,
        trajectories=np.asarray(run.indices)[run.slot_traj[slots]],
        step=n0,
        root_known=known,
        depth=np.full(a, t.depth),
        parent=np.append(t.parent, -1),
        node_depth=np.append(t.node_depth, -1),
        corrected_parent=np.where(corrected, walk.node, -1),
        status=status,
        evaluated=evaluated,
        delta=extend(w.delta, np.nan),
        node_accept_prob=extend(w.node_accept_prob, np.nan),
        child_accept_prob=extend(w.child_accept_prob, np.nan),
        committed_steps=ends,
    )
    if run.trace_only is not None:  # the node values of these trajectories alone are read back
        keep = np.isin(record.trajectories, run.trace_only)
        record, slots, corrected, evaluated = record.restricted(keep), slots[keep], corrected[keep], evaluated[keep]
        a = slots.size
    if not (run.trace_states or run.trace_outputs) or not a:
        return record
    rows = torch.from_numpy(np.arange(full)[None] * ws.capacity + slots[:, None]).to(run.device)
    read = lambda plane: plane[rows].view(a, full, *run.shape).float().cpu().numpy()
    if run.trace_states:
        record.states = np.full((a, full + 1, *run.shape), np.nan, dtype=np.float32)
        record.states[:, :full] = read(ws.x_flat)
        record.states[corrected, full] = run.y[torch.from_numpy(slots[corrected]).to(run.device)].float().cpu().numpy()
    if run.trace_outputs:
        held = evaluated.copy()
        held[:, 0] = True  # a known root's output is in the root's row too (call_target copies it there)
        record.outputs = np.full((a, full + 1, *run.shape), np.nan, dtype=np.float32)
        record.outputs[:, :full] = read(ws.out_flat)
        record.outputs[~held] = np.nan
    return record
