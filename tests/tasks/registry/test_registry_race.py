"""The same trained model registered twice at once: a retry beside a first attempt still running.

GIVEN two real processes registering the same outcome (the same registration key), each made
      to look for an earlier registration only once the other has asked to register (it signals
      before it takes the claim), so that the first to look does so while the other waits
WHEN  they register at once, into an embedded SQLite store or through a real `mlflow server`
THEN  there is exactly one run of that key and one version, both processes return it, and each
      saw the other asking while it looked (the control: a late second process is no race and
      fails the test instead of passing it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.registry.register import TAG_KEY, registration_key
from tasks.registry.tracking import TrackingConfig, configure
from tests.faults import start_child
from tests.localhost import mlflow_server
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

CHILD_SAME_MODEL = """
    import json
    from pathlib import Path
    import tasks.registry.register as reg
    from tasks.registry.tracking import TrackingConfig
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

    ME, OTHER, SYNC = {me!r}, {other!r}, Path({sync!r})
    tracking = TrackingConfig.model_validate(json.loads({tracking!r}))
    outcome = make_outcome(tiny_model(3), 0.85, seed=3)
    original_claim, original_find = reg.claim_registration, reg.find_registration
    STUCK_S = 300.0  # a guard against a broken schedule, never a window the test waits out
    raced = []

    def claim_registration(*args, **kwargs):
        (SYNC / ME).touch()  # asking to register: about to wait for the claim
        return original_claim(*args, **kwargs)

    def find_registration(*args, **kwargs):
        waited = 0.0
        while not (SYNC / OTHER).exists() and waited < STUCK_S:
            time.sleep(0.02)
            waited += 0.02
        raced.append((SYNC / OTHER).exists())
        return original_find(*args, **kwargs)

    reg.claim_registration = claim_registration
    reg.find_registration = find_registration
    result = reg.register_outcome(outcome, tracking)
    print("RESULT " + json.dumps([result.run_id, result.model_version, raced[0]]))
"""


def register_twice_at_once(tmp_path: Path, tracking: TrackingConfig) -> list[list[str]]:
    """Both processes' [run id, version]."""
    sync = tmp_path / "sync"
    sync.mkdir()
    children = []
    for me, other in (("a", "b"), ("b", "a")):
        code = CHILD_SAME_MODEL.format(
            me=me, other=other, sync=str(sync), tracking=tracking.model_dump_json()
        )
        log = tmp_path / f"{me}.log"
        children.append((start_child(code, log), log))
    results = []
    for proc, log in children:
        rc = proc.wait()
        proc._heapcast_log.close()
        text = log.read_text()
        assert rc == 0, text[-4000:]
        (line,) = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        *result, raced = json.loads(line.removeprefix("RESULT "))
        # the control: this process looked while the other was asking, or it was no race
        assert raced, f"{log.name}: the other process never asked to register"
        results.append(result)
    return results


def assert_one_run_and_one_version(tracking: TrackingConfig, results: list[list[str]]) -> None:
    from mlflow import MlflowClient

    experiment_id = configure(tracking)
    client = MlflowClient()
    key = registration_key(make_outcome(tiny_model(3), 0.85, seed=3), tracking.model_name)
    runs = client.search_runs([experiment_id], f"tags.`{TAG_KEY}` = '{key}'")
    found = client.search_model_versions(f"name = '{tracking.model_name}'")
    assert [str(v.version) for v in found] == ["1"], [(v.version, v.run_id) for v in found]
    assert [r.info.run_id for r in runs] == [found[0].run_id], every_run(client, experiment_id)
    assert results[0] == results[1] == [found[0].run_id, "1"]


def every_run(client, experiment_id: str) -> list[tuple]:
    """Each run of the experiment, deleted ones too, with its state and registration tags: what
    a failure must show to tell a lost tag from a lost run."""
    from mlflow.entities import ViewType

    runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL)
    return [
        (r.info.run_id, r.info.status, r.info.lifecycle_stage)
        + tuple(sorted((k, v) for k, v in r.data.tags.items() if k.startswith("heapcast.")))
        for r in runs
    ]


def test_the_same_model_registered_twice_at_once_into_a_file_store(tmp_path):
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    results = register_twice_at_once(tmp_path, tracking)
    assert_one_run_and_one_version(tracking, results)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("race-server-root")) as server:
        yield server.url


@pytest.mark.integration
def test_the_same_model_registered_twice_at_once_through_a_tracking_server(tmp_path, server_url):
    tracking = TrackingConfig(tracking_uri=server_url, experiment="race", model_name="race-model")
    results = register_twice_at_once(tmp_path, tracking)
    assert_one_run_and_one_version(tracking, results)
