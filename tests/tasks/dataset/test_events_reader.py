"""tasks.dataset.events_reader: the one reader of the events dataset, on a folder (the S3 commit
race is in test_dataset_s3.py)."""

from __future__ import annotations

import json
import os
import shutil
import threading

import dask
import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.dask_cluster import START_CONFIG, START_TIMEOUT_S
from tasks.dataset.events_reader import (
    SUMMARY_NAME,
    EventsChanged,
    EventsNotFound,
    EventsReadError,
    RunParts,
    committed_name,
    iter_batches,
    list_runs,
    read_run,
    read_stack_frames,
    read_stacks,
)
from tasks.dataset.events_schema import EVENTS_SCHEMA, STACKS_SCHEMA
from tasks.dataset.partitions import RunRef, _exchange, convert_run
from tasks.dataset.synthetic_events import events_table
from tests.tasks.dataset.test_partitions import good_trace
from tests.tracegen import synthetic_records, trace_bytes


def _tokens(n: int, start: int) -> np.ndarray:
    return (np.arange(n) % 20 + start).astype(np.uint8)


def _write_run(root: Root, workload: str, run: str, parts: dict[str, object], summary=None):
    path = root.events_run(workload, run)
    root.fs.makedirs(path, exist_ok=True)
    for name, table in parts.items():
        pq.write_table(table, f"{path}/{name}")
    if summary is not None:
        root.fs.pipe_file(f"{path}/{SUMMARY_NAME}", json.dumps(summary).encode())
    return path


@pytest.fixture
def root(tmp_path) -> Root:
    root = Root.from_url(str(tmp_path))
    # GIVEN a converted run of two processes (parts named after their raw files) whose summary
    # lists them, a stray Parquet file the summary does not list, and a hand-made run
    _write_run(
        root,
        "w",
        "r1",
        {
            "part-200-1.parquet": events_table([_tokens(7, 1), _tokens(3, 30)], pid=200),
            "part-100-1.parquet": events_table([_tokens(5, 2)], pid=100),
            "part-999-1.parquet": events_table([_tokens(50, 3)], pid=999),
        },
        summary={"rows": 15, "parts": ["part-100-1.parquet", "part-200-1.parquet"]},
    )
    _write_run(root, "w", "r0", {"part-0.parquet": events_table([_tokens(4, 5)], pid=7)})
    return root


def test_read_run_gives_the_chosen_columns_in_call_order(root):
    # WHEN one run is read with chosen columns and the part number
    t = read_run(root, "w", "r1", ["pid", "seq", "token"], part_column="image")
    # THEN those columns come, typed as EVENTS_SCHEMA, the listed parts in name order (pid 100
    # before 200), each part's rows as written; the unlisted part is not read
    assert t.column_names == ["pid", "seq", "token", "image"]
    assert t.schema.field("seq").type == EVENTS_SCHEMA.field("seq").type
    assert t.column("pid").to_pylist() == [100] * 5 + [200] * 10
    assert t.column("image").to_pylist() == [0] * 5 + [1] * 10
    assert t.column("seq").to_pylist() == list(range(5)) + list(range(7)) + list(range(3))
    want = np.concatenate([_tokens(5, 2), _tokens(7, 1), _tokens(3, 30)])
    assert t.column("token").to_numpy().tolist() == want.tolist()
    # AND every column by default
    assert read_run(root, "w", "r1").column_names == EVENTS_SCHEMA.names


def test_a_part_written_before_a_column_existed_reads_it_as_nulls(tmp_path):
    root = Root.from_url(str(tmp_path))
    old = events_table([_tokens(4, 1)], pid=3).drop_columns(["caller_module", "caller_offset"])
    _write_run(root, "w", "old", {"part-3-1.parquet": old})
    t = read_run(root, "w", "old", ["pid", "caller_module"])
    assert t.column("caller_module").null_count == 4
    assert t.schema.field("caller_module").type == EVENTS_SCHEMA.field("caller_module").type


