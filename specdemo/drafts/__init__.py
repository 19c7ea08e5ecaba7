"""Drafts: the cheap mean m^p of the draft kernel."""

from .base import Draft, LevelMeans
from .biased import BiasedDraft
from .corrected import CorrectedNetworkDraft
from .frozen import FREEZE, FrozenDraft
from .network import NetworkDraft

__all__ = ["Draft", "LevelMeans", "FrozenDraft", "NetworkDraft", "BiasedDraft", "CorrectedNetworkDraft", "FREEZE"]
