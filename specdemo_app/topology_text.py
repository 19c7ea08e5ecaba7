"""The topology as the page takes it, typed: "auto" (planned per step) or widths such as 3,2,1."""

from __future__ import annotations


def is_auto(tree: str | None) -> bool:
    """Whether `tree` asks for a topology planned per step (SamplerConfig.tree = "auto")."""
    return str(tree or "").strip().lower() == "auto"
