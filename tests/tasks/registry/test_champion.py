"""Promotion compares on the same evaluation: the champion is re-scored when the data changed.

GIVEN a champion registered on data A (top-1 0.80 there)
WHEN a candidate scored on data B arrives
THEN the champion is loaded and re-evaluated on B before the comparison, and that score decides.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.registry.champion import TAG_HASH, beats, call_evaluator, score_of
from tasks.registry.register import register_outcome, rescore_config
from tasks.registry.tracking import TrackingConfig
from tests.tasks.registry.outcome_factory import CONTEXT, make_evaluation, make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"
HASH_A = "a" * 64
HASH_B = "b" * 64


def test_beats_respects_direction_margin_and_nan():
    assert beats(0.81, 0.80, "top1") and not beats(0.80, 0.80, "top1")
    assert not beats(0.805, 0.80, "top1", min_improvement=0.01)
    assert beats(0.5, 0.6, "log_loss") and not beats(0.6, 0.5, "log_loss")
    assert not beats(math.nan, 0.5, "top1") and beats(0.1, math.nan, "top1")


def test_score_of_reads_the_model_overall_unseen_runs():
    assert score_of(make_evaluation(0.77), "top1") == pytest.approx(0.77)
    with pytest.raises(ValueError, match="promotion metric"):
        score_of(make_evaluation(0.77), "accuracy")


def test_evaluator_may_take_the_model_alone_or_with_the_champion_config():
    assert call_evaluator(lambda m: ("one", m), "M", {"c": 1}) == ("one", "M")
    assert call_evaluator(lambda m, c: ("two", m, c), "M", {"c": 1}) == ("two", "M", {"c": 1})
    assert call_evaluator(lambda m, c=None: ("two", m, c), "M", None) == ("two", "M", None)


def test_rescore_config_keeps_today_data_and_the_champion_model_shape():
    from tasks.learning.train_config import TrainConfig

    today = TrainConfig.model_validate(
        {"mode": "sequence", "context": 100, "epochs": 5, "data": {"heldout_workloads": ["git"]}}
    )
    champ = TrainConfig.model_validate(
        {"mode": "windows", "context": 50, "model": {"kind": "gru", "units": [16]}}
    ).model_dump(mode="json")
    cfg = rescore_config(today, champ)
    assert (cfg.mode, cfg.context, cfg.model.kind, cfg.model.units) == ("windows", 50, "gru", [16])
    assert cfg.data == today.data and cfg.ngram == today.ngram
    assert rescore_config(today, None) is today
    assert rescore_config(today, {"unknown": 1}) is today


@pytest.fixture(scope="module")
def model():
    return tiny_model()


class Evaluator:
    """A stand-in for today's evaluation: scores whatever model it is given at `top1`."""

    def __init__(self, top1: float):
        self.top1 = top1
        self.models = []

    def __call__(self, model, champion_config):
        # It gets a real, loaded Keras model that predicts on today's tokens, and the champion's
        # own training config (logged with it) to score it the way it was built.
        assert champion_config["model"] == {"kind": "gru", "units": [8], "dropout": 0.0}
        x = np.zeros((1, CONTEXT), dtype=np.int32)
        assert model.predict(x, verbose=0).shape == (1, CONTEXT, 64)
        self.models.append(model)
        return make_evaluation(self.top1, seed=99)


def test_champion_reevaluated_when_content_hash_differs(tmp_path, model):
    tracking = TrackingConfig(root=str(tmp_path))
    first = register_outcome(make_outcome(model, 0.80, content_hash=HASH_A), tracking)
    assert first.promoted

    # On data B the candidate scores 0.75: worse than the champion's stored 0.80 on A, but the
    # champion re-scored on B only reaches 0.70, so the candidate wins on the same evaluation.
    evaluator = Evaluator(0.70)
    second = register_outcome(
        make_outcome(model, 0.75, content_hash=HASH_B), tracking, evaluate_model=evaluator
    )
    assert len(evaluator.models) == 1
    assert (second.promoted, second.decision) == (True, "promoted")
    assert second.champion_score == pytest.approx(0.70)
    assert second.champion_version == "2"

    from mlflow import MlflowClient

    client = MlflowClient()
    old = client.get_model_version(NAME, "1")
    assert old.tags[TAG_HASH] == HASH_B  # the old champion now carries its score on B
    assert float(old.tags["heapcast.eval.top1"]) == pytest.approx(0.70)
    run = client.get_run(second.run_id)
    assert run.data.params["promotion.champion_reevaluated"] == "true"
    assert run.data.metrics["promotion/champion.top1"] == pytest.approx(0.70)
    assert run.data.metrics["promotion/candidate.top1"] == pytest.approx(0.75)
    assert "promotion/champion_evaluation.json" in {
        a.path for a in client.list_artifacts(second.run_id, "promotion")
    }

    # Same data B again: the stored score is used, nothing is re-evaluated.
    def must_not_run(_model):
        raise AssertionError("champion re-evaluated although the evaluation did not change")

    third = register_outcome(
        make_outcome(model, 0.74, content_hash=HASH_B), tracking, evaluate_model=must_not_run
    )
    assert (third.promoted, third.decision, third.champion_score) == (
        False,
        "kept",
        pytest.approx(0.75),
    )
    assert client.get_run(third.run_id).data.params["promotion.champion_reevaluated"] == "false"
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"


def test_without_an_evaluator_a_changed_evaluation_never_promotes(tmp_path, model):
    tracking = TrackingConfig(root=str(tmp_path))
    register_outcome(make_outcome(model, 0.60, content_hash=HASH_A), tracking)
    res = register_outcome(make_outcome(model, 0.99, content_hash=HASH_B), tracking)
    assert (res.promoted, res.decision, res.champion_version) == (False, "not_comparable", "1")
    assert "no evaluator" in res.reason
    from mlflow import MlflowClient

    assert MlflowClient().get_run(res.run_id).data.tags["heapcast.promotion"] == "not_comparable"
