"""The headline of a training run: the figures a person compares two nights by, and the tables
that keep the rest.

The metric names (`headline/<table>.top1.*`, `headline/whatif_<causal|optimistic>.hit_rate.*`,
`layer/`, `log_loss/`, `train/`) are chosen for the sections of MLflow's chart view; the detail
goes to table artifacts. `figure` reads a new name and falls back to the name a store written
before the headline used.

The names and what each means: docs/results.md#the-headlines-names
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.learning.evaluate import TABLES
from tasks.learning.outcome import TrainOutcome
from tasks.learning.scores import BASELINES, HEDGED_NEXT, MODEL, MODELS, OVERALL, Evaluation

PREFIX = "headline/"
HIGHER_IS_BETTER = {"top1": True, "top5": True, "log_loss": False}
WHATIF_PREDICTOR = "guided_model"  # the guided policy driven by the model's predictions
CAUSAL_HORIZON = 1  # a prediction for the next call only: what a live cache has at the free


def key(table: str, measure: str, who: str) -> str:
    """The metric name of one figure; who in model | model_hedged | best_baseline | margin
    (top-1 only)."""
    if measure == "top1":
        return f"{PREFIX}{table}.top1.{who}"
    return f"{measure}/{table}.{who}"


def legacy_key(table: str, measure: str, predictor: str) -> str:
    """The name the same figure had before the headline (over all workloads)."""
    return f"{table}.{measure}/{OVERALL}.{predictor}"


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TableHeadline:
    """One evaluation table's figures over all its workloads."""

    table: str
    positions: int
    top1_model: float
    top1_best_baseline: float
    best_baseline_top1: str  # which baseline that is
    log_loss_model: float
    log_loss_best_baseline: float
    best_baseline_log_loss: str

    @property
    def margin(self) -> float:
        return self.top1_model - self.top1_best_baseline


def table_headlines(evaluation: Evaluation) -> list[TableHeadline]:
    """Per table the evaluation has (in TABLES order): the model and its best baseline."""
    out = []
    for table in TABLES:
        try:
            model = evaluation.get(MODEL, OVERALL, table)
            base = [evaluation.get(b, OVERALL, table) for b in BASELINES]
        except KeyError:
            continue  # a table this evaluation has no runs for (no held-out workload, ...)
        top = max(base, key=lambda s: s.top1)
        low = min(base, key=lambda s: s.log_loss)
        out.append(
            TableHeadline(
                table,
                int(model.positions),
                float(model.top1),
                float(top.top1),
                top.predictor,
                float(model.log_loss),
                float(low.log_loss),
                low.predictor,
            )
        )
    return out


def training_metrics(
    evaluation: Evaluation, seconds: float, predictions_per_second: float
) -> dict[str, float]:
    """The headline figures of a training run, logged as metrics (the whatif ones come later,
    on the same run)."""
    out: dict[str, float] = {}
    for h in table_headlines(evaluation):
        out[key(h.table, "top1", MODEL)] = h.top1_model
        out[key(h.table, "top1", "best_baseline")] = h.top1_best_baseline
        out[key(h.table, "top1", "margin")] = h.margin
        out[key(h.table, "log_loss", MODEL)] = h.log_loss_model
        out[key(h.table, "log_loss", "best_baseline")] = h.log_loss_best_baseline
        hedged = evaluation.find(HEDGED_NEXT, OVERALL, h.table)
        if hedged is not None:  # None: an evaluation made without it (the model alone)
            out[key(h.table, "top1", HEDGED_NEXT)] = float(hedged.top1)
            out[key(h.table, "log_loss", HEDGED_NEXT)] = float(hedged.log_loss)
    out["train/seconds"] = float(seconds)
    out["train/predictions_per_second"] = float(predictions_per_second)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def figure(metrics: Mapping[str, float], table: str, measure: str, who: str) -> float | None:
    """One headline figure of a logged run: its headline name, else (a run logged before the
    headline) the figure rebuilt from the old per-predictor names; None when neither is there."""
    if key(table, measure, who) in metrics:
        return float(metrics[key(table, measure, who)])
    if who == MODEL:
        v = metrics.get(legacy_key(table, measure, MODEL))
        return None if v is None else float(v)
    old = [metrics[k] for b in BASELINES if (k := legacy_key(table, measure, b)) in metrics]
    if not old:
        return None
    best = max(old) if HIGHER_IS_BETTER[measure] else min(old)
    if who == "best_baseline":
        return float(best)
    if who == "margin":
        model = metrics.get(legacy_key(table, measure, MODEL))
        return None if model is None else float(model - best)
    raise ValueError(f"headline figure {who!r}: expected model, best_baseline or margin")


# ----------------------------------------------------------------------------- tables


def evaluation_table(evaluation: Evaluation, table: str) -> pd.DataFrame:
    """One table's every workload x predictor (workloads by name, `all` last; the model first),
    with the model's margin over the best baseline per workload."""
    order = {p: i for i, p in enumerate((*MODELS, *BASELINES))}
    rows = [s for s in evaluation.scores if s.table == table]
    rows.sort(key=lambda s: (s.slice == OVERALL, s.slice, order.get(s.predictor, 99)))
    df = pd.DataFrame(
        {
            "workload": [s.slice for s in rows],
            "predictor": [s.predictor for s in rows],
            "positions": [int(s.positions) for s in rows],
            "top1": [float(s.top1) for s in rows],
            "top5": [float(s.top5) for s in rows],
            "log_loss": [float(s.log_loss) for s in rows],
        }
    )
    margins = {}
    for w in df["workload"].unique():
        try:
            margins[w] = evaluation.margin_over_best_baseline(w, table)
        except KeyError:
            margins[w] = float("nan")
    df["margin_top1_vs_best_baseline"] = df["workload"].map(margins)
    return df


LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"  # the tag MLflow's UI reads to show tables


def log_table(client, run_id: str, df: pd.DataFrame, artifact_file: str) -> None:
    """`mlflow.log_table`'s artifact (JSON, pandas "split" orient) and its entry in the run's
    table list, written whole: MlflowClient.log_table appends to an artifact of the same name,
    so a retried registration or a second whatif replay of a version would double its rows."""
    folder, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
        path = Path(tmp) / name
        df.to_json(path, orient="split", index=False, date_format="iso", double_precision=15)
        client.log_artifact(run_id, str(path), folder or None)
    listed = json.loads(client.get_run(run_id).data.tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in listed:
        client.set_tag(run_id, LOGGED_ARTIFACTS_TAG, json.dumps([*listed, entry]))


def log_evaluation_tables(client, run_id: str, evaluation: Evaluation) -> list[str]:
    """`evaluation/<table>.json` per table the evaluation has; the artifact paths."""
    paths = []
    for table in TABLES:
        df = evaluation_table(evaluation, table)
        if df.empty:
            continue
        paths.append(f"evaluation/{table}.json")
        log_table(client, run_id, df, paths[-1])
    return paths


# ----------------------------------------------------------------------------- whatif


@dataclass(frozen=True)
class WhatifHeadline:
    """What the predictions bought over all replayed runs, at the night's idle-byte budget."""

    horizon: int  # calls of a thread the guided policy read predictions for
    idle_budget: int
    best_heuristic: float  # hit rate
    guided_model: float | None  # hit rate; None when the model could not be loaded
    # the guided policy driven by the questions' reuse network (always causal: it answers at the
    # free itself); None when the version logged no network
    guided_questions: float | None = None

    @property
    def kind(self) -> str:
        return "causal" if self.horizon <= CAUSAL_HORIZON else "optimistic"


def whatif_metrics(w: WhatifHeadline) -> dict[str, float]:
    base = f"{PREFIX}whatif_{w.kind}.hit_rate."
    out = {base + "best_heuristic": float(w.best_heuristic)}
    if w.guided_model is not None:
        out[base + WHATIF_PREDICTOR] = float(w.guided_model)
        out[base + "gain"] = float(w.guided_model - w.best_heuristic)
    if w.guided_questions is not None:
        out[base + "guided_questions"] = float(w.guided_questions)
    return {k: v for k, v in out.items() if math.isfinite(v)}


# ----------------------------------------------------------------------------- the version


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def version_description(
    evaluation: Evaluation,
    *,
    content_hash: str,
    workloads: list[str],
    train_tokens: int,
    seconds: float,
    decision: str,
    reason: str,
) -> str:
    """The model version's description (Markdown on its page): headline figures, training data,
    what it beat, the champion decision and why."""
    lines = [
        "| table | positions | model top-1 | best baseline top-1 | margin | model log-loss "
        "| best baseline log-loss |",
        "|---|---|---|---|---|---|---|",
    ]
    beat = []
    for h in table_headlines(evaluation):
        lines.append(
            f"| {h.table} | {h.positions:,} | {_pct(h.top1_model)} | {_pct(h.top1_best_baseline)} "
            f"({h.best_baseline_top1}) | {100 * h.margin:+.1f} pts | {h.log_loss_model:.3f} | "
            f"{h.log_loss_best_baseline:.3f} ({h.best_baseline_log_loss}) |"
        )
        verb = "beats" if h.margin > 0 else "does not beat"
        beat.append(f"{verb} {h.best_baseline_top1} on {h.table}")
    return "\n".join(
        [
            f"Next-call model: {'; '.join(beat) or 'no evaluation table'} (top-1).",
            "",
            *lines,
            "",
            f"Trained on {train_tokens:,} calls of {', '.join(workloads) or '(none)'} "
            f"(data {content_hash[:12]}) in {seconds:,.0f} s.",
            "",
            f"Champion decision: **{decision}**: {reason}",
        ]
    )


def version_tags(
    evaluation: Evaluation, decision: str, reason: str, workloads: list[str]
) -> dict[str, str]:
    """Tags to filter versions by in the registry's search
    (tags.`heapcast.beats_baselines` = 'all')."""
    heads = table_headlines(evaluation)
    wins = sum(h.margin > 0 for h in heads)
    tags = {
        "heapcast.decision": decision,
        "heapcast.decision_reason": reason[:5000],
        "heapcast.workloads": ",".join(workloads),
        # on how many tables the model beats its best baseline: all | some | none
        "heapcast.beats_baselines": "all"
        if heads and wins == len(heads)
        else ("some" if wins else "none"),
    }
    for h in heads:
        tags[f"heapcast.margin.{h.table}"] = f"{h.margin:+.4f}"
        tags[f"heapcast.best_baseline.{h.table}"] = h.best_baseline_top1
    return tags


def describe_version(
    client, name: str, version: str, outcome: TrainOutcome, decision: str, reason: str
) -> None:
    """The description and tags of a registered version, with the champion decision taken for
    it and its reason (idempotent: a retried registration writes the same)."""
    d = outcome.dataset
    workloads = sorted({w for w, _ in d.train_runs})
    text = version_description(
        outcome.evaluation,
        content_hash=d.content_hash,
        workloads=workloads,
        train_tokens=int(d.train_tokens),
        seconds=float(outcome.seconds),
        decision=decision,
        reason=reason,
    )
    client.update_model_version(name, version, description=text)
    for k, v in version_tags(outcome.evaluation, decision, reason, workloads).items():
        client.set_model_version_tag(name, version, k, v)
