"""What evaluation scores, by name: the predictors (the model, the hedged model and the
baselines), one predictor's scores on a slice, one predictor's on an allocator question, and an
evaluation that holds them on the same positions. Training, the questions, registration and the
night's summary read these; none of them is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Stable predictor names: MLflow metric keys are built from them, so the UI's compare view lines
# runs and baselines up under the same names from one run to the next.
MODEL = "model"
# the network mixed per thread with the online counter and the majority (tasks/learning/nextcall/hedge.py)
HEDGED_NEXT = "model_hedged"
MODELS = (MODEL, HEDGED_NEXT)
# ngram_online: the online counter (tasks/learning/counters/online.py), trained on nothing, learning from
# the thread's own past as it runs: the predictor an allocator inside the program always has.
ONLINE_COUNTER = "ngram_online"
BASELINES = ("majority", "repeat_last", "ngram", ONLINE_COUNTER)
OVERALL = "all"


@dataclass(frozen=True)
class PredictorScores:
    """One predictor's scores on one evaluation slice (a workload, or all)."""

    predictor: str  # one of MODELS or BASELINES
    slice: str  # workload name, OVERALL
    table: str  # one of tasks.learning.evaluate.TABLES
    positions: int
    top1: float
    top5: float
    log_loss: float
    per_class_accuracy: np.ndarray  # 64 entries, NaN where the class does not occur
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. {"order": 7} for the n-gram


@dataclass(frozen=True)
class QuestionScores:
    """One predictor's scores on one allocator question (tasks/learning/questions/reuse.py: "reuse"), one
    slice (a workload, or OVERALL), one table; positions are that question's (e.g. frees)."""

    question: str
    predictor: str
    slice: str
    table: str
    positions: int
    top1: float
    log_loss: float
    positions_without_site: int = 0  # positions whose call has no call site (no callers traced)


@dataclass(frozen=True)
class Evaluation:
    """Every predictor's scores on exactly the same evaluation positions."""

    scores: tuple[PredictorScores, ...]
    confusion: np.ndarray  # 64x64 counts for the model, overall unseen-runs table (true x pred)

    def get(
        self, predictor: str, slice: str = OVERALL, table: str = "unseen_runs"
    ) -> PredictorScores:
        for s in self.scores:
            if (s.predictor, s.slice, s.table) == (predictor, slice, table):
                return s
        raise KeyError(f"no scores for predictor={predictor} slice={slice} table={table}")

    def find(
        self, predictor: str, slice: str = OVERALL, table: str = "unseen_runs"
    ) -> PredictorScores | None:
        """`get`, or None where this evaluation did not score that predictor there (a champion
        re-scored alone, a table without runs)."""
        try:
            return self.get(predictor, slice, table)
        except KeyError:
            return None

    def margin_over_best_baseline(self, slice: str = OVERALL, table: str = "unseen_runs") -> float:
        model = self.get(MODEL, slice, table).top1
        best = max(self.get(b, slice, table).top1 for b in BASELINES)
        return model - best
