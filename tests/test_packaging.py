"""The package as users install it: `import specdemo` without the app's and the benchmarks' packages, a
command line whose --help imports no torch, options that agree with the library, and a pyproject.toml
that declares what the library imports and ships the files it reads.
"""

import ast
import dataclasses
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import specdemo
from specdemo.cli import build_parser, sample_options, sample_settings
from specdemo.config import SamplerConfig

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# the app's, the benchmarks' and the parallel extra's packages, not the library's
OPTIONAL = ("gradio", "plotly", "sklearn", "accelerate")


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, *args, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_library_imports_and_samples_without_the_app_and_bench_packages():
    blocked = python(f"""
import json, sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # import of it fails, as where it is not installed
import specdemo
bare = sorted(m for m in ("torch", "diffusers") if m in sys.modules)
from specdemo import *
from specdemo import SamplerConfig, generate
result, _ = generate(SamplerConfig(model="gm2d", method="chain", tree="1x3", steps=10, num_samples=2, device="cpu"))
try:
    specdemo.figures
    figures = "imported"
except ModuleNotFoundError as err:
    figures = err.name.split(".")[0]
print(json.dumps({{"bare": bare, "shape": list(result.samples.shape), "figures": figures}}))
""")
    assert blocked.returncode == 0, blocked.stderr
    report = json.loads(blocked.stdout.strip().splitlines()[-1])
    assert report["bare"] == [], "`import specdemo` alone imports " + ", ".join(report["bare"])
    assert report["shape"] == [2, 2]
    assert report["figures"] == "plotly"  # the figures need the app extra, and say which package is missing


