"""Several processes (and devices): `accelerate launch --multi_gpu --num_processes P -m specdemo sample ...`.

Process p of P draws trajectories p, p + P, p + 2P, ...; every trajectory has its own random
stream (specdemo.rng), so the gathered samples are those one process would draw with the same
seed and plan: the main process calibrates (--tree auto, --freeze auto) and the others take its
calibration (Broadcast). The main process gathers samples and costs and writes the outputs.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .errors import SpecdemoError
from .sampling import Cost


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


SINGLE_PROCESS_NOTE = (
    "specdemo: note: accelerate started one process (`accelerate launch --cpu` ignores "
    "--num_processes); for P processes on CPUs run `accelerate launch --multi_gpu --num_processes "
    "P`, which uses the CPUs where there is no GPU"
)


def single_process_note() -> str | None:
    """What to tell a user whom accelerate launched as one process while CPUs were asked for: `--cpu`
    runs one process whatever --num_processes says (accelerate 1.x), and says nothing about it."""
    return SINGLE_PROCESS_NOTE if os.environ.get("ACCELERATE_USE_CPU") and not launched_by_torchrun() else None


def process_state():
    """accelerate's PartialState (gloo on CPUs), or None for a plain single-process run."""
    if not launched_by_torchrun():
        return None
    try:
        from accelerate import PartialState
    except ImportError:
        raise SpecdemoError("several processes need accelerate: pip install 'specdemo[parallel]'") from None

    return PartialState(cpu=not torch.cuda.is_available())


class Broadcast:
    """A value of the main process given to every process (the calibration: one plan for all)."""

    def __init__(self, state):
        self.is_main = state.is_main_process

    @staticmethod
    def send(value):
        from accelerate.utils import broadcast_object_list

        broadcast_object_list([value], from_process=0)

    @staticmethod
    def receive():
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([None], from_process=0)[0]


def my_indices(state, num_samples: int) -> list[int]:
    return list(range(state.process_index, num_samples, state.num_processes))


def gather(state, indices: list[int], samples: torch.Tensor, cost: Cost) -> tuple[np.ndarray, Cost] | None:
    """On the main process: all samples in trajectory order and the merged cost; None elsewhere."""
    from accelerate.utils import gather_object

    parts = gather_object([(indices, samples.cpu().numpy(), cost)])
    if not state.is_main_process:
        return None
    order = np.argsort(np.concatenate([p[0] for p in parts]))
    return np.concatenate([p[1] for p in parts])[order], merge_costs([p[2] for p in parts], order)


def merge_costs(costs: list[Cost], order: np.ndarray) -> Cost:
    """The processes' costs as one run's: per-trajectory figures in trajectory order (`order` sorts
    the processes' trajectories, concatenated), sequential figures (calls, rounds, seconds) of the
    slowest process, since the processes run side by side, and every process's calls in
    processes_calls."""
    per = lambda name: np.concatenate([getattr(c, name) for c in costs])[order]
    first = costs[0]
    return Cost(
        method=first.method,
        steps=first.steps,
        stochastic_steps=first.stochastic_steps,
        calls_per_trajectory=per("calls_per_trajectory"),
        counted_calls=per("counted_calls"),
        rows_per_trajectory=per("rows_per_trajectory"),
        target_calls=max(c.target_calls for c in costs),
        processes_calls=sum(c.total_target_calls for c in costs),
        draft_calls=max(c.draft_calls for c in costs),
        rounds=max(c.rounds for c in costs),
        warm_ups=sum(c.warm_ups for c in costs),
        wall_s=max(c.wall_s for c in costs),
        target_s=max(c.target_s for c in costs),
        examined_per_depth=list(np.sum([c.examined_per_depth for c in costs], axis=0)),
        accepted_per_depth=list(np.sum([c.accepted_per_depth for c in costs], axis=0)),
    )
