"""The README: its first lines are the two commands for a fresh machine (the test command is CI's), its
quickstart runs as written, and it stays short: at most 150 lines and 1,500 words, sentences of 22 words on
average and none over 50, one image."""

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from specdemo import RoundTrace, cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CPU_INDEX = "$(nvidia-smi -L >/dev/null 2>&1 || echo --extra-index-url https://download.pytorch.org/whl/cpu)"
MAX_LINES, MAX_WORDS, MEAN_SENTENCE, LONGEST_SENTENCE = 150, 1500, 22, 50


def code_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", markdown, re.S | re.M)


def prose_sentences(markdown: str) -> list[str]:
    """The sentences of a markdown text: code blocks, HTML comments, headings and table rows hold none; a
    paragraph or list item is split after each '.', '!' or '?' that ends a word."""
    text = re.sub(r"^```.*?^```$", "", markdown, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    paragraphs: list[list[str]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        item = re.match(r"[-*] (.*)", line)
        if not line or line.startswith(("#", "|")) or item:
            paragraphs.append([item.group(1)] if item else [])
        else:
            paragraphs[-1].append(line)
    return [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+", " ".join(p)) if s.strip()]


def commands(readme: str) -> tuple[str, str]:
    """The README's first block: a comment, the app's command, a comment, the tests' command."""
    lines = readme.splitlines()
    assert lines[1:3] == ["", "```bash"], "the two commands are not the README's first lines"
    block = code_blocks(readme, "bash")[0].splitlines()
    assert [line.startswith("# ") for line in block] == [True, False, True, False], block
    return block[1], block[3]


def test_the_first_lines_are_the_two_commands_and_pick_the_cpu_wheel_where_there_is_no_gpu():
    app, tests = commands(README.read_text())
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert app.startswith(venv) and tests.startswith("apt-get install -y chromium && " + venv)
    for command, requirements in ((app, "requirements.txt"), (tests, "requirements-dev.txt")):
        assert f"pip install -r {requirements} {CPU_INDEX} && " in command
    assert app.endswith(" && python app.py")


def test_the_test_command_is_what_ci_runs():
    """.ci/run installs requirements-dev.txt and runs the README's pytest command, word for word."""
    _, tests = commands(README.read_text())
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    pytest_line = next(line for line in ci if "python -m pytest" in line and not line.startswith("#"))
    assert tests.endswith(" && " + pytest_line), (tests, pytest_line)
    assert any(re.fullmatch(r"pip install (-q )?-r requirements-dev.txt", line) for line in ci)


def test_the_readme_is_short():
    readme = README.read_text()
    sentences = [len(s.split()) for s in prose_sentences(readme)]
    assert len(readme.splitlines()) <= MAX_LINES and len(readme.split()) <= MAX_WORDS
    assert sum(sentences) / len(sentences) <= MEAN_SENTENCE and max(sentences) <= LONGEST_SENTENCE
    assert len(re.findall(r"!\[", readme)) <= 1


def test_the_sentence_counter_counts_what_a_reader_reads():
    text = (
        "# A title\n\nOne two three. Four five\nsix seven.\n\n- an item, with `a.b` inside\n\n```bash\nnot. a. "
        "sentence.\n```\n\n| a table. | cell. |\n<!-- a comment. -->\n"
    )
    assert prose_sentences(text) == ["One two three.", "Four five six seven.", "an item, with `a.b` inside"]


@pytest.mark.slow
def test_the_quickstart_commands_run_as_written(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    lines = [line.split("#")[0].split() for line in code_blocks(README.read_text(), "bash")[1].splitlines()]
    runs = [args[4:] for args in lines if args[:4] == ["python", "-m", "specdemo", "sample"] and "--help" not in args]
    assert len(runs) >= 2
    for args in runs:
        assert cli.main(["sample", *args]) == 0, shlex.join(args)
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["target_calls"] >= 1 and summary["wall_s"] > 0
    assert (tmp_path / "sevens.png").stat().st_size > 0  # the digits line's --grid


def test_the_python_example_runs_as_written(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    scope: dict = {}
    exec(code_blocks(README.read_text(), "python")[0], scope)
    result = scope["result"]
    assert result.samples.shape == (16, 2) and torch.isfinite(result.samples).all()  # "(16, 2)", as commented
    assert {"target_calls", "target_rows", "acceptance_per_depth", "speedup", "wall_s"} <= set(result.cost.summary())
    assert isinstance(result.trace[0], RoundTrace)
