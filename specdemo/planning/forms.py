"""--freeze auto's per-step table and the draft choice, learnt from runs with no call of the target
(docs/algorithms.md section 6, "The freeze table learnt from runs").

A run that traces its target outputs (sample(trace_outputs=True)) knows, along each trajectory's committed
path, the state x_n and the target's output at most steps n. From those alone each draft form can be priced
as a pilot of that form would: frozen at a committed step f, its mean at the committed state x_m, m = f + k,
against the target's mean there gives delta = ||m^q_m(x_m) - m^p_m(x_m)|| / s_m, cell (m, k), the pilot's
cell of a level k below a frozen node (DeltaStats). Unlike a pilot's, these deltas are not conditioned on
the levels above being accepted: every committed step counts at every distance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from scipy.special import ndtr

from ..drafts import BiasedDraft, CorrectedNetworkDraft, Draft, NetworkDraft, frozen_draft
from ..drafts.base import AffineLevels, LevelMeans
from ..drafts.frozen import FORMS
from ..drafts.stepwise import RESIDUAL
from ..kernels import Kernel
from ..resolve import AUTO_FORMS, PILOT_DEPTH
from ..sampling.record import ACCEPTED, ROOT, RoundTrace
from .cache import (
    KEPT_PER_CELL,
    MACHINE,
    cache_folder,
    drop_plan,
    index_ranges,
    key_name,
    load_plan,
    plan_key,
    range_indices,
    store_plan,
)
from .planner import auto_draft, online_form, online_frozen_form
from .programme import DeltaStats
from .setup import Setup

PAIRS_A_CHUNK = 4096  # frozen nodes priced at once (each with PILOT_DEPTH levels) ...
STATES_A_CHUNK = 1 << 22  # ... and at most this many state values over their levels (each level's nodes at once)
FORM_NAMES = {**FORMS, "residual": RESIDUAL}


def candidates(problem: Setup) -> list[tuple[int, Draft]]:
    """The drafts --freeze auto chooses among per step: each frozen form (AUTO_FORMS: the output, x0-hat,
    its extrapolation in time, the fitted Gaussian), and with a draft network that network corrected by the
    target's residual (RESIDUAL)."""
    assert problem.config.start is not None  # resolve() settles it
    drafts: list[tuple[int, Draft]] = [
        (FORMS[mode], frozen_draft(mode, start=problem.config.start)) for mode in AUTO_FORMS
    ]
    network = _draft_network(problem.draft)
    if network is not None:
        drafts.append((RESIDUAL, CorrectedNetworkDraft(network.network, network.name)))
    return drafts


def _draft_network(draft: Draft | None) -> NetworkDraft | None:
    """The setting's draft network: the draft as built, or within the draft planning made of it (a stepwise
    draft, under a bias)."""
    return None if draft is None else draft.part(NetworkDraft)


def options(problem: Setup, measured: list[tuple[int, DeltaStats]]) -> list[tuple[DeltaStats, Draft]]:
    """The drafts to plan with from each candidate form's deltas (a pilot's, or learnt), each with the deltas
    of its table: the first drafts each step with the form of highest mean acceptance (a tie goes to the
    earlier form; a step no form measured keeps planner.online_form, or online_frozen_form). Where that gives
    some steps to the network, the second drafts with the frozen forms alone: a network level costs a draft call, which the
    time objective weighs (planner.planned_options)."""
    n_steps = problem.kernel.num_steps
    acceptance = np.stack([mean_acceptance(stats) for _, stats in measured])
    frozen_kinds = sum(form != RESIDUAL for form, _ in measured)
    chosen = []
    for kinds in (len(measured), frozen_kinds):  # every form, then the frozen forms alone
        best = acceptance[:kinds].argmax(0)
        measured_any = np.isfinite(acceptance[:kinds]).any(0)
        fallback = online_form(problem) if kinds == len(measured) else online_frozen_form(problem.kernel)
        table = tuple(measured[i][0] if seen else fallback for i, seen in zip(best.tolist(), measured_any, strict=True))
        stats = DeltaStats(
            {k: v for form, st in measured for k, v in st.deltas.items() if table[k[0]] == form},
            n_steps,
        )
        chosen.append((stats, auto_draft(problem, table)))
        if RESIDUAL not in table:
            break
    return chosen


def mean_acceptance(stats: DeltaStats) -> np.ndarray:
    """(N,): per step, the mean single-child acceptance 2 Phi(-delta/2) of the nodes verified there, all
    depths; -inf where none was (no form wins there on this account)."""
    sums, counts = np.zeros(stats.num_steps), np.zeros(stats.num_steps)
    for (step, _), values in stats.deltas.items():
        sums[step] += (2 * ndtr(-np.asarray(values) / 2)).sum()
        counts[step] += len(values)
    return np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)


