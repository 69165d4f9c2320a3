"""The `whatif` flow under a Prefect test API: a tiny trained champion's evaluation runs replayed.

GIVEN a champion trained on a small synthetic dataset (the `train` flow), one of its evaluation
      runs since deleted
WHEN  `whatif` runs with its defaults for the model and the runs (a reduced policy grid)
THEN  the other runs are replayed with the model and the online counter (causal: the prediction
      made at the free) and the freeing thread's true future (named optimistic) as
      predictors; the table is under <root>/whatif/, the metrics and the Pareto plot on the
      champion's MLflow run, and the `whatif` artifact names the deleted run.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest

from flows.train import train_flow
from flows.whatif import whatif
from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.learning.train_config import QUICK_CONFIG, TrainParams
from tasks.registry.tracking import configure, resolve_target, tracking_for
from tasks.whatif.night import ARTIFACT_KEY, WhatifParams, registered_ref
from tests.flows.flow_harness import TINY_TRAINING_BETA_HELD_OUT, latest_artifact

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

GRID = [
    {"kind": "none"},
    {"kind": "largest", "n": 4},
    {"kind": "layer_guided", "regret": True},
    {"kind": "lru", "budget": 1 << 16},
    {"kind": "guided", "budget": 1 << 16, "ttl_calls": 16},
    {"kind": "belady", "budget": 1 << 16},
]


def test_whatif_replays_the_champions_evaluation_runs(prefect_harness, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = Root.from_url(str(tmp_path / "data"))
    write_synthetic_events(root, {"alpha": 3, "beta": 2}, tokens_per_run=2000)
    # each evaluation run capped, as the quick night caps them: whatif replays the same calls
    overrides = {
        **TINY_TRAINING_BETA_HELD_OUT,
        "data": {**TINY_TRAINING_BETA_HELD_OUT["data"], "max_eval_tokens": 1500},
    }
    trained = train_flow(TrainParams(root=root.url, config=str(QUICK_CONFIG), overrides=overrides))
    model = trained.model  # the typed reference registration handed on
    assert (model.name, model.version) == ("heapcast-next-call", "1")
    d = trained.outcome.dataset
    assert model.evaluation_runs == (
        *d.eval_runs,
        *d.unseen_program_runs,
        *d.heldout_runs,
    )  # beta, held out, is a program of its own: unseen_program_runs
    evaluated = [*d.eval_runs, *d.unseen_program_runs, *d.heldout_runs]
    gone_w, gone_r = d.eval_runs[0]
    assert gone_w == "alpha" and {w for w, _ in evaluated[1:]} == {"beta"}
    shutil.rmtree(tmp_path / "data" / "events" / f"workload={gone_w}" / f"run={gone_r}")

    summary = whatif(WhatifParams(root=root.url, policies=GRID, idle_budget=1 << 16))

    # the runs came from the champion's MLflow run; the deleted one is named, the others replayed
    assert summary.model_version == "1"
    assert summary.runs_failed.keys() == {f"{gone_w}/{gone_r}"}
    assert sorted(summary.runs_ok) == sorted(f"{w}/{r}" for w, r in evaluated[1:])
    page = latest_artifact(ARTIFACT_KEY)
    assert f"{gone_w}/{gone_r}" in page and "## Runs not replayed" in page
    assert "guided_model" in page and "best_heuristic" in page

    df = pq.read_table(tmp_path / "data" / "whatif" / "heapcast-next-call-v1.parquet").to_pandas()
    assert summary.table_url == root.url_of("whatif", "heapcast-next-call-v1.parquet")
    assert set(zip(df["workload"], df["run"])) == set(evaluated[1:])
    guided = df[df["policy"] == "guided"]
    # the questions' reuse network, logged with the version, guides a policy of its own
    assert sorted(set(guided["predictor"])) == [
        "model",
        "online",
        "questions",
        "thread_future_optimistic",
    ]
    assert (df["model_run_id"] == model.run_id).all()
    assert (df["policy"] == "layer_guided").any()  # the layer's own guided policy (the core)

    tracking = tracking_for(root)
    configure(tracking)
    from mlflow import MlflowClient

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    logged = client.get_run(model.run_id).data.metrics
    # what the model's predictions bought, in the run's headline (the default horizon 1 is causal)
    head = "headline/whatif_causal.hit_rate."
    assert logged[head + "gain"] == pytest.approx(
        logged[head + "guided_model"] - logged[head + "best_heuristic"]
    )
    assert 0.0 <= logged[head + "guided_questions"] <= 1.0
    assert (summary.at_budget[-1].workload, summary.at_budget[-1].questions_hit_rate) == (
        "all",
        logged[head + "guided_questions"],
    )
    assert not [k for k in logged if k.startswith("whatif.")]  # the detail is in tables
    artifacts = {a.path for a in client.list_artifacts(model.run_id, "whatif")}
    assert {"whatif/pareto.png", "whatif/policies.json", "whatif/grid.json"} <= artifacts
    import mlflow

    policies = mlflow.load_table("whatif/policies.json", run_ids=[model.run_id])
    rows = {(r.workload, r.policy): r for r in policies.itertuples()}
    assert rows[("beta", "none")].hit_rate == 0.0
    assert ("beta", "guided_model") in rows and ("all", "oracle") in rows
    assert ("all", "guided_thread_future_optimistic") in rows
    assert not [w for w, _ in rows if w == "alpha"]  # run gone

    # the networks' answers were the evaluation's, logged with the version, read back for every
    # replayed run on exactly the calls the evaluation scored (the first 1500 of each)
    logged = {a.path for a in client.list_artifacts(model.run_id, "answers/beta")}
    assert logged and {f"answers/beta/{r}.npz" for w, r in evaluated[1:]} == logged
    assert "answered here" not in page and "first 1,500 tokens" in page
    # outside a flow (the benchmarks), the same version, runs and cap
    ref = registered_ref(WhatifParams(root=root.url), root)
    assert (ref.version, ref.run_id, ref.max_eval_tokens) == ("1", model.run_id, 1500)
    assert sorted(ref.runs) == sorted(evaluated)
    # and they are the very answers the networks give when asked again
    again = whatif(WhatifParams(root=root.url, policies=GRID, idle_budget=1 << 16, recompute=True))
    assert again.runs_ok == summary.runs_ok
    df2 = pq.read_table(tmp_path / "data" / "whatif" / "heapcast-next-call-v1.parquet").to_pandas()
    cols = [c for c in df.columns if c != "created_at"]
    pd.testing.assert_frame_equal(
        df[cols].sort_values(["workload", "run", "config", "predictor"]).reset_index(drop=True),
        df2[cols].sort_values(["workload", "run", "config", "predictor"]).reset_index(drop=True),
    )
