"""Metrics and the Evaluation built from them."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.learning.counters.baselines import NONE, Predictions
from tasks.learning.evaluate import (
    HELDOUT_WORKLOADS,
    UNSEEN_RUNS,
    EvaluationBuilder,
    confusion_matrix,
    evaluation_markdown,
    log_loss,
    per_class_accuracy,
    top1_accuracy,
    top5_accuracy,
)
from tasks.learning.scores import OVERALL


def preds(top1: list[int], p: float = 0.5) -> Predictions:
    top = np.full((len(top1), 5), NONE, np.uint8)
    top[:, 0] = top1
    top[:, 1] = 9
    return Predictions(top, np.full(len(top1), p))


def test_top1_top5_log_loss_per_class_and_confusion():
    y = np.array([1, 1, 2, 9], np.uint8)
    p = preds([1, 2, 2, 1], p=0.25)
    assert top1_accuracy(y, p) == 0.5
    assert top5_accuracy(y, p) == 0.75  # the 9 is second choice
    assert log_loss(p) == pytest.approx(np.log(4))
    acc = per_class_accuracy(y, p)
    assert acc[1] == 0.5 and acc[2] == 1.0 and acc[9] == 0.0 and np.isnan(acc[3])
    cm = confusion_matrix(y, p.top1)
    assert cm.sum() == 4 and cm[1, 2] == 1 and cm[9, 1] == 1


def test_log_loss_is_finite_for_zero_probability():
    assert np.isfinite(log_loss(Predictions(np.zeros((1, 5), np.uint8), np.zeros(1))))


def test_builder_scores_every_predictor_per_workload_and_overall():
    b = EvaluationBuilder(details={"ngram": {"order": 3}})
    y = np.array([1, 2, 3], np.uint8)
    answers = {
        "model": preds([1, 2, 3]),
        "model_hedged": preds([1, 2, 0]),
        "majority": preds([1, 1, 1]),
        "repeat_last": preds([0, 1, 2]),
        "ngram": preds([1, 2, 0]),
        "ngram_online": preds([0, 2, 0]),
    }
    b.add(UNSEEN_RUNS, "a", y, answers)
    b.add(
        UNSEEN_RUNS,
        "b",
        y[:2],
        {k: Predictions(v.top[:2], v.p_true[:2]) for k, v in answers.items()},
    )
    b.add(HELDOUT_WORKLOADS, "c", y, answers)
    ev = b.build()
    assert ev.get("model", "a").top1 == 1.0
    assert ev.get("model", OVERALL).positions == 5
    assert ev.get("ngram", "a").detail["order"] == 3
    assert ev.margin_over_best_baseline("a") == pytest.approx(1 / 3)
    assert ev.get("majority", "c", HELDOUT_WORKLOADS).top1 == pytest.approx(1 / 3)
    assert ev.get("ngram_online", "a").top1 == pytest.approx(1 / 3)
    assert ev.confusion.sum() == 5
    md = evaluation_markdown(ev, ["a note"])
    assert "| a |" in md and "Held-out" in md and "order chosen on validation: 3" in md
    assert "model_hedged top-1" in md


def test_markdown_shows_only_the_predictors_an_evaluation_scored():
    # GIVEN a champion re-scored alone on today's runs beside the baselines of tonight's table
    b = EvaluationBuilder(predictors=("model", "majority", "repeat_last", "ngram", "ngram_online"))
    y = np.array([1, 2, 3], np.uint8)
    answers = {k: preds([1, 2, 3]) for k in ("model", "majority", "repeat_last", "ngram")}
    b.add(UNSEEN_RUNS, "a", y, {**answers, "ngram_online": preds([1, 1, 1])})
    md = evaluation_markdown(b.build())
    # THEN its table has no column for the mixture it was not scored with
    assert "model top-1" in md and "model_hedged" not in md


def test_builder_refuses_answers_at_other_positions():
    b = EvaluationBuilder()
    y = np.array([1, 2], np.uint8)
    names = ("model", "model_hedged", "majority", "repeat_last", "ngram_online")
    answers = {k: preds([1, 2]) for k in names}
    answers["ngram"] = preds([1])
    with pytest.raises(ValueError, match="ngram"):
        b.add(UNSEEN_RUNS, "a", y, answers)
