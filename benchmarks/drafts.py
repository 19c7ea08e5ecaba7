"""Drafts that stay close deeper: the frozen draft's forms (x0-hat, x0-hat extrapolated in time, x0-hat of a
Gaussian fitted to the last two target outputs) on fixed block-verified chains and in planned runs, on gm512
and the digits model, and the digits draft network with and without the target's residual, in target calls
(hardware-free).

Fixed chains: block verification, nearest prefetch; planned: `--tree auto --objective calls --verifier block`, the
defaults otherwise; pilot calls are not in the speedup. The digits draft network runs as it is (`out`), corrected
by the target's residual (`residual`), or per step that or a frozen form, whichever its pilots found best (`auto`;
docs/algorithms.md, section 2). On gm512 the fitted Gaussian gains most: its components are isotropic Gaussians,
whose x0-hat is exactly the fitted form once a trajectory's component is settled.
"""

from __future__ import annotations

from pathlib import Path

from specdemo.pipeline import SamplerConfig

from .common import BY_CALLS, NETWORK, find, percent_gain, run_cell

TITLE = "Beyond the papers: drafts that stay close deeper"
GM512_TRAJECTORIES = 300  # the count
FORMS = ("x0", "x0-linear", "gaussian")
CHAINS = ("1x5", "1x9", "1x16")
NETWORK_FORMS = ("out", "residual", "auto")  # the draft network as it is, corrected throughout, per step
# (model, steps, samples, rows budget): the settings
PLANNED = [("gm512", 30, GM512_TRAJECTORIES, 85), ("digits", 100, 32, 48), ("digits", 1000, 16, 48)]


def config(model: str, steps: int, samples: int, **settings) -> SamplerConfig:
    """gm512's cells start warm, as the authors' code they are set against counts its calls."""
    label = {"class_label": 3} if model == "digits" else {"start": "warm"}
    return SamplerConfig(
        pilot=True, model=model, steps=steps, num_samples=samples, device="cpu", seed=0, **label, **settings
    )


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    planned = [
        (m, st, 40 if quick and m == "gm512" else (4 if quick else n), b)
        for m, st, n, b in (PLANNED[:2] if quick else PLANNED)
    ]
    runs = []
    for model, steps, samples, _ in planned[:2]:
        for chain in CHAINS[:1] if quick else CHAINS:
            for form in FORMS:
                runs.append(
                    run_cell(
                        config(
                            model,
                            steps,
                            samples,
                            method="chain",
                            tree=chain,
                            verifier="block",
                            freeze=form,
                            prefetch="nearest",
                            objective="calls",
                        )
                    )
                )
    for model, steps, samples, budget in planned:
        for form in ("x0", "gaussian", "auto"):
            runs.append(
                run_cell(
                    config(
                        model,
                        steps,
                        samples,
                        method="tree",
                        tree="auto",
                        budget=budget,
                        freeze=form,
                        verifier="block",
                        **({"objective": "calls"} if model == "gm512" else BY_CALLS),
                    ),
                    with_pilot=True,
                )
            )
    for _, steps, samples, budget in planned[1:]:
        trees = [("auto", budget)] if steps > 100 or quick else [*((c, None) for c in CHAINS[1:]), ("auto", budget)]
        for tree, rows in trees:
            for form in NETWORK_FORMS:
                runs.append(
                    run_cell(
                        config(
                            "digits",
                            steps,
                            samples,
                            method="chain" if rows is None else "tree",
                            tree=tree,
                            budget=rows,
                            verifier="block",
                            freeze=form,
                            objective="calls",
                            **NETWORK,
                            **({"prefetch": "nearest"} if rows is None else {}),
                        ),
                        with_pilot=rows is not None,
                    )
                )
    results = {"runs": runs}
    return render(results), results


def render(results: dict) -> str:
    """The section's body from its saved results alone."""
    runs = results["runs"]
    frozen = [r for r in runs if r["config"]["draft"] != NETWORK["draft"]]
    network = [r for r in runs if r["config"]["draft"] == NETWORK["draft"]]
    lines = [
        "Draft forms (docs/algorithms.md, section 2): x0-hat frozen (`x0`), extrapolated in time (`x0-linear`), "
        "of the fitted Gaussian (`gaussian`), or per step (`auto`).",
        "On the digits model the fit gains little: x0-hat of a digit is not that of one isotropic Gaussian.",
        "",
        "### Fixed block-verified chains (speedup in target calls)",
        "",
        "| model | steps | samples | chain | " + " | ".join(f"freeze {f}" for f in FORMS) + " | gaussian vs x0 |",
        "|---|---|---|---|" + "---|" * len(FORMS) + "---|",
    ]
    chains = [r["config"] for r in frozen if r["config"]["method"] == "chain"]
    for c in dict.fromkeys((c["model"], c["steps"], c["num_samples"], c["tree"]) for c in chains):
        model, steps, samples, chain = c
        cells = [find(frozen, model=model, num_samples=samples, tree=chain, freeze=f)["speedup"] for f in FORMS]
        lines.append(
            f"| {model} | {steps} | {samples} | {chain} | "
            + " | ".join(f"{c:.2f}" for c in cells)
            + f" | {percent_gain(cells[-1], cells[0])} |"
        )
    lines += [
        "",
        "### Planned (calls objective, the defaults otherwise; pilot calls not in the speedup)",
        "",
        "| model | steps | samples | rows | freeze | speedup | calls / sample | planned | rows / call | pilot calls |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in frozen:
        c = s["config"]
        if c["tree"] == "auto":
            lines.append(
                f"| {c['model']} | {c['steps']} | {c['num_samples']} | {c['budget']} | {c['freeze']} | "
                f"{s['speedup']:.2f} | {s['target_calls_per_sample']:.2f} | {s['planned_calls']:.2f} | "
                f"{s['rows_per_call']:.1f} | {s['pilot_calls']} |"
            )
    lines += [
        "",
        "### The digits draft network as it is (`out`), corrected by the target's residual, or per step (`auto`)",
        "",
        "| steps | samples | topology | "
        + " | ".join(f"freeze {f}" for f in NETWORK_FORMS)
        + " | auto vs out | pilot calls ("
        + ", ".join(NETWORK_FORMS)
        + ") |",
        "|---|---|---|" + "---|" * len(NETWORK_FORMS) + "---|---|",
    ]
    cells = dict.fromkeys((r["config"]["steps"], r["config"]["tree"], r["config"]["budget"]) for r in network)
    for steps, tree, rows in cells:
        pair = [find(network, steps=steps, tree=tree, budget=rows, freeze=f) for f in NETWORK_FORMS]
        shown = tree if rows is None else f"auto, {rows} rows"
        pilots = ", ".join(str(s["pilot_calls"]) for s in pair) if rows is not None else ""
        lines.append(
            f"| {steps} | {pair[0]['config']['num_samples']} | {shown} | "
            + " | ".join(f"{s['speedup']:.2f}" for s in pair)
            + f" | {percent_gain(pair[-1]['speedup'], pair[0]['speedup'])} | {pilots} |"
        )
    return "\n".join(lines)
