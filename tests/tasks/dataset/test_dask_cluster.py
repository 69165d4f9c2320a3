"""The local Dask cluster ends quietly (tasks/dataset/dask_cluster.py).

GIVEN a conversion on the local cluster with worker processes, in a process of its own
WHEN  the process ends (the cluster is closed at exit)
THEN  it exits 0 with no traceback on stderr; and a local worker's heartbeat that meets the
      closed scheduler ("heartbeat_worker ... Stream is closed") logs nothing, while a heartbeat
      failing for another reason, and the worker's other errors, are still logged.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from distributed.comm.core import CommClosedError

from tasks.core.config import PROJECT_DIR
from tasks.dataset import dask_cluster

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

CHILD = """
import os
from pathlib import Path
from tests.tasks.dataset.test_partitions import make_run
from tasks.dataset.partitions import RunRef, convert_run

if __name__ == "__main__":  # worker processes start by spawn: they import this file
    for i in range(3):
        root = make_run(Path({tmp!r}), "w", f"r{{i}}", bad=False)
        print(convert_run(root, RunRef("w", f"r{{i}}"))["rows"], flush=True)
    # what a program this process runs next inherits (a replay, an allocator's run, the layer)
    print("trim", os.environ.get("MALLOC_TRIM_THRESHOLD_"), flush=True)
    print("converted", flush=True)
"""


def test_a_conversion_on_worker_processes_ends_without_a_traceback_or_a_changed_environment(
    tmp_path,
):
    script = tmp_path / "convert_three.py"
    script.write_text(CHILD.format(tmp=str(tmp_path / "root")))
    env = {
        "HEAPCAST_DASK_WORKERS": "2",
        "HEAPCAST_DASK_PROCESSES": "1",
        "PYTHONPATH": str(PROJECT_DIR),
    }
    mine = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=PROJECT_DIR,
        env={**mine, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "converted"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    # the cluster's workers got distributed's trim threshold; the process that started them
    # keeps its own environment (a fixed threshold turns the layer's following off)
    assert "trim None" in out.stdout.splitlines(), out.stdout


@pytest.fixture
def worker_log():
    """What distributed.worker logs, once a local worker's setup (dask_setup) ran."""
    logger = logging.getLogger("distributed.worker")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    saved = list(logger.filters)
    dask_cluster.dask_setup(worker=None)
    try:
        yield logger, records
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved


def log_heartbeat_failure(logger: logging.Logger, err: Exception) -> None:
    try:
        raise err
    except OSError:  # as distributed.worker.Worker.heartbeat does
        logger.exception("Failed to communicate with scheduler during heartbeat.")


def test_a_heartbeat_meeting_the_closed_scheduler_is_not_logged(worker_log):
    logger, records = worker_log
    log_heartbeat_failure(
        logger, CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker")
    )
    assert records == []


def test_other_worker_errors_are_still_logged(worker_log):
    logger, records = worker_log
    log_heartbeat_failure(logger, ConnectionRefusedError("scheduler unreachable"))
    try:
        raise CommClosedError("Stream is closed")
    except CommClosedError:
        logger.exception("Failed to send data to the scheduler")
    assert [r.getMessage() for r in records] == [
        "Failed to communicate with scheduler during heartbeat.",
        "Failed to send data to the scheduler",
    ]
