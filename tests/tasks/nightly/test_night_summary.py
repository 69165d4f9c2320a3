"""The night's summary reads the model run's headline under its MLflow names.

GIVEN a train stage that registered a model (its RegisteredModel's headline figures) and a
whatif stage that replayed it (its WhatifSummary's headline figures)
WHEN the night is summarized
THEN the summary holds both under the names the MLflow run has, and its page lists them.
"""

from __future__ import annotations

import pytest

from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel, TrainResult
from tasks.nightly.markdown import markdown_text
from tasks.nightly.night_summary import StageOutcome, summarize
from tasks.nightly.params import NightContext
from tasks.registry import headline
from tasks.registry.tracking import TrackingConfig
from tasks.replay.workloads import load_catalog
from tasks.whatif.night import WhatifSummary
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model
from tests.tasks.registry.test_headline import three_tables

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"


def test_the_summary_shows_the_headline_under_its_mlflow_names(tmp_path):
    scores = headline.training_metrics(three_tables(), seconds=3.0, predictions_per_second=10.0)
    outcome = make_outcome(tiny_model(), 0.8)
    d = outcome.dataset
    model = RegisteredModel(
        NAME, "2", "r1", tuple(d.eval_runs), tuple(d.unseen_program_runs), tuple(d.heldout_runs),
        decision="promoted", reason="better", headline=tuple(sorted(scores.items())),
    )  # fmt: skip
    root = Root.from_url(str(tmp_path / "data"))
    context = NightContext(
        root=root, tracking=TrackingConfig(root=root.url), catalog=load_catalog()
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
        context,
        [
            StageOutcome("train", "COMPLETED", None, TrainResult(outcome, model)),
            StageOutcome("whatif", "COMPLETED", None, whatif),
        ],
        "1",
        "2",
    )
    assert night.headline["headline/unseen_programs.top1.margin"] == pytest.approx(0.05)
    assert night.headline["headline/whatif_optimistic.hit_rate.gain"] == pytest.approx(0.125)
    assert night.headline["train/seconds"] == 3.0
    page = markdown_text(night)
    assert "## Headline" in page
    assert "| headline/whatif_optimistic.hit_rate.gain | 0.125 |" in page
    assert "| headline/unseen_runs.top1.model | 0.8 |" in page
    # the train stage's line says where the model trained and how fast (outcome_factory's)
    train_line = next(s.detail for s in night.stages if s.name == "train")
    assert train_line.endswith(
        "; trained with jax on gpu: NVIDIA H200, mixed_bfloat16, batch 1024, 12 k positions/s"
    )
