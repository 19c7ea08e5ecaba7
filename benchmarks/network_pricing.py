"""The time objective with a draft network (`--draft NETWORK --freeze auto`): which draft, and what its levels
cost. From one pilot and one measurement of the target's calls: the stepwise draft planned with its network
levels priced at the steps its table gives them, the same table with that cost spread over every step (what a
per-level cost measured along a whole run gives), and the frozen forms alone; the three plans run side by side,
alternating (wall-clock on this machine)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from specdemo.drafts.stepwise import RESIDUAL
from specdemo.pipeline import prepare
from specdemo.planning import best_plan, draft_options, plan_tree, planned_options

from .common import NETWORK
from .drafts import config

TITLE = "The time objective with a draft network: which draft, and its levels priced where they are"
BUDGET = 16
CELLS = ((100, 1), (100, 16), (1000, 1))  # (steps, trajectories a batch)
REPEATS = 7  # alternating runs of each plan; the median of their wall-clock
AT_STEPS, SPREAD, FROZEN = (
    "stepwise, network levels priced at their steps",
    "stepwise, spread over the steps",
    "frozen forms alone",
)


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    rows = []
    for steps, batch in ((20, 2),) if quick else CELLS:
        problem = prepare(
            config(
                "digits",
                steps,
                batch,
                method="tree",
                tree="auto",
                budget=BUDGET,
                verifier="block",
                freeze="auto",
                objective="time",
                cache_dir="off",
                **NETWORK,
            )
        )
        _, options = draft_options(problem, auto_freeze=True)
        planned = planned_options(problem, options)
        if len(planned) < 2:  # the pilots gave the network no step: nothing to weigh
            continue
        stepwise, frozen = planned
        cost = stepwise.cost_model
        share = float((stepwise.draft.forms.numpy() == RESIDUAL).mean())
        spread = replace(
            stepwise, cost_model=replace(cost, level_s=cost.level_s + share * cost.network_level_s, network_level_s=0.0)
        )
        plans = {AT_STEPS: stepwise, SPREAD: replace(spread, tree=plan_tree(spread, BUDGET)), FROZEN: frozen}
        kept = best_plan([stepwise, frozen], "time")
        walls = {name: [] for name in plans}
        runs = {}
        for _ in range(2 if quick else REPEATS):
            for name, p in plans.items():
                runs[name] = p.run().cost  # the same samples every time; only the clock differs
                walls[name].append(runs[name].wall_s)
        for name, p in plans.items():
            c = runs[name]
            rows.append(
                {
                    "steps": steps,
                    "batch": batch,
                    "plan": name,
                    "kept": p is kept,
                    "network_steps": share,
                    "level_s": p.cost_model.level_s,
                    "network_level_s": p.cost_model.network_level_s,
                    "planned_s": p.tree.expected_s,
                    "planned_calls": p.tree.expected_calls,
                    "wall_s": float(np.median(walls[name])),
                    "walls": walls[name],
                    "calls": float(np.mean(c.calls_per_trajectory)),
                    "draft_calls": c.draft_calls,
                }
            )
    results = {"rows": rows, "repeats": 2 if quick else REPEATS}
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone. Three plans from one pilot: the stepwise draft with its
    network levels priced at their steps (specdemo/planning/programme.py), the same with the network's cost spread over
    every step, and the frozen forms alone; the time objective keeps the one of fewer planned seconds (*kept*)."""
    rows = results["rows"]
    lines = [
        f"The digits UNet, class 3, `--draft digits-draft --freeze auto --tree auto --budget {BUDGET} --objective "
        "time`, block verification; of three plans from one pilot, the time objective *kept* one.",
        f"Wall-clock: the median of {results['repeats']} alternating runs of each plan.",
        "",
        "| steps | batch | plan | network steps | network_level_s ms | level_s ms | planned s | wall-clock s | "
        "calls / trajectory | draft-network calls |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"{r['plan']} (*kept*)" if r["kept"] else r["plan"]
        network = f"{100 * r['network_steps']:.0f}%" if r["plan"] != FROZEN else "0%"
        lines.append(
            f"| {r['steps']} | {r['batch']} | {name} | {network} | {1e3 * r['network_level_s']:.2f} | "
            f"{1e3 * r['level_s']:.3f} | {r['planned_s']:.3f} | {r['wall_s']:.3f} | {r['calls']:.1f} | "
            f"{r['draft_calls']} |"
        )
    cells = {}
    for r in rows:
        cells.setdefault((r["steps"], r["batch"]), {})[r["plan"]] = r
    lines += [
        "",
        "| steps | batch | wall-clock, spread over priced at their steps | the fastest plan |",
        "|---|---|---|---|",
    ]
    for (steps, batch), cell in cells.items():
        at, spread = cell[AT_STEPS], cell[SPREAD]
        fastest = min(cell.values(), key=lambda r: r["wall_s"])
        lines.append(
            f"| {steps} | {batch} | {spread['wall_s'] / at['wall_s']:.2f}x | "
            f"{fastest['plan']}{' (*kept*)' if fastest['kept'] else ''} |"
        )
    return "\n".join(lines)
