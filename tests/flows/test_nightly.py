"""The `nightly` flow under a Prefect test API: its failures.

GIVEN a night whose trace stage fails (a training of a few steps on a tiny network)
WHEN  `nightly` runs
THEN  a stage that fails does not stop the night; a night that trains nothing fails at the end.

The tiny night that completes every stage runs once, through the deployment, a real server and
worker (tests/integration/test_prefect_deployment.py), with what its summary must say.
"""

from __future__ import annotations

import pytest

from flows.nightly import nightly
from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.nightly.markdown import markdown_text
from tasks.nightly.night_summary import ARTIFACT_KEY, NothingTrained
from tasks.nightly.params import NightlyParams
from tasks.nightly.terminal import terminal_text
from tests.flows.flow_harness import TINY_TRAINING, latest_artifact

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_dask_worker(monkeypatch):
    monkeypatch.setenv("HEAPCAST_DASK_WORKERS", "1")
    monkeypatch.delenv("HEAPCAST_DASK_SCHEDULER", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_failed_stage_does_not_stop_the_night(prefect_harness, tmp_path):
    # GIVEN events already in the root (an earlier night), and a trace stage that fails
    root = Root.from_url(str(tmp_path / "data"))
    write_synthetic_events(root, {"alpha": 2}, tokens_per_run=2000)
    params = NightlyParams(
        root=root.url, trace={"workloads": ["no-such-workload"]}, train={"overrides": TINY_TRAINING}
    )
    summary = nightly(params)

    trace = summary.stages[0]
    assert (trace.name, trace.ok) == ("trace", False)
    assert "no-such-workload" in trace.error
    assert summary.trained  # dataset and train went on with the data there was
    whatif = next(s for s in summary.stages if s.name == "whatif")
    assert whatif.ok and "replayed for v1" in whatif.detail  # tonight's model, after training
    assert "**failed**" in markdown_text(summary)


def test_night_without_a_model_fails_at_the_end(prefect_harness, tmp_path):
    params = NightlyParams(
        root=str(tmp_path / "empty"),
        trace={"workloads": ["no-such-workload"]},
        train={"overrides": TINY_TRAINING},
    )
    with pytest.raises(NothingTrained, match="no model was trained") as failed:
        nightly(params)
    page = latest_artifact(ARTIFACT_KEY)  # published before failing
    assert "(no model trained)" in page
    # the error carries the summary, so that the command line still prints the verdict first
    summary = failed.value.summary
    assert summary is not None and not summary.trained
    assert terminal_text(summary).splitlines()[2].startswith("NO MODEL TRAINED: ")
