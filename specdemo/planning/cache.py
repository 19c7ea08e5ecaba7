"""The plan cache: a JSON file per setting (its key), in a folder of the user's; and the statistics shipped with
the package for the app's default settings (specdemo/plans/: the same records, statistics only)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..trees import Topology, TopologyPlan

if TYPE_CHECKING:
    from .setup import Setup


PLAN_FORMAT = "specdemo-plan/6"
SHIPPED_PLANS = Path(__file__).parents[1] / "plans"
MACHINE = ("batch", "device", "dtype", "launch")  # what a plan priced by time depends on, and statistics do not
KEPT_PER_CELL = 64  # deltas a stored statistics record keeps per (step, depth): DeltaStats.pooled reads 24


def cache_folder(setting: str | None) -> Path | None:
    """Where plans are kept: `setting` (a folder, or "off" for none), else $SPECDEMO_CACHE, else
    $XDG_CACHE_HOME/specdemo, else ~/.cache/specdemo."""
    setting = setting or os.environ.get("SPECDEMO_CACHE")
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdemo"


def plan_key(problem: Setup) -> dict:
    """Everything a plan depends on: the model, kernel, draft (its start too), verifier (as configured: auto or a
    name; the record keeps the one planned with) and budget, the pilot's
    size, and for the time objective the batch, device and dtype it was priced for. Not the seed:
    any plan is exact, so a setting's plan serves every seed (and the same seed gives the same
    samples once the plan is kept)."""
    c = problem.config
    from .. import __version__

    key = {
        "format": PLAN_FORMAT,
        "version": __version__,
        "model": c.model,
        "kernel": problem.kernel.config(),
        "method": c.method,
        "tree": c.tree,
        "verifier": c.verifier,
        "draft": c.draft,
        "freeze": c.freeze,
        "start": c.start,
        "draft_bias": c.draft_bias,
        "prefetch": c.prefetch,
        "budget": c.budget,
        "objective": c.objective,
        "class_label": c.class_label,
        "pilot_samples": c.pilot_samples,
        "device": problem.device.type,
        "dtype": str(problem.dtype),
        "prompt": c.prompt,
        "negative_prompt": c.negative_prompt,
        "guidance_scale": c.guidance_scale,
    }
    if c.objective == "time":
        key["batch"] = problem.slots
    if problem.device.type == "cuda":  # how the networks are launched prices their calls
        key["launch"] = c.launch
    return key


def key_name(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20] + ".json"


def load_plan(key: dict, folder: Path | None) -> tuple[dict, str] | None:
    """The record stored for this key in `folder` (a plan, or statistics), and "cache"."""
    if folder is None:
        return None
    try:
        stored = json.loads((folder / key_name(key)).read_text())
    except (OSError, ValueError):
        return None
    return (stored, "cache") if stored.get("key") == json.loads(json.dumps(key, default=str)) else None


def store_plan(key: dict, record: dict, folder: Path | None) -> None:
    """Write atomically; a cache that cannot be written is skipped (the run goes on)."""
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key_name(key)}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"key": key, **record}, default=str))
        tmp.replace(folder / key_name(key))
    except OSError:
        pass


def drop_plan(key: dict, folder: Path) -> None:
    """Remove the record kept for this key (a plan whose deltas --replan starts again); a cache that cannot be
    written is skipped, as store_plan skips it."""
    try:
        (folder / key_name(key)).unlink(missing_ok=True)
    except OSError:
        pass


def plan_to_dict(plan: TopologyPlan) -> dict:
    return {
        "trees": [list(t.widths) for t in plan.trees],
        "leaves": list(plan.leaves),
        "known_trees": [list(t.widths) for t in plan.known_trees],
        "known_leaves": list(plan.known_leaves),
        "expected_calls": plan.expected_calls,
        "expected_s": plan.expected_s,
        "objective": plan.objective,
        "name": plan.name,
    }


def plan_from_dict(d: dict) -> TopologyPlan:
    trees: dict[tuple[int, ...], Topology] = {}
    topology = lambda widths: trees.setdefault(tuple(widths), Topology(tuple(widths)))
    return TopologyPlan(
        trees=tuple(topology(w) for w in d["trees"]),
        leaves=tuple(d["leaves"]),
        known_trees=tuple(topology(w) for w in d["known_trees"]),
        known_leaves=tuple(d["known_leaves"]),
        expected_calls=float(d["expected_calls"]),
        expected_s=d["expected_s"],
        objective=d["objective"],
        name=d["name"],
    )


def parse_cell(text: str) -> tuple[int, int]:
    """A stored cell "n,d": (step, depth)."""
    n, d = (int(v) for v in text.split(","))
    return n, d


def index_ranges(indices: set[int]) -> list[list[int]]:
    """Trajectory indices as [first, last + 1) runs: a run's range(num_samples) is kept as one."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def range_indices(ranges: list[list[int]]) -> set[int]:
    return {i for first, stop in ranges for i in range(first, stop)}
