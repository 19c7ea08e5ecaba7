"""What planning reads of a problem, as a type: planning never imports the pipeline that builds problems.

pipeline.Problem is a Setup. Planning reads the resolved settings, the models and where they run, and the
fields that earlier planning settled; it returns the same type it was given, changed through `settled`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from ..config import SamplerConfig
    from ..drafts import Draft
    from ..kernels import Kernel
    from ..models import Target
    from ..resolve import PlanRequest
    from ..sampling import Cost
    from ..trees import Topology, TopologyPlan
    from ..verifiers import Verifier
    from .cost_model import CostModel
    from .programme import DeltaStats


class Setup(Protocol):
    """A problem as planning sees it, read only (pipeline.Problem's fields of the same names)."""

    @property
    def config(self) -> SamplerConfig: ...

    @property
    def request(self) -> PlanRequest | None: ...  # what planning settles; None: nothing

    @property
    def target(self) -> Target: ...

    @property
    def kernel(self) -> Kernel: ...

    @property
    def network(self) -> Callable[..., torch.Tensor]: ...

    @property
    def cond(self) -> dict: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def tree(self) -> Topology | TopologyPlan | None: ...

    @property
    def draft(self) -> Draft | None: ...

    @property
    def verifier(self) -> Verifier | None: ...

    @property
    def pilot(self) -> Cost | None: ...

    @property
    def stats(self) -> DeltaStats | None: ...

    @property
    def cost_model(self) -> CostModel | None: ...

    @property
    def plan_source(self) -> str | None: ...

    @property
    def learnt(self) -> bool: ...

    @property
    def learning_table(self) -> bool: ...

    @property
    def plain_s(self) -> float | None: ...

    @property
    def declined(self) -> Any: ...  # the planned Setup plain sampling was expected to beat

    @property
    def measured_s(self) -> float | None: ...

    @property
    def calibration_s(self) -> float: ...

    @property
    def planning_calls(self) -> int: ...

    @property
    def slots(self) -> int: ...

    @property
    def stream_seed(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...


S = TypeVar("S", bound=Setup)


def settled(setup: S, **fields: Any) -> S:
    """`setup` with `fields` changed (dataclasses.replace: every Setup is a frozen dataclass)."""
    return dataclasses.replace(setup, **fields)  # type: ignore[type-var]
