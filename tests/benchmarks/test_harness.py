"""benchmarks/harness.py: one JSON shape for every benchmark, with the machine, the commit, the
reference and the command, and no private path.

GIVEN a benchmark's figures WHEN the harness writes them THEN the file has the one shape and its
paths are relative to the repository, `<root>` or `<tmp>`.
"""

from __future__ import annotations

import json
import tempfile

from benchmarks import harness
from benchmarks.__main__ import main as run_suite
from benchmarks.suite import by_name

REPO = harness.REPO


def test_a_result_has_the_one_shape_and_no_private_path(tmp_path):
    tmp = tempfile.gettempdir()
    figures = {
        "trace": f"{REPO}/data/raw/sqlite3/small/1.hct",
        "work": f"{tmp}/heapcast-bench-x/run",
        "root": str(tmp_path / "store" / "events"),
        "rate": 1.5,
    }
    out = harness.write_result(
        "example",
        figures,
        reference="a plain loop",
        out=tmp_path / "example.json",
        roots=(tmp_path / "store",),
        argv=["--root", str(REPO / "data")],
    )
    doc = json.loads(out.read_text())
    assert list(doc) == list(harness.ENVELOPE)
    assert doc["benchmark"] == "example" and doc["reference"] == "a plain loop"
    assert doc["command"].endswith("--root data")
    assert doc["machine"]["cores"] and doc["machine"]["cpu"]
    assert set(doc["commit"]) == {"sha", "dirty"}
    assert doc["results"]["trace"] == "data/raw/sqlite3/small/1.hct"
    assert doc["results"]["root"] == "<root>/events"
    assert doc["results"]["work"] == "<tmp>/heapcast-bench-x/run"
    assert doc["results"]["rate"] == 1.5


def test_the_runner_lists_what_it_runs_without_running(capsys):
    assert run_suite(["--list"]) == 0
    out = capsys.readouterr().out
    for b in by_name([]):
        assert b.name in out and b.script in out
    assert "studies" in out


def test_an_unknown_benchmark_is_named_with_the_known_ones():
    try:
        by_name(["crossfit"])
    except SystemExit as e:
        assert "crossfit is a study" in str(e) and "cli" in str(e)
    else:
        raise AssertionError("an unknown name must fail")
