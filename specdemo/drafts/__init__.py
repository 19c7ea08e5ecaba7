"""Drafts: the cheap mean m^p of the draft kernel."""

from .base import Draft, LevelMeans
from .biased import BiasedDraft
from .corrected import CorrectedNetworkDraft
from .frozen import FREEZE, FrozenDraft
from .network import NetworkDraft
from .stepwise import StepwiseDraft

__all__ = ["Draft", "LevelMeans", "FrozenDraft", "NetworkDraft", "BiasedDraft", "CorrectedNetworkDraft", "StepwiseDraft", "FREEZE"]
