"""The `nightly` flow under a Prefect test API: the real stages on tiny inputs, and the failures.

GIVEN a tiny night (one quick workload replayed with the local runner, a one-worker local Dask
      cluster, a training of a few steps on a tiny network)
WHEN  `nightly` runs
THEN  every stage completes, the summary names the replays, the converted runs and the
      evaluation, and it is published as the `nightly-summary` artifact;
AND   a stage that fails does not stop the night; a night that trains nothing fails at the end.
"""

from __future__ import annotations

from pathlib import Path

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


def test_tiny_night_runs_every_stage(prefect_harness, tmp_path):
    params = NightlyParams(
        root=str(tmp_path / "data"),
        quick=True,
        trace={"workloads": ["sqlite3"], "runner": "local"},
        train={"overrides": TINY_TRAINING},
    )
    summary = nightly(params)

    assert [(s.name, s.ok) for s in summary.stages] == [
        ("trace", True),
        ("dataset", True),
        ("train", True),
        ("whatif", True),
    ]
    assert summary.replays_ok == ["sqlite3/small", "sqlite3/medium"]
    assert len(summary.converted) == 2
    assert summary.trained and summary.model_top1 is not None
    assert "ngram top-1" in summary.evaluation_markdown
    # the first model in a fresh registry takes the alias
    assert (summary.champion_before, summary.champion_after) == (None, "1")
    assert summary.champion_changed
    # a heap report per evaluation run of the model, under the data root, named in the summary
    heap = summary.heap_reports
    converted = {c.split(" ")[0] for c in summary.converted}  # "workload/run (rows)"
    assert heap is not None and heap.failed == {} and heap.reports
    assert {r.run for r in heap.reports} < converted  # not the training run
    for r in heap.reports:
        assert r.path.startswith(str(tmp_path / "data" / "reports")) and Path(r.path).is_file()
        assert r.events > 0 and r.peak_bytes > 0 and r.processes >= 1
    page = latest_artifact(ARTIFACT_KEY)
    assert "4 of 4 stages completed" in page and "## Champion" in page
    assert "## Heap reports (evaluation runs)" in page and heap.reports[0].path in page
    # what the predictions bought: per workload at the whatif budget, guided by tonight's model
    bought = {a.workload: a for a in summary.whatif_at_budget}
    assert "all" in bought and bought["all"].guided_hit_rate is not None
    assert "## What the predictions bought (whatif, at 64.00 KiB held idle)" in page
    assert "All workloads, by idle budget" in page and len(summary.whatif_by_budget) == 5
    assert f"| all | {bought['all'].best_heuristic} " in page
    # the model's run stays readable: at most 60 metrics once the seeds stage (not in this
    # night) adds its headline figures per case; its other figures go to a table
    from mlflow import MlflowClient

    from tasks.allocators.seeds import HEADLINE_PAIRS
    from tasks.registry.tracking import TrackingConfig, resolve_target

    target = resolve_target(TrackingConfig(root=str(tmp_path / "data")))
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    run = client.get_run(client.get_model_version("heapcast-next-call", "1").run_id)
    seed_cases = 3  # configs/allocators.yaml's seeds.workloads
    assert len(run.data.metrics) + seed_cases * len(HEADLINE_PAIRS) <= 60, sorted(run.data.metrics)


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
