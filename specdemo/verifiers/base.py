"""What every verifier shares: the rank-one reduction of algorithms.md section 3, the walk of a round
that each verifier owns, and the base classes.

At an evaluated node with target mean mq, draft mean mp and scale s, the K children were drawn
i.i.d. from N(mp, s^2 I) before anything was verified. With delta = ||mq - mp|| / s and
e = (mq - mp) / (s delta), a child x has projection u = <e, (x - mp) / s>; u ~ N(0, 1) under P,
N(delta, 1) under Q, and the rest of z = (x - mp) / s has the same law under both. A verifier sees
these scalars only: the sampling round reduces every node on the device to inner products, copies them to
the host once a round, where delta and u are formed and the verifier's `walk` (numpy, float64) decides the
whole round:

    walk(tree, delta (R, parents), u (R, nodes), uniforms (R, uniforms_per_round(tree)), rng) -> Walk

R rows (trajectories) share the tree. A Walk says where each row's round ends: the committed leaf,
or the node whose children were all rejected together with the corrected draw there, given as a
child whose orthogonal part z_perp is kept and the draw's projection u_new. The round then forms
child + s (u_new - u_child) e on the device. The uniforms were drawn for the round before anything
was looked at; `rng` serves rare draws beyond them (rank-aware selection's rejection sampler).

Contract (tests/verifiers/test_verifiers.py for every verifier): the committed state is an exact draw from the
target kernel given the past; a kept child is committed bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from scipy import special

from ..trees.tables import TreeTables, tables
from ..trees.topology import Topology

# below this delta, P and Q are the same to float64 precision: child 1 is accepted as is
DELTA_FLOOR = math.sqrt(np.finfo(np.float64).eps)
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
TINY = np.finfo(np.float64).tiny


def std_normal_log_pdf(u: np.ndarray) -> np.ndarray:
    return -0.5 * u * u - LOG_SQRT_2PI


def std_normal_pdf(u: np.ndarray) -> np.ndarray:
    return np.exp(std_normal_log_pdf(u))


def normal_sf(x: np.ndarray) -> np.ndarray:
    """Phibar(x) = P(N(0, 1) > x), accurate in the upper tail."""
    return special.ndtr(-x)


class Uniforms(Protocol):
    """A source of uniforms for draws beyond a round's own: uniform(rows, count) (len(rows), count) on [0, 1),
    float64, row j from the stream of rows[j]."""

    def uniform(self, rows: np.ndarray, count: int) -> np.ndarray: ...


@dataclass
class Decision:
    """Which child each of R nodes keeps: kept (R,) the child's index, -1 where a corrected draw ends
    the round; child_accept_prob (R, K) the probability each examined child was accepted with given
    that it was examined (NaN for children never examined); accept_prob (R,) the probability that the
    node keeps a child, or None where the closed form (`acceptance`) gives it."""

    kept: np.ndarray
    child_accept_prob: np.ndarray
    accept_prob: np.ndarray | None


@dataclass
class WalkTrace:
    """What a walk looked at, per node (R, nodes), for the round views: delta and the probability of
    keeping a child at the verified parents, the probability each examined child was accepted with,
    and which children were accepted and which rejected (under block verification both probabilities
    are P(eta >= i | the weighed path))."""

    delta: np.ndarray
    node_accept_prob: np.ndarray
    child_accept_prob: np.ndarray
    accepted: np.ndarray
    rejected: np.ndarray

    @classmethod
    def empty(cls, rows: int, nodes: int) -> WalkTrace:
        nan = lambda: np.full((rows, nodes), np.nan)
        return cls(nan(), nan(), nan(), np.zeros((rows, nodes), bool), np.zeros((rows, nodes), bool))


@dataclass
class Walk:
    """Where each of R rounds ends. end_depth (R,): committed steps; corrected (R,) bool; node (R,):
    the committed leaf, or the parent whose residual the corrected draw comes from; child (R,): for a
    corrected row the child whose orthogonal part the draw keeps (else the leaf); u_new (R,): the
    draw's projection (NaN where not corrected)."""

    end_depth: np.ndarray
    corrected: np.ndarray
    node: np.ndarray
    child: np.ndarray
    u_new: np.ndarray
    trace: WalkTrace | None = None


