"""What every verifier shares: the rank-one reduction of algorithms.md section 3 and its result.

At an evaluated node with target mean mq, draft mean mp and scale s, the K children were drawn
i.i.d. from N(mp, s^2 I) before anything was verified. With delta = ||mq - mp|| / s and
e = (mq - mp) / (s delta), a child x has projection u = <e, (x - mp) / s>; u ~ N(0, 1) under P,
N(delta, 1) under Q, and the rest of z = (x - mp) / s has the same law under both. All scalar work
below is one-dimensional, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..rng import TrajectoryRandom

# below this delta, P and Q are the same to float64 precision: child 1 is accepted as is
DELTA_FLOOR = math.sqrt(torch.finfo(torch.float64).eps)
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Verdict:
    """The outcome of verifying one node per row.

    kept: (A,) index of the kept child, -1 where a corrected draw ends the round.
    sample: (A, *shape) the committed state: the kept child bit for bit, or the corrected draw.
    delta: (A,) float64.
    child_accept_prob: (A, K) float64, the probability with which each examined child was accepted
        given that it was examined (NaN for children never examined).
    accept_prob: (A,) float64, the probability that the node keeps a drafted child.
    """

    kept: torch.Tensor
    sample: torch.Tensor
    delta: torch.Tensor
    child_accept_prob: torch.Tensor
    accept_prob: torch.Tensor


@dataclass
class RankOne:
    """delta (A,), e (A, d) float64, u (A, K) float64 for one node per row."""

    delta: torch.Tensor
    e: torch.Tensor
    u: torch.Tensor

    @classmethod
    def reduce(cls, mq: torch.Tensor, mp: torch.Tensor, s: torch.Tensor, children: torch.Tensor) -> "RankOne":
        diff = (mq - mp).flatten(1).double()
        norm = diff.norm(dim=1)
        delta = norm / s
        e = diff / norm.clamp_min(torch.finfo(torch.float64).tiny)[:, None]
        u = torch.einsum("akd,ad->ak", children.flatten(2).double() - mp.flatten(1).double()[:, None], e) / s[:, None]
        return cls(delta, e, u)

    def select(self, idx: torch.Tensor) -> "RankOne":
        return RankOne(self.delta[idx], self.e[idx], self.u[idx])

    def move(self, child: torch.Tensor, u_old: torch.Tensor, u_new: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The point with projection u_new and the orthogonal part z_perp of `child` (A, *shape):
        child + s (u_new - u_old) e."""
        step = (s * (u_new - u_old))[:, None] * self.e
        return child + step.view_as(child).to(child.dtype)


def std_normal_log_pdf(u: torch.Tensor) -> torch.Tensor:
    return -0.5 * u * u - LOG_SQRT_2PI


def std_normal_pdf(u: torch.Tensor) -> torch.Tensor:
    return std_normal_log_pdf(u).exp()


def normal_sf(x: torch.Tensor) -> torch.Tensor:
    """Phibar(x) = P(N(0, 1) > x), accurate in the upper tail."""
    return torch.special.ndtr(-x)


class Verifier:
    """Verifies one node per row: `verify` returns a Verdict whose committed state is an exact
    draw from N(mq, s^2 I) given everything drafted before, and, when a child is kept, that child
    bit for bit (its pre-drafted subtree is used next).
    """

    name: str
    max_children: int | None = None
    verifies_blocks = False  # True: weighs a whole chain at once (BlockVerification.verify_block)

    def verify(self, mq, mp, s, children, rng: TrajectoryRandom, rows) -> Verdict:
        """mq, mp: (A, *shape); s: (A,) float64 scales; children: (A, K, *shape) in drafting order;
        rows: the trajectory of each row (its random stream in rng)."""
        a, k = children.shape[:2]
        red = RankOne.reduce(mq, mp, s, children)
        # where P and Q coincide to float64 precision, child 1 is kept: no randomness spent
        verdict = Verdict(
            kept=torch.zeros(a, dtype=torch.long, device=children.device),
            sample=children[:, 0].clone(),
            delta=red.delta,
            child_accept_prob=torch.full((a, k), float("nan"), dtype=torch.float64, device=children.device),
            accept_prob=torch.ones(a, dtype=torch.float64, device=children.device),
        )
        verdict.child_accept_prob[:, 0] = 1.0
        live = (red.delta >= DELTA_FLOOR).nonzero().squeeze(1)
        if live.numel():
            sub = self._verify(red.select(live), s[live], children[live], rng, rows[live])
            verdict.kept[live], verdict.sample[live] = sub.kept, sub.sample
            verdict.child_accept_prob[live], verdict.accept_prob[live] = sub.child_accept_prob, sub.accept_prob
        return verdict

    def _verify(self, red: RankOne, s, children, rng, rows) -> Verdict:
        raise NotImplementedError

    def acceptance(self, delta: torch.Tensor, k: int) -> torch.Tensor:
        """Closed-form probability that a node with this delta and K children keeps a child."""
        raise NotImplementedError

    def config(self) -> dict:
        return {"verifier": self.name}
