"""Faults a conversion must survive, provoked for real on synthetic raw runs.

GIVEN a raw run converted once, then grown by a new raw file
WHEN  the process converting it again is SIGKILLed (while writing a part, before its commit,
      right after the swap), or the data root's disk (a small tmpfs) fills during the conversion
THEN  readers see exactly the rows of one conversion, never a half-written or doubled part; the
      next run completes and leaves nothing in staging; a full disk fails the run with a message
      naming it and the free space it needs, its previous partition intact, other runs unaffected.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.partitions import (
    SUMMARY_NAME,
    DiskFull,
    RunRef,
    convert_run,
    read_events,
    read_summary,
    runs_to_convert,
    sweep_staging,
)
from tests.faults import kill_at_marker, small_tmpfs
from tests.tracegen import synthetic_records, trace_bytes

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

RUN = RunRef("w", "r1")
KEY = ["workload", "run", "pid", "thread", "seq"]


@pytest.fixture(scope="module")
def client():
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:
        yield c


def add_raw(root_dir: Path, run: RunRef, pid: int, records: int) -> None:
    d = root_dir / "raw" / run.workload / run.run
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({"workload": run.workload, "ok": True}))
    recs = synthetic_records(records, threads=2, seed=pid)
    (d / f"{pid}-1.hct").write_bytes(trace_bytes(recs, pid=pid))


def events(root: Root, **kw):
    return read_events(root, **kw).sort_by([(k, "ascending") for k in KEY])


def reference(tmp_path: Path, root_dir: Path, client, name: str):
    """The rows one clean conversion of the run's current raw files gives (another root)."""
    ref = tmp_path / f"ref-{name}"
    shutil.copytree(root_dir / "raw", ref / "raw")
    convert_run(Root.from_url(str(ref)), RUN, client=client)
    return events(Root.from_url(str(ref)))


def staged_files(root_dir: Path) -> list[Path]:
    return [p for p in (root_dir / "events" / "_staging").rglob("*") if p.is_file()]


CHILD_CONVERTS = """
    from distributed import Client
    import pyarrow.parquet as pq
    import tasks.dataset.convert as convert
    import tasks.dataset.partitions as p
    from tasks.core.storage import Root

    POINT, MARKER = {point!r}, {marker!r}
    convert.GROUP_ROWS = 1000  # many row groups: a part is written a piece at a time

    if POINT == "writing":  # half of a part written, its footer never
        def write_events(tables, where):
            writer = pq.ParquetWriter(where, p.EVENTS_SCHEMA, **p.PARQUET_OPTIONS)
            for i, table in enumerate(tables):
                writer.write_table(table, row_group_size=table.num_rows)
                if i == 2:
                    pause_here(MARKER)
        p.write_events = write_events
    elif POINT == "before-commit":  # every part staged, nothing visible changed yet
        p._commit = lambda *args, **kwargs: pause_here(MARKER)
    elif POINT == "after-swap":  # the new partition in place, the old one still in staging
        original = p._exchange
        def exchange(a, b):
            assert original(a, b)
            pause_here(MARKER)
        p._exchange = exchange

    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:
        p.convert_run(Root.from_url({root!r}), p.RunRef("w", "r1"), client=c)
"""


def kill_a_conversion(tmp_path: Path, root_dir: Path, point: str) -> None:
    marker = tmp_path / f"killed-{point}"
    code = CHILD_CONVERTS.format(point=point, marker=str(marker), root=str(root_dir))
    kill_at_marker(code, marker)


