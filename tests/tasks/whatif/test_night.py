"""The whatif stage's tasks on tiny synthetic runs: the table, the page, the MLflow run."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.learning.outcome import RegisteredModel
from tasks.nightly.markdown import markdown_text
from tasks.nightly.night_summary import StageOutcome, skipped
from tasks.nightly.night_summary import summarize as summarize_night
from tasks.nightly.params import NightlyParams
from tasks.registry.tracking import configure, resolve_target, tracking_for
from tasks.report.page import fmt_bytes
from tasks.whatif import policies
from tasks.whatif.night import (
    SWEEP_BUDGETS,
    ModelRef,
    WhatifParams,
    WhatifSummary,
    log_to_mlflow,
    parse_runs,
    pooled,
    replay_run,
    representatives,
    results_table,
    summarize,
    whatif_plan,
    write_table,
)
from tests.tasks.whatif.reference import ROW_FIGURES

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

GRID = [
    policies.NoneConfig(),
    policies.LargestConfig(n=2),
    policies.PoolsConfig(decay_ns=1000),
    policies.LayerGuidedConfig(),
    policies.LayerGuidedConfig(regret=True),
    policies.LayerGuidedConfig(table=True),  # no model, no table: no row
    policies.LruConfig(budget=1 << 16),
    policies.GuidedConfig(budget=1 << 16, ttl_calls=16),
    policies.BeladyConfig(budget=1 << 16),
    policies.OracleConfig(budget=1e3),
    policies.OracleConfig(budget=1e6),
]
RUNS = (("alpha", "r0"), ("beta", "r0"), ("gone", "r9"))


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Two synthetic runs and one that does not exist, replayed without a model."""
    root = Root.from_url(str(tmp_path_factory.mktemp("whatif") / "data"))
    write_synthetic_events(root, {"alpha": 1, "beta": 1}, tokens_per_run=2000)
    params = WhatifParams(root=root.url, policies=GRID, idle_budget=1 << 16)
    model = RegisteredModel("heapcast-next-call", "1", "", RUNS[:1], RUNS[1:2], RUNS[2:])
    ref = ModelRef(model, RUNS, None)
    replays = [replay_run.fn(root, w, r, params) for w, r in RUNS]
    return root, params, ref, replays


def test_rows_per_run_policy_and_predictor(replayed):
    root, params, ref, replays = replayed
    assert [r.ok for r in replays] == [True, True, False]
    assert "gone" in replays[2].error
    url = write_table.fn(root, replays, ref)
    assert url == root.url_of("whatif", "heapcast-next-call-v1.parquet")
    df = pq.read_table(url).to_pandas()
    assert not [p for p in (root.fs.ls(root.join("whatif"))) if p.endswith(".tmp")]
    for col in ("workload", "run", "policy", "predictor", "config", *ROW_FIGURES, "model_version"):
        assert col in df.columns, col
    # per run: every non-guided config once, the guided one per predictor (no model here)
    for _, g in df.groupby(["workload", "run"]):
        # the grid: GRID and the oracle at the budget, the guided config once per predictor,
        # the layer's guided policy asking a table left out (no version, no table)
        assert len(g) == len(params.grid()) - 1 + 2 - 1
        guided = g[g["policy"] == "guided"]
        assert sorted(guided["predictor"]) == ["online", "thread_future_optimistic"]
        assert sorted(
            g.loc[g["policy"] == "layer_guided", "config"].str.contains('regret":true')
        ) == [
            False,
            True,
        ]
    assert set(zip(df["workload"], df["run"])) == {("alpha", "r0"), ("beta", "r0")}
    assert (df.loc[df["policy"] == "none", "hit_rate"] == 0).all()
    assert (df["model_version"] == "1").all()


