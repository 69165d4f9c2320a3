"""Where conversion runs: a Dask `distributed` local cluster by default, a scheduler to scale out.

`dask_client(None)` starts one LocalCluster per process the first time it is asked for and keeps
it (starting one costs seconds: a flow converting many runs pays it once); `dask_client(address)`
connects to a running scheduler (`dask scheduler` + workers, Kubernetes, SSH, cloud). Workers
need heapcast importable (the same image or `pip install -e .`), since tasks call its functions.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dask
from distributed import Client, LocalCluster
from distributed.comm.core import CommClosedError

_lock = threading.Lock()
_local: LocalCluster | None = None

# Worker settings of the local cluster. The statistical profiler samples the task thread every
# 10 ms for the dashboard's profile page; local workers have no dashboard (measured: about
# -0.1 CPU-s per 22.5 M-event conversion without it).
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}
CLOSE_TIMEOUT_S = 30  # for the local cluster's close, at most
# For a worker or a client to reach the scheduler as the cluster starts: distributed's default
# (30 s) is not enough on two cores busy with other work (a test suite beside it, a training).
START_TIMEOUT_S = 120
START_CONFIG = {"distributed.comm.timeouts.connect": f"{START_TIMEOUT_S}s"}
# The one line a local worker logs when its heartbeat meets the scheduler closing
# (distributed.worker.Worker.heartbeat: "... heartbeat_worker ... Stream is closed").
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."


class ShutdownHeartbeat(logging.Filter):
    """Drops a local worker's failed heartbeat when the comm was closed. The local scheduler
    lives in the process that started the cluster: it goes away only when that process closes
    the cluster (after its flow finished with success) or dies (which says so itself). Every
    other record, a failed heartbeat for another reason included, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (record.msg == HEARTBEAT_FAILED and isinstance(exc, CommClosedError))


def dask_setup(worker) -> None:
    """distributed's preload hook, run in each local worker as it starts (`preload=` below)."""
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, ShutdownHeartbeat) for f in logger.filters):
        logger.addFilter(ShutdownHeartbeat())


@contextmanager
def _environment_kept() -> Iterator[None]:
    """distributed's nanny sets its pre-spawn environment (`distributed.nanny.pre-spawn-environ`:
    MALLOC_TRIM_THRESHOLD_ and the BLAS thread counts) in the starting process's own os.environ
    for its workers to inherit, and leaves it there: every program this process runs afterwards
    (a replay, an allocator's measured run, the layer) would inherit a glibc trim threshold fixed
    at 64 KiB, which turns glibc's dynamic mmap threshold off and the layer's following with it.
    Those variables are put back as they were once the workers have started."""
    keys = set(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    before = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _local_cluster() -> LocalCluster:
    global _local
    with _lock:
        if _local is None or _local.status.name in ("closed", "closing", "failed"):
            n_workers = int(os.environ.get("HEAPCAST_DASK_WORKERS", os.cpu_count() or 1))
            # One thread per worker process: the per-file work is numpy/Arrow that mostly
            # holds the GIL in between calls, so processes, not threads, use the cores.
            processes = os.environ.get("HEAPCAST_DASK_PROCESSES", "1") != "0"
            # workers take the config they start with
            with dask.config.set({**WORKER_CONFIG, **START_CONFIG}), _environment_kept():
                _local = LocalCluster(
                    n_workers=n_workers,
                    threads_per_worker=1,
                    processes=processes,
                    dashboard_address=None,
                    silence_logs=40,
                    preload=[__name__],  # dask_setup: a quiet shutdown
                )
            atexit.register(_close_at_exit)
        return _local


def _close_at_exit() -> None:
    """At interpreter exit, logging handlers (Prefect's, pytest's) may already be closed, and
    the scheduler's shutdown messages would print tracebacks: close without logging."""

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("distributed", "dask", "tornado", "asyncio"):
            logging.getLogger(name).disabled = True
    logging.raiseExceptions = False  # a handler closed at exit says nothing rather than a traceback
    close_local_cluster()


def close_local_cluster() -> None:
    """Stop the process's local cluster, if one was started, within CLOSE_TIMEOUT_S (its
    workers go first, then the scheduler: SpecCluster.close). Clients are closed by
    dask_client as each use ends."""
    global _local
    with _lock:
        if _local is None:
            return
        cluster, _local = _local, None
        cluster.close(timeout=CLOSE_TIMEOUT_S)


@contextmanager
def dask_client(address: str | None = None) -> Iterator[Client]:
    """A Dask client: to the scheduler at `address`, else to this process's local cluster."""
    if address:
        client = Client(address, set_as_default=False, timeout=START_TIMEOUT_S)
    else:
        client = Client(_local_cluster(), set_as_default=False, timeout=START_TIMEOUT_S)
    try:
        yield client
    finally:
        client.close()
