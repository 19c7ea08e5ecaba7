"""A network call as one launch on CUDA: the network captured as a CUDA graph once per call shape and
replayed at every call (`launch="graphs"`), or compiled by torch.compile (`launch="compile"`).

A small network's call is bound by dispatching its kernels one by one, not by computing them (the digits
UNet: about 150 operations a call). A graph replays them all with one launch. The driver pads every call to
one of a few sizes (sampling/padding.py CALL_SIZES), so a run captures a few graphs, each when its size is
first called: pipeline.warm_up calls every size a run can use before the run, as it already does to set up
a network's kernels.

A replay writes its output into memory the graphs share: the next call of any shape may overwrite it, so
a caller reads a call's outputs before it calls again (the driver does). Only the target network is
captured: its calls come in the driver's few padded sizes, where a draft network's come in as many shapes
as a round's levels. A capture is thread-local and serialised (a server runs several jobs at once), and a
network that cannot be captured (a host synchronisation inside it, say) runs eagerly for that shape, with
one warning.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..config import LAUNCHES
from ..errors import SpecdemoError

WARM_UP_CALLS = 3  # eager calls on a side stream before a capture (lazy set-up inside the network)
_CAPTURE = threading.Lock()  # one capture at a time in a process


def launched(network: Callable[..., torch.Tensor], launch: str, device: torch.device) -> Callable[..., torch.Tensor]:
    """The network as `launch` runs it on `device`: auto is graphs on CUDA and eager elsewhere; graphs and
    compile need CUDA."""
    if launch not in LAUNCHES:
        raise SpecdemoError(f"unknown launch {launch!r}; accepted: {', '.join(LAUNCHES)}")
    if launch == "auto":
        launch = "graphs" if device.type == "cuda" else "eager"
    if launch != "eager" and device.type != "cuda":
        raise SpecdemoError(
            f"launch {launch} replays the network on a CUDA GPU; on {device.type} use launch eager or auto"
        )
    if launch == "graphs":
        return GraphedNetwork(network)
    if launch == "compile":
        return torch.compile(network, mode="reduce-overhead", dynamic=False)
    return network


class GraphedNetwork:
    """network(x, n, **cond) replayed from a CUDA graph per shape of its inputs (module docstring)."""

    def __init__(self, network: Callable[..., torch.Tensor], max_graphs: int = 64) -> None:
        self.network, self.max_graphs = network, max_graphs
        self._graphs: dict[tuple, tuple | None] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None

    def __getattr__(self, name: str) -> Any:  # the wrapped network's attributes (its model, its kernel)
        return getattr(self.network, name)

    def __call__(self, x: torch.Tensor, n: torch.Tensor, **cond: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, n.dtype, tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(cond.items())))
        if key not in self._graphs:
            self._graphs[key] = self._capture(x, n, cond) if len(self._graphs) < self.max_graphs else None
        entry = self._graphs[key]
        if entry is None:
            return self.network(x, n, **cond)
        graph, static_x, static_n, static_cond, static_out = entry
        static_x.copy_(x)
        static_n.copy_(n)
        for k, v in cond.items():
            static_cond[k].copy_(v)
        graph.replay()
        return static_out

    def _capture(self, x: torch.Tensor, n: torch.Tensor, cond: dict[str, torch.Tensor]) -> tuple | None:
        static_x, static_n = x.clone(), n.clone()
        static_cond = {k: v.clone() for k, v in cond.items()}
        try:
            with _CAPTURE:
                return self._captured(x, static_x, static_n, static_cond)
        except RuntimeError as err:  # not capturable: this shape runs eagerly
            warnings.warn(
                f"the network could not be captured as a CUDA graph for inputs {tuple(x.shape)} ({err}); "
                "it runs eagerly there",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def _captured(
        self, x: torch.Tensor, static_x: torch.Tensor, static_n: torch.Tensor, static_cond: dict[str, torch.Tensor]
    ) -> tuple:
        """Warm the network up on a side stream, then capture one call into the graphs' shared pool."""
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_CALLS):
                self.network(static_x, static_n, **static_cond)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            static_out = self.network(static_x, static_n, **static_cond)
        return graph, static_x, static_n, static_cond, static_out
