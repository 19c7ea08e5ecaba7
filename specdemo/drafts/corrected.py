"""A draft network corrected by the target's residual (ours; `--draft NETWORK --freeze residual`).

The draft network misses the target by r = out_target(y, n) - out_draft(y, n). Where a round starts, the
target's output is known at one node (the prefetch's choice, as for the frozen draft); the residual there
is kept, and every drafted level adds it to the draft network's output:

    m^p_n(y) = formula(y, n, out_draft(y, n) + r_f),   r_f = out_target(y_f, n_f) - out_draft(y_f, n_f).

The residual of a small network trained on the same data varies slowly in the state and the step, so
it carries the target's correction down the drafted path. At a root whose output is known (y_f the
root itself) the first level is the target's own kernel, exact, as for the frozen draft. One more
draft call a round (at y_f). A trajectory's first round, before any target output of it exists, drafts
with r_f = 0 (the network as it is) instead of spending a warm-up call. Exact like every draft: r_f is a
function of target outputs computed before the round.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels import Kernel
from .network import NetworkDraft


class CorrectedNetworkDraft(NetworkDraft):
    uses_frozen = True
    cold_start = True
    exact_at_known_root = True

    def frozen_value(
        self,
        kernel: Kernel,
        out: torch.Tensor,
        x: torch.Tensor,
        n: torch.Tensor,
        previous: torch.Tensor | None = None,
        earlier: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """r_f: the target's output at (x, n) less the draft network's."""
        return out - self.network(x, n, **(cond or {}))

    def cold_value(
        self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, int]:
        """r_f = 0: the draft network as it is, for a trajectory's first round (no warm-up call)."""
        return torch.zeros_like(x), 0

    def level_output(self, output: torch.Tensor, frozen: torch.Tensor | None) -> torch.Tensor:
        """out_draft + r_f at every node of a level."""
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        return output + frozen[None]

    def config(self) -> dict[str, Any]:
        return {"draft": self.name, "freeze": "residual"}
