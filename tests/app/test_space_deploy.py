"""The Hugging Face Space: its front matter and runtime (space_config/README.md, deploy.check), its
requirements resolved for the Space's Python, and the staged Space run whole in a fresh venv."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from ..helpers import served_app

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "space_config" / "deploy.py"
# what the Space is made of, and nothing else (deploy.stage)
SHIPPED = {"app.py", "README.md", "requirements.txt", "specdemo", "specdemo_app"}
NOT_SHIPPED = {"tests", "docs", "benchmarks", "scripts", "__pycache__"}


def load_deploy():
    """space_config/deploy.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("specdemo_space_deploy", DEPLOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


deploy = load_deploy()


def stage(out: Path) -> dict:
    """`deploy.py --dry-run --out out`: the files staged in `out`, and the plan it prints."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY), "--repo-id", "someone/specdemo", "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def test_space_config_front_matter_and_dry_run(tmp_path):
    meta = deploy.front_matter()
    for key in ("title", "sdk", "sdk_version", "app_file", "python_version", "suggested_hardware"):
        assert meta[key]
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gr.__version__ and meta["app_file"] == "app.py"
    deploy.check(meta)
    reqs = (ROOT / "space_config" / "requirements.txt").read_text()
    assert "torch==" in reqs and "spaces" in reqs
    plan = stage(tmp_path / "space")
    assert plan["dry_run"] and SHIPPED <= set(plan["top_level"])
    staged = tmp_path / "space"
    assert (staged / "README.md").read_text().startswith("---\ntitle:")
    assert (staged / "specdemo" / "figures" / "tree.py").is_file()
    assert {p.name for p in (ROOT / "specdemo_app").glob("*.py")} == {
        p.name for p in (staged / "specdemo_app").iterdir()
    }
    assert not list(staged.rglob("__pycache__"))
    bad = subprocess.run(
        [sys.executable, str(DEPLOY), "--repo-id", "not a repo", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "USER/NAME" in bad.stderr


def test_the_space_declares_a_python_that_zerogpu_offers():
    meta = deploy.front_matter()
    assert meta["python_version"] in deploy.ZEROGPU_PYTHONS
    assert set(deploy.ZEROGPU_PYTHONS) == {"3.10", "3.12"}  # Hub docs, docs/hub/spaces-zerogpu.md
    for version in ("3.11", "3.13", "3"):
        with pytest.raises(deploy.DeployError, match="python_version") as refused:
            deploy.check({**meta, "python_version": version})
        assert all(accepted in str(refused.value) for accepted in deploy.ZEROGPU_PYTHONS), refused.value


def test_the_space_ships_mcp_at_the_repos_pin():
    """gradio's MCP server needs its `mcp` extra (mcp>=1.21,<2); the Space installs it from its requirements."""
    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in (ROOT / "space_config" / "requirements.txt").read_text().splitlines()
        if "==" in line.split("#")[0]
    )
    major, minor, *_ = (int(part) for part in pins["mcp"].split("."))
    assert (1, 21) <= (major, minor) < (2, 0)


@pytest.mark.slow
def test_the_space_requirements_resolve_for_its_python(tmp_path):
    """pip resolves what the Space installs (its requirements.txt and gradio at the README's sdk_version) to
    wheels for the front matter's Python, without installing. Needs PyPI."""
    meta = deploy.front_matter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--target",
            str(tmp_path / "target"),
            "--python-version",
            meta["python_version"],
            "--only-binary=:all:",
            "-r",
            str(ROOT / "space_config" / "requirements.txt"),
            f"gradio=={meta['sdk_version']}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    would = next(line for line in done.stdout.splitlines() if line.startswith("Would install"))
    for name, version in [("gradio", meta["sdk_version"]), ("torch", None), ("mcp", None), ("spaces", None)]:
        assert f" {name}-{version or ''}" in would, would


def isolated_env(venv: Path) -> dict:
    """The environment of a process of the fresh venv: nothing that points back at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    return {**env, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
def test_the_staged_space_runs_whole_in_a_fresh_venv(tmp_path):
    """The staged folder, with only what its requirements.txt and the README's gradio install (no checkout),
    serves the app as the Space does and answers a default /sample call. About 2 minutes on 2 cores (pip's cache warm)."""
    from gradio_client import Client

    staged = tmp_path / "space"
    stage(staged)
    # what is shipped: the five entries and nothing else (checked before anything runs there and writes bytecode)
    assert {p.name for p in staged.iterdir()} == SHIPPED
    assert (staged / "specdemo").is_dir() and (staged / "specdemo_app").is_dir()
    extra = [p for p in staged.rglob("*") if NOT_SHIPPED & set(p.relative_to(staged).parts) or p.suffix == ".pyc"]
    assert not extra, extra

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, env = str(venv / "bin" / "python"), isolated_env(venv)
    sdk_version = deploy.front_matter(staged / "README.md")["sdk_version"]
    pip_log = tmp_path / "pip.log"
    with pip_log.open("w") as log:
        installed = subprocess.run(
            [python, "-m", "pip", "install", "-r", "requirements.txt", f"gradio=={sdk_version}"],
            cwd=staged,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    assert installed.returncode == 0, tail(pip_log)
    # the packages come from the staged folder, not from an installed checkout
    where = subprocess.run(
        [python, "-c", "import specdemo, specdemo_app; print(specdemo.__file__); print(specdemo_app.__file__)"],
        cwd=staged,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(staged) for line in where.stdout.split()), where.stdout

    with served_app(staged, env, python, start_s=180) as (address, _):
        out = Client(address, verbose=False).submit(api_name="/sample").result(timeout=300)
    assert "fewer target calls" in out["headline"], out["headline"]
    assert out["runs"] and all(run["target_calls"] > 0 for run in out["runs"]), out["runs"]
    assert out["runs"][0]["label"] == "plain target"
