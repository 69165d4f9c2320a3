"""The reaper of unfinished registrations judges another machine's runs by their lease only.

GIVEN a store with two unfinished registrations owned by a process of another machine: one
      failed two hours ago whose owner still holds its lease (its retry is pending there), one
      still marked running whose lease ran out (its machine went away)
WHEN  this machine registers another model (which reaps what will never finish)
THEN  the pending one keeps its version; the one whose lease ran out loses it, and says why.
"""

from __future__ import annotations

import time

import pytest

from tasks.registry.register import (
    TAG_DECISION,
    TAG_LEASE,
    TAG_OWNER,
    TAG_STATE,
    register_outcome,
)
from tasks.registry.tracking import TrackingConfig, configure
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"
ELSEWHERE = "build-7.example|0f0e0d0c-boot|4242|987654"  # host|boot id|pid|process start
HOUR_MS = 3600 * 1000


def as_unfinished_elsewhere(client, run_id: str, status: str, end_ms: int, lease_ms: int) -> None:
    """A finished registration rewritten as one an owner on another machine left unfinished."""
    client.set_tag(run_id, TAG_STATE, "started")
    client.set_tag(run_id, TAG_OWNER, ELSEWHERE)
    client.set_tag(run_id, TAG_LEASE, str(lease_ms))
    client.delete_tag(run_id, TAG_DECISION)
    if status == "RUNNING":
        client.update_run(run_id, status="RUNNING")
    else:
        client.set_terminated(run_id, status, end_time=end_ms)


def test_the_reaper_spares_a_pending_retry_elsewhere_and_reaps_an_expired_lease(tmp_path):
    from mlflow import MlflowClient

    tracking = TrackingConfig(root=str(tmp_path))
    register_outcome(make_outcome(tiny_model(0), 0.80, seed=0), tracking)  # v1, champion
    pending = register_outcome(make_outcome(tiny_model(1), 0.70, seed=1), tracking)  # v2
    expired = register_outcome(make_outcome(tiny_model(2), 0.72, seed=2), tracking)  # v3
    configure(tracking)
    client = MlflowClient()
    now = int(time.time() * 1000)
    as_unfinished_elsewhere(client, pending.run_id, "FAILED", now - 2 * HOUR_MS, now + HOUR_MS)
    as_unfinished_elsewhere(client, expired.run_id, "RUNNING", 0, now - 60_000)

    result = register_outcome(make_outcome(tiny_model(4), 0.60, seed=4), tracking)

    found = sorted(int(v.version) for v in client.search_model_versions(f"name = '{NAME}'"))
    assert found == [1, 2, int(result.model_version)]
    spared = client.get_run(pending.run_id)
    assert spared.data.tags[TAG_STATE] == "started" and spared.info.status == "FAILED"
    reaped = client.get_run(expired.run_id)
    assert reaped.data.tags[TAG_STATE] == "abandoned" and reaped.info.status == "KILLED"
    assert "removed v3" in reaped.data.tags["heapcast.abandoned"]
