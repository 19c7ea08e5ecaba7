"""The studies of what the library does not build (docs/experiments/): each report is its committed results
rendered, under the machine line of the run that wrote them, and each study is indexed and out of the
benchmarks' runner."""

import json

import pytest

from benchmarks import experiment
from benchmarks.run import SECTIONS


@pytest.mark.parametrize("name", experiment.STUDIES)
def test_a_studys_report_is_its_committed_results_rendered(name):
    record = json.loads((experiment.FOLDER / f"{name}.json").read_text())
    module = experiment.load(name)
    assert record["section"] == name
    expected = experiment.report(module.TITLE, record["machine"], name, module.render(record["results"]))
    assert (experiment.FOLDER / f"{name}.md").read_text() == expected


def test_every_study_is_indexed_and_none_is_a_benchmark():
    index = (experiment.FOLDER / "README.md").read_text()
    files = {p.stem for p in experiment.FOLDER.glob("*.py")}
    assert files == set(experiment.STUDIES)
    for name in experiment.STUDIES:
        assert f"({name}.md)" in index and name not in SECTIONS
