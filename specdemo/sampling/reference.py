"""The readable sampler: one trajectory, round by round, in plain loops (algorithms.md section 4).

It is the oracle the tests hold the batched driver (driver.py, round.py) against: the same algorithm,
the same random streams (TrajectoryRandom: one normal draw of the round's tree, one uniform draw for
its verifier), written the plain way, node by node. The driver fuses what this does in loops (every
slot, level and node at once), so the two differ by floating-point rounding where they compute the
same number another way; a trajectory's path, and so its sample, is the same unless a draw sits on an
acceptance boundary within that rounding.

    y = sample_one(network, kernel, shape, tree=..., draft=..., verifier=..., seed=..., index=...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..drafts import Draft
from ..drafts.base import FrozenHistory
from ..kernels import Kernel
from ..trees import Topology, TopologyPlan
from ..trees.tables import tables
from ..verifiers import Verifier
from .driver import Schedule
from .prefetch import PREFETCH, Prefetch
from .rng import TrajectoryRandom


def sample_one(  # noqa: C901, PLR0912, PLR0915 (issue 56 splits it)
    network: Callable[..., torch.Tensor],
    kernel: Kernel,
    shape: Sequence[int],
    *,
    tree: Topology | TopologyPlan = Topology(()),
    draft: Draft | None = None,
    verifier: Verifier | None = None,
    prefetch: Prefetch | str = "nearest",
    seed: int = 0,
    index: int = 0,
    cond: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Trajectory `index` of a run seeded `seed` (sample's arguments), its sample Y_N (*shape); cond holds
    this trajectory's conditioning (each value's first row)."""
    prefetch = PREFETCH[prefetch]() if isinstance(prefetch, str) else prefetch
    shape, steps = tuple(shape), kernel.num_steps
    speculates = tree.max_depth > 0
    keeps_outputs = speculates and draft is not None and draft.uses_frozen
    schedule = Schedule(tree, kernel, prefetch.leaf_table(tree, steps) if keeps_outputs else np.zeros((steps, 2), bool))
    streams = TrajectoryRandom(seed, 1, "cpu")
    generator = streams.assign(0, index)
    cond = {k: v[:1] for k, v in (cond or {}).items()}
    y = kernel.prior(shape, generator, torch.device("cpu"), dtype)
    call = lambda x, n: network(x, torch.as_tensor(n), **{k: v.expand(len(n), *v.shape[1:]) for k, v in cond.items()})
    frozen, root_out, fresh = None, None, True  # root_out: the target's output at y, where known
    accepted = examined = 0  # levels of this trajectory's rounds, which a plan's reach rule cuts its chains by

    def keep(
        out: torch.Tensor, x: torch.Tensor, n: int, above: tuple[torch.Tensor, torch.Tensor, int] | None = None
    ) -> torch.Tensor:
        """The frozen value from the output `out` at (x, n); above: (out, x, n) one node up, else the node itself."""
        assert draft is not None  # keep runs only where keeps_outputs, which needs a draft
        history: FrozenHistory = {}
        if draft.frozen_history:
            held = frozen if frozen is not None else torch.zeros((1, *draft.frozen_shape(shape)), dtype=dtype)
            out_0, x_0, n_0 = above or (out, x, n)
            history = {"previous": held, "earlier": (out_0[None], x_0[None], torch.tensor([n_0]))}
        return draft.frozen_value(
            kernel, out[None], x[None], torch.tensor([n]), cond=cond if draft.calls_network else None, **history
        )

    n = 0
    while n < steps:
        known = root_out is not None
        cell = (n, int(known), int(schedule.cuts(np.array([accepted]), np.array([examined]))[0]))
        depth = int(schedule.depth[cell])
        if not depth:  # a plain or deterministic step, with the target
            out = root_out if root_out is not None else call(y[None], [n])[0].to(dtype)
            if keeps_outputs and draft is not None and draft.cold_start and not draft.calls_network:
                frozen, fresh = keep(out, y, n), False
            mean = kernel.mean(out[None], y[None], torch.tensor([n]))[0]
            if kernel.scales[n] > 0:
                xi = torch.empty((1, *shape), dtype=dtype).normal_(generator=generator)[0]
                mean = mean + float(kernel.scales[n]) * xi
            y, n, root_out = mean, n + 1, None
            continue
        assert draft is not None and verifier is not None  # a speculative round: check_run's rule
        if keeps_outputs and frozen is None and not known:
            if draft.cold_start and fresh:
                frozen = draft.cold_value(kernel, y[None], torch.tensor([n]), cond)[0]
            else:  # a warm-up: the root alone is evaluated, and the trajectory speculates from it next round
                root_out = call(y[None], [n])[0].to(dtype)
                frozen = keep(root_out, y, n)
                continue
        fresh = False
        t = tables(schedule.trees[schedule.tree_id[cell]][0])
        leaves = bool(schedule.leaves[cell])
        s = lambda node: float(kernel.scales[n + t.node_depth[node]])  # noqa: B023  (called this round) the scale the node's children were drawn with
        # draft, level by level: the children of node v at depth d are m^p_d(X_v) + s xi
        xi = torch.empty((t.num_nodes - 1, *shape), dtype=dtype).normal_(generator=generator)
        means = draft.for_round(kernel, torch.arange(n, n + t.depth)[:, None], frozen, cond)
        x, mp = [y], []
        for v in range(t.num_parents):
            mp.append(means(int(t.node_depth[v]), x[v][None, None])[0, 0])
            x += [mp[v] + s(v) * xi[c - 1] for c in range(t.first_child[v], t.first_child[v] + t.num_children[v])]
        # one target call at the evaluated nodes (the root's output, where known, is not asked again)
        count = t.num_nodes if leaves else t.num_parents
        first = int(known)
        outs = [root_out] if root_out is not None else []
        if count > first:
            rows = call(torch.stack(x[first:count]), [n + int(t.node_depth[v]) for v in range(first, count)])
            outs += list(rows.to(dtype))
        # each parent's delta and its children's u; the verifier decides the round
        delta = np.zeros((1, t.num_parents))
        u = np.zeros((1, t.num_nodes))
        gram = np.zeros((t.num_parents, t.max_width + 1, t.max_width + 1))
        diffs = []
        for v in range(t.num_parents):
            mq = kernel.mean(outs[v][None], x[v][None], torch.tensor([n + int(t.node_depth[v])]))[0]
            diff = (mq - mp[v]).double().flatten()
            kids = range(t.first_child[v], t.first_child[v] + t.num_children[v])
            z = torch.stack([(x[c] - mp[v]).double().flatten() for c in kids] + [diff])
            gram[v, : len(kids), : len(kids)] = (z[:-1] @ z[:-1].T).numpy()
            gram[v, : len(kids), -1] = gram[v, -1, : len(kids)] = (z[:-1] @ diff).numpy()
            gram[v, -1, -1] = float(diff @ diff)
            norm = max(float(diff.norm()), np.finfo(np.float64).tiny)
            delta[0, v] = float(diff.norm()) / s(v)
            for k, c in enumerate(kids):
                u[0, c] = float(z[k] @ diff) / max(norm * s(v), np.finfo(np.float64).tiny)
            diffs.append(diff)
        if known and draft.exact_at_known_root:  # the first level's mean is the target's there: delta 0
            delta[0, 0] = 0.0
        walk = verifier.walk(
            t, delta, u, streams.uniform([0], verifier.uniforms_per_round(t)), _Stream(streams), trace=False
        )
        stop, corrected, child = int(walk.node[0]), bool(walk.corrected[0]), int(walk.child[0])
        factor = 0.0
        if corrected:  # the child moved along e = (mq - mp) / ||mq - mp|| to the draw's projection
            norm = max(float(diffs[stop].norm()), np.finfo(np.float64).tiny)
            factor = s(stop) * (float(walk.u_new[0]) - u[0, child]) / norm
            y = (x[child].double() + factor * diffs[stop].view(shape)).to(dtype)
        else:
            y = x[stop]
        if keeps_outputs:
            source = prefetch.source(
                t, walk, leaves, gram[None, min(stop, t.num_parents - 1)], np.array([factor]), t.max_width
            )
            if source is None:
                frozen = None
            else:
                v = int(source[0])
                above = max(int(t.parent[v]), 0)
                frozen = keep(
                    outs[v], x[v], n + int(t.node_depth[v]), (outs[above], x[above], n + int(t.node_depth[above]))
                )
        root_out = outs[stop] if leaves and not corrected else None
        given = int(known and draft.exact_at_known_root)  # a level accepted by construction tells nothing
        examined += int(walk.end_depth[0]) - given
        accepted += int(walk.end_depth[0]) - int(corrected) - given
        n += int(walk.end_depth[0])
    return y


class _Stream:
    """The trajectory's uniform stream, for a verifier's draws beyond a round's uniforms."""

    def __init__(self, streams: TrajectoryRandom) -> None:
        self.streams = streams

    def uniform(self, rows: np.ndarray, count: int) -> np.ndarray:
        return self.streams.uniform([0] * len(rows), count)
