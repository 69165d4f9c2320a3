"""The same dataset through S3: a moto server on 127.0.0.1, s3fs, the root an s3:// URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.partitions import SUMMARY_NAME, RunRef, convert_run, read_events, runs_to_convert
from tests.localhost import free_port
from tests.tasks.dataset.test_partitions import make_run


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
    assert names == [SUMMARY_NAME, "part-100-1.parquet", "part-200-1.parquet", "part-500-1.parquet"]
    assert not s3.fs.exists(s3.join("events", "_staging", "w", "r1"))
    ddf = dd.read_parquet(s3.url_of("events"), storage_options=s3.storage_options)
    assert len(ddf) == want["rows"]
