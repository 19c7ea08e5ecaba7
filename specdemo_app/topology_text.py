"""The topology as the page takes it, typed: "auto" (planned per step) or widths such as 3,2,1."""

from __future__ import annotations

from specdemo.trees import Topology


def is_auto(tree: str | None) -> bool:
    """Whether `tree` asks for a topology planned per step (SamplerConfig.tree = "auto")."""
    return str(tree or "").strip().lower() == "auto"


def speculative_method(tree: str) -> str:
    """chain if every width is 1, else tree; "auto" plans trees (refuses malformed widths with the reason)."""
    if is_auto(tree):
        return "tree"
    return "chain" if Topology.parse(tree).is_chain else "tree"
