"""A bad night leaves the champion alone: the `nightly` flow on broken data, for real.

GIVEN a champion in the registry and events from earlier nights
WHEN  a night's every replay fails (a workload that exits 3), or its evaluation runs hold fewer
      positions than the training config's data.min_eval_positions
THEN  nothing is registered, the champion stays, and the published summary says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.nightly import nightly
from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.nightly.night_summary import ARTIFACT_KEY, NothingTrained
from tasks.nightly.params import NightlyParams
from tasks.registry.register import register_outcome
from tasks.registry.tracking import tracking_for
from tests.flows.flow_harness import TINY_TRAINING, latest_artifact
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

CATALOG = Path(__file__).parents[1] / "tasks" / "replay" / "catalogs" / "flow.yaml"
NAME = "heapcast-next-call"
# the synthetic events hold one workload: nothing held out of it
ONLY_ALPHA = {"workloads": None, "heldout_workloads": [], "heldout_programs": []}


@pytest.fixture(autouse=True)
def one_dask_worker(monkeypatch):
    monkeypatch.setenv("HEAPCAST_DASK_WORKERS", "1")
    monkeypatch.delenv("HEAPCAST_DASK_SCHEDULER", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def root_with_a_champion(tmp_path: Path) -> Root:
    """Events of earlier nights (enough to train on) and version 1 as the champion."""
    root = Root.from_url(str(tmp_path / "data"))
    write_synthetic_events(root, {"alpha": 2}, tokens_per_run=2000)
    assert register_outcome(make_outcome(tiny_model(), 0.80), tracking_for(root)).promoted
    return root


def registry_versions(root: Root) -> tuple[list[str], str]:
    from mlflow import MlflowClient

    from tasks.registry.tracking import configure

    tracking = tracking_for(root)
    configure(tracking)
    client = MlflowClient()
    versions = sorted(str(v.version) for v in client.search_model_versions(f"name = '{NAME}'"))
    return versions, str(client.get_model_version_by_alias(NAME, "champion").version)


def test_a_night_whose_every_replay_failed_registers_nothing(prefect_harness, tmp_path):
    root = root_with_a_champion(tmp_path)
    params = NightlyParams(
        root=root.url,
        quick=True,
        trace={"catalog": str(CATALOG), "workloads": ["broken"], "runner": "local"},
        train={"overrides": TINY_TRAINING},
    )
    # WHEN the night's only replay fails
    with pytest.raises(NothingTrained, match="every replay failed"):
        nightly(params)
    # THEN nothing was registered and the champion stayed
    assert registry_versions(root) == (["1"], "1")
    # AND the summary says why
    page = latest_artifact(ARTIFACT_KEY)
    assert "| train | **skipped** |" in page
    assert "**Nothing was registered tonight**: tonight's data is broken" in page
    assert "every replay failed (1 of 1): broken/small: exit code 3, expected 0" in page
    assert "The champion did not change: version 1." in page


def test_a_night_with_too_small_an_evaluation_registers_nothing(prefect_harness, tmp_path):
    root = root_with_a_champion(tmp_path)
    params = NightlyParams(
        root=root.url,
        trace={"workloads": ["no-such-workload"]},  # no new replays: the earlier events
        train={
            "overrides": {**TINY_TRAINING, "data": {**ONLY_ALPHA, "min_eval_positions": 50_000}}
        },
    )
    # WHEN the evaluation runs hold ~2,000 positions where 50,000 are required
    with pytest.raises(NothingTrained, match="min_eval_positions"):
        nightly(params)
    # THEN nothing was registered and the champion stayed
    assert registry_versions(root) == (["1"], "1")
    page = latest_artifact(ARTIFACT_KEY)
    assert "| train | **failed** |" in page and "EvaluationTooSmall" in page
    assert "**Nothing was registered tonight**" in page
    assert "fewer than data.min_eval_positions=50,000" in page
    assert "The champion did not change: version 1." in page