def test_page_names_the_missing_run_and_compares_policies(replayed):
    _, params, ref, replays = replayed
    s = summarize.fn(replays, ref, params, "file:///x.parquet")
    assert s.runs_failed.keys() == {"gone/r9"} and s.runs_ok == ["alpha/r0", "beta/r0"]
    page = s.markdown
    assert "## Runs not replayed" in page and "gone/r9" in page
    for heading in ("## alpha (1 run)", "## beta (1 run)", "## all (2 runs)"):
        assert heading in page
    for row in (
        "best_heuristic",
        "layer_guided",
        "layer_guided_regret",
        "guided_online",
        "guided_thread_future_optimistic",
        "oracle (bound)",
    ):
        assert row in page
    assert "no `model` predictor" not in page  # no model asked for, none missing
    # the detail, per workload and policy, is the policy table (whatif/policies.json)
    rows = {(r["workload"], r["policy"]): r for r in s.policies}
    assert rows[("alpha", "none")]["hit_rate"] == 0.0
    assert ("all", "guided_online") in rows and ("beta", "best_heuristic") in rows
    assert rows[("all", "oracle")]["idle_bytes_mean"] is None  # the bound has a hit rate only
    # the oracle bounds every policy under the same budget (one run per workload here)
    for w in ("alpha", "beta"):
        top = rows[(w, "oracle")]["hit_rate"]
        for p in ("largest", "pools", "lru", "guided_online", "guided_thread_future_optimistic"):
            if rows[(w, p)]["idle_bytes_mean"] <= params.idle_budget:
                assert rows[(w, p)]["hit_rate"] <= top + 1e-12
    # whatever peeks ahead of the free is named so, in the page and the tables
    assert "belady_optimistic" in page and "guided_thread_future_optimistic" in page
    assert ("all", "belady_optimistic") in rows
    assert not [k for k in rows if k[1] in ("belady", "guided_labels")]
    # the layer's guided policies are the layer's own (the core), not a predictor of lru's
    assert ("all", "layer_guided_regret") in rows
    assert not [k for k in rows if "layer_online" in k[1]]
    # the headline: no model here, so the best heuristic only; the default horizon 1 is causal
    best = rows[("all", "best_heuristic")]["hit_rate"]
    assert s.metrics == {"headline/whatif_causal.hit_rate.best_heuristic": pytest.approx(best)}


def test_metrics_and_plot_on_the_models_run(replayed, tmp_path):
    _, params, ref, replays = replayed
    tracking = tracking_for(Root.from_url(str(tmp_path / "store")))
    configure(tracking)
    from mlflow import MlflowClient

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    exp = client.get_experiment_by_name(tracking.experiment)
    run_id = client.create_run(exp.experiment_id).info.run_id
    client.create_registered_model(ref.model.name)
    version = str(
        client.create_model_version(ref.model.name, f"runs:/{run_id}/model", run_id).version
    )
    ref = ModelRef(dataclasses.replace(ref.model, run_id=run_id, version=version), ref.runs, None)
    s = summarize.fn(replays, ref, params, None)
    log_to_mlflow.fn(s, replays, tracking)
    # what the predictions bought, on the version's page too
    tags = client.get_model_version(ref.model.name, version).tags
    assert float(tags["heapcast.whatif_causal.hit_rate.best_heuristic"]) == pytest.approx(
        s.metrics["headline/whatif_causal.hit_rate.best_heuristic"]
    )

    logged = client.get_run(run_id).data.metrics
    assert logged == pytest.approx(s.metrics)  # the headline only: the detail is in tables
    names = {a.path for a in client.list_artifacts(run_id, "whatif")}
    assert {
        "whatif/pareto.png",
        "whatif/whatif.md",
        "whatif/whatif.csv",
        "whatif/policies.json",
        "whatif/grid.json",
    } <= names
    import mlflow

    policies = mlflow.load_table("whatif/policies.json", run_ids=[run_id])
    assert len(policies) == len(s.policies)
    row = policies[(policies["workload"] == "alpha") & (policies["policy"] == "none")].iloc[0]
    assert row["hit_rate"] == 0.0
    grid = mlflow.load_table("whatif/grid.json", run_ids=[run_id])
    assert len(grid) == sum(len(r.rows) for r in replays if r.ok)
    # a second replay of the same version replaces its tables, never appends to them
    log_to_mlflow.fn(s, replays, tracking)
    assert len(mlflow.load_table("whatif/grid.json", run_ids=[run_id])) == len(grid)
    tables = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert sorted(t["path"] for t in tables) == ["whatif/grid.json", "whatif/policies.json"]


def test_params_are_strict():
    with pytest.raises(ValidationError, match="idle_budget"):
        WhatifParams(idle_budget=0)
    with pytest.raises(ValidationError, match="n"):
        WhatifParams(policies=[{"kind": "largest", "n": 0}])
    with pytest.raises(ValidationError, match="extra"):
        WhatifParams(budget=1)
    p = WhatifParams(policies=[{"kind": "lru", "budget": 4096}])
    assert p.grid() == [
        policies.LruConfig(budget=4096),
        policies.OracleConfig(budget=float(p.idle_budget)),
    ]
    assert len(WhatifParams().grid()) > 50  # the default grid


def test_parse_runs_drops_an_entry_cut_short():
    assert parse_runs("a/r0,b/r1,a/r0,c") == [("a", "r0"), ("b", "r1")]
    assert parse_runs(["x/y"]) == [("x", "y")]
    assert parse_runs("") == []


def test_results_table_of_nothing_is_empty():
    from tasks.whatif.night import pooled, representatives

    assert representatives(pooled(pd.DataFrame()), 1.0).empty


