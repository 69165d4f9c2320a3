"""The nightly summary gives the last allocator recommendation per workload, with the line to paste.

GIVEN a data root where the allocators stage wrote two measurements (its own writer:
tasks.allocators.report.write_outcome), or none, or one whose table is corrupt
WHEN the night is summarized
THEN the summary's allocator section gives each workload's newest recommendation, its margin
with interval and the line `heapcast tune` would print, where the full table lives, or how to
get measurements; a broken table is one line, never a failed night.
"""

from __future__ import annotations

import pytest

from tasks.allocators.config import load_allocators_config
from tasks.allocators.report import write_outcome
from tasks.core.storage import Root
from tasks.nightly.markdown import markdown_text
from tasks.nightly.night_summary import summarize
from tasks.nightly.params import NightContext
from tasks.registry.tracking import TrackingConfig
from tasks.replay.workloads import load_catalog
from tests.tasks.allocators.tables import make_measurements, runs_of

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

BASE = [1.00, 1.02, 0.98, 1.01, 0.99]
FAST = [0.80, 0.81, 0.79, 0.82, 0.80]
OLDER, NEWER = "20261101T020000Z", "20261108T020000Z"


def night_of(root: Root):
    ctx = NightContext(root=root, tracking=TrackingConfig(root=root.url), catalog=load_catalog())
    return summarize.fn(ctx, [], None, None)


@pytest.fixture
def measured(tmp_path):
    """Two measurements: the older of sqlite3 and git, the newer of sqlite3 alone."""
    root = Root.from_url(str(tmp_path))
    cfg = load_allocators_config()
    older = make_measurements(
        {},
        cases={
            "sqlite3": {"glibc": runs_of(BASE, 100.0), "jemalloc": runs_of(BASE, 100.0)},
            "git": {"glibc": runs_of(BASE, 50.0), "tcmalloc": runs_of([1.1] * 5, 50.0)},
        },
    ).model_copy(update={"night": OLDER})
    newer = make_measurements(
        {"glibc": runs_of(BASE, 100.0), "jemalloc": runs_of(FAST, 104.0)}, case="sqlite3"
    ).model_copy(update={"night": NEWER})
    for m in (older, newer):
        write_outcome(root, m, cfg, to_mlflow=False)
    return root, cfg


def test_the_newest_recommendation_per_workload_with_the_line_to_paste(measured):
    root, cfg = measured
    page = markdown_text(night_of(root))
    assert "## Allocator advice (last measured 2026-11-08 02:00 UTC)" in page
    (sqlite3,) = [line for line in page.splitlines() if line.startswith("- sqlite3")]
    # the newer night's answer, with its margin's interval and `heapcast tune`'s line
    assert "**jemalloc**" in sqlite3 and "less time than glibc (interval" in sqlite3
    assert "beyond the noise" in sqlite3
    line = cfg.get("jemalloc").line()
    assert line.startswith("LD_PRELOAD=")
    assert f"paste: `{line} PROGRAM`" in sqlite3
    # git was measured only in the older night: its answer stays, dated
    assert "- git (measured 2026-11-01 02:00 UTC): glibc: nothing beyond the noise" in page
    report = root.url_of("allocators", "reports", f"night={NEWER}", "allocators.md")
    assert f"Full table: `{report}`; MLflow experiment `{cfg.experiment}`." in page


def test_without_measurements_the_summary_says_how_to_get_them(tmp_path):
    page = markdown_text(night_of(Root.from_url(str(tmp_path))))
    assert "## Allocator advice\n" in page
    assert "No allocator measurements under this root yet" in page
    assert "prefect deployment run 'allocators/allocators'" in page
    assert "python -m flows.allocators" in page


def test_a_corrupt_table_is_one_line_and_the_others_still_count(measured):
    root, _ = measured
    broken = root.join("allocators", "summary", f"night={NEWER}", "part-0.parquet")
    with root.fs.open(broken, "wb") as f:
        f.write(b"not parquet")
    page = markdown_text(night_of(root))
    where = root.url_of("allocators", "summary", f"night={NEWER}")
    (problem,) = [line for line in page.splitlines() if line.startswith("- could not read")]
    assert where in problem
    # the older night answers for both workloads now
    assert "## Allocator advice (last measured 2026-11-01 02:00 UTC)" in page
    assert "- sqlite3: glibc: nothing beyond the noise" in page
    assert "- git: glibc: nothing beyond the noise" in page


def test_a_newer_measurement_too_short_to_decide_does_not_replace_a_decisive_one(measured):
    """A quick seeds-style measurement (3 rounds: the rank test cannot decide) after the
    5-round ones: the advice stays with the decisive measurement; a case only the short one
    measured gets its answer, said to be too short to decide."""
    root, cfg = measured
    short = make_measurements(
        {},
        cases={
            "sqlite3": {"glibc": runs_of(BASE[:3], 100.0), "jemalloc": runs_of(FAST[:3], 104.0)},
            "perl": {"glibc": runs_of(BASE[:3], 80.0), "jemalloc": runs_of(FAST[:3], 80.0)},
        },
    ).model_copy(update={"night": "20261115T020000Z"})
    write_outcome(root, short, cfg, to_mlflow=False)
    page = markdown_text(night_of(root))
    (sqlite3,) = [line for line in page.splitlines() if line.startswith("- sqlite3")]
    assert sqlite3.startswith("- sqlite3 (measured 2026-11-08 02:00 UTC): **jemalloc**")
    # one candidate, 3 runs against 3: p 1/20 at best, not below 0.05; 4 rounds would reach it
    assert (
        "- perl (3 rounds only: too few to decide; the rule needs 4, 1 more): glibc: "
        "nothing beyond the noise" in page
    )
