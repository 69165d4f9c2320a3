"""The night's summary reads the model run's headline under its MLflow names.

GIVEN a train stage that registered a model (its RegistrationResult's headline figures) and a
whatif stage that replayed it (its WhatifSummary's headline figures)
WHEN the night is summarized
THEN the summary holds both under the names the MLflow run has, and its page lists them.
"""

from __future__ import annotations

import pytest

from tasks.nightly.summary import StageOutcome, summarize
from tasks.registry import headline
from tasks.registry.register import RegistrationResult
from tasks.whatif.night import WhatifSummary
from tests.tasks.registry.test_headline import three_tables

NAME = "heapcast-next-call"


def test_the_summary_shows_the_headline_under_its_mlflow_names():
    scores = headline.training_metrics(three_tables(), seconds=3.0, predictions_per_second=10.0)
    reg = RegistrationResult(
        run_id="r1",
        experiment_id="1",
        model_name=NAME,
        model_version="2",
        model_uri=f"models:/{NAME}/2",
        promoted=True,
        champion_version="2",
        decision="promoted",
        reason="better",
        metric="top1",
        candidate_score=0.8,
        champion_score=0.7,
        scores=scores,
    )
    bought = headline.WhatifHeadline(16, 1 << 16, best_heuristic=0.5, guided_model=0.625)
    whatif = WhatifSummary(
        model_name=NAME,
        model_version="2",
        model_run_id="r1",
        idle_budget=1 << 16,
        metrics=headline.whatif_metrics(bought),
    )
    night = summarize.fn(
        "/data",
        [
            StageOutcome("train", "COMPLETED", None, reg),
            StageOutcome("whatif", "COMPLETED", None, whatif),
        ],
        "1",
        "2",
    )
    assert night.headline["headline/unseen_programs.top1.margin"] == pytest.approx(0.05)
    assert night.headline["headline/whatif_optimistic.hit_rate.gain"] == pytest.approx(0.125)
    assert night.headline["train/seconds"] == 3.0
    page = night.markdown()
    assert "## Headline" in page
    assert "| headline/whatif_optimistic.hit_rate.gain | 0.125 |" in page
    assert "| headline/unseen_runs.top1.model | 0.8 |" in page
