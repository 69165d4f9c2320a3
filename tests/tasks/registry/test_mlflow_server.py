"""The same registration through a real `mlflow server` on 127.0.0.1, read back through REST.

GIVEN scripts/mlflow-server.sh started on a free port over a temporary data root
WHEN two runs are registered with tracking_uri pointing at it (the second one worse)
THEN the REST API returns their params, metrics (under the same keys), artifacts, the registered
versions and the alias on the better one; `stop` ends the server's whole process group.
"""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

from tasks.learning.scores import MODEL, OVERALL
from tasks.registry.register import register_outcome
from tasks.registry.tracking import TrackingConfig
from tests.localhost import MLFLOW_SCRIPT, alive, mlflow_server
from tests.tasks.registry.outcome_factory import CONTEXT, make_outcome, tiny_model

pytestmark = pytest.mark.integration

SCRIPT = MLFLOW_SCRIPT
NAME = "heapcast-next-call"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("server-root")) as s:
        assert s.start_stdout.strip() == f"export MLFLOW_TRACKING_URI={s.url}"
        yield {"url": s.url, "root": s.root, "pid": s.pid, "env": s.env}


@pytest.fixture(scope="module")
def registered(server):
    model = tiny_model()
    tracking = TrackingConfig(tracking_uri=server["url"])
    outcomes = [make_outcome(model, 0.82, seed=0), make_outcome(model, 0.78, seed=1)]
    return outcomes, [register_outcome(o, tracking) for o in outcomes]


def test_status_reports_the_running_server(server):
    res = subprocess.run([str(SCRIPT), "status"], env=server["env"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert server["url"] in res.stdout


def test_runs_read_back_through_rest(server, registered):
    import requests

    outcomes, results = registered
    api = f"{server['url']}/api/2.0/mlflow"
    for outcome, res in zip(outcomes, results):
        run = requests.get(f"{api}/runs/get", params={"run_id": res.run_id}, timeout=60).json()[
            "run"
        ]
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert params["config.model.kind"] == "gru"
        assert params["dataset.content_hash"] == outcome.dataset.content_hash
        assert "lib.tensorflow" in params and len(params["code.git_commit"]) == 40
        for table in ("unseen_runs", "heldout_workloads"):
            assert metrics[f"headline/{table}.top1.model"] == pytest.approx(
                outcome.evaluation.get(MODEL, OVERALL, table).top1
            )
        hist = requests.get(
            f"{api}/metrics/get-history",
            params={"run_id": res.run_id, "metric_key": "train/loss"},
            timeout=60,
        ).json()
        assert sorted((m["step"], m["value"]) for m in hist["metrics"]) == [
            (0, 2.1),
            (1, 1.5),
            (2, 1.2),
        ]
        files = requests.get(
            f"{api}/artifacts/list", params={"run_id": res.run_id, "path": "plots"}, timeout=60
        ).json()["files"]
        assert {f["path"] for f in files} >= {
            "plots/confusion_matrix.png",
            "plots/learning_curves.png",
        }
        files = requests.get(
            f"{api}/artifacts/list", params={"run_id": res.run_id, "path": "evaluation"}, timeout=60
        ).json()["files"]
        assert "evaluation/unseen_runs.json" in {f["path"] for f in files}
        # Artifacts went through the server's proxy into --artifacts-destination.
        assert run["info"]["artifact_uri"].startswith("mlflow-artifacts:/")

    png = requests.get(
        f"{server['url']}/get-artifact",
        params={"path": "plots/token_histogram.png", "run_uuid": results[0].run_id},
        timeout=60,
    )
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    assert any((server["root"] / "mlflow" / "artifacts").rglob("token_histogram.png"))


def test_registry_and_alias_through_rest(server, registered):
    import requests

    _, (better, worse) = registered
    assert (better.promoted, worse.promoted) == (True, False)
    api = f"{server['url']}/api/2.0/mlflow"
    alias = requests.get(
        f"{api}/registered-models/alias", params={"name": NAME, "alias": "champion"}, timeout=60
    ).json()["model_version"]
    assert (str(alias["version"]), alias["run_id"]) == (better.model_version, better.run_id)
    latest = requests.post(
        f"{api}/registered-models/get-latest-versions", json={"name": NAME}, timeout=60
    ).json()["model_versions"]
    assert {str(v["version"]) for v in latest} == {worse.model_version}
    mv = requests.get(
        f"{api}/model-versions/get",
        params={"name": NAME, "version": worse.model_version},
        timeout=60,
    ).json()["model_version"]
    assert mv["run_id"] == worse.run_id
    run = requests.get(f"{api}/runs/get", params={"run_id": worse.run_id}, timeout=60).json()["run"]
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert metrics["promotion/champion.top1"] == pytest.approx(0.82)
    assert metrics["promotion/candidate.top1"] == pytest.approx(0.78)


def test_champion_loads_through_the_server(server, registered):
    import mlflow.pyfunc

    x = np.ones((2, CONTEXT), dtype=np.int32)
    pred = np.asarray(mlflow.pyfunc.load_model(f"models:/{NAME}@champion").predict(x))
    assert pred.shape == (2, CONTEXT, 64)


def test_stop_ends_the_process_group(server, registered):
    # Last in this module: stop through the script and check no process of the group is left.
    pid = server["pid"]
    res = subprocess.run([str(SCRIPT), "stop"], env=server["env"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for _ in range(600):  # the script already waited; the exit may lag a moment
        if not alive(pid):
            break
        time.sleep(0.2)
    assert not alive(pid)
    group = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert group == []
    assert not (server["root"] / "mlflow" / "server.pid").exists()
