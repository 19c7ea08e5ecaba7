"""`python -m specdemo sample`: the CLI contract. Options are documented, a run prints its cost as a
JSON object on the last line of stdout and can save the samples, bad arguments exit non-zero with
exactly one line on stderr and no traceback.

The cases of the contract are each a subprocess (the CLI's exit path is what is tested), two at a
time; further bad arguments run in process through `specdemo.cli.main`, which is what the
subprocess runs, to keep the module fast (each subprocess pays about 5 s of imports).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
OPTIONS = [
    "--model",
    "--kernel",
    "--steps",
    "--eta",
    "--churn",
    "--method",
    "--tree",
    "--verifier",
    "--draft",
    "--freeze",
    "--draft-bias",
    "--prefetch",
    "--num-samples",
    "--seed",
    "--device",
    "--out",
    "--threads",
]
SUMMARY_KEYS = [
    "target_calls",
    "target_rows",
    "draft_calls",
    "steps",
    "speedup",
    "speedup_total",
    "acceptance",
    "wall_s",
]

BAD = {  # name: (arguments, a word the one-line error must contain)
    "unknown-model": (["--model", "no-such-model"], "no-such-model"),
    "malformed-tree": (["--method", "tree", "--tree", "4x"], "4x"),
    "rmc-with-a-tree": (["--method", "tree", "--tree", "2x3", "--verifier", "rmc"], "rmc"),
    "steps-zero": (["--steps", "0"], "--steps"),
    "steps-abc": (["--steps", "abc"], "abc"),
}
BAD_IN_PROCESS = {
    "missing-mixture-file": (["--model", "no/such/mixture.json"], "mixture.json"),
    "tree-letters": (["--method", "tree", "--tree", "a,b"], "a,b"),
    "chain-with-a-tree": (["--method", "chain", "--tree", "2x2"], "chain"),
    "unknown-kernel": (["--kernel", "euler"], "euler"),
    "unknown-verifier": (["--method", "tree", "--verifier", "magic"], "magic"),
    "num-samples-zero": (["--num-samples", "0"], "samples"),
    "langevin-freeze-x0": (["--model", "banana", "--method", "chain", "--freeze", "x0"], "x0"),
    "eta-out-of-range": (["--kernel", "ddim", "--eta", "3"], "eta"),
    "negative-seed": (["--seed", "-1"], "seed"),
    "long-model-name": (["--model", "x" * 10_000], "10000 characters long"),
    "huge-chain": (["--method", "chain", "--tree", "1x3000000000"], "over the limit of 128"),
    "huge-width": (["--method", "tree", "--tree", "99999999999x2"], "over the limit of 4096"),
    "long-tree-text": (["--method", "tree", "--tree", "1," * 2000 + "1"], "characters long"),
    "steps-over-the-limit": (["--model", "gm2d", "--steps", "100000"], "over the limit of 10000 steps"),
    "rows-over-the-limit": (
        ["--model", "gm2d", "--method", "tree", "--tree", "4x4", "--steps", "1000", "--num-samples", "100000"],
        "target rows",
    ),
    # refused before sampling, not after it
    "grid-of-vectors": (["--model", "gm2d", "--grid", "samples.png"], "--grid draws images"),
    "out-into-a-missing-folder": (["--model", "gm2d", "--out", "no/such/folder/x.npz"], "folder does not exist"),
}
CUDA = torch.cuda.is_available()


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), e.get("PYTHONPATH", "")])
    return e


def start(args):
    return subprocess.Popen(
        [sys.executable, "-m", "specdemo", *args],
        cwd=REPO,
        env=env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The module's subprocess invocations, two at a time; {name: (returncode, stdout, stderr)}. About 30 s on
    two cores: the tests that take it are slow (pytest.ini)."""
    out = tmp_path_factory.mktemp("cli") / "samples.npz"
    small = [
        "sample",
        "--model",
        "gm512",
        "--method",
        "chain",
        "--tree",
        "1x3",
        "--num-samples",
        "3",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    jobs = {
        "help": ["sample", "--help"],
        "small": small,
        "device-cuda": [
            "sample",
            "--model",
            "gm2d",
            "--method",
            "target",
            "--steps",
            "5",
            "--num-samples",
            "2",
            "--device",
            "cuda",
        ],
        **{name: ["sample", "--device", "cpu", "--num-samples", "2", *args] for name, (args, _) in BAD.items()},
    }
    results, names = {}, list(jobs)
    for i in range(0, len(names), 2):  # two at a time: two cores
        procs = {name: start(jobs[name]) for name in names[i : i + 2]}
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            results[name] = (p.returncode, stdout, stderr)
    results["out_path"] = out
    return results


def in_process(args, capsys):
    """specdemo.cli.main(args) -> (exit status, stdout, stderr); argparse errors exit by SystemExit."""
    from specdemo.cli import main

    try:
        code = main(args)
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_help_documents_every_option(runs):
    code, stdout, stderr = runs["help"]
    assert code == 0, stderr
    for option in OPTIONS:  # the option itself, not a longer one it starts (--draft vs --draft-bias)
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", stdout), f"{option} missing from --help"
    # each option comes with some explanation, not only its name
    assert len(stdout.splitlines()) > len(OPTIONS)


def last_json(stdout):
    """The last line of stdout, parsed as strict JSON (NaN and Infinity are not JSON)."""
    line = stdout.strip().splitlines()[-1]

    def refuse(constant):
        raise ValueError(f"{constant} is not valid JSON")

    return json.loads(line, parse_constant=refuse)


def loose_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_small_run_prints_its_cost_and_saves_samples(runs):
    code, stdout, stderr = runs["small"]
    assert code == 0, stderr
    summary = loose_json(stdout)
    assert isinstance(summary, dict)
    for key in SUMMARY_KEYS:
        assert key in summary, f"{key} missing from {sorted(summary)}"
    assert summary["steps"] == 30
    assert summary["target_calls"] > 0 and summary["target_rows"] >= summary["target_calls"]
    assert summary["draft_calls"] == 0
    assert 1.0 <= summary["speedup"] <= 3.0 and summary["speedup_total"] > 0.5
    assert 0.0 <= summary["acceptance"] <= 1.0 and summary["wall_s"] > 0
    with np.load(runs["out_path"]) as saved:
        samples = saved["samples"]
    assert samples.shape == (3, 512) and np.isfinite(samples).all()


@pytest.mark.slow
def test_the_last_line_is_strict_json(runs, capsys):
    """A JSON object for any consumer (jq, JavaScript): NaN (e.g. the acceptance of plain sampling, or
    of a depth never reached) must be written as null."""
    code, stdout, stderr = runs["small"]
    assert code == 0, stderr
    assert isinstance(last_json(stdout), dict)
    code, stdout, stderr = in_process(PLAIN, capsys)
    assert code == 0, stderr
    assert isinstance(last_json(stdout), dict)


PLAIN = ["sample", "--model", "gm2d", "--method", "target", "--steps", "10", "--num-samples", "2", "--device", "cpu"]


def test_plain_run_in_process(capsys):
    code, stdout, stderr = in_process(PLAIN, capsys)
    assert code == 0, stderr
    summary = loose_json(stdout)
    assert summary["target_calls"] == 10 and summary["speedup"] == 1.0 and summary["speedup_total"] == 1.0


def test_sample_with_no_topology_runs_the_planned_default(capsys):
    """`sample` with no topology plans a tree (here, with no plan cached, the online plan), not a fixed tree."""
    code, stdout, stderr = in_process(["sample", "--num-samples", "1", "--steps", "20"], capsys)
    assert code == 0, stderr
    summary = loose_json(stdout)
    assert summary["model"] == "digits" and summary["method"] == "tree" and summary["plan_source"] == "online"
    assert summary["tree"] == "online(16 rows)" and summary["pilot_calls"] == 0


def test_the_method_is_reported_as_asked(capsys):
    """A tree method whose topology is a chain (or a plan of chains) is still reported as the tree method."""
    code, stdout, stderr = in_process(
        [
            "sample",
            "--model",
            "gm2d",
            "--method",
            "tree",
            "--tree",
            "1x3",
            "--steps",
            "10",
            "--num-samples",
            "2",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, stderr
    assert loose_json(stdout)["method"] == "tree"


def one_line_error(result):
    code, stdout, stderr = result
    assert code != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr has {len(lines)} lines:\n{stderr}"
    assert "Traceback" not in stderr and "error" in lines[0].lower()
    return lines[0]


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.slow
def test_bad_arguments_fail_with_one_line(runs, name):
    line = one_line_error(runs[name])
    assert BAD[name][1] in line, line


@pytest.mark.parametrize("name", list(BAD_IN_PROCESS))
def test_more_bad_arguments_fail_with_one_line(capsys, name):
    args, word = BAD_IN_PROCESS[name]
    line = one_line_error(in_process(["sample", "--device", "cpu", "--num-samples", "2", *args], capsys))
    assert word in line, line


@pytest.mark.slow
def test_device_cuda(runs):
    """Without a GPU, --device cuda is refused in one line; with one, it runs."""
    if CUDA:
        code, stdout, stderr = runs["device-cuda"]
        assert code == 0, stderr
        assert loose_json(stdout)["device"].startswith("cuda")
    else:
        assert "cuda" in one_line_error(runs["device-cuda"]).lower()


def test_unknown_bench_section_fails_with_one_line(capsys):
    line = one_line_error(in_process(["bench", "--sections", "nosuch", "--out", "unused.md"], capsys))
    assert "nosuch" in line and "gm512" in line


def test_deterministic_kernel_runs_plain(capsys):
    """DDIM with eta 0 has no stochastic step: nothing to speculate on, a speedup of exactly 1."""
    code, out, err = in_process(
        [
            "sample",
            "--model",
            "gm2d",
            "--kernel",
            "ddim",
            "--eta",
            "0",
            "--method",
            "target",
            "--steps",
            "5",
            "--num-samples",
            "2",
        ],
        capsys,
    )
    assert code == 0, err
    summary = loose_json(out)
    assert summary["stochastic_steps"] == 0 and summary["speedup"] == 1.0 and summary["target_calls"] == 5


def test_the_cli_runs_on_one_cpu_thread_by_default_and_reports_it(capsys, tmp_path):
    """One thread on a CPU unless --threads says otherwise, set before planning and reported in the JSON; the
    same seed and threads give the same samples."""
    import numpy as np
    import torch

    before = torch.get_num_threads()
    try:
        runs = {}
        for name, extra in (("default", []), ("again", []), ("two", ["--threads", "2"])):
            out = tmp_path / f"{name}.npz"
            code, stdout, stderr = in_process(
                [
                    "sample",
                    "--model",
                    "gm2d",
                    "--tree",
                    "1x4",
                    "--steps",
                    "10",
                    "--num-samples",
                    "8",
                    "--device",
                    "cpu",
                    "--out",
                    str(out),
                    *extra,
                ],
                capsys,
            )
            assert code == 0, stderr
            runs[name] = (json.loads(stdout.strip().splitlines()[-1])["threads"], np.load(out)["samples"])
        assert runs["default"][0] == runs["again"][0] == 1 and runs["two"][0] == 2
        assert np.array_equal(runs["default"][1], runs["again"][1])
        code, _, stderr = in_process(["sample", "--model", "gm2d", "--threads", "-1"], capsys)
        assert code == 2 and "--threads must be >= 0" in stderr
    finally:
        torch.set_num_threads(before)
