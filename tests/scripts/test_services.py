"""scripts/services.sh against real processes: up on free ports, status, URLs answer, down.

GIVEN free ports and a services folder of its own (nothing of the user's is touched)
WHEN  `services.sh up` starts the Prefect server, pool and worker, MLflow and Dask
THEN  `status` reports each one up, their URLs answer, the printed exports name them,
AND   `down` stops every recorded pid.

The container engine is left out (HEAPCAST_SERVICES): its own script has its own test, and the
deployments too (HEAPCAST_DEPLOY=0): tests/integration/test_prefect_deployment.py deploys.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.localhost import alive, free_ports

pytestmark = pytest.mark.integration

PROJECT_DIR = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT_DIR / "scripts" / "services.sh"
NAMES = ("prefect-server", "prefect-worker", "mlflow", "dask-scheduler", "dask-worker")


def run(env: dict, cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), cmd], env=env, text=True, capture_output=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def test_up_status_down(tmp_path):
    prefect_port, mlflow_port, dask_port, dash_port = free_ports(4)
    svc = tmp_path / "services"
    env = {
        **os.environ,
        "HEAPCAST_SERVICES_DIR": str(svc),
        "HEAPCAST_SERVICES": "prefect mlflow dask",
        "HEAPCAST_DEPLOY": "0",
        "HEAPCAST_PREFECT_PORT": str(prefect_port),
        "HEAPCAST_MLFLOW_PORT": str(mlflow_port),
        "HEAPCAST_DASK_PORT": str(dask_port),
        "HEAPCAST_DASK_DASHBOARD_PORT": str(dash_port),
        "HEAPCAST_DASK_WORKERS": "1",
        "HEAPCAST_ROOT": str(tmp_path / "data"),  # MLflow serves <root>/mlflow
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
    }
    try:
        up = run(env, "up")
        assert up.returncode == 0, up.stderr
        assert f"export PREFECT_API_URL=http://127.0.0.1:{prefect_port}/api" in up.stdout
        assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{mlflow_port}" in up.stdout
        assert f"export HEAPCAST_DASK_SCHEDULER=tcp://127.0.0.1:{dask_port}" in up.stdout
        assert f"http://127.0.0.1:{prefect_port}" in up.stderr  # the URLs are printed

        status = run(env, "status")
        assert status.returncode == 0, status.stderr
        for name in NAMES:
            assert any(line.split()[:2] == [name, "up"] for line in status.stderr.splitlines()), (
                status.stderr
            )

        assert answers(f"http://127.0.0.1:{prefect_port}/api/health")
        assert answers(f"http://127.0.0.1:{mlflow_port}/health")
        assert answers(f"http://127.0.0.1:{dash_port}/health")

        # `up` again is a no-op on what runs
        again = run(env, "up")
        assert again.returncode == 0, again.stderr
        assert "prefect-server already running" in again.stderr

        pids = {n: int((svc / f"{n}.pid").read_text()) for n in NAMES}
    finally:
        down = run(env, "down")
    assert down.returncode == 0, down.stderr
    assert not [n for n, pid in pids.items() if alive(pid)]
    assert not list(svc.glob("*.pid"))
    status = run(env, "status")
    assert status.returncode != 0
    assert not answers(f"http://127.0.0.1:{prefect_port}/api/health")
