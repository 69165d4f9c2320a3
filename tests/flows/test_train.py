"""The `train` flow under a Prefect test API, on a small synthetic events dataset."""

from __future__ import annotations

import pytest

from flows.train import TrainParams, train_flow
from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.learning.train_config import QUICK_CONFIG
from tasks.registry.tracking import configure, tracking_for
from tests.flows.flow_harness import TINY_TRAINING_BETA_HELD_OUT

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def test_train_flow_trains_evaluates_registers_and_publishes(prefect_harness, tmp_path):
    root = Root.from_url(str(tmp_path / "data"))
    write_synthetic_events(root, {"alpha": 3, "beta": 2}, tokens_per_run=2000)
    params = TrainParams(
        root=root.url,
        config=str(QUICK_CONFIG),
        overrides=TINY_TRAINING_BETA_HELD_OUT,
    )
    state = train_flow(params, return_state=True)
    result = state.result()
    outcome = result.outcome
    flow_run_id = state.state_details.flow_run_id
    assert outcome.evaluation.get("model").positions > 0
    # beta is held out and is a program of its own: the unseen-programs table scores it
    assert outcome.evaluation.get("model", "beta", "unseen_programs").positions > 0

    # the first model of an empty registry becomes the champion, in the embedded store under the root
    from mlflow import MlflowClient

    tracking = tracking_for(root)
    configure(tracking)
    client = MlflowClient()
    champion = client.get_model_version_by_alias(tracking.model_name, "champion")
    assert int(champion.version) == 1
    # the flow hands on a typed reference to that version, and the runs it was evaluated on
    assert (result.model.version, result.model.run_id) == ("1", champion.run_id)
    assert result.model.decision == "first"
    d = outcome.dataset
    assert result.model.unseen_program_runs == d.unseen_program_runs
    assert {w for w, _ in result.model.evaluation_runs} == {"alpha", "beta"}
    # the flow's report step made the training run's page; registration logged that file
    w, r = outcome.dataset.train_runs[0]
    tags = client.get_run(champion.run_id).data.tags
    assert tags["heapcast.report"] == f"report/{w}-{r}.html"
    assert [a.path for a in client.list_artifacts(champion.run_id, "report")] == [
        f"report/{w}-{r}.html"
    ]
    assert (tmp_path / "data" / "mlflow" / "mlflow.db").exists()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    async def latest():
        # this flow run's artifact: the test server is shared with other tests' runs
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["train-evaluation"]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                )
            )

    import asyncio

    artifacts = asyncio.run(latest())
    assert artifacts and "ngram top-1" in artifacts[0].data
    assert "### Unseen programs" in artifacts[0].data
