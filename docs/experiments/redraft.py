"""Picard-style re-drafting, measured before it is built: would a round's nodes be drafted closer to the
target if each took its frozen value from the previous round's drafted path at the same step, rather than
from the round's own frozen node? Compared on the very nodes the driver verified, in acceptance
(hardware-free)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import NETWORK
from benchmarks.drafts import config
from specdemo.pipeline import build
from specdemo.verifiers import get_verifier

TITLE = "Picard-style re-drafting, measured before it is built"
CHAIN = "1x12"  # the pilots' chain (specdemo/planning/stats.py, PILOT_DEPTH)
REGIONS = ((0.0, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.0))  # fractions of the schedule's steps
CHUNK = 256  # rows a network call
# (model, steps, trajectories, draft settings, what the draft is called): the forms that keep no history (the
# fitted Gaussian and the extrapolation also read the node above the frozen one, which a re-drafted node lacks)
SETTINGS = (
    ("gm512", 30, 100, {"freeze": "x0"}, "frozen x0-hat"),
    ("digits", 100, 8, {"freeze": "x0"}, "frozen x0-hat"),
    ("digits", 100, 8, {**NETWORK, "freeze": "residual"}, "digits-draft + residual"),
    ("digits", 1000, 8, {"freeze": "x0"}, "frozen x0-hat"),
    ("digits", 1000, 8, {**NETWORK, "freeze": "residual"}, "digits-draft + residual"),
)
REFERENCE = ("gm512", 30, 100, {"freeze": "gaussian"}, "the fitted Gaussian")  # what gm512 plans with instead of x0-hat


def _nodes(trace, steps: int) -> tuple[list, ...]:
    """Per verified node of a round that follows another round of the same trajectory, where that earlier
    round evaluated a node at the node's step: (step m, trajectory, delta as drafted, state, the earlier
    round's state at step m)."""
    rounds = defaultdict(list)
    for rnd in trace:
        for i, a in enumerate(rnd.trajectories.tolist()):
            rounds[a].append(
                (rnd.round, int(rnd.step[i]), rnd.states[i], rnd.delta[i], rnd.node_depth, rnd.evaluated[i])
            )
    found = []
    for a, seq in rounds.items():
        seq.sort(key=lambda r: r[0])
        for (_, n0, states0, _, depth0, evaluated0), (_, n1, states1, delta1, depth1, _) in zip(
            seq, seq[1:], strict=False
        ):
            earlier = {n0 + int(d): k for k, d in enumerate(depth0) if evaluated0[k]}
            for node in np.nonzero(~np.isnan(delta1))[0]:
                m = n1 + int(depth1[node])
                if m < steps and m in earlier:
                    found.append((m, a, float(delta1[node]), states1[node], states0[earlier[m]]))
    return tuple(zip(*found, strict=True)) if found else ((),) * 5


def _redrafted_deltas(problem, steps_m, trajectories, states, earlier_states) -> np.ndarray:
    """delta = ||m^p - m^q|| / s_m at each node, m^p formed from the frozen value the target's output at
    the earlier round's node of the same step gives (the draft's own frozen_value and for_round)."""
    kernel, draft = problem.kernel, problem.draft
    out = []
    with torch.inference_mode():
        for i in range(0, len(steps_m), CHUNK):
            m = torch.tensor(steps_m[i : i + CHUNK])
            y = torch.stack([torch.as_tensor(s) for s in states[i : i + CHUNK]]).to(problem.dtype)
            y_earlier = torch.stack([torch.as_tensor(s) for s in earlier_states[i : i + CHUNK]]).to(problem.dtype)
            cond = {k: v[list(trajectories[i : i + CHUNK])] for k, v in problem.cond.items()}
            frozen = draft.frozen_value(kernel, problem.network(y_earlier, m, **cond), y_earlier, m, cond=cond)
            mp = draft.for_round(kernel, m[None], frozen, cond)(0, y[None])[0]
            mq = kernel.mean(problem.network(y, m, **cond), y, m)
            scale = kernel.scales[m].to(problem.dtype).view(-1, *[1] * (y.dim() - 1))
            out.append(((mp - mq) / scale).flatten(1).norm(dim=1).double().numpy())
    return np.concatenate(out)


