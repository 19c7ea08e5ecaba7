"""What every verifier shares: the rank-one reduction of algorithms.md section 3, and the two kinds
of verifier the sampling driver dispatches on.

At an evaluated node with target mean mq, draft mean mp and scale s, the K children were drawn
i.i.d. from N(mp, s^2 I) before anything was verified. With delta = ||mq - mp|| / s and
e = (mq - mp) / (s delta), a child x has projection u = <e, (x - mp) / s>; u ~ N(0, 1) under P,
N(delta, 1) under Q, and the rest of z = (x - mp) / s has the same law under both. All scalar work
below is one-dimensional, in float64.

A `NodeVerifier` couples one node's children with the target kernel there. It works in two parts,
so that the driver can decide many nodes at once (every level of a chain in one call) and draw
corrections only where a round stops:
  decide(red, uniforms)   which child is kept (or none), from the node's projections and a fixed
                          number of uniforms (`uniforms_per_node(K)`) drawn before anything is looked at;
  correct(red, uniforms)  the corrected draw's projection u_new and the child whose orthogonal part
                          z_perp it keeps, from the same uniforms (a function of them, so deciding
                          and correcting separately is the same coupling as doing both at once).
Contract (checked by tests/test_verifiers.py for every subclass): the committed state, the kept child
or mp + s (u_new e + z_perp), is an exact draw from N(mq, s^2 I); a kept child is returned bit for bit.

A `TreeVerifier` weighs a whole drafted tree at once, chains included (block verification).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# below this delta, P and Q are the same to float64 precision: child 1 is accepted as is
DELTA_FLOOR = math.sqrt(torch.finfo(torch.float64).eps)
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
TINY = torch.finfo(torch.float64).tiny


@dataclass
class Decision:
    """Which child each of A nodes keeps.

    kept: (A,) index of the kept child, -1 where a corrected draw ends the round.
    child_accept_prob: (A, K) float64, the probability with which each examined child was accepted
        given that it was examined (NaN for children never examined).
    accept_prob: (A,) float64, the probability that the node keeps a drafted child; None where the
        verifier's closed form (`acceptance`) gives it and nothing else needed it (records compute it).
    """

    kept: torch.Tensor
    child_accept_prob: torch.Tensor
    accept_prob: torch.Tensor | None


@dataclass
class Verdict:
    """A decision with its committed state: `sample` (A, *shape) is the kept child bit for bit, or
    the corrected draw; delta (A,) float64."""

    kept: torch.Tensor
    sample: torch.Tensor
    delta: torch.Tensor
    child_accept_prob: torch.Tensor
    accept_prob: torch.Tensor


class RankOne:
    """delta (A,), u (A, K) float64 for one node per row; diff = mq - mp (A, d) float64 and its norm,
    whose direction e = diff / ||diff|| a corrected draw moves along."""

    def __init__(self, delta: torch.Tensor, u: torch.Tensor, diff: torch.Tensor, norm: torch.Tensor):
        self.delta, self.u, self._diff, self._norm = delta, u, diff, norm

    @classmethod
    def reduce(cls, mq: torch.Tensor, mp: torch.Tensor, s: torch.Tensor, children: torch.Tensor) -> "RankOne":
        """mq, mp (A, *shape), s (A,) float64, children (A, K, *shape); or the states already
        flattened, mq, mp (A, d) and children (A, K, d)."""
        if mq.dim() > 2:
            mq, mp, children = mq.flatten(1), mp.flatten(1), children.flatten(2)
        diff = (mq - mp).double()
        norm = torch.linalg.vector_norm(diff, dim=1)
        z = children.double() - mp.double()[:, None]  # s xi of each child, in float64
        u = torch.bmm(z, diff[:, :, None])[:, :, 0] / (norm * s).clamp_min(TINY)[:, None]
        return cls(norm / s, u, diff, norm)

    def select(self, idx: torch.Tensor) -> "RankOne":
        return RankOne(self.delta[idx], self.u[idx], self._diff[idx], self._norm[idx])

    def move(self, child: torch.Tensor, u_old: torch.Tensor, u_new: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The point with projection u_new and the orthogonal part z_perp of `child` (A, *shape):
        child + s (u_new - u_old) e."""
        along = s * (u_new - u_old) / self._norm.clamp_min(TINY)  # the move along e, in units of diff
        return child + (along[:, None] * self._diff).view_as(child).to(child.dtype)


