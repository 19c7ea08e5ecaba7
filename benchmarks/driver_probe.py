"""Run by path in a fresh process whose PYTHONPATH puts one checkout's `specdemo` first (this folder is
sys.path[0], not the repository root): the driver's own milliseconds per round for each cell, as JSON.

Written against the API both the current driver and the driver before the phases rewrite (commit
85c9071) expose, so that benchmarks/latency.py can time the two side by side, in alternation.
"""

import json
import sys

import torch
from diffusers import DDPMScheduler

import specdemo
from specdemo import Topology, get_verifier, sample
from specdemo.drafts import FrozenX0
from specdemo.kernels import DDPMKernel


def main(spec: dict) -> dict:
    torch.set_num_threads(1)
    kernel = DDPMKernel(DDPMScheduler.from_config(spec["scheduler"]), spec["steps"])
    noise = kernel.noise.float()

    def instant(x, n, **cond):  # the exact eps-prediction for data ~ N(0, I): returns at once
        return x * noise[n].view(-1, *[1] * (x.dim() - 1))

    ms = {}
    with torch.inference_mode():
        for batch, tree, verifier in spec["cells"]:
            per_round = []
            for seed in range(spec["seeds"]):
                cost = sample(
                    instant,
                    kernel,
                    tuple(spec["shape"]),
                    batch,
                    tree=Topology.parse(tree),
                    draft=FrozenX0(),
                    verifier=get_verifier(verifier),
                    seed=seed,
                ).cost
                per_round.append(1e3 * (cost.wall_s - cost.target_s) / cost.rounds)
            ms[f"{batch}|{tree}|{verifier}"] = sorted(per_round)[len(per_round) // 2]
    return {"specdemo": specdemo.__file__, "ms": ms}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
