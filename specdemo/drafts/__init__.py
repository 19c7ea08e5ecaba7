"""Drafts: the cheap mean m^p of the draft kernel."""

from .base import Draft
from .biased import BiasedDraft
from .frozen import FREEZE, FrozenDraft
from .network import NetworkDraft

__all__ = ["Draft", "FrozenDraft", "NetworkDraft", "BiasedDraft", "FREEZE"]
