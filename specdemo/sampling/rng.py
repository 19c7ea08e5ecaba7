"""Per-trajectory random streams.

Trajectory i of a run with seed S draws everything from its own streams seeded from (S, i): its
normals (initial noise, drafts) from a torch.Generator on the run's device, its uniforms (the
verifiers' coins, on the host) from a numpy Generator. The same seed, device and batch give the same
samples bit for bit. Across batches and processes they stay the same bit for bit when the network
computes each row on its own; a network evaluated in batches may round by batch size, which moves a
sample by rounding or, where a draw sits on an acceptance boundary, sends the trajectory down another
path. The law of the samples is exact either way.

A round draws each trajectory's normals in one call (the round's whole tree) and its uniforms in one
more, on the host. A counter-based generator keyed by (trajectory, step, node) would draw every
trajectory's normals in one call, but written with torch operations it is slower at every batch size
measured (docs/benchmarks.md, latency section: Philox-4x32-10 against torch.randn).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def trajectory_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for trajectory `index` of a run seeded with `seed`."""
    words = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def _slots(rows: Sequence[int] | np.ndarray | torch.Tensor) -> list[int]:
    """Host slot numbers from a list, an array or a tensor (a tensor on a device costs a copy)."""
    return rows.tolist() if isinstance(rows, (np.ndarray, torch.Tensor)) else list(rows)


class TrajectoryRandom:
    """One pair of streams per batch slot, holding the streams of the trajectory in that slot; `rows`
    in the draws are slots. A slot gets a new trajectory (and its streams) with `assign`."""

    def __init__(self, seed: int, slots: int, device: torch.device | str) -> None:
        self.seed, self.device = seed, torch.device(device)
        self.generators = [torch.Generator(device=self.device) for _ in range(slots)]
        self.host: list[np.random.Generator | None] = [None] * slots

    def assign(self, slot: int, index: int) -> torch.Generator:
        """Start trajectory `index`'s streams in `slot`."""
        self.host[slot] = np.random.Generator(np.random.Philox(trajectory_seed(self.seed, index)))
        return self.generators[slot].manual_seed(trajectory_seed(self.seed, index))

    def normal_(self, slot: int, out: torch.Tensor) -> torch.Tensor:
        """Fill `out` with standard normals from slot's stream."""
        return out.normal_(generator=self.generators[slot])

    def uniform(self, rows: Sequence[int] | np.ndarray | torch.Tensor, count: int) -> np.ndarray:
        """Uniforms on [0, 1) in float64 on the host, shape (len(rows), count); row j from slot rows[j]."""
        slots = _slots(rows)
        out = np.empty((len(slots), count))
        for j, r in enumerate(slots):
            host = self.host[r]
            assert host is not None, "a slot draws only once assign() gave it a trajectory"
            out[j] = host.random(count)
        return out
