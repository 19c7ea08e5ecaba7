"""Run by path in a fresh process whose PYTHONPATH puts one checkout's `specdemo` first: the ATen operations
a sampling run dispatches per round outside the target network, for each cell, as JSON. Written against
the public API every driver since commit e2c14cd exposes (SamplerConfig, build, Problem.run), so that
benchmarks/launches.py can count today's driver and the one before the fused round side by side.

On a GPU every one of these operations is a kernel launch (or a view, which costs the host its dispatch).
"""

import dataclasses
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Counter(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is active, except inside `paused` sections."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def count(problem, runs: int = 1) -> dict:
    """Operations per round outside the network in a run of `problem` (after an uncounted run, as in a
    long-lived process), rounds and calls of that run, and the network's own operations per call."""
    counter, network = Counter(), problem.network
    inside = []

    def paused(*args, **kwargs):
        counter.paused += 1
        try:
            return network(*args, **kwargs)
        finally:
            counter.paused -= 1

    problem = dataclasses.replace(problem, network=paused)
    problem.run()
    with counter:
        cost = problem.run().cost
    probe = Counter()
    x, n = torch.zeros((1, *problem.target.shape)), torch.zeros(1, dtype=torch.long)
    cond = {k: v[:1] for k, v in problem.cond.items()}
    with torch.inference_mode(), probe:
        network(x.to(problem.device), n.to(problem.device), **cond)
    inside.append(probe.ops)
    return {
        "ops_per_round": counter.ops / cost.rounds,
        "rounds": cost.rounds,
        "target_calls": cost.target_calls,
        "network_ops_per_call": inside[0],
    }


def main(spec: dict) -> dict:
    import specdemo
    from specdemo import SamplerConfig, build

    torch.set_num_threads(1)
    out = {}
    for name, settings in spec["cells"].items():
        out[name] = count(build(SamplerConfig(pilot=True, **settings)))
    return {"specdemo": specdemo.__file__, "cells": out}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
