"""prefect.yaml against a real Prefect server and worker: deploy, run the quick nightly, schedule.

GIVEN a `prefect server start` on a free port (its own PREFECT_HOME), the `heapcast` process pool,
      every deployment of prefect.yaml, and a `prefect worker start --pool heapcast`
WHEN  `prefect deployment run nightly/nightly` runs a tiny quick night (one quick workload, as
      tests/flows/test_nightly.py's, and a training of a few steps) into a temporary data root
THEN  the flow run ends Completed with every stage completed, the registry there has a
      `champion`, the summary page names the replays, conversions, evaluation, heap reports and
      what-if figures (as the night ran in-process did before: tests/flows/test_nightly.py
      keeps the night's failures), and the nightly schedule has upcoming scheduled runs.

What the whole quick night (every quick workload, configs/train-quick.yaml untouched) learns is
`make run`'s to show; here the deployment's path is what is tested, on the smallest night.

No wall-clock limits: every wait is a bounded number of polls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.flow_harness import TINY_TRAINING
from tests.localhost import free_port

pytestmark = pytest.mark.integration

PROJECT_DIR = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
POOL = "heapcast"
POLL_S = 2


def api(url: str, path: str, body: dict | None = None):
    import httpx

    if body is None:
        r = httpx.get(url + path, timeout=30)
    else:
        r = httpx.post(url + path, json=body, timeout=30)
    r.raise_for_status()
    return r.json()


def poll(check, polls: int, what: str):
    """Call `check` until it returns a truthy value, at most `polls` times."""
    for _ in range(polls):
        value = check()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"gave up waiting for {what} after {polls} polls")


def prefect(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PREFECT, *args], cwd=PROJECT_DIR, env=env, text=True, capture_output=True
    )


def stop(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def prefect_services(tmp_path_factory):
    """A real Prefect server and worker, with prefect.yaml deployed; yields (api_url, env, root)."""
    tmp = tmp_path_factory.mktemp("prefect-deploy")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    root = tmp / "data"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "PREFECT_API_URL": url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        "PREFECT_LOGGING_LEVEL": "INFO",
        # Flow runs inherit the worker's environment: the data root and the embedded MLflow
        # store under it, a small local Dask cluster.
        "HEAPCAST_ROOT": str(root),
        "HEAPCAST_DASK_WORKERS": "1",
    }
    for var in ("MLFLOW_TRACKING_URI", "HEAPCAST_DASK_SCHEDULER"):
        env.pop(var, None)
    server_log = open(tmp / "server.log", "w")
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = None
    try:
        t0 = time.monotonic()
        poll(lambda: _healthy(url) or _dead(server, tmp / "server.log"), 300, "the server")
        print(f"prefect server answered after {time.monotonic() - t0:.0f} s")

        out = prefect(env, "work-pool", "create", POOL, "--type", "process")
        assert out.returncode == 0 or "already exists" in out.stdout + out.stderr, out
        out = prefect(env, "--no-prompt", "deploy", "--all")
        assert out.returncode == 0, out.stdout + out.stderr

        worker_log = open(tmp / "worker.log", "w")
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", POOL],
            cwd=PROJECT_DIR,
            env=env,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        t0 = time.monotonic()
        poll(lambda: _worker_online(url) or _dead(worker, tmp / "worker.log"), 300, "the worker")
        print(f"prefect worker online after {time.monotonic() - t0:.0f} s")
        yield url, env, root
    finally:
        if worker is not None:
            stop(worker, signal.SIGINT)  # Prefect workers stop on SIGINT
        stop(server, signal.SIGTERM)
        for log in ("worker.log", "server.log"):
            if (tmp / log).exists():
                print(
                    f"--- last lines of {log}:\n"
                    + "\n".join((tmp / log).read_text(errors="replace").splitlines()[-40:])
                )


def _healthy(url: str) -> bool:
    try:
        return api(url, "/health") is True
    except Exception:
        return False


def _worker_online(url: str) -> bool:
    try:
        workers = api(url, f"/work_pools/{POOL}/workers/filter", {})
    except Exception:
        return False
    return any(w.get("status") == "ONLINE" for w in workers)


def _dead(proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    return False


def _deployment_id(url: str, name: str) -> str:
    return api(url, f"/deployments/name/{name}/{name}")["id"]


def test_deployments_and_schedule(prefect_services):
    url, env, _ = prefect_services
    names = {d["name"] for d in api(url, "/deployments/filter", {})}
    assert {"trace", "dataset", "train", "nightly", "allocators"} <= names

    weekly = api(url, "/deployments/name/allocators/allocators")
    assert [s["schedule"].get("cron") for s in weekly["schedules"]] == ["0 4 * * 0"], weekly

    nightly = api(url, "/deployments/name/nightly/nightly")
    crons = [s["schedule"].get("cron") for s in nightly["schedules"]]
    assert "0 2 * * *" in crons, nightly["schedules"]

    def scheduled():
        runs = api(
            url,
            "/flow_runs/filter",
            {
                "deployments": {"id": {"any_": [nightly["id"]]}},
                "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
            },
        )
        return [r for r in runs if r["state"]["name"] == "Scheduled"]

    upcoming = poll(scheduled, 60, "scheduled nightly runs")
    times = sorted(r["expected_start_time"] for r in upcoming)
    assert all(re.search(r"T02:00:00", t) for t in times), times


def test_quick_nightly_run_registers_a_champion(prefect_services):
    url, env, root = prefect_services
    # the quick night on one quick workload (its two inputs replayed for real) with a training
    # of a few steps: the deployment, the worker, the parameters' path through the server and
    # every stage are the night's; what the whole quick night learns is `make run`'s to show
    params = {
        "params": {
            "quick": True,
            "trace": {"workloads": ["sqlite3"], "runner": "local", "max_parallel": 2},
            "train": {"overrides": TINY_TRAINING},
        }
    }
    out = prefect(env, "deployment", "run", "nightly/nightly", "--params", json.dumps(params))
    assert out.returncode == 0, out.stdout + out.stderr
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out.stdout).group(1)

    t0 = time.monotonic()
    final = poll(lambda: _final_state(url, flow_run_id), 3000, "the nightly flow run")
    print(f"tiny quick nightly through the worker: {time.monotonic() - t0:.0f} s, {final['type']}")
    assert final["type"] == "COMPLETED", final

    from mlflow import MlflowClient

    db = root / "mlflow" / "mlflow.db"
    assert db.exists(), f"no embedded MLflow store at {db}"
    client = MlflowClient(f"sqlite:///{db}", f"sqlite:///{db}")
    champion = client.get_model_version_by_alias("heapcast-next-call", "champion")
    assert champion.version

    artifacts = api(url, "/artifacts/filter", {"artifacts": {"key": {"any_": ["nightly-summary"]}}})
    assert artifacts and "heapcast nightly" in artifacts[0]["data"]
    page = artifacts[0]["data"]
    # a night that completes may still have failed a stage (it goes on without it): none did
    assert "4 of 4 stages completed" in page, page
    for stage in ("trace", "dataset", "train", "whatif"):
        assert f"| {stage} | ok |" in page, page
    # the summary says what ran: both replays, both conversions, the evaluation
    assert "2 of 2 replays ok" in page and "2 run(s) converted: sqlite3/medium" in page
    assert "ngram top-1" in page
    # the first model in a fresh registry takes the alias
    assert "**The champion changed**: version (none) → version 1." in page
    # a heap report per evaluation run of the model (not the training run), under the root
    assert "## Heap reports (evaluation runs)" in page
    reports = re.findall(r"`(/[^`]+\.html)`", page)
    assert reports and all(
        Path(r).is_file() and r.startswith(str(root / "reports")) for r in reports
    )
    assert len(reports) < 2  # of the 2 runs, not the training run
    # what the predictions bought: per workload at the whatif budget, guided by tonight's model
    assert "## What the predictions bought (whatif, at 64.00 KiB held idle)" in page
    assert "All workloads, by idle budget" in page
    assert re.search(r"\n\| all \| \w+ 0\.\d+ \| 0\.\d+ \|", page), page
    # the summary is kept under the data root too
    (kept,) = (root / "nightly").glob("*.md")
    assert "4 of 4 stages completed" in kept.read_text()
    # the model's run stays readable: at most 60 metrics once the seeds stage (not in this
    # night) adds its headline figures per case; its other figures go to a table
    from tasks.allocators.seeds import HEADLINE_PAIRS

    run = client.get_run(champion.run_id)
    seed_cases = 3  # configs/allocators.yaml's seeds.workloads
    assert len(run.data.metrics) + seed_cases * len(HEADLINE_PAIRS) <= 60, sorted(run.data.metrics)


def _final_state(url: str, flow_run_id: str):
    state = api(url, f"/flow_runs/{flow_run_id}")["state"]
    return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None
