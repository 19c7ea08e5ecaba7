"""Plant known bugs one at a time and show that the test suite catches each.

    python scripts/mutations.py            # every planted bug
    python scripts/mutations.py --short    # the ones CI runs (see .ci/run)
    python scripts/mutations.py --list

Each mutation replaces one exact piece of code (it must occur once) in a copy of the checkout (the
files git tracks or would track), then runs the tests named for it there; the mutation is caught when
they fail. The checkout itself is never written. Exit status 1 if any planted bug went uncaught.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments
    short: bool = False  # one of CI's short list


MUTATIONS = [
    Mutation("a cold trajectory's kept plain-step output reads its slot's earlier trajectory's history",
             "specdemo/sampling/driver.py",
             "            history = {\"previous\": torch.where(held, self.frozen, 0.0),\n",
             "            history = {\"previous\": self.frozen,\n",
             ("tests/test_sampler.py", "-k", "slot_bitwise")),
    Mutation("the planner keeps its first plan, not the one of least expected seconds or calls",
             "specdemo/planning/planner.py",
             "    return min(planned, key=lambda p: p.tree.expected_s if objective == \"time\" else p.tree.expected_calls)\n",
             "    return planned[0]\n",
             ("tests/test_calibration.py", "-k", "verifier_auto or kept_plan")),
    Mutation("the fitted Gaussian draft drops its gain on the state", "specdemo/drafts/frozen.py",
             "        alpha_g, beta_g = torch.addcmul(alpha_x0, b_x0, w), lift(b_x0) * c_mu\n",
             "        alpha_g, beta_g = alpha_x0, lift(b_x0) * c_mu\n",
             ("tests/test_sampler.py", "-k", "gaussian")),
    Mutation("the draft network's residual correction is dropped", "specdemo/drafts/corrected.py",
             "        return output + frozen[None]\n",
             "        return output\n",
             ("tests/test_sampler.py", "-k", "residual")),
    Mutation("the stepwise draft drafts the network's steps with the frozen draft", "specdemo/drafts/stepwise.py",
             "                m[:, rows] = means(0, x[:, rows])\n",
             "                means(0, x[:, rows])\n",
             ("tests/test_sampler.py", "-k", "stepwise")),
    Mutation("siblings share one noise draw", "specdemo/sampling/layout.py",
             "        self.noise_nodes = noise[:drafted]\n",
             "        self.noise_nodes = noise[:drafted]\n"
             "        if lay.max_width > 1 and depth:\n"
             "            self.noise_nodes = noise[:1].expand(drafted, -1, -1)\n",
             ("tests/test_exactness.py", "-k", "gm2d-ddpm-wide-dgrs-bias2"), short=True),
    Mutation("a level drafted with another level's noise", "specdemo/sampling/round.py",
             "    torch.addcmul(ws.b_nodes, ws.scale_nodes, noise, out=ws.x_bias)\n",
             "    torch.addcmul(ws.b_nodes, ws.scale_nodes, noise.roll(1, 0), out=ws.x_bias)\n",
             ("tests/test_round.py", "-k", "chain-rmc-out"), short=True),
    Mutation("a round drafts from the roots of the round before (a stale input)", "specdemo/sampling/driver.py",
             "        ws.x_root.copy_(self.y_flat)\n",
             "        ws.x_root.copy_(self.y_flat) if self.cost.rounds == 0 else None\n",
             ("tests/test_round.py", "-k", "chain-rmc-out")),
    Mutation("RMC accepts every child", "specdemo/verifiers/rmc.py",
             "        accept = uniforms[:, 0] < p\n", "        accept = uniforms[:, 0] < 2.0\n",
             ("tests/test_verifiers.py", "-k", "rmc"), short=True),
    Mutation("RMC reflects to -u instead of delta - u", "specdemo/verifiers/rmc.py",
             "delta - u[:, 0]", "-u[:, 0]",
             ("tests/test_verifiers.py", "-k", "rmc")),
    Mutation("block verification draws from the unweighted residual", "specdemo/verifiers/block.py",
             "            u_new[rows] = self.residual(delta[rows, stop[rows]], -log_p[rows, eta[rows]], uniforms[rows, top + 1])\n",
             "            u_new[rows] = self.residual(delta[rows, stop[rows]], 0 * log_p[rows, eta[rows]], uniforms[rows, top + 1])\n",
             ("tests/test_exactness.py", "-k", "gm2d-ddpm-chain-block-bias1.5"), short=True),
    Mutation("a tree's later siblings weighed against the target, not the residual", "specdemo/verifiers/block.py",
             "        first = selected.log_ratio[:, None] if root_pick else residual_log_ratio(lr[:, :1], log_lam[:, None], d[:, :1])\n",
             "        first = selected.log_ratio[:, None] if root_pick else lr[:, :1]\n",
             ("tests/test_exactness.py", "-k", "gm2d-ddpm-tree-block-bias1.5")),
    Mutation("a tree's stairs do not climb after a rejected sibling", "specdemo/verifiers/block.py",
             "            stepped = np.logaddexp(log_lam, np.log(residual_mass(log_lam, d[:, 0])))\n",
             "            stepped = log_lam\n",
             ("tests/test_block.py", "-k", "dgrs")),
    Mutation("a rank-selected root child weighed as if drawn from the draft", "specdemo/verifiers/block.py",
             "    log_ratio = std_normal_log_pdf(u_sel - delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]\n",
             "    log_ratio = delta * u_sel - 0.5 * delta**2\n",
             ("tests/test_block.py", "-k", "target_law")),
    Mutation("D-GRS levels off (lambda grows by 0.99 G)", "specdemo/verifiers/dgrs.py",
             "            lam.append(lam[-1] + reach[-1])\n", "            lam.append(lam[-1] + 0.99 * reach[-1])\n",
             ("tests/test_verifiers.py", "-k", "grs_levels")),
    Mutation("a known root takes its parent's output", "specdemo/sampling/driver.py",
             "                decided.known_rows(kept, walk.node[~corrected] * a + kept, part.index)\n",
             "                decided.known_rows(kept, t.parent[walk.node[~corrected]] * a + kept, part.index)\n",
             ("tests/test_exactness.py", "-k", "known_root"), short=True),
    Mutation("a plan learnt from runs samples from the learning runs' own streams", "specdemo/pipeline.py",
             "        return learnt_seed(self.config.seed) if self.learnt else self.config.seed\n",
             "        return self.config.seed\n",
             ("tests/test_learning.py", "-k", "streams"), short=True),
    Mutation("a known root's first-level delta taken as computed (rounding), not 0", "specdemo/sampling/driver.py",
             "                delta[self.root_known[slots], 0] = 0.0\n",
             "                pass\n",
             ("tests/test_reproducible.py", "-k", "rounding"), short=True),
    Mutation("the network's conditioning taken by slot, not by trajectory", "specdemo/sampling/driver.py",
             "            box[\"traj\"][at:hi] = self.slot_traj[slots]\n",
             "            box[\"traj\"][at:hi] = slots\n",
             ("tests/test_sampler.py", "-k", "own_conditioning"), short=True),
    Mutation("guidance's unconditional rows take their neighbour's step", "specdemo/models/latent.py",
             "        t = self.timesteps[n].repeat(groups)\n",
             "        t = self.timesteps[n].roll(1).repeat(groups)\n",
             ("tests/test_latent.py", "-k", "exact")),
    Mutation("leaves evaluated at step N", "specdemo/sampling/driver.py",
             "        self.leaves = leaf_table & (self.depth > 0) & (steps[:, None] + self.depth < n_steps)\n",
             "        self.leaves = leaf_table & (self.depth > 0)\n",
             ("tests/test_sampler.py", "-k", "within_the_steps")),
    Mutation("a run goes on after it is cancelled", "specdemo/sampling/driver.py",
             "            cancel.check()\n", "            pass\n",
             ("tests/test_limits.py",)),
    Mutation("the work limit ignores the pilot", "specdemo/limits.py",
             "        pilot = pilot_runs * pilot_samples * steps * pilot_rows_per_round\n", "        pilot = 0\n",
             ("tests/test_limits.py",)),
    Mutation("the time planner prices a draft network's levels nowhere", "specdemo/trees/auto.py",
             "        return self.cost.round_time(rows, int(self.network[n + depth] - self.network[n])) if self.cost else 0.0\n",
             "        return self.cost.round_time(rows) if self.cost else 0.0\n",
             ("tests/test_calibration.py", "-k", "network")),
]


def checkout_copy(into: Path) -> None:
    """The files git tracks or would track (not ignored), as they are in the working tree."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def run_one(mutation: Mutation, work: Path) -> tuple[bool, float]:
    """(caught, seconds): apply to the copy, run its tests, undo."""
    target = work / mutation.path
    original = target.read_text()
    if original.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name!r}: its code occurs {original.count(mutation.old)} times in "
                         f"{mutation.path}; update scripts/mutations.py")
    target.write_text(original.replace(mutation.old, mutation.new))
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", SPECDEMO_CACHE="off",
               PYTHONPATH=str(work))
    t0 = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests],
                                cwd=work, env=env, capture_output=True, text=True)
    finally:
        target.write_text(original)
    if result.returncode not in (0, 1):  # 5: no test selected, 2-4: usage or collection errors
        raise SystemExit(f"mutation {mutation.name!r}: pytest exited {result.returncode}\n{result.stdout[-2000:]}")
    return result.returncode == 1, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="only the mutations CI runs")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if m.short or not args.short]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path} -> {' '.join(m.tests)}")
        return 0
    missed = []
    with tempfile.TemporaryDirectory(prefix="specdemo-mutations-") as tmp:
        work = Path(tmp)
        checkout_copy(work)
        for m in chosen:
            caught, seconds = run_one(m, work)
            print(f"{'caught' if caught else 'MISSED'}  {m.name}  ({' '.join(m.tests)}, {seconds:.0f} s)", flush=True)
            if not caught:
                missed.append(m.name)
    print(f"{len(chosen) - len(missed)} of {len(chosen)} planted bugs caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