def test_a_dataset_from_before_stacks_reads_without_them(tmp_path):
    # GIVEN a run converted before the stack column and the stacks table existed
    root = Root.from_url(str(tmp_path))
    old = events_table([_tokens(4, 1)], pid=3).drop_columns(["stack"])
    _write_run(root, "w", "old", {"part-3-1.parquet": old}, summary={"parts": ["part-3-1.parquet"]})
    # THEN its events read with a null stack, and its stacks table is empty
    t = read_run(root, "w", "old", ["pid", "stack"])
    assert t.column("stack").null_count == 4
    assert t.schema.field("stack").type == EVENTS_SCHEMA.field("stack").type
    stacks = read_stacks(root, "w", "old")
    assert stacks.num_rows == 0 and stacks.schema.equals(STACKS_SCHEMA)
    # AND every event joins no frame
    assert read_stack_frames(root, "w", "old").matrix(t.column("stack")).shape == (4, 0)


def test_an_unreadable_stacks_table_is_named(root):
    path = root.events_run("w", "r1")
    root.fs.pipe_file(f"{path}/_stacks.parquet", b"not parquet")
    summary = json.loads(root.fs.cat_file(f"{path}/{SUMMARY_NAME}"))
    summary["stacks"] = {"file": "_stacks.parquet"}
    root.fs.pipe_file(f"{path}/{SUMMARY_NAME}", json.dumps(summary).encode())
    with pytest.raises(EventsReadError, match=r"run=r1/_stacks.parquet: not a readable stacks"):
        read_stacks(root, "w", "r1")


def test_batches_cover_the_run_in_the_same_order(root):
    # WHEN the run is read in batches of at most 4 rows
    batches = list(iter_batches(root, "w", "r1", ["pid", "seq"], batch_rows=4))
    # THEN no batch is larger, and together they are the run as read at once
    assert max(b.num_rows for b in batches) <= 4
    whole = read_run(root, "w", "r1", ["pid", "seq"])
    got = [b.column("seq").to_pylist() for b in batches]
    assert sum(got, []) == whole.column("seq").to_pylist()
    assert sum((b.column("pid").to_pylist() for b in batches), []) == whole["pid"].to_pylist()


def test_runs_listed_with_their_summaries(root):
    runs = list_runs(root)
    assert [str(r) for r in runs] == ["w/r0", "w/r1"]
    assert runs[0].summary is None and runs[1].summary["rows"] == 15
    assert list_runs(root, ["other"]) == []


def test_a_missing_run_is_a_clear_error(root):
    with pytest.raises(EventsNotFound) as err:
        read_run(root, "w", "r9")
    msg = str(err.value)
    assert "w/r9" in msg and "run=r9" in msg  # names the run and where it looked
    assert "w/r0, w/r1" in msg and "dataset flow" in msg  # what there is, what to do
    with pytest.raises(EventsNotFound, match="w/r9"):
        next(iter_batches(root, "w", "r9"))


def test_an_unreadable_part_is_named(root):
    path = root.events_run("w", "r1")
    (root.fs.open(f"{path}/part-200-1.parquet", "wb")).write(b"PAR1 garbage")
    with pytest.raises(EventsReadError, match=r"run=r1/part-200-1\.parquet.*convert the run"):
        read_run(root, "w", "r1")


def test_without_a_manifest_a_commit_in_progress_is_not_read(root):
    # GIVEN a run converted before the manifest existed (no parts list) into which an
    # object-store commit is copying its tagged parts
    path = _write_run(
        root,
        "w",
        "legacy",
        {
            "part-1-1.parquet": events_table([_tokens(3, 1)], pid=1),
            committed_name("part-1-1.parquet", "0123456789abcdef"): events_table(
                [_tokens(9, 1)], pid=1
            ),
        },
        summary={"rows": 3},
    )
    # THEN the reader reads the committed part only
    assert read_run(root, "w", "legacy", ["pid"]).num_rows == 3
    assert RunParts.of_run(root, "w", "legacy").names == ["part-1-1.parquet"]
    assert path.endswith("run=legacy")


