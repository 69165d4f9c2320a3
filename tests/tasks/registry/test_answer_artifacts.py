"""Registration logs the evaluation's answers with the version; whatif reads them back
(tasks/registry/answer_artifacts.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tasks.learning.answers import RunAnswers
from tasks.registry.answer_artifacts import answers_path, fetch_answers
from tasks.registry.register import register_outcome
from tasks.registry.tracking import TrackingConfig
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def test_the_evaluations_answers_are_logged_with_the_version_and_read_back(tmp_path):
    import mlflow

    top = np.random.default_rng(0).integers(0, 64, (300, 5)).astype(np.uint8)
    soon = np.where(np.arange(500) % 3 == 0, 0.5, np.nan)
    answers = (
        RunAnswers("sqlite3", "small", "t-digest", top, "r-digest", soon),
        RunAnswers("perl", "small", "t2", top[:10]),
    )
    outcome = dataclasses.replace(make_outcome(tiny_model(), 0.8), answers=answers)
    result = register_outcome(outcome, TrackingConfig(root=str(tmp_path)))

    got, why = fetch_answers(result.run_id, "sqlite3", "small")
    assert why == "" and (got.tokens_digest, got.rows_digest) == ("t-digest", "r-digest")
    np.testing.assert_array_equal(got.top, top)
    np.testing.assert_array_equal(got.soon, soon)
    got, _ = fetch_answers(result.run_id, "perl", "small")
    assert got.soon is None and got.top.shape == (10, 5)

    # a run the evaluation did not score, and a file that is not answers: None and why
    got, why = fetch_answers(result.run_id, "git", "small")
    assert got is None and f"{answers_path('git', 'small')}: not logged" in why
    bad = tmp_path / "bad" / "small.npz"
    bad.parent.mkdir()
    bad.write_bytes(b"not a zip")
    with mlflow.start_run(run_id=result.run_id):
        mlflow.log_artifact(str(bad), "answers/make_build")
    got, why = fetch_answers(result.run_id, "make_build", "small")
    assert got is None and "answers/make_build/small.npz: not an answers file" in why
