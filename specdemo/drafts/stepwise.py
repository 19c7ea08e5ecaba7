"""Per step, the frozen draft or the draft network corrected by the target's residual (ours;
`--draft NETWORK --freeze auto`).

Which draft fits best changes along the sampling path. On the digits model x0-hat frozen drafts the
early steps best (x0-hat moves little there, less than the draft network misses by) and the corrected
draft network the late ones. A per-step table (filled by planning from the runs or from a pilot of each form,
specdemo/planning/) says which one forms m^p at each step n:

    m^p_n(y) = the frozen draft's m^p_n(y)                     where forms[n] is one of its forms
                                                                (out, x0, x0-linear, gaussian: drafts/frozen.py),
    m^p_n(y) = formula(y, n, out_draft(y, n) + r_f)            where forms[n] = RESIDUAL (drafts/corrected.py).

Each target evaluation keeps what both need (the frozen draft's value and r_f), so a round whose levels
cross from one to the other needs nothing more; a level calls the draft network only for the
trajectories whose step it drafts. Exact like every draft: both are functions of target outputs
computed before the round.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import SpecdemoError
from ..kernels import Kernel
from .base import Draft, LevelFunction, LevelMeans
from .corrected import CorrectedNetworkDraft
from .frozen import OUT, X0, FrozenPerStep

RESIDUAL = 4  # forms[n]: the corrected draft network drafts step n (0..3: the frozen draft's forms)


class StepwiseDraft(Draft):
    uses_frozen = True
    cold_start = True
    calls_network = True
    exact_at_known_root = True

    def __init__(self, network: CorrectedNetworkDraft, forms: tuple[int, ...]) -> None:
        self.network, self.forms = network, torch.tensor([int(v) for v in forms], dtype=torch.long)
        if not bool(((self.forms >= OUT) & (self.forms <= RESIDUAL)).all()):
            raise SpecdemoError(
                f"a per-step draft table holds forms {OUT}..{RESIDUAL} "
                "(out, x0, x0-linear, gaussian, residual) per step"
            )
        # the frozen draft's table: any of its forms where the network drafts (never read there)
        self.frozen = FrozenPerStep(tuple(torch.where(self.forms == RESIDUAL, X0, self.forms).tolist()))
        self.frozen_history = self.frozen.frozen_history

    def check(self, kernel: Kernel) -> None:
        self.frozen.check(kernel)

    def parts(self) -> tuple[Draft, ...]:
        """Itself, its draft network, then its frozen draft."""
        return (self, *self.network.parts(), *self.frozen.parts())

    def frozen_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The frozen draft's channels, then r_f."""
        channels, *rest = self.frozen.frozen_shape(shape)
        return (channels + 1, *rest)

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
        kept = self.frozen.frozen_value(kernel, out, x, n, None if previous is None else previous[:, :-1], earlier)
        return torch.cat((kept, self.network.frozen_value(kernel, out, x, n, cond=cond)[:, None]), 1)

    def cold_value(
        self, kernel: Kernel, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, int]:
        """A trajectory's first round, before any target output of it exists: the frozen forms freeze the
        draft network's own output at the root, and r_f = 0 (one draft call instead of a warm-up call)."""
        kept = self.frozen.frozen_value(kernel, self.network.network(x, n, **cond), x, n)
        return torch.cat((kept, torch.zeros_like(x)[:, None]), 1), 1

    def for_round(
        self, kernel: Kernel, steps: torch.Tensor, frozen: torch.Tensor | None, cond: dict[str, torch.Tensor]
    ) -> LevelMeans:
        assert frozen is not None  # uses_frozen: the sampler passes each trajectory's frozen value
        frozen_means = self.frozen.for_round(kernel, steps, frozen[:, :-1], cond)
        on_network = self.forms.to(steps.device)[steps] == RESIDUAL  # (L, A)
        trajectories = on_network.sum(1).tolist()  # one host read a round: how many a level drafts by the network
        if not any(trajectories):
            return frozen_means
        network_means = self.network.for_round(kernel, steps, frozen[:, -1], cond)
        everyone = on_network.shape[1]

        def level(d: int, x: torch.Tensor) -> torch.Tensor:
            if trajectories[d] == everyone:  # a batch of one always: a level is one draft or the other
                return network_means(d, x)
            m = frozen_means(d, x)
            if trajectories[d]:
                rows = on_network[d].nonzero()[:, 0]
                means = self.network.for_round(
                    kernel, steps[d : d + 1, rows], frozen[rows, -1], {k: v[rows] for k, v in cond.items()}
                )
                m[:, rows] = means(0, x[:, rows])
            return m

        return LevelFunction(level, network_levels=sum(map(bool, trajectories)))

    def config(self) -> dict[str, Any]:
        return {"draft": self.network.name, "freeze": "auto"}
