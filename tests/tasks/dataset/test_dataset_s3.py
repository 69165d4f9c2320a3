"""The same dataset through S3: a moto server on 127.0.0.1, s3fs, the root an s3:// URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.events_reader import EventsChanged, RunParts, committed_name, read_run
from tasks.dataset.partitions import (
    SUMMARY_NAME,
    RunRef,
    convert_run,
    read_events,
    read_summary,
    runs_to_convert,
)
from tasks.report.sources import iter_parts, resolve
from tests.localhost import free_port
from tests.tasks.dataset.test_partitions import good_trace, make_run
from tests.tracegen import synthetic_records, trace_bytes

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_endpoint():
    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.exists() else [shutil.which("moto_server") or "moto_server"]
    port = free_port()
    proc = subprocess.Popen(
        cmd + ["-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"moto_server exited with {proc.returncode}")
                time.sleep(0.1)
        saved = {
            k: os.environ.get(k)
            for k in (
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_DEFAULT_REGION",
                "AWS_ENDPOINT_URL",
            )
        }
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=url,
        )
        yield url
    finally:
        for k, v in locals().get("saved", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client():
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c


def test_round_trip_through_s3_gives_the_same_dataset(tmp_path, s3_endpoint, client):
    import dask.dataframe as dd

    # GIVEN the same raw run on a folder and in a bucket
    local = make_run(tmp_path / "local")
    s3 = Root.from_url("s3://heapcast-test/data")
    s3.fs.mkdir("heapcast-test")
    s3.fs.put(str(tmp_path / "local" / "raw"), "heapcast-test/data/raw", recursive=True)
    run = RunRef("w", "r1")
    assert runs_to_convert(s3) == [run]

    # WHEN both are converted (the S3 one twice)
    want = convert_run(local, run, client=client)
    got = convert_run(s3, run, client=client)
    again = convert_run(s3, run, client=client)

    # THEN the rows, the summary and the skipped files are the same, and nothing is doubled
    key = [("pid", "ascending"), ("time_ns", "ascending"), ("seq", "ascending")]
    expected = read_events(local).sort_by(key)
    assert read_events(s3).sort_by(key).equals(expected)
    assert got["rows"] == again["rows"] == want["rows"]
    assert [s["file"] for s in got["skipped"]] == [s["file"] for s in want["skipped"]]
    assert got["token_hist"] == want["token_hist"]
    assert runs_to_convert(s3) == []
    s3.fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[1] for p in s3.fs.ls(s3.events_run("w", "r1")))
    # each raw file's part once, under the name its commit gave it (listed by the summary)
    commit = read_summary(s3, run)["commit"]
    parts = [committed_name(f"part-{s}.parquet", commit) for s in ("100-1", "200-1", "500-1")]
    assert names == [SUMMARY_NAME, *parts]
    assert read_summary(s3, run)["parts"] == parts
    assert not s3.fs.exists(s3.join("events", "_staging", "w", "r1"))
    ddf = dd.read_parquet(s3.url_of("events"), storage_options=s3.storage_options)
    assert len(ddf) == want["rows"]


def _raw_version(base, records: dict[str, bytes]) -> str:
    """A raw run folder on disk holding `records` ({file name: bytes}); its path."""
    d = base / "raw"
    d.mkdir(parents=True)
    for name, data in records.items():
        (d / name).write_bytes(data)
    return str(d)


def test_a_reader_racing_s3_commits_never_sees_old_and_new_parts_mixed(
    tmp_path, s3_endpoint, client, monkeypatch
):
    # GIVEN a run on S3 whose raw traces alternate between two versions that give every
    # process different rows, and an object store slow enough that a commit takes a while
    version_a = _raw_version(
        tmp_path / "a",
        {
            "100-1.hct": good_trace(100),
            "200-1.hct": trace_bytes(synthetic_records(3000, threads=2), pid=200),
        },
    )
    version_b = _raw_version(
        tmp_path / "b",
        {
            "100-1.hct": trace_bytes(synthetic_records(2000, threads=1), pid=100),
            "200-1.hct": good_trace(200),
            "600-1.hct": good_trace(600),
        },
    )
    s3 = Root.from_url("s3://heapcast-race/data")
    fs = s3.fs
    fs.mkdir("heapcast-race")
    raw = s3.raw_run("w", "r1")
    run = RunRef("w", "r1")

    def convert(version: str) -> dict[str, int]:
        if fs.exists(raw):
            fs.rm(raw, recursive=True)
        fs.put(version + "/", raw + "/", recursive=True)
        fs.invalidate_cache()
        convert_run(s3, run, client=client)
        return _rows_per_pid(read_run(s3, "w", "r1", columns=["pid"]))

    want_a = convert(version_a)
    want_b = convert(version_b)
    assert want_a != want_b and set(want_a) != set(want_b)

    def slow(method):
        def call(*args, **kwargs):
            time.sleep(0.1)
            return method(*args, **kwargs)

        return call

    for name in ("copy", "rm_file", "pipe_file"):
        monkeypatch.setattr(fs, name, slow(getattr(fs, name)))

    # WHEN a reader reads the run over and over while it is committed four more times
    seen: list[dict[str, int]] = []
    changed: list[str] = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(_rows_per_pid(read_run(s3, "w", "r1", columns=["pid"])))
            except EventsChanged as err:  # two commits in a row under one reader: said
                changed.append(str(err))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for version in (version_a, version_b, version_a, version_b):
            convert(version)
    finally:
        stop.set()
        t.join()

    # THEN every read saw one commit's parts: all of version a's, or all of version b's
    mixed = [s for s in seen if s not in (want_a, want_b)]
    assert not mixed, f"{len(mixed)} of {len(seen)} reads mixed two commits, e.g. {mixed[0]}"
    assert want_a in seen and want_b in seen
    assert len(changed) <= len(seen) // 4
    # AND the stale parts are gone: the folder holds the summary and the listed parts only
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(s3.events_run("w", "r1")))
    with RunParts.of_run(s3, "w", "r1") as parts:
        assert names == sorted([SUMMARY_NAME, *parts.names])
        assert len(parts.names) == 3


def _rows_per_pid(table) -> dict[str, int]:
    pids, counts = np.unique(table.column("pid").to_numpy(), return_counts=True)
    return {str(p): int(c) for p, c in zip(pids, counts)}


def test_a_report_of_an_s3_run_reads_the_parts_its_summary_commits(tmp_path, s3_endpoint, client):
    # GIVEN a run converted on S3, and a part a killed commit left beside its parts
    make_run(tmp_path / "local", bad=False)
    s3 = Root.from_url("s3://heapcast-report/data")
    s3.fs.mkdir("heapcast-report")
    s3.fs.put(str(tmp_path / "local" / "raw"), "heapcast-report/data/raw", recursive=True)
    summary = convert_run(s3, RunRef("w", "r1"), client=client)
    folder = s3.events_run("w", "r1")
    stray = committed_name("part-200-1.parquet", "0123456789abcdef")
    s3.fs.copy(f"{folder}/{summary['parts'][1]}", f"{folder}/{stray}")
    # WHEN a report resolves and reads it by name
    run = resolve("w/r1", root=s3)
    rows = sum(b.num_rows for part in iter_parts(run) for b in part.batches)
    # THEN it read the committed parts, each once
    assert run.kind == "events" and not run.warnings
    assert [f.rsplit("/", 1)[1] for f in run.files] == summary["parts"]
    assert rows == summary["rows"]


def test_a_stack_run_through_s3_commits_its_stacks_table_with_its_events(
    tmp_path, s3_endpoint, client
):
    from tasks.dataset.events_reader import read_stack_frames, read_stacks
    from tests.tasks.dataset.test_stacks_table import PROG, stack_trace

    # GIVEN a run of two stack traces in a bucket, its program in the run's sysroot
    raw = tmp_path / "raw" / "w" / "st"
    raw.mkdir(parents=True)
    for pid in (100, 200):
        (raw / f"{pid}-1.hct").write_bytes(stack_trace(pid))
    (raw / "sysroot" / PROG.lstrip("/")).parent.mkdir(parents=True)
    shutil.copy(sys.executable, raw / "sysroot" / PROG.lstrip("/"))
    s3 = Root.from_url("s3://heapcast-stacks/data")
    s3.fs.mkdir("heapcast-stacks")
    s3.fs.put(str(tmp_path / "raw"), "heapcast-stacks/data/raw", recursive=True)
    run = RunRef("w", "st")
    # WHEN it is converted twice
    convert_run(s3, run, client=client)
    summary = convert_run(s3, run, client=client)
    # THEN the stacks table is the commit's (named with it), the previous one is gone, and the
    # events join it
    name = committed_name("_stacks.parquet", summary["commit"])
    assert summary["stacks"]["file"] == name
    assert summary["stacks"]["sysroot"] == "s3://heapcast-stacks/data/raw/w/st/sysroot"
    s3.fs.invalidate_cache()
    stacks_files = [p for p in s3.fs.ls(s3.events_run("w", "st")) if "_stacks" in p]
    assert [p.rsplit("/", 1)[1] for p in stacks_files] == [name]
    stacks = read_stacks(s3, "w", "st")
    assert stacks.num_rows == 3 + 3 + 1 + 2
    # (named from the sysroot's copy, fetched from the bucket: the module is on no host)
    assert summary["stacks"]["named"] == 4 and "" not in stacks.column("function").to_pylist()[:3]
    ev = read_run(s3, "w", "st", ["stack"])
    assert (read_stack_frames(s3, "w", "st").matrix(ev["stack"])[:, 0] >= 0).sum() == 16
