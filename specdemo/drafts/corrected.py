"""A draft network corrected by the target's residual (ours; `--draft NETWORK --freeze residual`).

The draft network misses the target by r = out_target(y, n) - out_draft(y, n). Where a round starts, the
target's output is known at one node (the prefetch's choice, as for the frozen draft); the residual there
is kept, and every drafted level adds it to the draft network's output:

    m^p_n(y) = formula(y, n, out_draft(y, n) + r_f),   r_f = out_target(y_f, n_f) - out_draft(y_f, n_f).

The residual of a small network trained on the same data varies slowly in the state and the step, so
it carries the target's correction down the drafted path. At a root whose output is known (y_f the
root itself) the first level is the target's own kernel, exact, as for the frozen draft. One more
draft call a round (at y_f). Exact like every draft: r_f is a function of target outputs computed
before the round.
"""

from __future__ import annotations

from .network import NetworkDraft


class CorrectedNetworkDraft(NetworkDraft):
    uses_frozen = True

    def frozen_value(self, kernel, out, x, n, previous=None, earlier=None, cond=None):
        """r_f: the target's output at (x, n) less the draft network's."""
        return out - self.network(x, n, **(cond or {}))

    def level_output(self, output, frozen):
        """out_draft + r_f at every node of a level."""
        return output + frozen[:, None]

    def config(self):
        return {"draft": self.name, "freeze": "residual"}
