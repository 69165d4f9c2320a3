"""Metrics over `Predictions`, and the `Evaluation` handed to registration (tasks/learning/outcome.py).

Every predictor is scored on the same positions: the caller computes them once per run
(tasks.dataset.token_runs.eval_positions) and hands the same labels to every predictor's scores.
Slices are each workload and OVERALL (all positions of the table pooled). No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.predictions import Predictions
from tasks.learning.scores import BASELINES, MODEL, MODELS, OVERALL, Evaluation, PredictorScores

UNSEEN_RUNS = "unseen_runs"
HELDOUT_WORKLOADS = "heldout_workloads"
UNSEEN_PROGRAMS = "unseen_programs"
# The evaluation tables, in the order they are shown (tasks/learning/train_config.py: the rule)
TABLES = (UNSEEN_RUNS, UNSEEN_PROGRAMS, HELDOUT_WORKLOADS)
PREDICTORS = (*MODELS, *BASELINES)
MIN_PROB = 1e-7  # log-loss clip, so one confident miss costs ~16 nats, not infinity


def top1_accuracy(y: np.ndarray, pred: Predictions) -> float:
    return float((pred.top1 == y).mean()) if len(y) else float("nan")


def top5_accuracy(y: np.ndarray, pred: Predictions) -> float:
    return float((pred.top == y[:, None]).any(axis=1).mean()) if len(y) else float("nan")


def log_loss(pred: Predictions) -> float:
    if not len(pred):
        return float("nan")
    return float(-np.log(np.clip(pred.p_true, MIN_PROB, 1.0)).mean())


def per_class_accuracy(y: np.ndarray, pred: Predictions) -> np.ndarray:
    """Top-1 accuracy per true class (64 entries), NaN where the class does not occur."""
    total = np.bincount(y, minlength=N_TOKENS).astype(np.float64)
    hit = np.bincount(y[pred.top1 == y], minlength=N_TOKENS).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, hit / total, np.nan)


def confusion_matrix(y: np.ndarray, top1: np.ndarray) -> np.ndarray:
    """64x64 counts, rows the true token, columns the predicted one."""
    flat = y.astype(np.int64) * N_TOKENS + np.minimum(top1, N_TOKENS - 1).astype(np.int64)
    return np.bincount(flat, minlength=N_TOKENS * N_TOKENS).reshape(N_TOKENS, N_TOKENS)


def score(
    y: np.ndarray,
    pred: Predictions,
    predictor: str,
    slice: str,
    table: str,
    detail: dict[str, Any] | None = None,
) -> PredictorScores:
    if len(pred) != len(y):
        raise ValueError(
            f"{predictor} on {table}/{slice}: {len(pred)} answers for {len(y)} positions"
        )
    return PredictorScores(
        predictor=predictor,
        slice=slice,
        table=table,
        positions=int(len(y)),
        top1=top1_accuracy(y, pred),
        top5=top5_accuracy(y, pred),
        log_loss=log_loss(pred),
        per_class_accuracy=per_class_accuracy(y, pred),
        detail=dict(detail or {}),
    )


def _concat_preds(preds: list[Predictions]) -> Predictions:
    return Predictions(
        np.concatenate([p.top for p in preds]), np.concatenate([p.p_true for p in preds])
    )


@dataclass
class EvaluationBuilder:
    """Collects, per table and workload, the labels and every predictor's answers; then scores."""

    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # predictor -> detail
    # who is scored: every predictor, or the model alone (a champion re-scored for promotion)
    predictors: tuple[str, ...] = PREDICTORS
    _labels: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)
    _answers: dict[tuple[str, str, str], list[Predictions]] = field(default_factory=dict)

    def add(
        self, table: str, workload: str, y: np.ndarray, answers: dict[str, Predictions]
    ) -> None:
        """One run's labels and the answers of every predictor at the same positions."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; expected one of {TABLES}")
        missing = set(self.predictors) - set(answers)
        if missing:
            raise ValueError(f"answers missing for {sorted(missing)}")
        for name, pred in answers.items():
            if len(pred) != len(y):
                raise ValueError(f"{name}: {len(pred)} answers for {len(y)} positions")
        self._labels.setdefault((table, workload), []).append(y)
        for name, pred in answers.items():
            self._answers.setdefault((table, workload, name), []).append(pred)

    def build(self) -> Evaluation:
        scores: list[PredictorScores] = []
        confusion = np.zeros((N_TOKENS, N_TOKENS), np.int64)
        for table in TABLES:
            workloads = sorted(w for (t, w) in self._labels if t == table)
            if not workloads:
                continue
            all_y = [np.concatenate(self._labels[(table, w)]) for w in workloads]
            for name in self.predictors:
                preds = [_concat_preds(self._answers[(table, w, name)]) for w in workloads]
                for w, y, p in zip(workloads, all_y, preds):
                    scores.append(score(y, p, name, w, table, self.details.get(name)))
                y, p = np.concatenate(all_y), _concat_preds(preds)
                scores.append(score(y, p, name, OVERALL, table, self.details.get(name)))
                if name == MODEL and table == UNSEEN_RUNS:
                    confusion = confusion_matrix(y, p.top1)
        return Evaluation(scores=tuple(scores), confusion=confusion)


def slices(evaluation: Evaluation, table: str) -> list[str]:
    names = sorted({s.slice for s in evaluation.scores if s.table == table} - {OVERALL})
    return names + [OVERALL] if names else []


def evaluation_markdown(evaluation: Evaluation, notes: list[str] | None = None) -> str:
    """The tables a person reads: per workload, top-1 / top-5 / log-loss of every predictor."""
    lines: list[str] = []
    titles = {
        UNSEEN_RUNS: "Unseen runs of the trained workloads",
        UNSEEN_PROGRAMS: "Unseen programs (no training run comes from them)",
        HELDOUT_WORKLOADS: "Held-out workloads (never trained on; their program is, elsewhere)",
    }
    # an evaluation made without some predictor (the champion re-scored: the model alone)
    scored = {s.predictor for s in evaluation.scores}
    predictors = [p for p in PREDICTORS if p in scored]
    for table in TABLES:
        names = slices(evaluation, table)
        if not names:
            continue
        lines += [f"### {titles[table]}", ""]
        head = (
            "| workload | positions | "
            + " | ".join(f"{p} top-1 | {p} top-5 | {p} log-loss" for p in predictors)
            + " | margin (top-1 vs best baseline) |"
        )
        lines += [head, "|" + "---|" * (3 * len(predictors) + 3)]
        for w in names:
            cells = [w, str(evaluation.get(MODEL, w, table).positions)]
            for p in predictors:
                s = evaluation.get(p, w, table)
                cells += [f"{s.top1:.4f}", f"{s.top5:.4f}", f"{s.log_loss:.3f}"]
            cells.append(f"{evaluation.margin_over_best_baseline(w, table):+.4f}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    ngram = next((s for s in evaluation.scores if s.predictor == "ngram"), None)
    if ngram is not None and "order" in ngram.detail:
        lines.append(f"n-gram order chosen on validation: {ngram.detail['order']}")
    for note in notes or []:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"
