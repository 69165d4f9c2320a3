"""tasks.dataset.partitions: runs converted with Dask into the partitioned events dataset, on a folder."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.events_schema import EVENTS_SCHEMA
from tasks.dataset.partitions import (
    SUMMARY_NAME,
    RunRef,
    convert_run,
    list_raw_runs,
    read_events,
    read_summary,
    runs_to_convert,
    summary_markdown,
)
from tests.tracegen import free, malloc, realloc, synthetic_records, thread_start, trace_bytes


@pytest.fixture(scope="module")
def client():
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c


def good_trace(pid: int) -> bytes:
    return trace_bytes(
        [
            thread_start(0, pid),
            malloc(10, 100, 0x1000),
            malloc(20, 40, 0x2000),
            realloc(30, 0x1000, 300, 0x3000),
            free(40, 0x3000),
            free(50, 0x9990),
        ],
        pid=pid,
        ppid=1,
    )


def make_run(tmp_path, workload="w", run="r1", bad=True) -> Root:
    d = tmp_path / "raw" / workload / run
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"workload": workload, "run": run}))
    (d / "100-1.hct").write_bytes(good_trace(100))
    (d / "200-1.hct").write_bytes(trace_bytes(synthetic_records(5000, threads=2), pid=200))
    if bad:
        (d / "notatrace.hct").write_text("hello, world\n")
        (d / "empty.hct").write_bytes(b"")
        v2 = bytearray(good_trace(300))
        struct.pack_into("<I", v2, 8, 9)  # a version this reader does not know
        (d / "300-1.hct").write_bytes(bytes(v2))
        (d / "400-1.hct").write_bytes(good_trace(400)[:88])  # cut inside the header
        (d / "500-1.hct").write_bytes(good_trace(500) + b"\x01" * 5)  # partial last record
    return Root.from_url(str(tmp_path))


def test_run_converts_good_files_and_lists_bad_ones(tmp_path, client):
    root = make_run(tmp_path)
    summary = convert_run(root, RunRef("w", "r1"), client=client)

    skipped = {s["file"]: s["reason"] for s in summary["skipped"]}
    assert set(skipped) == {"notatrace.hct", "empty.hct", "300-1.hct", "400-1.hct"}
    assert "does not look like a heapcast trace" in skipped["notatrace.hct"]
    assert "empty file" in skipped["empty.hct"]
    assert "version 9" in skipped["300-1.hct"]
    assert "truncated" in skipped["400-1.hct"] or "inconsistent" in skipped["400-1.hct"]
    for name, reason in skipped.items():
        assert name in reason  # every message names its file
    files = {f["file"]: f for f in summary["files"]}
    assert set(files) == {"100-1.hct", "200-1.hct", "500-1.hct"}
    assert files["500-1.hct"]["dropped_bytes"] == 5 and files["500-1.hct"]["warnings"]

    table = read_events(root)
    assert table.num_rows == summary["rows"] == 5 + 5 + (5000 // 2 * 2)
    assert summary["unpaired_frees"] == 2 and summary["never_freed"] == 2
    assert summary["ops"] == {"free": 2504, "malloc": 2504, "realloc": 2}
    assert summary["threads"] == 4 and summary["processes"] == 3
    assert sum(summary["token_hist"]) == summary["rows"]
    assert files["100-1.hct"]["peak_live_bytes"] == 340  # 100 + 40 -> 40 + 300
    assert summary["peak_live_bytes"] == max(f["peak_live_bytes"] for f in files.values())
    assert read_summary(root, RunRef("w", "r1")) == summary
    assert "Skipped files" in summary_markdown(summary)

    p100 = (
        read_events(
            root, columns=["pid", "freed_size", "lifetime_calls", "token", "workload", "run"]
        )
        .filter(np.asarray(table.column("pid")) == 100)
        .to_pylist()
    )
    assert [r["freed_size"] for r in p100] == [None, None, 100, 300, None]
    assert [r["token"] for r in p100] == [7, 6, 9, 41, 32]
    assert {(r["workload"], r["run"]) for r in p100} == {("w", "r1")}


def test_parts_carry_the_schema(tmp_path, client):
    root = make_run(tmp_path, bad=False)
    convert_run(root, RunRef("w", "r1"), client=client)
    part = next((tmp_path / "events" / "workload=w" / "run=r1").glob("part-*.parquet"))
    assert pq.read_schema(part).equals(EVENTS_SCHEMA, check_metadata=False)
    assert pq.read_schema(part).metadata[b"heapcast.events.version"] == b"2"
    meta = pq.ParquetFile(part).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    assert "DELTA_BINARY_PACKED" in encodings["time_ns"]


def test_a_file_is_written_a_row_group_at_a_time_with_the_same_rows(tmp_path, client, monkeypatch):
    # GIVEN a run converted with each file in one group of rows
    root = make_run(tmp_path, bad=False)
    convert_run(root, RunRef("w", "r1"), client=client)
    part = tmp_path / "events" / "workload=w" / "run=r1" / "part-200-1.parquet"
    whole = pq.read_table(part)
    assert pq.ParquetFile(part).metadata.num_row_groups == 1
    # WHEN it is converted again in groups of 700 rows (lifetimes, freed sizes and call numbers
    # cross groups: two threads, blocks freed later)
    import tasks.dataset.convert as convert_module

    monkeypatch.setattr(convert_module, "GROUP_ROWS", 700)
    summary = convert_run(root, RunRef("w", "r1"), client=client)
    # THEN each group is one row group of the part, and the rows and the summary are the same
    md = pq.ParquetFile(part).metadata
    assert whole.num_rows > 2100
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [700] * (
        whole.num_rows // 700
    ) + ([whole.num_rows % 700] if whole.num_rows % 700 else [])
    assert pq.read_table(part).equals(whole)
    assert summary["rows"] == whole.num_rows + 5 and summary["unpaired_frees"] == 1


def test_converting_again_replaces_the_partition_without_duplicates(tmp_path, client):
    import dask.dataframe as dd

    root = make_run(tmp_path)
    run = RunRef("w", "r1")
    first = convert_run(root, run, client=client)
    rows1 = read_events(root).sort_by([("pid", "ascending"), ("time_ns", "ascending")])
    second = convert_run(root, run, client=client)
    rows2 = read_events(root).sort_by([("pid", "ascending"), ("time_ns", "ascending")])
    assert rows1.equals(rows2) and first["rows"] == second["rows"]
    assert len(dd.read_parquet(root.url_of("events"))) == first["rows"]
    assert not list((tmp_path / "events" / "_staging").rglob("*.parquet"))

    # a raw file that went away takes its part with it
    os.remove(tmp_path / "raw" / "w" / "r1" / "200-1.hct")
    third = convert_run(root, run, client=client)
    assert read_events(root).num_rows == third["rows"] == first["rows"] - 5000
    parts = sorted(p.name for p in (tmp_path / "events" / "workload=w" / "run=r1").iterdir())
    assert parts == [SUMMARY_NAME, "part-100-1.parquet", "part-500-1.parquet"]


def test_only_runs_without_up_to_date_events_are_listed(tmp_path, client):
    root = make_run(tmp_path, "a", "r1", bad=False)
    make_run(tmp_path, "b", "r2", bad=False)
    (tmp_path / "raw" / "b" / "empty-run").mkdir()
    assert list_raw_runs(root) == [RunRef("a", "r1"), RunRef("b", "r2")]
    assert list_raw_runs(root, workloads=["b"]) == [RunRef("b", "r2")]
    assert list_raw_runs(root, runs=["a/r1"]) == [RunRef("a", "r1")]
    convert_run(root, RunRef("a", "r1"), client=client)
    assert runs_to_convert(root) == [RunRef("b", "r2")]
    assert runs_to_convert(root, force=True) == [RunRef("a", "r1"), RunRef("b", "r2")]
    # a new raw file makes the run out of date
    (tmp_path / "raw" / "a" / "r1" / "900-1.hct").write_bytes(good_trace(900))
    assert runs_to_convert(root, workloads=["a"]) == [RunRef("a", "r1")]
    assert read_events(root, workloads=["a"], runs=["r1"], columns=["pid"]).num_rows == 5 + 5000
    assert read_events(root, workloads=["b"]).num_rows == 0


def test_a_failed_replay_is_not_listed_for_conversion_unless_named(tmp_path):
    # GIVEN a good run and a run whose replay failed (time limit): its partial trace is kept
    root = make_run(tmp_path, run="good", bad=False)
    failed = tmp_path / "raw" / "w" / "late"
    failed.mkdir()
    (failed / "manifest.json").write_text(json.dumps({"ok": False, "error": "time limit 5 s"}))
    (failed / "100-1.hct").write_bytes(good_trace(100))
    # WHEN runs are listed, THEN only the good one is training data; naming the failed one works
    assert list_raw_runs(root) == [RunRef("w", "good")]
    assert list_raw_runs(root, runs=["w/late"]) == [RunRef("w", "late")]