class Verifier:
    """Base of every verifier: a name, how many children a node may have, the uniforms a round of a tree
    takes, its walk, and the closed-form acceptance the planner uses."""

    name: str
    max_children: int | None = None
    weighs_whole_tree = False  # decides from every drafted node at once: its plans are fans (planning/programme.py)

    def uniforms_per_round(self, tree: TreeTables) -> int:
        raise NotImplementedError

    def walk(
        self,
        tree: TreeTables,
        delta: np.ndarray,
        u: np.ndarray,
        uniforms: np.ndarray,
        rng: Uniforms,
        trace: bool = False,
    ) -> Walk:
        """Decide R rounds of one tree (module docstring): delta (R, num_parents), u (R, num_nodes)
        (column 0 unused), uniforms (R, uniforms_per_round) on [0, 1), float64."""
        raise NotImplementedError

    def acceptance(self, delta: np.ndarray, k: int = 1) -> np.ndarray:
        """Closed-form probability that a node with this delta and K children keeps a child."""
        raise NotImplementedError

    def config(self) -> dict:
        return {"verifier": self.name}

    def verify(
        self,
        mq: torch.Tensor,
        mp: torch.Tensor,
        s: torch.Tensor,
        children: torch.Tensor,
        rng: Uniforms,
        rows: np.ndarray,
    ) -> Verdict:
        """One node per row, decided and corrected (a one-level tree of K children): mq, mp (A, *shape),
        s (A,) float64 scales, children (A, K, *shape) in drafting order; rng.uniform(rows, count)
        serves the uniforms, rows each row's stream."""
        k = children.shape[1]
        red = RankOne.reduce(mq, mp, s, children)
        tree = tables(Topology((k,)))
        u = np.zeros((len(rows), 1 + k))
        u[:, 1:] = red.u.numpy()
        walk = self.walk(
            tree,
            red.delta.numpy()[:, None],
            u,
            np.asarray(rng.uniform(rows, self.uniforms_per_round(tree))),
            _RowsOf(rng, rows),
            trace=True,
        )
        assert walk.trace is not None  # walked with trace=True
        kept = np.where(walk.corrected, -1, walk.node - 1)
        ar = torch.arange(children.shape[0])
        child = torch.from_numpy(walk.child - 1)
        u_old = red.u[ar, child]
        moved = red.move(children[ar, child], u_old, torch.from_numpy(np.nan_to_num(walk.u_new)), s)
        sample = torch.where(
            torch.from_numpy(walk.corrected)[:, None], moved.flatten(1), children[ar, child].flatten(1)
        )
        accept = walk.trace.node_accept_prob[:, 0]
        if np.isnan(accept).any():
            accept = self.acceptance(red.delta.numpy(), k)
        return Verdict(
            kept=torch.from_numpy(kept),
            sample=sample.view_as(mq),
            delta=red.delta,
            child_accept_prob=torch.from_numpy(walk.trace.child_accept_prob[:, 1:]),
            accept_prob=torch.from_numpy(np.asarray(accept)),
        )


class _RowsOf:
    """A source of uniforms for a walk's rows (0..R-1) that draws from `rows` of another source."""

    def __init__(self, rng: Uniforms, rows: np.ndarray) -> None:
        self.rng, self.rows = rng, rows

    def uniform(self, rows: np.ndarray, count: int) -> np.ndarray:
        return np.asarray(self.rng.uniform(np.asarray(self.rows)[rows], count))


@dataclass
class Verdict:
    """One node per row, decided and corrected: `sample` (A, *shape) is the kept child bit for bit, or
    the corrected draw; delta (A,) float64."""

    kept: torch.Tensor
    sample: torch.Tensor
    delta: torch.Tensor
    child_accept_prob: torch.Tensor
    accept_prob: torch.Tensor


