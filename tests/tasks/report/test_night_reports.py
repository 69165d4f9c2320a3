"""The night's heap reports (tasks/report/night_reports.py): a page per evaluation run under
<root>/reports/<night>/, the headline figures in the nightly summary, a failed run named
without failing the others, and the training run's page that registration logs.

GIVEN a data root holding the hand-made run (tests/tasks/report/scenario.py) converted as
      hand/r1, the same traces raw only as prog/u1, and no run gone/r9
WHEN  the evaluation runs of a model evaluated on all three are reported
THEN  two pages are written with the scenario's exact figures, gone/r9 is named as failed,
      and the summary's Markdown shows both.
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tasks.core.storage import Root
from tasks.learning.outcome import DatasetRef, RegisteredModel
from tasks.nightly.markdown import markdown_text
from tasks.nightly.params import NightlyParams
from tasks.nightly.summary_model import NightlySummary
from tasks.report.analysis import analyze
from tasks.report.night_reports import (
    KEEP_NIGHTS,
    NightReports,
    evaluation_runs,
    night_name,
    prune_nights,
    report_evaluation_runs,
    report_night,
    report_training_run,
    training_report,
)
from tasks.report.page import PLOTLY_JS, figures, plotly_js
from tasks.report.sources import resolve
from tests.tasks.report import scenario as sc
from tests.tasks.report.test_page import browse, plots_drawn

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

LEAK_BLOCKS = sum(n for _, n in sc.LEAKS.values())  # 4
LEAK_BYTES = sum(b for b, _ in sc.LEAKS.values())  # 2440


def dataset_ref(root: Path, train_runs: tuple = ()) -> DatasetRef:
    return DatasetRef(
        root=Root.from_url(str(root)),
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
    assert sorted(p.name for p in folder.iterdir()) == ["hand-r1.html", PLOTLY_JS, "prog-u1.html"]
    assert list(out.failed) == ["gone/r9"] and "no such run" in out.failed["gone/r9"]


def test_the_summary_shows_the_figures_paths_and_failures(root, model):
    reports = report_evaluation_runs(Root.from_url(str(root)), model, night="n2")
    summary = NightlySummary(root=str(root), finished_at="now", stages=[], heap_reports=reports)
    md = markdown_text(summary)

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


# ------------------------------------------------------------ one plotly.js per night's folder


def test_a_nights_pages_share_one_plotly_js_and_draw_every_plot(root, model, tmp_path):
    # GIVEN the night's pages WHEN written THEN plotly.js is in the folder once, not in a page
    out = report_evaluation_runs(Root.from_url(str(root)), model, night="shared")
    folder = root / "reports" / "shared"
    assert sorted(p.name for p in folder.iterdir()) == [
        "hand-r1.html",
        PLOTLY_JS,
        "prog-u1.html",
    ]
    library = (folder / PLOTLY_JS).read_text()
    assert library == plotly_js() and len(library) > 3_000_000
    for r in out.reports:
        page = Path(r.path).read_text()
        assert f"<script src='{PLOTLY_JS}'" in page
        assert len(page) < 500_000  # its data and tables, not the 4.6 MB library
        assert library[:2000] not in page
    # THEN the page, opened from its folder as a file, draws every figure
    page = Path(out.reports[0].path)
    n = len(figures([analyze(resolve("hand/r1", Root.from_url(str(root))))]))
    assert plots_drawn(page, tmp_path) == n


def test_a_page_moved_without_its_plotly_js_says_what_is_missing(root, model, tmp_path):
    out = report_evaluation_runs(Root.from_url(str(root)), model, night="moved")
    alone = tmp_path / "alone" / "hand-r1.html"
    alone.parent.mkdir()
    shutil.copy(out.reports[0].path, alone)

    r = browse(alone, tmp_path, "--dump-dom")
    assert 'id="plotly-missing"' in r.stdout, r.stderr[-2000:]
    assert f"The figures need {PLOTLY_JS}, which did not load" in r.stdout
    assert "<h2>Summary</h2>" in r.stdout  # the tables are still there


def test_the_training_page_for_mlflow_stands_alone(root, tmp_path):
    # MLflow serves an artifact as one file: its page carries plotly.js itself
    page = training_report(Root.from_url(str(root)), dataset_ref(root, (("hand", "r1"),)), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hand-r1.html"]
    text = page.read_text()
    assert "<script src=" not in text and plotly_js()[:2000] in text


# ------------------------------------------------------------ retention: the last N nights


def nights(n: int) -> list[str]:
    """n night names, oldest first, one a day."""
    start = datetime.datetime(2026, 1, 1, 2, 0, 0, tzinfo=datetime.UTC)
    return [night_name(start + datetime.timedelta(days=i, seconds=i)) for i in range(n)]


def put(root: Root, path: str, data: bytes) -> None:
    root.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # a local fs makes no parents
    root.fs.pipe_file(path, data)


def make_nights(root: Root, names: list[str]) -> None:
    for name in names:
        put(root, root.join("reports", name, "w-r.html"), b"<html></html>")


# not a night's folder, whatever the retention: each is left alone
STRAYS = ("notes", "2026-13-01T020000Z", "2026-01-01T020000Z.bak", "2026-01-01t020000z")


def listing(root: Root) -> list[str]:
    fs = root.fs
    fs.invalidate_cache()
    return sorted(
        p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(root.join("reports"), detail=False)
    )


@pytest.mark.parametrize("url", ["local", "memory://heapcast-retention/data"])
def test_retention_keeps_the_newest_nights_and_nothing_else_is_touched(url, tmp_path):
    data = Root.from_url(str(tmp_path / "data") if url == "local" else url)
    keep = 3
    names = nights(keep + 2)
    make_nights(data, names[::-1])  # written newest first: the order is the names', not the writes'
    for stray in STRAYS:
        put(data, data.join("reports", stray, "mine.txt"), b"keep me")
    put(data, data.join("reports", "2026-01-09T020000Z"), b"a file named as a night")

    deleted = prune_nights(data, keep)

    assert deleted == [data.join("reports", n) for n in names[:2]]  # the two oldest
    assert listing(data) == sorted([*names[2:], *STRAYS, "2026-01-09T020000Z"])
    for stray in STRAYS:
        assert data.fs.cat_file(data.join("reports", stray, "mine.txt")) == b"keep me"
    assert prune_nights(data, keep) == []  # applied again: nothing more to delete
    with pytest.raises(ValueError, match="keep at least 1 night"):
        prune_nights(data, 0)
    if url != "local":
        data.fs.rm(data.path, recursive=True)


def test_the_night_applies_its_retention_after_writing_tonights_pages(root, model, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(root / "raw", data_dir / "raw")
    shutil.copytree(root / "events", data_dir / "events")
    data = Root.from_url(str(data_dir))
    older = nights(4)
    make_nights(data, older)
    tonight = night_name(datetime.datetime(2026, 2, 1, 2, 0, 0, tzinfo=datetime.UTC))

    out = report_night.fn(data, model, night=tonight, keep_nights=2)

    assert listing(data) == [older[-1], tonight]
    assert out.pruned == [data.join("reports", n) for n in older[:3]] and out.prune_failed is None
    assert len(out.reports) == 2 and (data_dir / "reports" / tonight / PLOTLY_JS).is_file()
    md = out.markdown()
    assert f"Older nights deleted (retention): `{older[0]}`, `{older[1]}`, `{older[2]}`." in md

    # tonight's folder is never deleted, even under a clock that went back
    make_nights(data, ["2027-01-01T000000Z"])
    kept = report_night.fn(data, None, night=tonight, keep_nights=1)
    assert listing(data) == [tonight, "2027-01-01T000000Z"] and kept.skipped


def test_the_nightly_form_has_the_retention_setting(tmp_path):
    assert NightlyParams().reports_keep_nights == KEEP_NIGHTS == 14
    form = NightlyParams(root=str(tmp_path), reports_keep_nights=3)
    assert form.stages().reports_keep_nights == 3
    with pytest.raises(ValidationError, match="reports_keep_nights"):
        NightlyParams(reports_keep_nights=0)


def test_a_remote_roots_night_has_its_pages_and_one_plotly_js(root, model):
    # GIVEN the runs under a non-local root (fsspec's memory store, as an S3 bucket would be)
    data = Root.from_url("memory://heapcast-remote-night/data")
    data.fs.put(str(root / "raw"), data.join("raw"), recursive=True)
    data.fs.put(str(root / "events"), data.join("events"), recursive=True)
    make_nights(data, nights(3))

    out = report_night.fn(data, model, night="2026-03-01T020000Z", keep_nights=2)

    folder = data.join("reports", "2026-03-01T020000Z")
    assert out.folder == data.url_of("reports", "2026-03-01T020000Z")
    assert [r.path for r in out.reports] == [
        f"memory://{folder}/hand-r1.html",
        f"memory://{folder}/prog-u1.html",
    ]
    names = sorted(p.rsplit("/", 1)[1] for p in data.fs.ls(folder, detail=False))
    assert names == ["hand-r1.html", PLOTLY_JS, "prog-u1.html"]
    assert data.fs.cat_file(f"{folder}/{PLOTLY_JS}").decode() == plotly_js()
    assert listing(data) == [nights(3)[-1], "2026-03-01T020000Z"]
    data.fs.rm(data.path, recursive=True)
