"""The headline of a training run, and a store from before it.

GIVEN evaluations made by hand (the model against four baselines on three tables)
WHEN the headline is computed
THEN one `headline/` figure per (table, model | best baseline | margin), training time and
throughput, and what the predictions bought named causal or optimistic by its horizon; a run
logged in the old per-predictor scheme gives the same figures through `figure`, and the
promotion rule compares a new candidate with such a champion without re-scoring it.
"""

from __future__ import annotations

import numpy as np
import pytest

from tasks.learning.scores import BASELINES, HEDGED_NEXT, MODEL, OVERALL, Evaluation
from tasks.registry import headline
from tasks.registry.champion import decide
from tasks.registry.register import register_outcome
from tasks.registry.tracking import TrackingConfig, configure
from tests.tasks.registry.outcome_factory import (
    BASELINE_TOP1,
    make_evaluation,
    make_outcome,
    scores_for,
    tiny_model,
)

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"


def three_tables(model_top1: float = 0.8) -> Evaluation:
    """The factory's two tables and an unseen-programs table where repeat_last is best."""
    ev = make_evaluation(model_top1)
    rng = np.random.default_rng(5)
    top1 = {"majority": 0.2, "repeat_last": 0.6, "ngram": 0.5, "ngram_online": 0.55}
    extra = [scores_for(MODEL, OVERALL, "unseen_programs", 0.65, rng)]
    extra += [scores_for(b, OVERALL, "unseen_programs", top1[b], rng) for b in BASELINES]
    return Evaluation(scores=ev.scores + tuple(extra), confusion=ev.confusion)


def test_training_headline_sorts_into_sections_top1_first():
    m = headline.training_metrics(three_tables(), seconds=12.5, predictions_per_second=900.0)
    sections = {}
    for k in m:
        sections.setdefault(k.rsplit("/", 1)[0], []).append(k)
    # the chart view's sections, alphabetical: top-1 and margins first (whatif adds 3 there)
    assert sorted(sections) == ["headline", "log_loss", "train"]
    # three figures a table, and the hedged mix's top-1 and log-loss where it was scored (the
    # factory's two tables; the unseen-programs table here has the model alone)
    assert len(sections["headline"]) == 9 + 2 and len(sections["log_loss"]) == 6 + 2
    assert m["headline/unseen_runs.top1.model_hedged"] == pytest.approx(0.905, abs=0.05)
    assert "headline/unseen_programs.top1.model_hedged" not in m
    # in the section, sorted by name: each table's three figures side by side
    assert sorted(sections["headline"])[:3] == [
        "headline/heldout_workloads.top1.best_baseline",
        "headline/heldout_workloads.top1.margin",
        "headline/heldout_workloads.top1.model",
    ]
    assert m["headline/unseen_programs.top1.model"] == pytest.approx(0.65)
    assert m["headline/unseen_programs.top1.best_baseline"] == pytest.approx(0.6)
    assert m["headline/unseen_programs.top1.margin"] == pytest.approx(0.05)
    # log-loss: the lowest of the baselines (the factory's log-loss is -log(top1))
    assert m["log_loss/unseen_programs.best_baseline"] == pytest.approx(-np.log(0.6))
    assert m["headline/unseen_runs.top1.best_baseline"] == pytest.approx(BASELINE_TOP1["ngram"])
    assert m["train/seconds"] == 12.5
    assert m["train/predictions_per_second"] == 900.0


def test_a_table_without_runs_has_no_headline():
    m = headline.training_metrics(make_evaluation(0.8), 1.0, 1.0)
    assert not [k for k in m if "unseen_programs" in k]


def legacy_metrics(ev: Evaluation) -> dict[str, float]:
    """A run's metrics as registration logged them before the headline."""
    out = {}
    for s in ev.scores:
        for m in ("top1", "top5", "log_loss"):
            out[f"{s.table}.{m}/{s.slice}.{s.predictor}"] = float(getattr(s, m))
    return out