def _acceptance(delta: np.ndarray) -> float:
    """Mean acceptance of a lone child, RMC's closed form (section 3)."""
    return float(get_verifier("rmc").acceptance(np.asarray(delta, dtype=np.float64), 1).mean())


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    settings = [
        (m, 20 if quick and m == "digits" and st == 1000 else st, 4 if quick else n, extra, name)
        for m, st, n, extra, name in (SETTINGS[:3:2] if quick else SETTINGS)
    ]
    rows = []
    for model, steps, count, extra, name in settings:
        problem = _chain(model, steps, count, extra)
        trace = problem.run(trace=True, trace_states=True).trace
        steps_m, trajectories_m, drafted, states, earlier = _nodes(trace, steps)
        if not steps_m:
            continue
        drafted, redrafted = np.asarray(drafted), _redrafted_deltas(problem, steps_m, trajectories_m, states, earlier)
        at = np.asarray(steps_m) / steps
        for lo, hi in ((0.0, 1.0), *REGIONS):
            sel = (at >= lo) & ((at < hi) | (hi == 1.0))
            if sel.any():
                rows.append(
                    {
                        "model": model,
                        "steps": steps,
                        "draft": name,
                        "region": [lo, hi],
                        "nodes": int(sel.sum()),
                        "acceptance": _acceptance(drafted[sel]),
                        "acceptance_redrafted": _acceptance(redrafted[sel]),
                        "median_delta": float(np.median(drafted[sel])),
                        "median_delta_redrafted": float(np.median(redrafted[sel])),
                    }
                )
    reference = None
    if not quick:
        model, steps, count, extra, name = REFERENCE
        trace = _chain(model, steps, count, extra).run(trace=True).trace
        deltas = np.concatenate([rnd.delta[~np.isnan(rnd.delta)] for rnd in trace])
        reference = {"model": model, "draft": name, "nodes": int(deltas.size), "acceptance": _acceptance(deltas)}
    results = {"rows": rows, "reference": reference}
    return render(results), results


def render(results: dict) -> str:
    """The section's text from its results."""
    rows, reference = results["rows"], results["reference"]
    lines = [
        "Each round drafts its levels from one frozen value, kept from the target's output at the round's frozen "
        "node (the nearest prefetch: the root or its parent). Picard-style re-drafting would instead take, at a "
        "node of step m, the frozen value of the previous round's drafted node at step m, where that round reached "
        "step m (its target output is known: the previous call evaluated it); the time gap closes, but that node "
        "lies on the previous round's path, which left this one at the rejection. Measured here on the nodes a "
        f"chain {CHAIN} (RMC, nearest prefetch, seed 0) verified and the previous round covered: the acceptance "
        "2 Phi(-delta/2) of a lone child as drafted, against the delta the re-drafted mean would have had at the "
        "same node (the target evaluated at both nodes afresh). By region of the schedule (fractions of its "
        "steps; the last 5% are the finest details).",
        "",
        "| model | steps | draft | region | nodes | acceptance as drafted | acceptance re-drafted | "
        "median delta as drafted | median delta re-drafted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        region = "all" if r["region"] == [0.0, 1.0] else "{:.2f}-{:.2f}".format(*r["region"])
        lines.append(
            f"| {r['model']} | {r['steps']} | {r['draft']} | {region} | {r['nodes']} | {r['acceptance']:.4f} | "
            f"{r['acceptance_redrafted']:.4f} | {r['median_delta']:.3f} | {r['median_delta_redrafted']:.3f} |"
        )
    whole = [r for r in rows if r["region"] == [0.0, 1.0]]
    gains = [r for r in whole if r["acceptance_redrafted"] > r["acceptance"]]
    lines += [
        "",
        "- Over the whole schedule, a lone child's acceptance as drafted against re-drafted: "
        + "; ".join(
            f"{r['model']} {r['steps']} steps, {r['draft']}: {r['acceptance']:.3f} against {r['acceptance_redrafted']:.3f}"
            for r in whole
        )
        + ".",
    ]
    if reference:
        lines.append(
            f"- For reference, {reference['draft']} (what `gm512` plans with) accepts {reference['acceptance']:.3f} "
            f"on the {reference['nodes']} nodes its own chain {CHAIN} verified: re-drafting x0-hat there is to be "
            "weighed against it, not against x0-hat frozen."
        )
    # a gain counts where nothing this model already plans with accepts more than the re-drafted nodes
    useful = [
        r
        for r in gains
        if not (reference and r["model"] == reference["model"] and r["acceptance_redrafted"] < reference["acceptance"])
    ]
    digits = [r for r in rows if r["model"] == "digits"]
    worse = sum(r["acceptance_redrafted"] < r["acceptance"] for r in digits)
    if useful:
        lines.append(
            "- Re-drafting accepts more than the draft it would replace in: "
            + ", ".join(f"{r['model']} {r['steps']} steps ({r['draft']})" for r in useful)
            + "; worth building there."
        )
    elif worse < len(digits):
        lines.append(f"- Not built: re-drafting accepts less on the digits model in {worse} of {len(digits)} rows.")
    else:
        where = (
            (
                f"on {', '.join(sorted({r['model'] for r in gains}))} with x0-hat frozen, where the fitted Gaussian, "
                "which it plans with, accepts more still"
            )
            if gains
            else "nowhere here"
        )
        lines.append(
            f"- Not built: re-drafting accepts more only {where}; on the digits model it accepts less in {worse} "
            f"of {len(digits)} rows (every region, both drafts, the whole schedule): the previous round's path, "
            "which left this one at the rejection, is a worse place to read the target than the round's own "
            "frozen node."
        )
    return "\n".join(lines)


def _chain(model: str, steps: int, count: int, extra: dict):
    return build(config(model, steps, count, method="chain", tree=CHAIN, verifier="rmc", prefetch="nearest", **extra))
