"""specdemo.figures, and the app's runs they are drawn from (specdemo_app: the runner, the exactness test)."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from specdemo import STATUS_NAMES, SamplerConfig, SpecdemoError, Topology, build
from specdemo import figures as F
from specdemo.images import grid
from specdemo.resolve import method_of
from specdemo.trees import MAX_DEPTH
from specdemo_app.exactness import energy_test, exactness_check
from specdemo_app.labels import plan_segments
from specdemo_app.runner import matched_chain, run_comparison
from specdemo_app.topology_text import is_auto

from ..helpers import tiny_pipeline_folder

FOUR = {"accepted", "rejected", "corrected", "unvisited"}


@pytest.fixture(scope="module")
def gm2d():
    return run_comparison(SamplerConfig(model="gm2d", tree="3,2,1", verifier="dgrs", steps=30, num_samples=24, seed=1))


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    folder = tiny_pipeline_folder(tmp_path_factory.mktemp("unet"))
    return run_comparison(SamplerConfig(model=folder, tree="2,1", steps=8, num_samples=3, class_label=2, seed=0))


def test_comparison_runs_three_samplers_with_one_seed(gm2d):
    assert [r.key for r in gm2d.runs] == ["target", "chain", "tree"]
    plain, chain, tree = gm2d.runs
    assert tree.label == "tree 3,2,1 · D-GRS" and tree.rows_per_round == 10
    assert chain.tree == "1x10" and chain.verifier == "rmc" and chain.rows_per_round == 10  # same rows per round
    assert plain.tree == "none" and np.all(plain.cost.calls_per_trajectory == 30)
    for r in gm2d.runs:
        assert r.samples.shape == (24, 2) and torch.isfinite(r.samples).all()
    # same seed: the same initial noise, so the three sample sets are paired draws of one law
    assert gm2d.kind == "plane" and gm2d.paths.shape == (24, 31, 2)
    assert np.allclose(gm2d.paths[:, -1], tree.samples.numpy())
    h = gm2d.headline()
    assert h["speedup"] == pytest.approx(30 / np.mean(tree.cost.calls_per_trajectory))
    assert "speedup_chain" in h
    # one speedup: the headline's, the table's and the cost figure's are the cost's own against plain sampling
    assert F.comparison_table(gm2d.runs)[2][6] == f"{h['speedup']:.2f}×" == f"{tree.cost.speedup_over(plain.cost):.2f}×"
    assert F.comparison_table(gm2d.runs)[2][8] == f"{h['speedup_time']:.2f}×"
    assert F.cost_figure(gm2d.runs).data[4].y[2] == pytest.approx(h["speedup"])


def test_a_chain_is_compared_with_plain_sampling_only():
    comp = run_comparison(SamplerConfig(model="gm2d", tree="1x4", verifier="rmc", steps=12, num_samples=4))
    assert [r.key for r in comp.runs] == ["target", "chain"] and comp.config.method == "chain"


def test_progress_is_reported_per_round():
    seen = []
    run_comparison(
        SamplerConfig(model="gm2d", tree="2,1", steps=10, num_samples=3), progress=lambda f, d: seen.append((f, d))
    )
    fractions = [f for f, _ in seen]
    assert len(seen) > 10 and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(d.startswith("tree 2,1 · D-GRS: round") for _, d in seen)
    assert any(d.startswith("plain target: round") for _, d in seen)


def test_matched_chain_and_method():
    assert matched_chain("3,2,1", 100) == "1x10"
    assert matched_chain("2x5", 100) == "1x31"
    assert matched_chain("4x4", 30) == "1x30"  # capped at the stochastic steps
    assert matched_chain("4x4", 1000) == "1x85"
    assert matched_chain("4x5", 1000) == f"1x{MAX_DEPTH}"  # and at the deepest topology allowed
    assert matched_chain("2,1", 100, evaluate_leaves=True) == "1x5"
    assert method_of("1x5") == "chain" and method_of("3,2,1") == "tree"
    with pytest.raises(SpecdemoError, match="cannot read tree"):
        method_of("3,,x")


def test_round_nodes_are_consistent(gm2d):
    trace = gm2d.trace
    for r, rt in enumerate(trace[:6]):
        for row in range(len(rt.trajectories)):
            nodes = F.round_nodes(trace, r, row)
            assert nodes.status[0] == "root" and nodes.parent[0] == -1
            assert set(nodes.parent[1:]) <= set(nodes.node)
            assert (nodes.node_depth <= nodes.depth).all()
            path = nodes.path()
            # the committed path: root, accepted nodes, then the corrected sample if one ended the round
            assert len(path) - 1 == nodes.committed
            assert nodes.corrected == (nodes.status[path[-1]] == "corrected")
            examined = nodes.status[1:] != "unvisited"
            assert np.isfinite(nodes.parent_delta[1:][examined]).all()


def test_pick_round_shows_all_four_statuses(gm2d):
    assert F.statuses_in_run(gm2d.trace) == FOUR
    t, k = F.pick_round(gm2d.trace)
    r, row = F.trajectory_rounds(gm2d.trace, t)[k - 1]
    assert F.round_nodes(gm2d.trace, r, row).statuses() == FOUR


def _points(fig: go.Figure) -> dict[str, int]:
    """Marker count per legend group of a figure."""
    out = {}
    for tr in fig.data:
        if tr.mode == "markers" and tr.legendgroup:
            out[tr.legendgroup] = out.get(tr.legendgroup, 0) + sum(
                v is not None for v in (() if tr.x is None else tr.x)
            )
    return out


def test_tree_figure_colours_every_status_and_hovers(gm2d):
    t, k = F.pick_round(gm2d.trace)
    fig = F.tree_figure(gm2d.trace, t, k)
    counts = _points(fig)
    assert {s for s, n in counts.items() if n} == FOUR | {"root"}
    markers = {tr.legendgroup: tr for tr in fig.data if tr.mode == "markers" and tr.legendgroup}
    for status in FOUR:
        assert markers[status].marker.color == F.STATUS_COLORS[status]
    hover = " ".join(markers["rejected"].hovertext)
    assert "step n =" in hover and "δ at parent" in hover and "P(accept this child)" in hover
    assert "node acceptance" in " ".join(markers["root"].hovertext)
    # edges from parent to child: one segment per non-root node
    segments = sum(sum(v is None for v in tr.x) for tr in fig.data if tr.mode == "lines")
    assert segments == sum(counts.values()) - 1
    # x is the diffusion step
    r, row = F.trajectory_rounds(gm2d.trace, t)[k - 1]
    assert markers["root"].x[0] == gm2d.trace[r].step[row]
    json.loads(F.figure_json(fig, "tree"))


def test_tree_figure_for_a_missing_trajectory_says_so(gm2d):
    fig = F.tree_figure(gm2d.trace, 999, 1)
    assert "no speculative round" in fig.layout.annotations[0].text
    assert "no speculative rounds" in F.rounds_figure([], 0, 10).layout.annotations[0].text


def test_rounds_figure_tiles_the_trajectory(gm2d):
    fig = F.rounds_figure(gm2d.trace, 0, gm2d.num_steps, k=2)
    bars = fig.data[0]
    rounds = F.trajectory_rounds(gm2d.trace, 0)
    assert len(bars.y) == len(rounds)
    assert sum(bars.y) <= gm2d.num_steps  # deterministic steps are direct, not rounds
    heat = next(tr for tr in fig.data if isinstance(tr, go.Heatmap))
    assert np.asarray(heat.z).shape == (24, gm2d.num_steps)


def test_plane_figure_draws_the_drafted_nodes(gm2d):
    t, k = F.pick_round(gm2d.trace)
    fig = F.plane_figure(gm2d.trace, t, k, gm2d.log_density, path=gm2d.paths[t], samples=gm2d.chosen.samples.numpy())
    r, row = F.trajectory_rounds(gm2d.trace, t)[k - 1]
    nodes = F.round_nodes(gm2d.trace, r, row)
    drawn = np.isfinite(nodes.states).all(1).sum()
    assert drawn >= len(nodes.node) - 1  # every node of the tree, and the corrected draw where there is one
    right = [
        tr
        for tr in fig.data
        if isinstance(tr, go.Scatter) and tr.mode == "markers" and tr.legendgroup and tr.xaxis == "x2"
    ]
    assert sum(len(tr.x) for tr in right) == drawn
    assert sum(isinstance(tr, go.Heatmap) for tr in fig.data) == 2  # the density, in both panels
    vec = run_comparison(SamplerConfig(model="gm16", tree="2,1", steps=6, num_samples=3))
    assert vec.kind == "vector" and vec.trace[0].states is None
    assert "2-D targets" in F.plane_figure(vec.trace, 0, 1, None).layout.annotations[0].text


def test_cost_acceptance_table_and_samples(gm2d):
    cost = F.cost_figure(gm2d.runs)
    assert len(cost.data) == 5 and list(cost.data[4].y)[0] == pytest.approx(1.0)  # speedup in calls: plain 1
    assert list(cost.data[1].y)[0] == pytest.approx(1.0)  # speedup in wall-clock: plain 1
    acc = F.acceptance_figure(gm2d.runs)
    assert [tr.name for tr in acc.data] == ["chain 1x10 · RMC", "tree 3,2,1 · D-GRS"]
    assert len(acc.data[1].x) == 3
    table = F.comparison_table(gm2d.runs)
    assert len(table) == 3 and all(len(row) == len(F.TABLE_HEADERS) for row in table)
    assert table[0][0] == "plain target" and table[2][-3].endswith("×") and table[2][-1].endswith("×")
    samples = F.samples_figure(gm2d.runs, log_density=gm2d.log_density)
    scatters = [tr for tr in samples.data if isinstance(tr, go.Scatter)]
    assert len(scatters) == 3 and all(len(tr.x) == 24 for tr in scatters)


def test_image_views(image_run):
    assert image_run.kind == "image" and image_run.paths is None
    t, k = F.pick_round(image_run.trace)
    fig = F.path_images_figure(image_run.trace, t, k)
    r, row = F.trajectory_rounds(image_run.trace, t)[k - 1]
    path = F.round_nodes(image_run.trace, r, row).path()
    assert sum(isinstance(tr, go.Image) for tr in fig.data) == len(path)
    assert np.asarray(fig.data[0].z).shape == (8, 8, 3)
    samples = F.samples_figure(image_run.runs)
    assert sum(isinstance(tr, go.Image) for tr in samples.data) == 3
    assert (
        "image models"
        in F.path_images_figure(
            run_comparison(SamplerConfig(model="gm2d", tree="2,1", steps=5, num_samples=2)).trace, 0, 1
        )
        .layout.annotations[0]
        .text
    )


def test_run_json(gm2d):
    data = json.loads(json.dumps(gm2d.to_json()))
    assert data["config"]["tree"] == "3,2,1" and data["model"]["steps"] == 30
    assert [m["label"] for m in data["methods"]] == [r.label for r in gm2d.runs]
    assert len(data["samples"]) == 24 and len(data["trace"]) == len(gm2d.trace)
    first = data["trace"][0]
    assert first["status_names"] == list(STATUS_NAMES) and len(first["states"][0][0]) == 2
    small = gm2d.to_json(max_trajectories=2)
    assert all(set(rt["trajectories"]) <= {0, 1} for rt in small["trace"])


def test_energy_test_separates_and_accepts():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 2, generator=g), torch.randn(300, 2, generator=g)
    stat, p = energy_test(a, b, permutations=200)
    assert p > 0.05 and stat >= 0
    _, p_shift = energy_test(a, b + 0.4, permutations=200)
    assert p_shift < 0.01


def test_exactness_check_with_a_biased_draft():
    report = exactness_check(
        SamplerConfig(model="gm2d", tree="2,1", steps=20, draft_bias=2.0, seed=3), 200, permutations=200
    )
    assert report.plain.shape == report.speculative.shape == (200, 2)
    assert report.p_value > 0.01  # deterministic given the seeds
    assert report.mixture is not None
    fig = F.exactness_figure(report.plain, report.speculative, report.p_value, mixture=report.mixture)
    assert sum(isinstance(tr, go.Histogram) for tr in fig.data) == 4 and "p = " in fig.layout.title.text


def test_exactness_check_refuses_what_it_cannot_test(image_run, tmp_path):
    with pytest.raises(SpecdemoError, match="analytic targets"):
        exactness_check(SamplerConfig(model=tiny_pipeline_folder(tmp_path), tree="2,1", steps=4), 50)
    with pytest.raises(SpecdemoError, match="20..2000"):
        exactness_check(SamplerConfig(model="gm2d", tree="2,1"), 5)


def test_figure_json_carries_the_png_export():
    spec = json.loads(F.figure_json(F.message_figure("x"), "specdemo-tree"))
    assert spec["config"]["toImageButtonOptions"] == {"format": "png", "filename": "specdemo-tree", "scale": 2}
    assert "data" in spec and "layout" in spec


@pytest.mark.slow
def test_figures_do_not_import_gradio():
    import subprocess
    import sys

    code = "import sys, specdemo.figures as F; [getattr(F, name) for name in F.__all__]; print('gradio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


@pytest.fixture(scope="module")
def planned():
    """A topology planned per step (tree "auto") on gm2d, with a small pilot; planned for calls, which
    depend on the seed alone (a plan for time reads the machine's measured costs, which vary with load)."""
    return run_comparison(
        SamplerConfig(
            model="gm2d",
            tree="auto",
            budget=8,
            freeze="x0",
            verifier="dgrs",
            prefetch="nearest",
            pilot_samples=8,
            steps=24,
            objective="calls",
            num_samples=16,
            seed=2,
            pilot=True,
        )
    )


def test_auto_topology_is_compared_with_the_chain_at_its_mean_rows(planned):
    plain, chain, tree = planned.runs
    assert planned.config.method == "tree" and planned.plan is not None
    assert tree.key == "tree" and tree.label == "tree auto(8 rows) · D-GRS" and tree.tree == "auto(8 rows)"
    assert tree.rows_per_round == pytest.approx(planned.plan.rows_per_round())
    assert chain.tree == f"1x{round(planned.plan.rows_per_round())}" and chain.verifier == "rmc"
    assert tree.pilot is not None and tree.pilot.target_calls > 0 and chain.pilot is None
    assert matched_chain(planned.plan, 24) == chain.tree
    assert method_of("auto") == "tree" and is_auto(" Auto ") and not is_auto("1x5")
    # every round record was drafted with the tree the plan gives its starting step and root state
    for rt in planned.trace:
        for step, known in zip(rt.step, rt.root_known, strict=True):
            assert F.round_widths(rt) == planned.plan.at(int(step), bool(known)).widths
    data = json.loads(json.dumps(planned.to_json()))
    assert data["plan"] and data["methods"][2]["pilot_target_calls"] == tree.pilot.target_calls


def test_plan_segments_cover_the_speculative_steps(planned):
    segments = plan_segments(planned.plan)
    covered = [n for a, b, _ in segments for n in range(a, b + 1)]
    assert covered == sorted(covered) and len(covered) == len(set(covered))
    assert covered == [n for n, t in enumerate(planned.plan.trees) if t.widths]
    for a, b, tree in segments:
        assert all(planned.plan.at(n).text(planned.plan.leaves_at(n)) == tree for n in range(a, b + 1))
    assert all(
        s1[2] != s2[2] or s1[1] + 1 < s2[0] for s1, s2 in zip(segments, segments[1:], strict=False)
    )  # maximal runs


def test_figures_of_a_planned_run(planned):
    t, k = F.pick_round(planned.trace)
    fig = F.tree_figure(planned.trace, t, k)
    r, row = F.trajectory_rounds(planned.trace, t)[k - 1]
    assert f"tree {Topology(F.round_widths(planned.trace[r]))}" in fig.layout.title.text
    assert "committed" in fig.layout.annotations[0].text
    cost = F.cost_figure(planned.runs)
    assert list(cost.data[0].x) == ["plain<br>target", f"chain<br>{planned.runs[1].tree}", "auto<br>8 rows"]
    table = F.comparison_table(planned.runs)
    assert table[2][1].endswith("(mean)") and isinstance(table[1][1], int)
    assert Topology((1, 1, 1)).text(False) == "1x3"
    assert Topology((3, 1, 1)).text(True) == "3,1,1, leaves evaluated"


def test_pick_round_prefers_all_statuses_then_branching(planned):
    t, k = F.pick_round(planned.trace)
    r, row = F.trajectory_rounds(planned.trace, t)[k - 1]
    best = F.round_nodes(planned.trace, r, row).statuses()
    for tt in sorted(set(np.concatenate([rt.trajectories for rt in planned.trace]).tolist())):
        for rr, rrow in F.trajectory_rounds(planned.trace, tt):
            assert len(F.round_nodes(planned.trace, rr, rrow).statuses()) <= len(best)
    if any(
        len(F.round_nodes(planned.trace, rr, rrow).statuses()) == len(best)
        and max(F.round_widths(planned.trace[rr])) > 1
        for tt in range(16)
        for rr, rrow in F.trajectory_rounds(planned.trace, tt)
    ):
        assert max(F.round_widths(planned.trace[r])) > 1


def test_one_image_grid_for_the_png_and_the_page(image_run):
    """specdemo.images.grid draws the CLI's PNG (black between images) and the page's samples (white)."""
    samples = image_run.runs[0].samples  # 3 images, 1 x 8 x 8
    png, page = grid(samples, 2), grid(samples, 2, background=255)
    assert png.shape == page.shape == (2 * 9 + 1, 2 * 9 + 1, 1)
    assert png[0, 0, 0] == 0 and page[0, 0, 0] == 255 and (png[1:9, 1:9] == page[1:9, 1:9]).all()
    shown = np.asarray(F.samples_figure(image_run.runs).data[0].z)
    assert (shown == np.repeat(page, 3, axis=-1)).all()


def test_the_legends_colours_follow_the_status_codes():
    assert tuple(F.STATUS_COLORS) == STATUS_NAMES == tuple(F.STATUS_LABELS)


def test_image_views_wrap_long_paths_and_fit_the_grid(image_run):
    t, k = F.pick_round(image_run.trace)
    fig = F.path_images_figure(image_run.trace, t, k)
    assert fig.layout.height == 50 + 108  # one row of thumbnails
    samples = F.samples_figure(image_run.runs)
    assert 220 <= samples.layout.height <= 420  # as tall as a 2x2 grid of 3 samples needs
    assert F.samples_figure(image_run.runs, height=500).layout.height == 500


def test_freeze_auto_chain_baseline_reuses_the_pilots_and_matches_a_fresh_build():
    config = SamplerConfig(model="gm2d", tree="3,1", freeze="auto", pilot_samples=8, steps=20, num_samples=8, seed=4)
    comp = run_comparison(config)
    chain = comp.runs[1]
    assert chain.config.method == "chain" and chain.config.freeze == "auto" and chain.verifier == "rmc"
    fresh = build(chain.config)  # what the chain's own build plans: the same freeze table from the same pilots
    assert torch.equal(fresh.run().samples.float(), chain.samples)
    assert np.array_equal(fresh.run().cost.calls_per_trajectory, chain.cost.calls_per_trajectory)