def imported_modules(importtime_stderr: str) -> set[str]:
    """The modules a `python -X importtime` run imported, from its stderr."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_help_imports_no_torch():
    """What makes --help answer at once (0.05 to 0.2 s measured, against about 10 s for torch and
    diffusers): it imports none of them. Timed in the notes, not here (a loaded machine is slow)."""
    module, _, function = PYPROJECT["project"]["scripts"]["specdemo"].partition(":")
    script = f"import sys; from {module} import {function}; sys.exit({function}())"  # what the installed command runs
    for argv in (["--help"], ["sample", "--help"], ["bench", "--help"]):
        for code, prog in (
            (f"import sys; sys.argv[1:] = {argv!r}; {script}", "specdemo"),
            (
                f"import runpy, sys; sys.argv[1:] = {argv!r}; runpy.run_module('specdemo', run_name='__main__')",
                "python -m specdemo",
            ),
        ):
            out = python(code, "-X", "importtime")
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith(f"usage: {prog}"), out.stdout[:200]
            heavy = {m for m in imported_modules(out.stderr) if m.split(".")[0] in ("torch", "numpy", "diffusers")}
            assert not heavy, f"{prog} {' '.join(argv)} imports {sorted(heavy)[:5]}"
    sample_help = python(f"import sys; sys.argv[1:] = ['sample', '--help']; {script}").stdout
    for flag, _ in sample_options():
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", sample_help), f"{flag} missing from sample --help"


def test_the_public_names_and_submodules_still_import():
    from specdemo import pipeline

    for name in specdemo.__all__:
        getattr(specdemo, name)  # AttributeError or ImportError where a name lost its module
    assert specdemo.SamplerConfig is pipeline.SamplerConfig is SamplerConfig and specdemo.generate is pipeline.generate
    assert specdemo.kernels.DDPMKernel.__name__ == "DDPMKernel"  # a submodule, as `import specdemo` gave before
    assert set(specdemo.__all__) <= set(dir(specdemo))
    for missing in ("no_such_name", "_private"):
        try:
            getattr(specdemo, missing)
        except AttributeError as err:
            assert missing in str(err)
        else:
            raise AssertionError(f"specdemo.{missing} should not exist")


def test_sample_options_are_the_config_fields_and_the_names_are_the_registries():
    from specdemo import config
    from specdemo.models import EMBEDDED
    from specdemo.sampling import PREFETCH
    from specdemo.targets import PRESETS
    from specdemo.verifiers import VERIFIERS

    # every field is an option, and no option sets anything else; the defaults are SamplerConfig's
    assert sample_settings(build_parser().parse_args(["sample"])) == SamplerConfig().to_dict()
    given = sample_settings(
        build_parser().parse_args(["sample", "--draft-bias", "2", "--replan", "--class-label", "3"])
    )
    assert (given["draft_bias"], given["replan"], given["class_label"]) == (2.0, True, 3)
    # the accepted names config.py lists are the ones the library implements
    assert tuple(VERIFIERS) == config.VERIFIER_NAMES and tuple(PREFETCH) == config.PREFETCH_NAMES
    assert tuple(PRESETS) == config.PRESET_NAMES and tuple(EMBEDDED) == config.EMBEDDED_NAMES
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sample", "--verifier", "nosuch"])


def test_a_new_config_field_is_a_new_option(monkeypatch, capsys):
    from specdemo import cli, config

    @dataclasses.dataclass(frozen=True)
    class Extended(config.SamplerConfig):
        temperature: float = config.setting(1.0, "a setting added for this test")

    monkeypatch.setattr(cli, "SamplerConfig", Extended)
    assert cli.sample_settings(cli.build_parser().parse_args(["sample", "--temperature", "0.5"]))["temperature"] == 0.5
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["sample", "--help"])
    assert "a setting added for this test (default 1.0)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_a_saved_config_replays_and_options_change_it(tmp_path):
    saved = SamplerConfig(model="gm2d", method="chain", tree="1x3", steps=20, num_samples=3, seed=7)
    path = tmp_path / "run.json"
    path.write_text(saved.to_json())
    assert SamplerConfig.from_json(path) == saved

    def replay(*extra):
        trace = tmp_path / "trace.json"
        subprocess.run(
            [sys.executable, "-m", "specdemo", "sample", "--config", str(path), "--trace", str(trace), *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return json.loads(trace.read_text())["config"]

    fields = ("model", "method", "tree", "steps", "num_samples", "seed")
    replayed, changed = replay(), replay("--num-samples", "5")
    assert {k: replayed[k] for k in fields} == {k: getattr(saved, k) for k in fields}
    assert {k: changed[k] for k in fields} == {**{k: getattr(saved, k) for k in fields}, "num_samples": 5}
    assert SamplerConfig.from_json(tmp_path / "trace.json").num_samples == 5  # a run's trace replays too
    bad = tmp_path / "bad.json"
    bad.write_text('{"modell": "gm2d"}')
    out = subprocess.run(
        [sys.executable, "-m", "specdemo", "sample", "--config", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "unknown settings ['modell']" in out.stderr and "Traceback" not in out.stderr


def distribution(module: str) -> str:
    """The normalised name of the distribution that provides a top-level module (PIL -> pillow)."""
    name = importlib.metadata.packages_distributions().get(module, [module])[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requirements) -> dict[str, Requirement]:
    return {re.sub(r"[-_.]+", "-", r.name).lower(): r for r in map(Requirement, requirements)}


@pytest.mark.slow
def test_pyproject_declares_what_the_library_imports():
    project = PYPROJECT["project"]
    runtime = declared(project["dependencies"])
    extras = {name: declared(reqs) for name, reqs in project["optional-dependencies"].items()}
    anywhere = runtime.keys() | {name for reqs in extras.values() for name in reqs}
    imported = set()
    for path in (REPO / "specdemo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {distribution(m) for m in imported - set(sys.stdlib_module_names) - {"specdemo"}}
    assert third_party <= anywhere, f"imported but not declared: {sorted(third_party - anywhere)}"
    assert not {"gradio", "plotly", "scikit-learn", "accelerate"} & runtime.keys()  # the extras'
    assert "accelerate" in extras["parallel"]
    # ranges from the version tested (requirements.txt pins it) to the next major version
    assert runtime["torch"].specifier.contains("2.13.0") and not runtime["torch"].specifier.contains("3.0.0")


def test_requirement_files_pin_versions_that_pyproject_accepts():
    project = PYPROJECT["project"]
    ranges = declared(project["dependencies"])
    for reqs in project["optional-dependencies"].values():
        ranges.update(declared(reqs))
    for name in ("requirements.txt", "requirements-dev.txt"):
        lines = [line.strip() for line in (REPO / name).read_text().splitlines()]
        pins = declared(line for line in lines if line and not line.startswith(("#", "-")))
        for dist, pin in pins.items():
            version = next(iter(pin.specifier)).version
            assert dist in ranges, f"{name} pins {dist}, which pyproject.toml does not declare"
            assert ranges[dist].specifier.contains(version), f"{name}: {dist}=={version} is outside {ranges[dist]}"
    assert "-e .[app,parallel]" in (REPO / "requirements.txt").read_text()


def test_every_file_the_library_reads_is_package_data():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["specdemo"]
    root = REPO / "specdemo"
    data = [
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert data, "specdemo/ holds no data files: the plans and the rank weights are missing"
    for path in data:
        assert any(path.match(pattern) for pattern in patterns), f"specdemo/{path} is not in package-data"


def test_several_processes_without_accelerate_name_the_extra(monkeypatch):
    from specdemo import SpecdemoError
    from specdemo.parallel import process_state

    monkeypatch.setenv("WORLD_SIZE", "2")  # as `accelerate launch` or torchrun sets it
    monkeypatch.setitem(sys.modules, "accelerate", None)  # not installed
    with pytest.raises(SpecdemoError, match=r"pip install 'specdemo\[parallel\]'"):
        process_state()