def test_a_local_reader_keeps_its_folder_across_a_commit(root, tmp_path):
    # GIVEN a reader that resolved run r1's parts, then a commit that swaps a new folder in
    # (same part names, other rows) and deletes the old one, as partitions._commit does
    final = root.events_run("w", "r1")
    staged = str(tmp_path / "staged")
    root.fs.makedirs(staged)
    pq.write_table(events_table([_tokens(2, 1)], pid=100), f"{staged}/part-100-1.parquet")
    pq.write_table(events_table([_tokens(2, 1)], pid=200), f"{staged}/part-200-1.parquet")
    root.fs.pipe_file(
        f"{staged}/{SUMMARY_NAME}",
        json.dumps({"parts": ["part-100-1.parquet", "part-200-1.parquet"]}).encode(),
    )
    parts = RunParts.of_run(root, "w", "r1")
    old = staged  # where the old partition is after the swap
    if not _exchange(staged, final):  # the commit's fallback: two renames
        old = str(tmp_path / "old")
        os.rename(final, old)
        os.rename(staged, final)
    # WHEN it reads its parts after the swap
    with parts:
        rows = [parts.open(i).metadata.num_rows for i in range(len(parts.names))]
    # THEN it read the folder it started in, whole (5 + 10 rows), not the new one (2 + 2)
    assert rows == [5, 10]
    # AND once the old folder is deleted, a new read is the new commit
    shutil.rmtree(old)
    assert read_run(root, "w", "r1", ["pid"]).num_rows == 4


def test_a_part_gone_twice_says_the_run_is_being_converted(root, monkeypatch):
    # GIVEN a summary whose parts are deleted under every reader (a commit after each read)
    paths = RunParts.paths
    monkeypatch.setattr(RunParts, "paths", lambda self: [p + ".gone" for p in paths(self)])
    # THEN a read says so, once it has read again through the summary
    with pytest.raises(EventsChanged, match=r"w/r1.*converted again.*read it again"):
        read_run(root, "w", "r1")
    with pytest.raises(EventsChanged, match=r"w/r1"):
        list(iter_batches(root, "w", "r1"))


def test_a_part_gone_once_is_read_again_through_the_new_summary(root, monkeypatch):
    # GIVEN a commit that deletes the parts of the summary a reader resolved first
    resolved = []
    paths = RunParts.paths

    def first_gone(self):
        resolved.append(self)
        gone = ".gone" if resolved[0] is self else ""
        return [p + gone for p in paths(self)]

    monkeypatch.setattr(RunParts, "paths", first_gone)
    # THEN the read resolves the run again and reads the new parts whole
    assert read_run(root, "w", "r1", ["pid"]).num_rows == 15
    assert len({id(p) for p in resolved}) == 2


def test_a_reader_racing_local_commits_never_sees_old_and_new_parts_mixed(tmp_path):
    # GIVEN a run on a folder whose raw traces alternate between two versions that give every
    # process different rows
    root = Root.from_url(str(tmp_path / "data"))
    raw = tmp_path / "data" / "raw" / "w" / "r1"
    versions = {
        "a": {"100-1.hct": good_trace(100), "200-1.hct": _synthetic(200, 3000)},
        "b": {"100-1.hct": _synthetic(100, 2000), "200-1.hct": good_trace(200)},
    }

    def convert(client, version: str) -> None:
        shutil.rmtree(raw, ignore_errors=True)
        raw.mkdir(parents=True)
        for name, data in versions[version].items():
            (raw / name).write_bytes(data)
        convert_run(root, RunRef("w", "r1"), client=client)

    def rows_per_pid() -> dict[int, int]:
        pids, counts = np.unique(read_run(root, "w", "r1", ["pid"])["pid"], return_counts=True)
        return dict(zip(pids.tolist(), counts.tolist()))

    local = {"processes": False, "n_workers": 1, "threads_per_worker": 1, "dashboard_address": None}
    with dask.config.set(START_CONFIG), Client(**local, timeout=START_TIMEOUT_S) as c:
        convert(c, "a")
        want_a = rows_per_pid()
        convert(c, "b")
        want_b = rows_per_pid()
        # WHEN a reader reads the run over and over while it is committed six more times
        seen: list[dict[int, int]] = []
        stop = threading.Event()

        def reader():
            while not stop.is_set():
                seen.append(rows_per_pid())

        t = threading.Thread(target=reader)
        t.start()
        try:
            for version in "ababab":
                convert(c, version)
        finally:
            stop.set()
            t.join()
    # THEN every read saw one commit's parts whole
    assert want_a != want_b
    mixed = [s for s in seen if s not in (want_a, want_b)]
    assert not mixed, f"{len(mixed)} of {len(seen)} reads mixed two commits, e.g. {mixed[0]}"
    assert len(seen) > 6


def _synthetic(pid: int, n: int) -> bytes:
    return trace_bytes(synthetic_records(n, threads=1), pid=pid)