@pytest.mark.parametrize("point", ["writing", "before-commit", "after-swap"])
def test_a_conversion_killed_midway_leaves_one_conversion_visible(tmp_path, client, point):
    # GIVEN a run converted once (two raw files), then grown by a third raw file
    root_dir = tmp_path / "root"
    root = Root.from_url(str(root_dir))
    add_raw(root_dir, RUN, 100, 6000)
    add_raw(root_dir, RUN, 200, 4000)
    convert_run(root, RUN, client=client)
    old = events(root)
    add_raw(root_dir, RUN, 300, 8000)
    new = reference(tmp_path, root_dir, client, point)
    assert new.num_rows > old.num_rows

    # WHEN the process converting it again is SIGKILLed at `point`
    kill_a_conversion(tmp_path, root_dir, point)

    # THEN readers see exactly one conversion: the old one, or (killed after the swap) the new
    seen = events(root)
    assert seen.equals(new if point == "after-swap" else old)
    if point == "writing":  # really half-written: the staged part has no footer
        (half,) = [p for p in staged_files(root_dir) if p.suffix == ".parquet"]
        with pytest.raises(Exception, match="(?i)parquet|magic|footer|size"):
            pq.read_metadata(half)
    assert staged_files(root_dir)  # what the killed process left (invisible to readers)

    # AND the next run completes: the run is converted again unless it was committed
    todo = runs_to_convert(root)
    assert todo == ([] if point == "after-swap" else [RUN])
    sweep_staging(root, todo)  # what the dataset flow does before converting
    for run in todo:
        convert_run(root, run, client=client)
    assert events(root).equals(new)  # exactly the rows of one conversion, none twice
    assert read_summary(root, RUN)["rows"] == new.num_rows
    parts = sorted(p.name for p in (root_dir / "events" / "workload=w" / "run=r1").iterdir())
    assert parts == [SUMMARY_NAME, "part-100-1.parquet", "part-200-1.parquet", "part-300-1.parquet"]
    assert staged_files(root_dir) == []


@contextmanager
def two_runs_on_a_small_disk(root_dir: Path, client: Client):
    """A data root whose events live on an 8 MiB disk, with two small runs converted (RUN and
    w/other): (the root, the disk's mount point, RUN's events, the other run's)."""
    root = Root.from_url(str(root_dir))
    other = RunRef("w", "other")
    with small_tmpfs(root_dir / "events", "8m") as disk:
        add_raw(root_dir, RUN, 100, 6000)
        add_raw(root_dir, other, 500, 6000)
        convert_run(root, RUN, client=client)
        convert_run(root, other, client=client)
        yield root, disk, events(root, runs=["r1"]), events(root, runs=["other"])


def test_a_full_disk_fails_the_run_by_name_and_keeps_its_previous_partition(tmp_path, client):
    # GIVEN a data root whose events live on an 8 MiB disk, with two small runs converted
    root_dir = tmp_path / "root"
    with two_runs_on_a_small_disk(root_dir, client) as (root, disk, before, before_other):
        free_before = shutil.disk_usage(disk).free
        # WHEN the run grows by traces whose events need more than the disk has left
        add_raw(root_dir, RUN, 300, 1_600_000)
        with pytest.raises(DiskFull) as err:
            convert_run(root, RUN, client=client)
        # THEN the error names the run and the free space needed
        msg = str(err.value)
        assert msg.startswith("w/r1: the data root's disk is full")
        assert "needs about" in msg and "MiB free under" in msg and "free now" in msg
        assert "previous partition is intact" in msg
        needed = float(msg.split("needs about ")[1].split(" MiB")[0].replace(",", ""))
        assert needed * 2**20 > free_before
        # AND its previous partition is intact and readable, the other run untouched
        assert events(root, runs=["r1"]).equals(before)
        assert read_summary(root, RUN)["rows"] == before.num_rows
        assert events(root, runs=["other"]).equals(before_other)
        # AND the partial output is gone: the space is free again, other runs still convert
        assert staged_files(root_dir) == []
        assert shutil.disk_usage(disk).free == free_before
        third = RunRef("w", "third")
        add_raw(root_dir, third, 700, 3000)
        assert convert_run(root, third, client=client)["rows"] == 3000
        assert runs_to_convert(root) == [RUN]  # the failed run stays due, nothing else


def test_commit_without_an_atomic_swap_falls_back_to_two_renames(tmp_path, client, monkeypatch):
    import tasks.dataset.partitions as partitions

    monkeypatch.setattr(partitions, "_exchange", lambda a, b: False)
    root_dir = tmp_path / "root"
    root = Root.from_url(str(root_dir))
    add_raw(root_dir, RUN, 100, 3000)
    convert_run(root, RUN, client=client)
    add_raw(root_dir, RUN, 200, 3000)
    convert_run(root, RUN, client=client)
    assert events(root).equals(reference(tmp_path, root_dir, client, "fallback"))
    assert staged_files(root_dir) == []
