"""Drafts: the cheap mean m^p of the draft kernel."""

from .base import AffineLevels, Draft, LevelFunction, LevelMeans
from .biased import BiasedDraft
from .corrected import CorrectedNetworkDraft
from .frozen import FREEZE, FrozenDraft
from .network import NetworkDraft
from .stepwise import StepwiseDraft

__all__ = ["Draft", "AffineLevels", "LevelFunction", "LevelMeans", "FrozenDraft", "NetworkDraft", "BiasedDraft", "CorrectedNetworkDraft", "StepwiseDraft", "FREEZE"]
