"""Deploy the app to a Hugging Face Space.

    python space_config/deploy.py --repo-id USER/specdemo --dry-run   # stage and print the plan; no network
    HF_TOKEN=... python space_config/deploy.py --repo-id USER/specdemo  # create the Space and upload

What the Space gets: app.py, the app's package specdemo_app/ next to it, the specdemo package (with
its embedded models), space_config/README.md as README.md (its front matter configures the Space) and
space_config/requirements.txt as requirements.txt. The token comes from --token or huggingface_hub's
usual places (HF_TOKEN, `hf auth login`); this script never prints it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
REQUIRED_KEYS = ("title", "sdk", "sdk_version", "app_file", "python_version", "suggested_hardware")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".DS_Store")
PACKAGES = ("specdemo", "specdemo_app")  # the library, and the app's side next to app.py
# The Pythons a ZeroGPU Space runs: 3.12.12 or 3.10.13, named by their minor version in the front matter
# (Hugging Face Hub docs, docs/hub/spaces-zerogpu.md). The one list of them in this project.
ZEROGPU_PYTHONS = ("3.10", "3.12")


class DeployError(Exception):
    pass


def front_matter(readme: Path = HERE / "README.md") -> dict[str, str]:
    """The README's YAML front matter as flat key: value strings (it holds no nesting)."""
    text = readme.read_text(encoding="utf-8")
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    if not m:
        raise DeployError(f"{readme} has no front matter between --- lines")
    out = {}
    for line in m.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def check(meta: dict[str, str]) -> None:
    """The front matter names everything a Space needs and agrees with the repo's pins."""
    missing = [k for k in REQUIRED_KEYS if not meta.get(k)]
    if missing:
        raise DeployError(f"front matter lacks {missing}")
    if meta["sdk"] != "gradio":
        raise DeployError(f"sdk must be gradio, got {meta['sdk']}")
    if not (ROOT / meta["app_file"]).is_file():
        raise DeployError(f"app_file {meta['app_file']} does not exist")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", (ROOT / "requirements.txt").read_text(), re.M))
    if pins.get("gradio") and pins["gradio"] != meta["sdk_version"]:
        raise DeployError(f"sdk_version {meta['sdk_version']} differs from requirements.txt's gradio=={pins['gradio']}")
    if meta["python_version"] not in ZEROGPU_PYTHONS:
        raise DeployError(
            f"python_version {meta['python_version']} is not one ZeroGPU offers: use one of {', '.join(ZEROGPU_PYTHONS)}"
        )
    if len(meta.get("short_description", "")) > 60:
        raise DeployError("short_description is over 60 characters")
    space_pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", (HERE / "requirements.txt").read_text(), re.M))
    for name, version in space_pins.items():
        if name in pins and pins[name] != version:
            raise DeployError(f"space_config/requirements.txt pins {name}=={version}, requirements.txt {pins[name]}")


def stage(out: Path) -> list[tuple[str, int]]:
    """Lay the Space's files out in `out`; returns (relative path, bytes) for each."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "app.py", out / "app.py")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, out / package, ignore=IGNORE, dirs_exist_ok=True)
    shutil.copy2(HERE / "README.md", out / "README.md")
    shutil.copy2(HERE / "requirements.txt", out / "requirements.txt")
    return sorted((str(p.relative_to(out)), p.stat().st_size) for p in out.rglob("*") if p.is_file())


def deploy(repo_id: str, folder: Path, *, token: str | None, private: bool, message: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(repo_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True)
    api.upload_folder(
        folder_path=str(folder),
        repo_id=repo_id,
        repo_type="space",
        commit_message=message,
        delete_patterns=[f"{package}/**" for package in PACKAGES],
    )
    return str(url)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo-id", required=True, help="the Space, as USER/NAME or ORG/NAME")
    p.add_argument("--dry-run", action="store_true", help="stage the files and print the plan; touch no network")
    p.add_argument("--out", type=Path, help="where to stage the files (default: a temporary folder)")
    p.add_argument("--token", help="a Hugging Face write token (default: huggingface_hub's own lookup)")
    p.add_argument("--private", action="store_true", help="create the Space private")
    p.add_argument("--message", default="Deploy specdemo", help="the commit message on the Space")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", args.repo_id):
        print(f"deploy: error: --repo-id must look like USER/NAME, got {args.repo_id!r}", file=sys.stderr)
        return 2
    try:
        meta = front_matter()
        check(meta)
        folder = args.out or Path(tempfile.mkdtemp(prefix="specdemo-space-"))
        files = stage(folder)
        plan = {
            "repo_id": args.repo_id,
            "dry_run": args.dry_run,
            "folder": str(folder),
            "front_matter": meta,
            "files": len(files),
            "bytes": sum(size for _, size in files),
            "top_level": sorted({path.split("/")[0] for path, _ in files}),
        }
        print(json.dumps(plan, indent=2, ensure_ascii=False))
        if args.dry_run:
            return 0
        print(f"deployed: {deploy(args.repo_id, folder, token=args.token, private=args.private, message=args.message)}")
        return 0
    except DeployError as err:
        print(f"deploy: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
