"""Per-trajectory random streams.

Trajectory i of a run with seed S draws everything (initial noise, drafts, uniforms) from its own
torch.Generator seeded from (S, i). Its samples therefore do not depend on the batch it runs in:
the same seed gives the same samples on the same device whether the run has one process or
several, one batch or many (bit for bit when the network treats rows independently; batched
matrix products may round by batch size, which moves samples by float rounding only).
"""

from __future__ import annotations

import numpy as np
import torch

UNIFORM_BUFFER = 256  # uniforms pre-drawn per trajectory, so that small draws are one gather


def trajectory_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for trajectory `index` of a run seeded with `seed`."""
    words = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


class TrajectoryRandom:
    """One generator per batch slot, holding the stream of the trajectory in that slot; `rows` in
    the draws are slots. A slot gets a new trajectory (and its stream) with `assign`."""

    def __init__(self, seed: int, slots: int, device: torch.device | str):
        self.seed, self.device = seed, torch.device(device)
        self.generators = [torch.Generator(device=self.device) for _ in range(slots)]
        self._uniforms = torch.empty((slots, UNIFORM_BUFFER), dtype=torch.float64, device=self.device)
        self._used = torch.full((slots,), UNIFORM_BUFFER, dtype=torch.long, device=self.device)

    def assign(self, slot: int, index: int) -> torch.Generator:
        """Start trajectory `index`'s stream in `slot`."""
        self.generators[slot].manual_seed(trajectory_seed(self.seed, index))
        self._used[slot] = UNIFORM_BUFFER
        return self.generators[slot]

    def normal(self, rows: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Standard normals, shape (len(rows), *shape); row j from trajectory rows[j]'s stream."""
        out = torch.empty((len(rows), *shape), device=self.device, dtype=dtype)
        for j, r in enumerate(rows.tolist()):
            torch.randn(shape, generator=self.generators[r], out=out[j])
        return out

    def uniform(self, rows: torch.Tensor, count: int) -> torch.Tensor:
        """Uniforms on [0, 1) in float64, shape (len(rows), count), rows distinct.

        Served from per-trajectory buffers; a buffer without `count` unused values is redrawn
        (what was left is dropped, which keeps every stream a function of its own draws alone).
        """
        if count > UNIFORM_BUFFER:
            raise ValueError(f"at most {UNIFORM_BUFFER} uniforms per draw")
        refill = rows[self._used[rows] + count > UNIFORM_BUFFER]
        for r in refill.tolist():
            torch.rand(UNIFORM_BUFFER, generator=self.generators[r], out=self._uniforms[r], dtype=torch.float64)
        self._used[refill] = 0
        cols = self._used[rows, None] + torch.arange(count, device=self.device)
        self._used[rows] += count
        return self._uniforms[rows[:, None], cols]
