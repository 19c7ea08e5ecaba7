"""What a run records of its rounds, when asked for a trace: one RoundTrace per round and topology.

Figures are drawn from these records alone (numpy arrays, JSON-serialisable through `to_json`).
The driver builds them from a round's state after its walk (`round_trace`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np

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

    def restricted(self, keep: np.ndarray) -> "RoundTrace":
        """The record of the trajectories selected by keep (A,) bool."""
        per_trajectory = {f.name: getattr(self, f.name)[keep] for f in fields(self)
                          if f.name not in ("round", "parent", "node_depth", "states")}
        return replace(self, **per_trajectory, states=None if self.states is None else self.states[keep])

    def to_json(self) -> dict:
        # NaN is not JSON: unverified nodes' values become null
        out = {k: (np.where(np.isnan(v), None, v).tolist() if v.dtype.kind == "f" else v.tolist())
               if isinstance(v, np.ndarray) else v for k, v in asdict(self).items()}
        out["status_names"] = list(STATUS_NAMES)
        return out


def _trace_tree_walk(state, delta, node_acc, child_acc, status) -> None:
    """A whole tree weighed path by path: on each path, its committed nodes accepted and the first
    one not committed rejected, each with P(eta >= i | the path) (at the node and at its parent),
    and delta at their parents."""
    record, a = state.tree_record, state.count
    parent = state.tree.parent.numpy()
    inner = state.layout.num_parents
    deltas = record.red.delta.view(a, inner).cpu().numpy()
    for path, length, eta, accept, live in record.walk.paths:
        path, eta, accept = path.cpu().numpy(), eta.cpu().numpy(), accept.cpu().numpy()
        seen = np.minimum(eta + 1, length.cpu().numpy())
        rows, j = np.nonzero((np.arange(path.shape[1])[None] < seen[:, None]) & live.cpu().numpy()[:, None])
        nodes = path[rows, j]
        above = parent[nodes]
        delta[rows, above] = deltas[rows, above]
        node_acc[rows, above] = child_acc[rows, nodes] = accept[rows, j]
        status[rows, nodes] = np.where(j < eta[rows], ACCEPTED, REJECTED)


def round_trace(state, run) -> RoundTrace:
    """The RoundTrace of a walked, corrected and committed RoundState (specdemo.sampling.phases)."""
    tree, lay, a = state.tree, state.layout, state.count
    full = tree.num_nodes  # the corrected draw's slot
    ends = np.asarray(state.end_host)
    corrected = np.asarray(state.corrected_host)
    nan = lambda: np.full((a, full + 1), np.nan)
    delta, node_acc, child_acc = nan(), nan(), nan()
    status = np.full((a, full + 1), UNVISITED, dtype=np.int8)
    status[:, 0] = ROOT
    if state.tree_record is not None:
        _trace_tree_walk(state, delta, node_acc, child_acc, status)
    for rec in state.records:
        s_len = rec.segment.levels
        nodes, kids = rec.nodes.cpu().numpy(), rec.kid_index.cpu().numpy()
        kept = rec.decision.kept.view(a, s_len).cpu().numpy()
        if state.chain_verdict is not None:  # a chain weighed at once: P(eta >= i) at node i and its parent
            accept = state.chain_verdict.accept_prob
            child = accept[..., None]
        else:  # the closed form where the verifier left it to the records
            accept = rec.decision.accept_prob
            accept = run.verifier.acceptance(rec.red.delta, rec.segment.width) if accept is None else accept
            child = rec.decision.child_accept_prob
        child_p = child.reshape(a, s_len, -1).cpu().numpy()
        # the levels of this segment that the row's walk verified
        rows, j = np.nonzero(rec.segment.first + np.arange(s_len)[None] < ends[:, None])
        delta[rows, nodes[rows, j]] = rec.red.delta.view(a, s_len).cpu().numpy()[rows, j]
        node_acc[rows, nodes[rows, j]] = accept.reshape(a, s_len).cpu().numpy()[rows, j]
        examined = ~np.isnan(child_p[rows, j])
        er, ek = np.nonzero(examined)
        child_nodes = kids[rows[er], j[er], ek]
        child_acc[rows[er], child_nodes] = child_p[rows[er], j[er], ek]
        status[rows[er], child_nodes] = REJECTED
        ok = kept[rows, j] >= 0
        status[rows[ok], kids[rows[ok], j[ok], kept[rows[ok], j[ok]]]] = ACCEPTED
    status[corrected, full] = CORRECTED
    cur = state.cur.cpu().numpy()
    node_depth = tree.node_depth.numpy()
    evaluated = np.zeros((a, full + 1), dtype=bool)
    evaluated[:, :full] = node_depth[None] <= state.evaluated_depth
    evaluated[:, 0] = not state.root_known
    states = None
    if run.trace_states:
        states = np.full((a, full + 1, *run.shape), np.nan, dtype=np.float32)
        states[:, :lay.num_drafted_nodes] = state.x.float().cpu().numpy()
        last = state.records[-1] if state.records else None
        if last is not None and last.segment.lazy:  # leaves the walk never reached were never drawn: NaN
            reached = np.flatnonzero(ends == tree.depth)
            kids = last.kid_index.cpu().numpy()[reached, 0]
            states[reached[:, None], kids] = last.kids.float().cpu().numpy()[reached, 0]
        states[corrected, full] = state.y_new.float().cpu().numpy()[corrected]
    return RoundTrace(
        round=run.cost.rounds, trajectories=np.asarray(run.indices)[run.slot_traj[state.slot_list]],
        step=state.step.cpu().numpy(), root_known=np.full(a, state.root_known), depth=np.full(a, tree.depth),
        parent=np.append(tree.parent.numpy(), -1), node_depth=np.append(node_depth, -1),
        corrected_parent=np.where(corrected, cur, -1), status=status, evaluated=evaluated, delta=delta,
        node_accept_prob=node_acc, child_accept_prob=child_acc, committed_steps=ends, states=states,
    )