def test_nightly_step_plans_on_tonights_model_and_reports_a_failure(tmp_path):
    # GIVEN the model tonight's train stage registered (evaluated on three tables' runs)
    model = RegisteredModel("m", "7", "run", (("a", "r1"),), (("p", "r0"),), (("h", "r0"),))
    data = Root.from_url(str(tmp_path / "data"))
    # THEN whatif replays for that version on those runs, under the night's root
    plan = whatif_plan(data, model)
    assert plan.model == "7" and plan.runs == ["a/r1", "p/r0", "h/r0"] and plan.root == data.url
    assert "no model" in whatif_plan(data, None)

    failed = StageOutcome("whatif", "FAILED", "KeyError: boom")
    context = NightlyParams(root=data.url).stages().context
    night = summarize_night.fn(context, [failed], None, None)
    assert [(s.name, s.ok, s.error) for s in night.stages] == [("whatif", False, "KeyError: boom")]
    assert "What the predictions bought" not in markdown_text(night)
    assert "no model" in whatif_plan(data, None) and skipped("whatif", "x").state == "SKIPPED"


def test_the_quick_night_replays_the_smallest_run_of_each_workload(tmp_path):
    # GIVEN evaluation runs of three workloads, two with two runs of known sizes (conversion
    # summaries), one whose runs have none
    from tasks.dataset.events_reader import EVENTS_DIR, SUMMARY_NAME

    data = Root.from_url(str(tmp_path / "data"))
    sizes = {("a", "big"): 900, ("a", "tiny"): 100, ("p", "s"): 50, ("p", "m"): 70}
    for (w, r), rows in sizes.items():
        folder = tmp_path / "data" / EVENTS_DIR / f"workload={w}" / f"run={r}"
        folder.mkdir(parents=True)
        (folder / SUMMARY_NAME).write_text(json.dumps({"rows": rows}))
    runs = (("a", "big"), ("a", "tiny"))
    model = RegisteredModel(
        "m", "7", "run", runs, (("p", "m"), ("p", "s")), (("h", "x"), ("h", "y"))
    )
    # WHEN the quick night plans whatif; and the full night
    quick, full = whatif_plan(data, model, quick=True), whatif_plan(data, model)
    # THEN one run each: the fewest events, the first listed when nothing says; all otherwise
    assert quick.runs == ["a/tiny", "p/s", "h/x"]
    assert full.runs == ["a/big", "a/tiny", "p/m", "p/s", "h/x", "h/y"]


def test_the_night_summary_prints_what_the_predictions_bought(replayed, tmp_path):
    # GIVEN the whatif stage's summary of two runs at a 64 KiB idle budget
    _, params, ref, replays = replayed
    s = summarize.fn(replays, ref, params, None)
    # THEN it holds, per workload, the figures of its own policy table (whatif/policies.json)
    assert [a.workload for a in s.at_budget] == ["alpha", "beta", "all"]
    rows = {(r["workload"], r["policy"]): r for r in s.policies}
    for a in s.at_budget:
        w = a.workload
        assert a.best_heuristic in ("largest", "pools", "lru")
        # (the table's JSON keeps 15 significant digits)
        assert a.best_heuristic_hit_rate == pytest.approx(rows[(w, "best_heuristic")]["hit_rate"])
        assert a.oracle_hit_rate == pytest.approx(rows[(w, "oracle")]["hit_rate"])
        assert a.guided_hit_rate is None  # no model here: nothing guided by it
        # the layer's own guided policy, decided by the policy core
        assert a.layer_guided_hit_rate == pytest.approx(rows[(w, "layer_guided")]["hit_rate"])
    # WHEN the night's summary is made from the completed whatif stage
    context = NightlyParams(root=str(tmp_path / "data")).stages().context
    done = StageOutcome("whatif", "COMPLETED", None, s)
    md = markdown_text(summarize_night.fn(context, [done], None, None))
    # THEN the printed summary says what the predictions bought, per workload, at the budget
    assert "## What the predictions bought (whatif, at 64.00 KiB held idle)" in md
    alpha = s.at_budget[0]
    row = next(line for line in md.splitlines() if line.startswith("| alpha |"))
    assert row == (
        f"| alpha | {alpha.best_heuristic} {alpha.best_heuristic_hit_rate:.4f} | n/a | n/a | "
        f"{alpha.oracle_hit_rate:.4f} |"
    )
    assert any(line.startswith("| all |") for line in md.splitlines())
    # and the pooled answer at each sweep budget, each as the representatives at that budget
    assert [a.budget for a in s.by_budget] == list(SWEEP_BUDGETS)
    for a in s.by_budget:
        pooled_at = representatives(pooled(results_table(replays, ref)), a.budget)
        best = pooled_at[(pooled_at.workload == "all") & (pooled_at.label == "best_heuristic")]
        assert a.best_heuristic_hit_rate == pytest.approx(float(best.hit_rate.iloc[0]))
        assert f"| {fmt_bytes(a.budget)} | {a.best_heuristic} " in md
    # and the summary survives Prefect's result storage
    assert WhatifSummary.model_validate_json(s.model_dump_json()) == s
