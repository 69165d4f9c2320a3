"""The night's heap reports (tasks/report/night.py): a page per evaluation run under
<root>/reports/<night>/, the headline figures in the nightly summary, a failed run named
without failing the others, and the training run's page that registration logs.

GIVEN a data root holding the hand-made run (tests/tasks/report/scenario.py) converted as
      hand/r1, the same traces raw only as prog/u1, and no run gone/r9
WHEN  the evaluation runs of a model evaluated on all three are reported
THEN  two pages are written with the scenario's exact figures, gone/r9 is named as failed,
      and the summary's Markdown shows both.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tasks.core.storage import Root
from tasks.learning.outcome import DatasetRef, RegisteredModel
from tasks.nightly.summary import NightlySummary
from tasks.report.night import (
    NightReports,
    evaluation_runs,
    report_evaluation_runs,
    report_night,
    report_training_run,
    training_report,
)
from tests.tasks.report import scenario as sc

LEAK_BLOCKS = sum(n for _, n in sc.LEAKS.values())  # 4
LEAK_BYTES = sum(b for b, _ in sc.LEAKS.values())  # 2440


def dataset_ref(root: Path, train_runs: tuple = ()) -> DatasetRef:
    return DatasetRef(
        root=str(root),
        train_runs=train_runs,
        eval_runs=(),
        heldout_runs=(),
        train_tokens=0,
        eval_tokens=0,
        content_hash="",
        token_histogram=np.zeros(64),
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    raw = sc.write_raw(root / "raw" / "hand" / "r1")
    sc.write_events(raw, root, "hand", "r1")
    shutil.copytree(raw, root / "raw" / "prog" / "u1")  # never converted: read raw
    return root


@pytest.fixture(scope="module")
def model() -> RegisteredModel:
    """A registered model evaluated on three runs (what registration hands to the reports)."""
    return RegisteredModel(
        name="m",
        version="1",
        run_id="run",
        eval_runs=(("hand", "r1"),),
        unseen_program_runs=(("prog", "u1"),),
        heldout_runs=(("gone", "r9"), ("hand", "r1")),  # hand/r1 again: reported once
    )


def test_evaluation_runs_are_each_run_once_in_table_order(model):
    assert evaluation_runs(model) == [
        ("hand", "r1", "unseen_runs"),
        ("prog", "u1", "unseen_programs"),
        ("gone", "r9", "heldout_workloads"),
    ]


def test_a_page_per_evaluation_run_and_a_failed_run_named(root, model):
    out = report_evaluation_runs(Root.from_url(str(root)), model, night="n1")

    folder = root / "reports" / "n1"
    assert out.folder == str(folder)
    assert [(r.run, r.table) for r in out.reports] == [
        ("hand/r1", "unseen_runs"),
        ("prog/u1", "unseen_programs"),
    ]
    for r in out.reports:  # events and raw traces: the same figures, exactly
        assert (r.events, r.peak_bytes, r.leaks, r.leak_bytes, r.processes) == (
            13,
            sc.PEAK,
            LEAK_BLOCKS,
            LEAK_BYTES,
            3,
        )
        page = Path(r.path)
        assert page.parent == folder and page.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in folder.iterdir()) == ["hand-r1.html", "prog-u1.html"]
    assert list(out.failed) == ["gone/r9"] and "no such run" in out.failed["gone/r9"]


def test_the_summary_shows_the_figures_paths_and_failures(root, model):
    reports = report_evaluation_runs(Root.from_url(str(root)), model, night="n2")
    summary = NightlySummary(root=str(root), finished_at="now", stages=[], heap_reports=reports)
    md = summary.markdown()

    assert "## Heap reports (evaluation runs)" in md
    row = next(line for line in md.splitlines() if line.startswith("| hand/r1 |"))
    assert "| 13 |" in row and "6.57 KiB" in row and "4 blocks, 2.38 KiB" in row
    assert str(root / "reports" / "n2" / "hand-r1.html") in row
    assert "- gone/r9: ReportInputError" in md
    # the summary survives the round trip Prefect's result storage makes
    assert NightlySummary.model_validate_json(summary.model_dump_json()) == summary


def test_report_night_takes_the_registered_model_and_never_raises(root, model, tmp_path):
    out = report_night.fn(Root.from_url(str(root)), model, night="n3")
    assert len(out.reports) == 2 and out.skipped is None

    # no model registered tonight (the train stage failed or was skipped)
    assert report_night.fn(Root.from_url(str(root)), None).skipped == "no model was trained tonight"
    assert "No heap reports tonight" in NightReports(skipped="x").markdown()

    # a root that cannot be written: the night goes on, the summary says why
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = report_night.fn(Root.from_url(str(blocker)), model, night="n4")
    assert out.reports == [] and out.skipped and "the reports failed" in out.skipped


def test_training_report_is_the_first_training_runs_page(root, tmp_path):
    data = Root.from_url(str(root))
    dataset = dataset_ref(root, train_runs=(("hand", "r1"), ("prog", "u1")))
    page = training_report(data, dataset, tmp_path)
    assert page == tmp_path / "hand-r1.html" and page.stat().st_size > 100_000

    with pytest.raises(ValueError, match="no training run"):
        training_report(data, dataset_ref(root), tmp_path)


def test_the_flows_report_step_hands_a_file_or_says_why(root, tmp_path):
    # what the train flow hands to registration: the page, or why there is none (never raises)
    data = Root.from_url(str(root))
    made = report_training_run.fn(data, dataset_ref(root, (("hand", "r1"),)), tmp_path)
    assert made.path == tmp_path / "hand-r1.html" and made.error is None
    missing = report_training_run.fn(data, dataset_ref(root, (("gone", "r9"),)), tmp_path)
    assert missing.path is None and missing.error.startswith("ReportInputError: gone/r9")