def test_figure_reads_the_headline_and_falls_back_to_the_old_names():
    ev = three_tables()
    new = headline.training_metrics(ev, 1.0, 1.0)
    old = legacy_metrics(ev)
    for table in ("unseen_runs", "unseen_programs", "heldout_workloads"):
        for measure, who in (
            ("top1", "model"),
            ("top1", "best_baseline"),
            ("top1", "margin"),
            ("log_loss", "model"),
            ("log_loss", "best_baseline"),
        ):
            want = new[headline.key(table, measure, who)]
            assert headline.figure(new, table, measure, who) == pytest.approx(want)
            assert headline.figure(old, table, measure, who) == pytest.approx(want)
    assert headline.figure(old, "unseen_runs", "top5", "model") == pytest.approx(0.88)
    assert headline.figure({}, "unseen_runs", "top1", "model") is None


def test_what_the_predictions_bought_is_named_by_its_horizon():
    causal = headline.WhatifHeadline(1, 1 << 16, best_heuristic=0.5, guided_model=0.6)
    assert headline.whatif_metrics(causal) == pytest.approx(
        {
            "headline/whatif_causal.hit_rate.best_heuristic": 0.5,
            "headline/whatif_causal.hit_rate.guided_model": 0.6,
            "headline/whatif_causal.hit_rate.gain": 0.1,
        }
    )
    ahead = headline.WhatifHeadline(16, 1 << 16, best_heuristic=0.5, guided_model=None)
    assert headline.whatif_metrics(ahead) == {
        "headline/whatif_optimistic.hit_rate.best_heuristic": 0.5
    }


def test_evaluation_table_has_every_workload_and_predictor():
    ev = three_tables()
    df = headline.evaluation_table(ev, "unseen_runs")
    assert list(df.columns) == [
        "workload",
        "predictor",
        "positions",
        "top1",
        "top5",
        "log_loss",
        "margin_top1_vs_best_baseline",
    ]
    assert list(df["workload"].unique()) == ["redis", "sqlite3", "all"]
    assert list(df["predictor"][:6]) == [MODEL, HEDGED_NEXT, *BASELINES]
    assert headline.evaluation_table(ev, "nowhere").empty


# ----------------------------------------------------------------------------- an old store


def old_scheme_champion(tracking: TrackingConfig, top1: float, content_hash: str) -> str:
    """A version as an older heapcast left it: per-predictor metrics on its run, no score tags
    on the version, the alias on it. Its run id."""
    exp = configure(tracking)
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.create_run(exp, tags={"heapcast.content_hash": content_hash})
    ev = make_evaluation(top1)
    for k, v in legacy_metrics(ev).items():
        client.log_metric(run.info.run_id, k, v)
    client.set_terminated(run.info.run_id)
    client.create_registered_model(NAME)
    v = client.create_model_version(NAME, f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_registered_model_alias(NAME, "champion", v.version)
    return run.info.run_id


def test_the_promotion_rule_finds_an_old_champions_score_under_its_old_name(tmp_path):
    tracking = TrackingConfig(root=str(tmp_path))
    content_hash = "c0ffee" * 6
    old_scheme_champion(tracking, 0.83, content_hash)
    from mlflow import MlflowClient

    client = MlflowClient()
    better = decide(client, NAME, "2", make_evaluation(0.85), content_hash)
    assert (better.decision, better.champion_score) == ("promoted", pytest.approx(0.83))
    worse = decide(client, NAME, "2", make_evaluation(0.80), content_hash)
    assert (worse.decision, worse.champion_score) == ("kept", pytest.approx(0.83))
    # scored on other data: its old figure says nothing about today's, as before
    other = decide(client, NAME, "2", make_evaluation(0.85), "beef" * 9)
    assert other.decision == "not_comparable"


def test_a_new_run_registers_next_to_an_old_one_and_both_compare(tmp_path):
    tracking = TrackingConfig(root=str(tmp_path))
    outcome = make_outcome(tiny_model(), 0.86)
    old_run = old_scheme_champion(tracking, 0.83, outcome.dataset.content_hash)
    res = register_outcome(outcome, tracking)
    assert (res.decision, res.champion_version) == ("promoted", "2")
    from mlflow import MlflowClient

    client = MlflowClient()
    old, new = client.get_run(old_run).data.metrics, client.get_run(res.run_id).data.metrics
    assert "unseen_runs.top1/all.model" in old  # old runs keep their metrics
    for table in ("unseen_runs", "heldout_workloads"):
        for who in ("model", "best_baseline", "margin"):
            assert headline.figure(old, table, "top1", who) is not None
            assert headline.figure(new, table, "top1", who) is not None
