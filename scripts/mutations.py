"""Plant known bugs one at a time and show that the test suite catches each.

    python scripts/mutations.py            # every planted bug
    python scripts/mutations.py --short    # the ones CI runs (see .ci/run)
    python scripts/mutations.py --check    # only that each bug can still be planted (no tests run)
    python scripts/mutations.py --list

Each mutation names the function it changes (its qualified name in its file, "Class.method" or
"outer.inner") and a piece of code in it, found by its tokens, not its text, so that reformatting the
code keeps the anchor; the piece must occur exactly once in that function. The bug is planted in a copy
of the checkout (the files git tracks or would track), then the tests named for it run there; the bug is
caught when they fail. The checkout itself is never written. Exit status 1 if any planted bug went
uncaught or could not be planted.
"""

from __future__ import annotations

import argparse
import ast
import io
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    function: str  # qualified name of the function changed, as ast finds it in `path`
    old: str  # code in that function, matched by tokens (layout and comments ignored)
    new: str  # its replacement; lines after the first are indented to where `old` starts
    tests: tuple[str, ...]  # pytest arguments
    short: bool = False  # one of CI's short list


MUTATIONS = [
    Mutation(
        "a trajectory's chain is cut by the acceptance its slot's earlier trajectory counted",
        "specdemo/sampling/driver.py",
        "_Batch.refill",
        "self.examined[slot] = self.accepted[slot] = 0",
        "pass",
        ("tests/sampling/test_reach.py", "-k", "bitwise"),
        short=True,
    ),
    Mutation(
        "a cold trajectory's kept plain-step output reads its slot's earlier trajectory's history",
        "specdemo/sampling/driver.py",
        "_Batch.freeze",
        'history = {"previous": torch.where(held, self.frozen, 0.0),',
        'history = {"previous": self.frozen,',
        ("tests/sampling/test_cold_start.py", "-k", "slot_bitwise"),
    ),
    Mutation(
        "the planner keeps its first plan, not the one of least expected seconds or calls",
        "specdemo/planning/planner.py",
        "best_plan",
        "return min(planned, key=expected)",
        "return planned[0]",
        ("tests/planning/test_calibration.py", "-k", "verifier_auto or kept_plan"),
    ),
    Mutation(
        "the fitted Gaussian draft drops its gain on the state",
        "specdemo/drafts/frozen.py",
        "FrozenGaussian.for_round",
        "alpha_g, beta_g = torch.addcmul(alpha_x0, b_x0, w), lift(b_x0) * c_mu",
        "alpha_g, beta_g = alpha_x0, lift(b_x0) * c_mu",
        ("tests/drafts/test_frozen_forms.py", "tests/sampling/test_batch_independence.py", "-k", "gaussian"),
    ),
    Mutation(
        "the draft network's residual correction is dropped",
        "specdemo/drafts/corrected.py",
        "CorrectedNetworkDraft.level_output",
        "return output + frozen[None]",
        "return output",
        ("tests/drafts/test_frozen_forms.py", "-k", "residual"),
    ),
    Mutation(
        "the stepwise draft drafts the network's steps with the frozen draft",
        "specdemo/drafts/stepwise.py",
        "StepwiseDraft.for_round.level",
        "m[:, rows] = means(0, x[:, rows])",
        "means(0, x[:, rows])",
        ("tests/drafts/test_frozen_forms.py", "-k", "stepwise"),
    ),
    Mutation(
        "siblings share one noise draw",
        "specdemo/sampling/layout.py",
        "Workspace._views",
        "self.noise_nodes = noise[:drafted]",
        "self.noise_nodes = noise[:drafted]\n"
        "if lay.max_width > 1 and depth:\n"
        "    self.noise_nodes = noise[:1].expand(drafted, -1, -1)",
        ("tests/test_exactness.py", "-k", "gm2d-ddpm-wide-dgrs-bias2"),
        short=True,
    ),
    Mutation(
        "a level drafted with another level's noise",
        "specdemo/sampling/round.py",
        "_draft_affine",
        "torch.addcmul(ws.b_nodes, ws.scale_nodes, noise, out=ws.x_bias)",
        "torch.addcmul(ws.b_nodes, ws.scale_nodes, noise.roll(1, 0), out=ws.x_bias)",
        ("tests/sampling/test_round.py", "-k", "chain-rmc-out"),
        short=True,
    ),
    Mutation(
        "a round drafts from the roots of the round before (a stale input)",
        "specdemo/sampling/driver.py",
        "_Batch.prepare",
        "ws.x_root.copy_(self.y_flat)",
        "ws.x_root.copy_(self.y_flat) if self.cost.rounds == 0 else None",
        ("tests/sampling/test_round.py", "-k", "chain-rmc-out"),
    ),
    Mutation(
        "RMC accepts every child",
        "specdemo/verifiers/rmc.py",
        "ReflectionMaximalCoupling._decide",
        "accept = uniforms[:, 0] < p",
        "accept = uniforms[:, 0] < 2.0",
        ("tests/verifiers/test_verifiers.py", "-k", "rmc"),
        short=True,
    ),
    Mutation(
        "RMC reflects to -u instead of delta - u",
        "specdemo/verifiers/rmc.py",
        "ReflectionMaximalCoupling.correct",
        "delta - u[:, 0]",
        "-u[:, 0]",
        ("tests/verifiers/test_verifiers.py", "-k", "rmc"),
    ),
    Mutation(
        "block verification draws from the unweighted residual",
        "specdemo/verifiers/block.py",
        "BlockVerification._walk_chain",
        "u_new[rows] = self.residual(delta[rows, stop[rows]], -log_p[rows, eta[rows]], uniforms[rows, top + 1])",
        "u_new[rows] = self.residual(delta[rows, stop[rows]], 0 * log_p[rows, eta[rows]], uniforms[rows, top + 1])",
        ("tests/test_exactness.py", "-k", "gm2d-ddpm-chain-block-bias1.5"),
        short=True,
    ),
    Mutation(
        "a tree's later siblings weighed against the target, not the residual",
        "specdemo/verifiers/block.py",
        "weigh_tree",
        "else residual_log_ratio(lr[:, :1], log_lam[:, None], d[:, :1])",
        "else lr[:, :1]",
        ("tests/test_exactness.py", "-k", "gm2d-ddpm-tree-block-bias1.5"),
    ),
    Mutation(
        "a tree's stairs do not climb after a rejected sibling",
        "specdemo/verifiers/block.py",
        "weigh_tree",
        "stepped = np.logaddexp(log_lam, np.log(residual_mass(log_lam, d[:, 0])))",
        "stepped = log_lam",
        ("tests/verifiers/test_block.py", "-k", "dgrs"),
    ),
    Mutation(
        "a rank-selected root child weighed as if drawn from the draft",
        "specdemo/verifiers/block.py",
        "select_root_child",
        "log_ratio = std_normal_log_pdf(u_sel - delta) - log_order_stat_mixture(u_sel[:, None], log_w)[:, 0]",
        "log_ratio = delta * u_sel - 0.5 * delta**2",
        ("tests/verifiers/test_block.py", "-k", "target_law"),
    ),
    Mutation(
        "D-GRS levels off (lambda grows by 0.99 G)",
        "specdemo/verifiers/dgrs.py",
        "grs_levels",
        "lam.append(lam[-1] + reach[-1])",
        "lam.append(lam[-1] + 0.99 * reach[-1])",
        ("tests/verifiers/test_verifiers.py", "-k", "grs_levels"),
    ),
    Mutation(
        "a known root takes its parent's output",
        "specdemo/sampling/driver.py",
        "_Batch.walk",
        "decided.known_rows(kept, walk.node[~corrected] * a + kept, part.index)",
        "decided.known_rows(kept, t.parent[walk.node[~corrected]] * a + kept, part.index)",
        ("tests/test_exactness.py", "-k", "known_root"),
        short=True,
    ),
    Mutation(
        "a plan learnt from runs samples from the learning runs' own streams",
        "specdemo/pipeline.py",
        "Problem.stream_seed",
        "return learnt_seed(self.config.seed) if self.learnt else self.config.seed",
        "return self.config.seed",
        ("tests/planning/test_learning.py", "-k", "streams"),
        short=True,
    ),
    Mutation(
        "a table learnt from runs samples from the learning runs' own streams",
        "specdemo/planning/__init__.py",
        "_planned",
        "problem = settled(problem, plan_source=source, learnt=True)",
        "problem = settled(problem, plan_source=source)",
        ("tests/planning/test_forms.py", "-k", "fixed_tree_learns"),
    ),
    Mutation(
        "the forms are priced one step off the committed path",
        "specdemo/planning/forms.py",
        "committed_paths",
        "n = rnd.step[a] + rnd.node_depth[node]",
        "n = np.minimum(rnd.step[a] + rnd.node_depth[node] + 1, num_steps - 1)",
        ("tests/planning/test_forms.py", "-k", "priced_deltas"),
    ),
    Mutation(
        "a known root's first-level delta taken as computed (rounding), not 0",
        "specdemo/sampling/driver.py",
        "_Batch.walk",
        "delta[self.root_known[slots], 0] = 0.0",
        "pass",
        ("tests/test_reproducible.py", "-k", "rounding"),
        short=True,
    ),
    Mutation(
        "the network's conditioning taken by slot, not by trajectory",
        "specdemo/sampling/driver.py",
        "_Batch.call_layout",
        'box["traj"][at:hi] = self.slot_traj[part_slots]',
        'box["traj"][at:hi] = part_slots',
        ("tests/sampling/test_batch_independence.py", "-k", "own_conditioning"),
        short=True,
    ),
    Mutation(
        "guidance's unconditional rows take their neighbour's step",
        "specdemo/models/latent.py",
        "GuidedNetwork.__call__",
        "t = self.timesteps[n].repeat(groups)",
        "t = self.timesteps[n].roll(1).repeat(groups)",
        ("tests/models/test_latent.py", "-k", "exact"),
    ),
    Mutation(
        "leaves evaluated at step N",
        "specdemo/sampling/driver.py",
        "Schedule.__init__",
        "self.leaves = leaf_table[..., None] & (self.depth > 0) & (ends < n_steps)",
        "self.leaves = leaf_table[..., None] & (self.depth > 0)",
        ("tests/sampling/test_intermediate_states.py", "-k", "within_the_steps"),
    ),
    Mutation(
        "a run goes on after it is cancelled",
        "specdemo/sampling/driver.py",
        "_run",
        "check = None if cancel is None else cancel.check",
        "check = None",
        ("tests/test_limits.py",),
    ),
    Mutation(
        "the work limit ignores the pilot",
        "specdemo/limits.py",
        "Limits.check",
        "pilot = pilot_runs * pilot_samples * steps * pilot_rows_per_round",
        "pilot = 0",
        ("tests/test_limits.py",),
    ),
    Mutation(
        "the time planner prices a draft network's levels nowhere",
        "specdemo/planning/programme.py",
        "RoundPrice.seconds",
        "return self.cost.round_time(rows, int(self.network[n + depth] - self.network[n])) if self.cost else 0.0",
        "return self.cost.round_time(rows) if self.cost else 0.0",
        ("tests/planning/test_calibration.py", "-k", "network"),
    ),
    Mutation(
        "a traced run's seconds weighed against plain sampling with its trace's records",
        "specdemo/planning/record.py",
        "record",
        "observe(problem, result.cost.wall_s - result.cost.trace_s, len(trajectories))",
        "observe(problem, result.cost.wall_s, len(trajectories))",
        ("tests/planning/test_calibration.py", "-k", "less_their_traces"),
    ),
]

LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}


class StaleAnchor(Exception):
    """A mutation's function or code is not found exactly once: the code moved on, so update the mutation."""


def code_tokens(source: str) -> list[tokenize.TokenInfo]:
    """The tokens of `source` less layout and comments, which a reformat may change."""
    tokens = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in LAYOUT:
                tokens.append(token)
    except tokenize.TokenError:  # a piece of code that leaves a bracket open ends there
        pass
    return tokens


def functions_named(tree: ast.Module, qualname: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions whose enclosing classes and functions, dotted, with their own name, spell `qualname`."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if prefix + child.name == qualname and not isinstance(child, ast.ClassDef):
                    found.append(child)
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def planted(mutation: Mutation, source: str) -> str:
    """`source`, the text of the mutation's file, with its `old` code in its function replaced by `new`."""
    functions = functions_named(ast.parse(source), mutation.function)
    if len(functions) != 1:
        raise StaleAnchor(
            f"mutation {mutation.name!r}: {len(functions)} functions named {mutation.function} "
            f"in {mutation.path}, not 1; update scripts/mutations.py"
        )
    function = functions[0]
    span = (function.lineno, function.col_offset), (function.end_lineno, function.end_col_offset)
    body = [t for t in code_tokens(source) if span[0] <= t.start and t.end <= span[1]]
    wanted = [(t.type, t.string) for t in code_tokens(mutation.old)]
    tokens = [(t.type, t.string) for t in body]
    starts = [i for i in range(len(tokens) - len(wanted) + 1) if tokens[i : i + len(wanted)] == wanted]
    if len(starts) != 1:
        raise StaleAnchor(
            f"mutation {mutation.name!r}: its code occurs {len(starts)} times in {mutation.function} "
            f"({mutation.path}), not once; update scripts/mutations.py"
        )
    first, last = body[starts[0]], body[starts[0] + len(wanted) - 1]
    line_offsets = list(itertools.accumulate((len(line) + 1 for line in source.split("\n")), initial=0))
    begin, end = (line_offsets[row - 1] + column for row, column in (first.start, last.end))
    return source[:begin] + mutation.new.replace("\n", "\n" + " " * first.start[1]) + source[end:]


def check(mutations: list[Mutation]) -> list[str]:
    """Why each mutation that cannot be planted in the checkout can't: its anchor is stale or the result won't compile."""
    problems = []
    for m in mutations:
        try:
            compile(planted(m, (REPO / m.path).read_text()), m.path, "exec")
        except StaleAnchor as stale:
            problems.append(str(stale))
        except SyntaxError as error:
            problems.append(f"mutation {m.name!r}: planted in {m.function} ({m.path}), it does not compile: {error}")
    return problems


def checkout_copy(into: Path) -> None:
    """The files git tracks or would track (not ignored), as they are in the working tree."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def run_one(mutation: Mutation, work: Path) -> tuple[bool, float]:
    """(caught, seconds): plant in the copy, run its tests, undo."""
    target = work / mutation.path
    original = target.read_text()
    target.write_text(planted(mutation, original))
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", SPECDEMO_CACHE="off", PYTHONPATH=str(work)
    )
    t0 = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        target.write_text(original)
    if result.returncode not in (0, 1):  # 5: no test selected, 2-4: usage or collection errors
        raise SystemExit(f"mutation {mutation.name!r}: pytest exited {result.returncode}\n{result.stdout[-2000:]}")
    return result.returncode == 1, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="only the mutations CI runs")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("--check", action="store_true", help="only check that each mutation can be planted")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if m.short or not args.short]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path} {m.function} -> {' '.join(m.tests)}")
        return 0
    problems = check(chosen)  # before any test runs, so a stale anchor fails at once
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems or args.check:
        print(f"{len(chosen) - len(problems)} of {len(chosen)} planted bugs can be planted")
        return 1 if problems else 0
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
