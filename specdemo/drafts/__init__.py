"""Drafts: the cheap mean m^p of the draft kernel."""

from .base import AffineLevels, Draft, LevelFunction, LevelMeans
from .biased import BiasedDraft
from .corrected import CorrectedNetworkDraft
from .frozen import FrozenDraft, FrozenGaussian, FrozenOutput, FrozenPerStep, FrozenX0, FrozenX0Linear, frozen_draft
from .network import NetworkDraft
from .stepwise import StepwiseDraft

__all__ = [
    "Draft",
    "AffineLevels",
    "LevelFunction",
    "LevelMeans",
    "FrozenDraft",
    "FrozenOutput",
    "FrozenX0",
    "FrozenX0Linear",
    "FrozenGaussian",
    "FrozenPerStep",
    "frozen_draft",
    "NetworkDraft",
    "BiasedDraft",
    "CorrectedNetworkDraft",
    "StepwiseDraft",
]