class RankOne:
    """The reduction on torch tensors, for `verify`: delta (A,), u (A, K) float64 for one node per row;
    diff = mq - mp (A, d) float64 and its norm, whose direction e a corrected draw moves along."""

    def __init__(self, delta: torch.Tensor, u: torch.Tensor, diff: torch.Tensor, norm: torch.Tensor) -> None:
        self.delta, self.u, self._diff, self._norm = delta, u, diff, norm

    @classmethod
    def reduce(cls, mq: torch.Tensor, mp: torch.Tensor, s: torch.Tensor, children: torch.Tensor) -> RankOne:
        """mq, mp (A, *shape), s (A,) float64, children (A, K, *shape)."""
        mq, mp, children = mq.flatten(1), mp.flatten(1), children.flatten(2)
        diff = (mq - mp).double()
        norm = torch.linalg.vector_norm(diff, dim=1)
        z = children.double() - mp.double()[:, None]
        u = torch.bmm(z, diff[:, :, None])[:, :, 0] / (norm * s).clamp_min(TINY)[:, None]
        return cls(norm / s, u, diff, norm)

    def move(self, child: torch.Tensor, u_old: torch.Tensor, u_new: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The point with projection u_new and the orthogonal part z_perp of `child` (A, *shape):
        child + s (u_new - u_old) e."""
        along = s * (u_new - u_old) / self._norm.clamp_min(TINY)
        return child + (along[:, None] * self._diff).view_as(child).to(child.dtype)


class NodeVerifier(Verifier):
    """Couples one node's children with the target kernel at a time (RMC, D-GRS, rank-aware), in two
    parts, so that a walk decides many nodes at once (every level of a width-1 run in one call) and
    draws corrections only where a round stops:
      decide(delta, u, uniforms)       which child is kept (or none), from a fixed number of uniforms
                                       (`uniforms_per_node(K)`) drawn before anything is looked at;
      correct(delta, u, uniforms, rng) the corrected draw's projection u_new and the child whose
                                       z_perp it keeps, from the same uniforms.
    The walk descends from the root, deciding the nodes it reaches; deciding nodes past a rejection
    uses uniforms that nothing else reads, so it changes no law."""

    def uniforms_per_node(self, k: int) -> int:
        raise NotImplementedError

    def uniforms_per_round(self, tree: TreeTables) -> int:
        return sum(self.uniforms_per_node(w) for w in tree.widths)

    def decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        """delta (R,), u (R, K), uniforms (R, uniforms_per_node(K)). Where delta < DELTA_FLOOR, P and Q
        coincide to float64 precision and child 1 is kept."""
        d = self._decide(delta, u, uniforms)
        same = delta < DELTA_FLOOR
        if not same.any():
            return d
        first_only = np.full(d.child_accept_prob.shape[1], np.nan)
        first_only[0] = 1.0
        return Decision(
            kept=np.where(same, 0, d.kept),
            child_accept_prob=np.where(same[:, None], first_only, d.child_accept_prob),
            accept_prob=None if d.accept_prob is None else np.where(same, 1.0, d.accept_prob),
        )

    def _decide(self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray) -> Decision:
        raise NotImplementedError

    def correct(
        self, delta: np.ndarray, u: np.ndarray, uniforms: np.ndarray, rng: Uniforms, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(child (R,), u_new (R,)) for rows where `decide` kept no child (elsewhere the residual may have
        no mass to draw from); rng.uniform(rows, count) serves draws beyond `uniforms`."""
        raise NotImplementedError

    def walk(
        self,
        tree: TreeTables,
        delta: np.ndarray,
        u: np.ndarray,
        uniforms: np.ndarray,
        rng: Uniforms,
        trace: bool = False,
    ) -> Walk:
        r = delta.shape[0]
        rows = np.arange(r)
        node = np.zeros(r, dtype=np.int64)
        end = np.full(r, tree.depth, dtype=np.int64)
        corrected = np.zeros(r, dtype=bool)
        child = np.zeros(r, dtype=np.int64)
        u_new = np.full(r, np.nan)
        record = WalkTrace.empty(r, tree.num_nodes) if trace else None
        alive = np.ones(r, dtype=bool)
        offset = 0
        for first, last, width in _segments(tree.widths):
            levels, per = last - first + 1, self.uniforms_per_node(width)
            # the nodes decided: a width-1 run's path below the row's node, or the node itself (rows that
            # stopped above decide from the root: valid indices, results unused)
            nodes = tree.leftmost[np.where(alive, node, 0), :levels]
            kids = tree.first_child[nodes][..., None] + np.arange(width)  # (R, S, K)
            d = delta[rows[:, None], nodes]
            uk = u[rows[:, None, None], kids]
            coins = uniforms[:, offset : offset + levels * per].reshape(r * levels, per)
            offset += levels * per
            decision = self.decide(d.reshape(-1), uk.reshape(r * levels, width), coins)
            kept = decision.kept.reshape(r, levels)
            lead = np.cumprod(kept >= 0, 1).sum(1)  # levels kept before the first rejection (S: none)
            stops = alive & (lead < levels)
            at = np.minimum(lead, levels - 1)
            if record is not None:  # walked with trace
                _record_segment(self, record, decision, d, kids, lead, alive, r, levels, width, nodes)
            if stops.any():
                s_rows = rows[stops]
                flat = s_rows * levels + at[stops]
                c, drawn = self.correct(d[s_rows, at[stops]], uk[s_rows, at[stops]], coins[flat], rng, s_rows)
                child[stops] = kids[s_rows, at[stops], c]
                u_new[stops] = drawn
                node[stops] = nodes[s_rows, at[stops]]
                end[stops] = first + at[stops] + 1
                corrected |= stops
            held = alive & ~stops
            node = np.where(held, kids[rows, levels - 1, np.maximum(kept[:, -1], 0)], node)
            alive = held
        child = np.where(corrected, child, node)
        return Walk(end, corrected, node, child, u_new, record)


def _segments(widths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(first, last, width): runs of width-1 levels, and single levels of width > 1."""
    out, d = [], 0
    while d < len(widths):
        last = d
        if widths[d] == 1:
            while last + 1 < len(widths) and widths[last + 1] == 1:
                last += 1
        out.append((d, last, widths[d]))
        d = last + 1
    return out


def _record_segment(
    verifier: Verifier,
    record: WalkTrace,
    decision: Decision,
    d: np.ndarray,
    kids: np.ndarray,
    lead: np.ndarray,
    alive: np.ndarray,
    r: int,
    levels: int,
    width: int,
    nodes: np.ndarray,
) -> None:
    """A segment's nodes in the walk's trace: the levels each live row verified (up to its first
    rejection), delta and acceptance there, its examined children and which one it kept."""
    accept = decision.accept_prob if decision.accept_prob is not None else verifier.acceptance(d.reshape(-1), width)
    accept = accept.reshape(r, levels)
    child_p = decision.child_accept_prob.reshape(r, levels, width)
    kept = decision.kept.reshape(r, levels)
    seen = alive[:, None] & (np.arange(levels)[None] <= np.minimum(lead, levels - 1)[:, None])
    rows, j = np.nonzero(seen)
    parents = nodes[rows, j]
    record.delta[rows, parents] = d[rows, j]
    record.node_accept_prob[rows, parents] = accept[rows, j]
    examined = ~np.isnan(child_p[rows, j])
    er, ek = np.nonzero(examined)
    kid_nodes = kids[rows[er], j[er], ek]
    record.child_accept_prob[rows[er], kid_nodes] = child_p[rows[er], j[er], ek]
    record.rejected[rows[er], kid_nodes] = True
    ok = kept[rows, j] >= 0
    won = kids[rows[ok], j[ok], kept[rows[ok], j[ok]]]
    record.accepted[rows[ok], won] = True
    record.rejected[rows[ok], won] = False