def std_normal_log_pdf(u: torch.Tensor) -> torch.Tensor:
    return -0.5 * u * u - LOG_SQRT_2PI


def std_normal_pdf(u: torch.Tensor) -> torch.Tensor:
    return std_normal_log_pdf(u).exp()


def normal_sf(x: torch.Tensor) -> torch.Tensor:
    """Phibar(x) = P(N(0, 1) > x), accurate in the upper tail."""
    return torch.special.ndtr(-x)


class Verifier:
    """Base of every verifier: a name, how many children a node may have, the closed-form acceptance
    the planner uses, and a JSON description."""

    name: str
    max_children: int | None = None

    def acceptance(self, delta: torch.Tensor, k: int) -> torch.Tensor:
        """Closed-form probability that a node with this delta and K children keeps a child."""
        raise NotImplementedError

    def config(self) -> dict:
        return {"verifier": self.name}


class NodeVerifier(Verifier):
    """Verifies the K children of one node per row (module docstring: decide, then correct)."""

    def uniforms_per_node(self, k: int) -> int:
        raise NotImplementedError

    def decide(self, red: RankOne, uniforms: torch.Tensor) -> Decision:
        """uniforms (A, uniforms_per_node(K)) float64 on [0, 1). Where delta < DELTA_FLOOR, P and Q
        coincide to float64 precision and child 1 is kept."""
        d = self._decide(red, uniforms)
        same = red.delta < DELTA_FLOOR  # masked, not branched on: no host synchronisation
        first_only = torch.full_like(d.child_accept_prob[:1], float("nan"))
        first_only[:, 0] = 1.0
        return Decision(kept=torch.where(same, 0, d.kept),
                        child_accept_prob=torch.where(same[:, None], first_only, d.child_accept_prob),
                        accept_prob=None if d.accept_prob is None else torch.where(same, 1.0, d.accept_prob))

    def correct(self, red: RankOne, uniforms: torch.Tensor, rng, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """(child (A,), u_new (A,)): the corrected draw is the child `child` moved to projection u_new.
        Call it only for rows where `decide` kept no child (elsewhere the residual may have no mass
        to draw from); rng and rows serve draws beyond `uniforms` (rank-aware selection's rejection
        sampler, rarely)."""
        raise NotImplementedError

    def _decide(self, red: RankOne, uniforms: torch.Tensor) -> Decision:
        raise NotImplementedError

    def verify(self, mq, mp, s, children, rng, rows) -> Verdict:
        """One node per row, decided and corrected: mq, mp (A, *shape); s (A,) float64 scales;
        children (A, K, *shape) in drafting order; rows: each row's random stream in rng."""
        red = RankOne.reduce(mq, mp, s, children)
        uniforms = rng.uniform(rows, self.uniforms_per_node(children.shape[1]))
        d = self.decide(red, uniforms)
        ar = torch.arange(children.shape[0], device=children.device)
        sample = children[ar, d.kept.clamp_min(0)]  # a copy: a kept child bit for bit
        rejected = (d.kept < 0).nonzero().squeeze(1)
        if rejected.numel():
            r = rejected
            child, u_new = self.correct(red.select(r), uniforms[r], rng, rows[r])
            sample[r] = red.select(r).move(children[r, child], red.u[r, child], u_new, s[r])
        accept_prob = self.acceptance(red.delta, children.shape[1]) if d.accept_prob is None else d.accept_prob
        return Verdict(kept=d.kept, sample=sample, delta=red.delta, child_accept_prob=d.child_accept_prob,
                       accept_prob=accept_prob)


class TreeVerifier(Verifier):
    """Weighs a whole drafted tree at once: a chain in one weighing (verify_chain), any other tree
    path by path (weigh_tree)."""

    def uniforms_per_tree(self, tree) -> int:
        raise NotImplementedError

    def verify_chain(self, delta: torch.Tensor, u: torch.Tensor, depth: torch.Tensor, uniforms: torch.Tensor):
        raise NotImplementedError

    def weigh_tree(self, log_rho: torch.Tensor, delta: torch.Tensor, uniforms: torch.Tensor, tables):
        raise NotImplementedError
