"""The parts of a round: its trajectories' trees, grouped so that each group drafts one tree for every slot.

Trees are widths per depth. A tree T cut from U (T's widths are U's first ones) has U's first nodes in
the same order, so a round can draft U for every slot and read T's nodes at their own indices; the
round's operations then compute each of T's nodes exactly as drafting T alone would (the same level
products, the same per-parent shapes, as long as the widest level is the same), so a trajectory's
draws and arithmetic do not depend on the trees beside it. A round's distinct trees are grouped into
parts of trees cut from one another with the same widest level (chains of any length; fans of one
width and any depth), the deepest of each part drafted for every slot; a round of one tree, or of
chains, has one part.
"""

from __future__ import annotations

from functools import lru_cache

from ..trees import Topology


def _fits(tree: Topology, union: Topology) -> bool:
    """Whether tree and union are cut from one another with the same widest level."""
    short, long = (tree, union) if tree.depth <= union.depth else (union, tree)
    return long.widths[: short.depth] == short.widths and max(tree.widths) == max(union.widths)


@lru_cache(maxsize=1024)
def parts_of(trees: tuple[Topology, ...]) -> tuple[tuple[Topology, tuple[int, ...]], ...]:
    """The parts of a round whose speculating trees are `trees` (distinct): (the tree the part drafts,
    the indices in `trees` of its members), in the order of their first member. No tree: one part that
    drafts nothing (the roots of plain steps and warm-ups)."""
    parts: list[tuple[Topology, list[int]]] = []
    for i, tree in enumerate(trees):
        for j, (union, members) in enumerate(parts):
            if _fits(tree, union):
                parts[j] = (tree if tree.depth > union.depth else union, members + [i])
                break
        else:
            parts.append((tree, [i]))
    return tuple((union, tuple(members)) for union, members in parts) or ((Topology(()), ()),)
