"""Verifiers: couplings between the draft and target kernels at one node (NodeVerifier: RMC, D-GRS,
rank-aware; algorithms.md section 3), and block verification of a whole chain or tree. Each owns the
walk of a round (Verifier.walk), on the host, from the scalars the round reduced its nodes to."""

from ..errors import SpecdemoError
from .base import DELTA_FLOOR, Decision, NodeVerifier, RankOne, Verdict, Verifier, Walk, WalkTrace
from .block import BlockVerification
from .dgrs import GreedyRejectionSampling
from .rank import RankAwareSelection
from .rmc import ReflectionMaximalCoupling

VERIFIERS = {
    v.name: v for v in (ReflectionMaximalCoupling, GreedyRejectionSampling, RankAwareSelection, BlockVerification)
}


def get_verifier(name: str) -> Verifier:
    try:
        return VERIFIERS[name]()
    except KeyError:
        raise SpecdemoError(f"unknown verifier {name!r}; accepted: {', '.join(VERIFIERS)}") from None


__all__ = [
    "Verifier",
    "NodeVerifier",
    "Decision",
    "Verdict",
    "RankOne",
    "Walk",
    "WalkTrace",
    "DELTA_FLOOR",
    "ReflectionMaximalCoupling",
    "GreedyRejectionSampling",
    "RankAwareSelection",
    "BlockVerification",
    "VERIFIERS",
    "get_verifier",
]
