"""Per-trajectory random streams.

Trajectory i of a run with seed S draws everything (initial noise, drafts, uniforms) from its own
torch.Generator seeded from (S, i). The same seed, device and batch give the same samples bit for
bit. Across batches and processes they stay the same bit for bit when the network computes each row
on its own; a network evaluated in batches may round by batch size, which moves a sample by rounding
or, where a draw sits on an acceptance boundary, sends the trajectory down another path. The law of
the samples is exact either way.

A round draws all of a trajectory's randomness at once: one call for its normals and one for its
uniforms. A counter-based generator keyed by (trajectory, step, node) would draw every trajectory in
one call, but written with torch operations it is slower at every batch size measured
(docs/benchmarks.md, latency section: Philox-4x32-10 against torch.randn), so the driver loops over the
round's trajectories once per kind of draw, not per level or per node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def trajectory_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for trajectory `index` of a run seeded with `seed`."""
    words = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def _slots(rows) -> list[int]:
    """Host slot numbers from a list, an array or a tensor (a tensor on a device costs a copy)."""
    return rows.tolist() if isinstance(rows, (np.ndarray, torch.Tensor)) else list(rows)


class TrajectoryRandom:
    """One generator per batch slot, holding the stream of the trajectory in that slot; `rows` in
    the draws are slots. A slot gets a new trajectory (and its stream) with `assign`."""

    def __init__(self, seed: int, slots: int, device: torch.device | str):
        self.seed, self.device = seed, torch.device(device)
        self.generators = [torch.Generator(device=self.device) for _ in range(slots)]

    def assign(self, slot: int, index: int) -> torch.Generator:
        """Start trajectory `index`'s stream in `slot`."""
        return self.generators[slot].manual_seed(trajectory_seed(self.seed, index))

    def normal(self, rows: Sequence[int], shape: tuple[int, ...], dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Standard normals, shape (len(rows), *shape) (into `out` when given); row j from the
        stream of slot rows[j]."""
        rows = _slots(rows)
        out = torch.empty((len(rows), *shape), device=self.device, dtype=dtype) if out is None else out
        for j, r in enumerate(rows):
            torch.randn(shape, generator=self.generators[r], out=out[j], dtype=dtype)
        return out

    def uniform(self, rows: Sequence[int], count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Uniforms on [0, 1) in float64, shape (len(rows), count) (into `out` when given)."""
        rows = _slots(rows)
        out = torch.empty((len(rows), count), device=self.device, dtype=torch.float64) if out is None else out
        for j, r in enumerate(rows):
            torch.rand(count, generator=self.generators[r], out=out[j], dtype=torch.float64)
        return out
