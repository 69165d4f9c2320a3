"""Prefect tasks `train` and `evaluate`: the next-call model, trained and honestly scored.

`train` gathers all it needs of the data root first (tasks.learning.split.read_training_data: the
split's token runs, and the questions' events, each run's read when asked), then answers the allocator's questions and fits
the model on what it read (tasks/learning/nextcall/training.py: early stopping, resumable
checkpoints);
`evaluate` scores it beside the baselines on runs it never saw and returns the `TrainOutcome`
that registration logs (tasks/learning/outcome.py). The work itself is in training.py, which
imports no orchestrator: a study or a lent GPU machine runs it without Prefect.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE

from tasks.core.storage import Root
from tasks.learning.answers import RunAnswers, merged
from tasks.learning.evaluate import evaluation_markdown
from tasks.learning.nextcall.fitting import placement_facts
from tasks.learning.nextcall.training import (
    checkpoint_dir,
    evaluate_model,
    fit_model,
    input_example,
    require_evaluation,
)
from tasks.learning.outcome import DatasetRef, TrainOutcome
from tasks.learning.questions.evaluation import question_evaluation
from tasks.learning.questions.network import QuestionNetwork
from tasks.learning.questions.reuse import question_markdown
from tasks.learning.scores import QuestionScores
from tasks.learning.split import Split, read_training_data
from tasks.learning.table.distill import ClassTable, TableAgreement
from tasks.learning.train_config import TrainConfig
from tasks.replay.workloads import Catalog


@dataclass
class TrainedModel:
    """What `train` hands to `evaluate`."""

    model: Any  # keras.Model
    config: TrainConfig
    root: Root
    split: Split
    history: dict[str, list[float]]
    predictions_per_second: float
    seconds: float
    checkpoint_dir: str
    placement: dict[str, str]  # backend, device, precision, batch_size (TrainOutcome's)
    initial_epoch: int  # > 0 when this training resumed a killed one
    notes: list[str] = field(default_factory=list)
    question_scores: tuple[QuestionScores, ...] = ()  # the allocator's questions' predictors
    # the layer's table and its agreement (tasks/learning/table/distill.py), the questions' network
    class_table: ClassTable | None = None
    table_agreement: tuple[TableAgreement, ...] = ()
    question_network: QuestionNetwork | None = None
    lifetime_table: tuple[np.ndarray, np.ndarray] | None = None  # the placement's (outcome.py)
    question_answers: tuple[RunAnswers, ...] = ()  # the network's, per evaluation run


@task(name="train", cache_policy=NO_CACHE)
def train(
    root: Root, config: TrainConfig, catalog: Catalog, callbacks: list[Any] | None = None
) -> TrainedModel:
    """Train the next-call model on the configured runs (resumes a killed training); `catalog`:
    the one config.data.catalog names (the workloads' programs), read where the flow starts."""
    r = root
    data = read_training_data(r, config.data, catalog)
    split = data.split
    if not split.train:
        raise ValueError(f"{r.url}: the split has no training run")
    require_evaluation(split, config.data.min_eval_positions, r.url)
    # the reuse question's predictors read the events (call sites, frees), not the tokens
    questions = question_evaluation(
        split, data.events, config.questions, config.seed, frames=data.frames
    )
    del data  # the questions' answers are all that is kept of the events
    ckpt = checkpoint_dir(r, config, split)
    t0 = time.perf_counter()
    model, facts = fit_model(config, split, ckpt, callbacks or [])
    notes = list(split.notes)
    if facts["initial_epoch"]:
        notes.append(f"resumed a killed training at epoch {facts['initial_epoch'] + 1} from {ckpt}")
    if facts.get("discarded_backup"):
        notes.append(
            f"discarded the unreadable backup of a training killed while writing it ({ckpt})"
        )
    return TrainedModel(
        model=model,
        config=config,
        root=r,
        split=split,
        history=facts["history"],
        predictions_per_second=facts["predictions_per_second"],
        seconds=time.perf_counter() - t0,
        checkpoint_dir=str(ckpt),
        placement=placement_facts(facts["placement"], facts["batch_size"]),
        initial_epoch=facts["initial_epoch"],
        notes=notes,
        question_scores=questions.scores,
        class_table=questions.table,
        table_agreement=questions.agreement,
        question_network=questions.network,
        lifetime_table=questions.lifetime_table,
        question_answers=questions.answers,
    )


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(trained: TrainedModel) -> TrainOutcome:
    """Score the model and the baselines on unseen runs, unseen programs, held-out workloads."""
    split, cfg = trained.split, trained.config
    tops: list[RunAnswers] = []  # the model's top-5 on each evaluation run, kept for whatif
    evaluation, _ = evaluate_model(trained.model, cfg, split, keep=tops)
    dataset = DatasetRef(
        root=trained.root,
        train_runs=tuple((r.workload, r.run) for r in split.train),
        eval_runs=tuple((r.workload, r.run) for r in split.evaluation),
        heldout_runs=tuple((r.workload, r.run) for r in split.heldout),
        train_tokens=split.train_tokens,
        eval_tokens=split.eval_tokens,
        content_hash=split.content_hash(),
        token_histogram=split.token_histogram(),
        validation_runs=tuple((r.workload, r.run) for r in split.validation),
        unseen_program_runs=tuple((r.workload, r.run) for r in split.unseen_programs),
    )
    return TrainOutcome(
        model=trained.model,
        config=cfg.model_dump(mode="json"),
        dataset=dataset,
        history=trained.history,
        evaluation=evaluation,
        predictions_per_second=trained.predictions_per_second,
        seconds=trained.seconds,
        placement=trained.placement,
        question_scores=trained.question_scores,
        class_table=trained.class_table,
        table_agreement=trained.table_agreement,
        question_network=trained.question_network,
        lifetime_table=trained.lifetime_table,
        answers=merged(trained.question_answers, tops),
        input_example=input_example(
            split.train[0],
            cfg.context,
            cfg.model.online_orders if cfg.model.online_features else None,
            cfg.model.online_ranks,
            cfg.model.frame_depth,
        ),
        notes=list(trained.notes),
    )


@task(name="publish-evaluation", cache_policy=NO_CACHE)
def publish_evaluation(outcome: TrainOutcome) -> str:
    """A Prefect markdown artifact with the evaluation tables; returns the markdown."""

    cfg = outcome.config
    head = (
        f"## Next-call model: {cfg['model']['kind']} {cfg['model']['units']}, mode {cfg['mode']}, "
        f"context {cfg['context']}\n\n"
        f"Trained on {outcome.dataset.train_tokens:,} tokens of "
        f"{', '.join(f'{w}/{r}' for w, r in outcome.dataset.train_runs)}; "
        f"{outcome.predictions_per_second:,.0f} training predictions/s; {outcome.seconds:.0f} s.\n\n"
    )
    markdown = head + evaluation_markdown(outcome.evaluation, outcome.notes)
    if outcome.question_scores:
        markdown += "\n" + question_markdown(list(outcome.question_scores))
    create_markdown_artifact(
        key="train-evaluation",
        markdown=markdown,
        description="model vs baselines on runs never seen in training",
    )
    return markdown


def clear_checkpoints(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