def committed_paths(
    trace: Sequence[RoundTrace], trajectories: Sequence[int], num_steps: int, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The states and target outputs (T, N, *shape) of `trajectories` at each step of their committed paths
    (a round's root and its accepted nodes), NaN where the trace has none (a plain step, a committed leaf
    whose output no round computed)."""
    row = {t: i for i, t in enumerate(trajectories)}
    states = np.full((len(trajectories), num_steps, *shape), np.nan, dtype=np.float32)
    outputs = np.full_like(states, np.nan)
    for rnd in trace:
        assert rnd.states is not None and rnd.outputs is not None  # a run traced for learning keeps both
        committed = (rnd.status == ROOT) | (rnd.status == ACCEPTED)
        committed &= np.isin(rnd.trajectories, trajectories)[:, None]
        a, node = np.nonzero(committed)
        t = np.array([row[i] for i in rnd.trajectories[a].tolist()], dtype=np.int64)
        n = rnd.step[a] + rnd.node_depth[node]
        inside = n < num_steps  # an accepted leaf at step N is the sample: no step of the path
        t, n, a, node = t[inside], n[inside], a[inside], node[inside]
        states[t, n] = rnd.states[a, node]
        out = rnd.outputs[a, node]
        known = np.isfinite(out).all(tuple(range(1, out.ndim)))
        outputs[t[known], n[known]] = out[known]  # a step committed twice (a leaf, then a root) keeps its output
    return states, outputs


def form_deltas(
    kernel: Kernel,
    drafts: list[tuple[int, Draft]],
    states: np.ndarray,
    outputs: np.ndarray,
    cond: dict,
    device: torch.device,
    dtype: torch.dtype,
) -> list[tuple[int, np.ndarray]]:
    """Each draft's deltas (each `drafts` entry a form and its draft) as a (3, K) array of (m, k, delta),
    k = 1..PILOT_DEPTH (as_stats makes DeltaStats of it),
    priced along the committed paths `states` and `outputs` (T, N, *shape), computed on `device` in `dtype`
    (module docstring). cond: each path's conditioning (T, ...). The frozen value takes the node one step
    above the frozen one as its `earlier` (the line's and the Gaussian's second point) where the path has
    it."""
    n_steps = kernel.num_steps
    flat = lambda a: a.reshape(*a.shape[:2], -1)
    has = np.isfinite(flat(states)).all(2) & np.isfinite(flat(outputs)).all(2)  # (T, N)
    t_f, f = np.nonzero(has[:, : n_steps - 1])
    levels = np.arange(1, PILOT_DEPTH + 1)
    runs, scales = kernel.stochastic_run_lengths().numpy(), kernel.scales.numpy()
    chunk = max(1, min(PAIRS_A_CHUNK, STATES_A_CHUNK // (PILOT_DEPTH * int(np.prod(states.shape[2:])))))
    on = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)
    cells: list[list[np.ndarray]] = [[] for _ in drafts]  # each draft's (step, depth, delta), a chunk at a time
    for lo in range(0, len(f), chunk):
        t, n = t_f[lo : lo + chunk], f[lo : lo + chunk]
        m = np.minimum(n[None] + levels[:, None], n_steps - 1)  # (D, P): the step of each level's node
        # a round rooted at f + 1 drafts as many levels as stochastic steps follow (r[f + 1])
        valid = (levels[:, None] <= runs[n + 1][None]) & has[t[None], m]
        if not valid.any():
            continue
        above = np.maximum(n - 1, 0)
        with_above = has[t, above] & (n > 0)
        lift = with_above.reshape(-1, *[1] * (states.ndim - 2))
        earlier = (
            on(np.where(lift, outputs[t, above], outputs[t, n])),
            on(np.where(lift, states[t, above], states[t, n])),
            torch.from_numpy(np.where(with_above, above, n)).to(device),
        )
        rows = {k: v[torch.from_numpy(t).to(v.device)].to(device) for k, v in cond.items()}
        d, p = np.nonzero(valid)  # by level, then pair: the order the cells are kept in
        step, drafted_levels = m[d, p], valid.any(1)
        with torch.inference_mode():
            out_f, x_f, f_steps = on(outputs[t, n]), on(states[t, n]), torch.from_numpy(n).to(device)
            steps = torch.from_numpy(m).to(device)
            x_m = on(states[t, m])  # (D, P, *shape): each level's nodes, and the target's mean there
            target = kernel.mean(on(outputs[t, m]), x_m, steps)
            for kept, (_, draft) in zip(cells, drafts, strict=True):
                frozen = draft.frozen_value(kernel, out_f, x_f, f_steps, earlier=earlier, cond=rows)
                drafted = _drafted(draft.for_round(kernel, steps, frozen, rows), x_m, drafted_levels)
                gap = torch.linalg.vector_norm(drafted.sub_(target).flatten(2), dim=2).double().cpu().numpy()
                kept.append(np.stack([step, d + 1, gap[d, p] / scales[step]]))
    return [
        (form, np.concatenate(kept, 1) if kept else np.zeros((3, 0)))
        for (form, _), kept in zip(drafts, cells, strict=True)
    ]


def _drafted(means: LevelMeans, x: torch.Tensor, levels: np.ndarray) -> torch.Tensor:
    """The draft's means m^p_d(x[d]) (D, P, *shape) at the levels d where `levels` holds, NaN at the others: an
    affine draft's every level in one pass, a draft network's one call a level."""
    if isinstance(means, AffineLevels):
        return means.at_levels(x)
    drafted = torch.full_like(x, torch.nan)
    for d in np.nonzero(levels)[0].tolist():
        drafted[d] = means(d, x[d][None])[0]
    return drafted


def as_stats(cells: np.ndarray, num_steps: int) -> DeltaStats:
    """DeltaStats of a (3, K) array of (step, depth, delta), each cell's deltas in the order given."""
    step, depth, delta = cells
    order = np.lexsort((depth, step))  # stable: a cell keeps its deltas' order
    keys = zip(step[order].astype(np.int64).tolist(), depth[order].astype(np.int64).tolist(), strict=True)
    grouped: dict[tuple[int, int], list[float]] = {}
    for key, value in zip(keys, delta[order].tolist(), strict=True):  # one conversion: tens of thousands of cells
        grouped.setdefault(key, []).append(value)
    return DeltaStats(grouped, num_steps)


def _kept(cells: np.ndarray) -> np.ndarray:
    """The first KEPT_PER_CELL deltas of each (step, depth) cell, in their order, at 5 significant digits."""
    step, depth, delta = cells
    order = np.lexsort((depth, step))
    key = step[order] * (PILOT_DEPTH + 1) + depth[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    rank = np.arange(key.size) - np.repeat(first, np.diff(np.r_[first, key.size]))
    kept = np.sort(order[rank < KEPT_PER_CELL])
    digits = 4 - np.floor(np.log10(np.maximum(np.abs(delta[kept]), 1e-300)))
    return np.stack([step[kept], depth[kept], np.round(delta[kept] * 10.0**digits) / 10.0**digits])


def forms_key(problem: Setup) -> dict:
    """Where a setting's learnt form deltas are kept: the plan's key without what they do not depend on (the
    tree, verifier, budget, prefetch, objective, pilot size, batch and launch), so that every topology of a
    model, draft and kernel learns one table."""
    drop = ("tree", "method", "verifier", "budget", "prefetch", "objective", "pilot_samples", *MACHINE)
    return {**{k: v for k, v in plan_key(problem).items() if k not in drop}, "record": "forms"}


def priced_count(problem: Setup, folder: Path | None = None) -> int | None:
    """How many trajectories the setting's runs priced the forms along (in `folder`: the shipped statistics;
    default the plan cache); None: none yet."""
    record = _forms_record(problem, folder)
    return None if record is None else int(record["trajectories"])


def load_forms(problem: Setup, folder: Path | None = None) -> tuple[list[tuple[int, DeltaStats]], int] | None:
    """Each candidate form's learnt deltas and how many trajectories measured them (in `folder`, as
    priced_count)."""
    record = _forms_record(problem, folder)
    if record is None:
        return None
    n_steps = int(record["num_steps"])
    measured = [(FORM_NAMES[name], as_stats(_cells(cells), n_steps)) for name, cells in record["deltas"].items()]
    return measured, int(record["trajectories"])


def _cells(stored: dict) -> np.ndarray:
    return np.array([stored["step"], stored["depth"], stored["delta"]], dtype=np.float64).reshape(3, -1)


def learns_table(problem: Setup) -> bool:
    """Whether the setting learns its --freeze auto table from runs (this module) rather than deltas under a
    fixed draft (stats.learn): --freeze auto on a kernel with x0-hat (without it the output is the only
    form)."""
    return problem.request is not None and problem.request.freeze and problem.kernel.has_denoised


def table_wanted(problem: Setup) -> bool:
    """Whether a run of the setting should trace what its table is learnt from: a writable cache holds fewer
    than config.pilot_samples of its trajectories (or --replan starts them again)."""
    if cache_folder(problem.config.cache_dir) is None:
        return False
    count = None if problem.config.replan else priced_count(problem)
    return count is None or count < problem.config.pilot_samples


def replanned(problem: Setup) -> bool:
    """Whether this setting's runs learn the forms anew since its --replan: a plan shipped for it is then set
    aside, as where its runs keep statistics of their own (stats.learn). Another topology's runs learning the
    table leave a shipped plan the default."""
    record = _forms_record(problem)
    return record is not None and key_name(plan_key(problem)) in record.get("replanned", [])


def to_price(problem: Setup, trajectories: Sequence[int]) -> list[int]:
    """The trajectories of a run (by index) whose paths learn_forms should price: those its seed has not priced
    yet, at most as many as config.pilot_samples still needs (under --replan, as if none were priced)."""
    record = None if problem.config.replan else _forms_record(problem)
    count = 0 if record is None else int(record["trajectories"])
    known = set() if record is None else range_indices(record.get("learnt", {}).get(str(problem.stream_seed), []))
    return sorted(set(trajectories) - known)[: max(problem.config.pilot_samples - count, 0)]


def learn_forms(problem: Setup, trace: Sequence[RoundTrace], priced: Sequence[int], cond: dict) -> None:
    """Add the form deltas along the paths of the run's trajectories `priced` (to_price's; cond: their
    conditioning, in that order) to the setting's record, kept per seed as stats.learn keeps its
    trajectories; --replan starts the record again and removes the setting's plan; a cache that cannot be
    written is skipped."""
    folder = cache_folder(problem.config.cache_dir)
    if folder is None or not priced:
        return
    existing = _forms_record(problem)
    record = None if problem.config.replan else existing  # --replan keeps the other settings' marks alone
    count = 0 if record is None else int(record["trajectories"])
    learnt = {} if record is None else record.get("learnt", {})
    seed = str(problem.stream_seed)
    kernel = problem.kernel
    states, outputs = committed_paths(trace, priced, kernel.num_steps, problem.target.shape)
    bias = problem.config.draft_bias
    drafts = [(form, BiasedDraft(draft, bias) if bias else draft) for form, draft in candidates(problem)]
    measured = form_deltas(kernel, drafts, states, outputs, cond, problem.device, problem.dtype)
    kept = {} if record is None else dict(record["deltas"])
    # the settings whose own runs learn anew: a plan shipped for them is set aside (replanned)
    anew = [] if existing is None else existing.get("replanned", [])
    if problem.config.replan:  # the setting's plan goes with the deltas it was made from (as stats.learn's)
        drop_plan(plan_key(problem), folder)
        anew = sorted({*anew, key_name(plan_key(problem))})
    names = {v: k for k, v in FORM_NAMES.items()}
    for form, cells in measured:
        name = names[form]
        both = np.concatenate([_cells(kept[name]), cells], 1) if name in kept else cells
        step, depth, delta = _kept(both)
        kept[name] = {"step": step.astype(np.int64).tolist(), "depth": depth.astype(np.int64).tolist()}
        kept[name]["delta"] = delta.tolist()
    store_plan(
        forms_key(problem),
        {
            "num_steps": kernel.num_steps,
            "trajectories": count + len(priced),
            "learnt": {**learnt, seed: index_ranges(range_indices(learnt.get(seed, [])) | set(priced))},
            "deltas": kept,
            "replanned": anew,
        },
        folder,
    )


_READ: dict[Path, tuple[tuple[int, int], dict | None]] = {}  # a record file's (mtime, size) and its contents


def _forms_record(problem: Setup, folder: Path | None = None) -> dict | None:
    """The setting's forms record in `folder` (default the plan cache), read again only where its file changed
    (a build reads it several times, and it holds tens of thousands of deltas). The caller must not change it."""
    folder = folder or cache_folder(problem.config.cache_dir)
    if folder is None:
        return None
    key = forms_key(problem)
    path = folder / key_name(key)
    try:
        stat = path.stat()
    except OSError:
        return None
    stamp = (stat.st_mtime_ns, stat.st_size)
    held = _READ.get(path)
    if held is None or held[0] != stamp:
        stored = load_plan(key, folder)
        held = _READ[path] = (stamp, None if stored is None else stored[0])
    return held[1]
