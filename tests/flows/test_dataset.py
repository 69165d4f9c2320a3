"""Flow `dataset`: converts runs without up-to-date events, publishes a summary per run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.dataset import DatasetParams, dataset
from tasks.core.storage import Root
from tasks.dataset.dask_cluster import close_local_cluster
from tasks.dataset.partitions import RunRef, read_events, read_summary
from tests.tasks.dataset.test_partitions import make_run

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def test_flow_converts_new_runs_once_and_on_force(tmp_path, prefect_harness, monkeypatch):
    monkeypatch.setenv("HEAPCAST_DASK_PROCESSES", "0")
    monkeypatch.setenv("HEAPCAST_DASK_WORKERS", "1")
    make_run(tmp_path, "w", "r1")
    make_run(tmp_path, "v", "r2", bad=False)
    params = DatasetParams(root=str(tmp_path))

    first = dataset(params)
    assert sorted((s["workload"], s["run"]) for s in first) == [("v", "r2"), ("w", "r1")]
    assert read_events(Root.from_url(str(tmp_path))).num_rows == sum(s["rows"] for s in first)
    assert dataset(params) == []  # up to date: nothing to do
    forced = dataset(DatasetParams(root=str(tmp_path), runs=["w/r1"], force=True))
    assert [(s["workload"], s["run"]) for s in forced] == [("w", "r1")]

    from prefect.artifacts import Artifact

    artifact = Artifact.get("events-w-r1")
    assert artifact is not None and "Skipped files" in artifact.data
    close_local_cluster()  # before pytest closes the streams its workers log to


def test_params_are_strict():
    with pytest.raises(ValidationError, match="sheduler"):
        DatasetParams(root="x", sheduler="tcp://x:8786")


def test_one_run_that_fails_does_not_stop_the_others(tmp_path, prefect_harness, monkeypatch):
    # GIVEN two runs, and a fault injected into the conversion of one (as a full disk would)
    monkeypatch.setenv("HEAPCAST_DASK_PROCESSES", "0")
    monkeypatch.setenv("HEAPCAST_DASK_WORKERS", "1")
    root = make_run(tmp_path, workload="w", run="good", bad=False)
    make_run(tmp_path, workload="w", run="broken", bad=False)
    import tasks.dataset.partitions as ds

    real = ds.convert_run

    def convert_run(root_, run, *a, **k):
        if run.run == "broken":
            raise OSError("disk full while writing the partition")
        return real(root_, run, *a, **k)

    monkeypatch.setattr("flows.dataset.convert_run", convert_run)
    # WHEN the flow runs, THEN it fails naming the broken run, and the good one is converted
    from tasks.dataset.partitions import ConversionFailed

    with pytest.raises(ConversionFailed, match=r"w/broken: OSError: disk full"):
        dataset(DatasetParams(root=root.url))
    assert read_summary(root, RunRef("w", "good"))["rows"] > 0
    assert read_summary(root, RunRef("w", "broken")) is None


def test_scheduler_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("HEAPCAST_DASK_SCHEDULER", "tcp://10.0.0.5:8786")
    assert DatasetParams().scheduler == "tcp://10.0.0.5:8786"
    monkeypatch.delenv("HEAPCAST_DASK_SCHEDULER")
    assert DatasetParams().scheduler is None
