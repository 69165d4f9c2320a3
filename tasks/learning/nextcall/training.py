"""The next-call model's training and scoring, with no orchestrator: what the Prefect tasks of
tasks/learning/train.py run, and what a study or a lent GPU machine (no Prefect there) runs
directly.

`fit_model` fits the Keras model on a split's training runs with early stopping on its
validation runs (resuming from checkpoints); `evaluate_model` fits the baselines on the same
training runs and scores every predictor on the same positions of runs the model never saw;
`export_bundle` writes what fitting needs to one file (tasks/learning/nextcall/bundle.py).

Keras is imported inside the functions that need it, so importing this module stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.core.config import PROJECT_DIR
from tasks.core.storage import Root
from tasks.dataset.frame_tokens import FRAME_PIECES
from tasks.dataset.token_runs import TokenRun, concat_runs, eval_positions
from tasks.learning.answers import RunAnswers, tokens_digest
from tasks.learning.counters.baselines import Baselines
from tasks.learning.evaluate import (
    HELDOUT_WORKLOADS,
    UNSEEN_PROGRAMS,
    UNSEEN_RUNS,
    EvaluationBuilder,
)
from tasks.learning.nextcall.bundle import TrainingBundle, write_bundle
from tasks.learning.nextcall.fitting import TrainingInputs, fit_inputs
from tasks.learning.nextcall.hedge import hedged_next, thread_of
from tasks.learning.nextcall.stack_input import stack_input
from tasks.learning.predictions import ranked
from tasks.learning.scores import HEDGED_NEXT, MODEL, ONLINE_COUNTER, Evaluation
from tasks.learning.split import Split, load_split
from tasks.learning.train_config import TrainConfig

if TYPE_CHECKING:  # deferred at run time: the model module imports Keras at its top
    from tasks.learning.nextcall.model import NGramTable


def checkpoint_dir(root: Root, cfg: TrainConfig, split: Split) -> Path:
    """<checkpoint_dir>/<hash of the config and of the data>/ (a local folder: Keras needs one)."""
    if cfg.checkpoint_dir is not None:
        base = Path(cfg.checkpoint_dir)
    elif root.is_local:
        base = Path(root.path) / "checkpoints"
    else:
        base = PROJECT_DIR / ".checkpoints"
    return base / f"{cfg.fingerprint()}-{split.content_hash()[:8]}"


def training_tables(
    runs: list[TokenRun], whole: TokenRun, pos: np.ndarray, cfg: TrainConfig
) -> tuple[NGramTable, dict[str, NGramTable] | None]:
    """The n-gram table of the training runs (`whole`: their concatenation, `pos` its positions
    in thread), and, where `cfg.model.ngram_crossfit` asks for it and there are two training
    workloads or more, each workload's table of the other workloads (crossfit_features), all
    from one count of the runs' (context, next) pairs (NGramTable.fit_leaving_out)."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import NGramTable

    order = cfg.model.ngram_order
    workloads = sorted({r.workload for r in runs})
    if cfg.model.ngram_crossfit <= 0 or len(workloads) < 2:
        return NGramTable.fit(whole.tokens, pos, order), None
    group = np.repeat([workloads.index(r.workload) for r in runs], [r.n_tokens for r in runs])
    table, others = NGramTable.fit_leaving_out(whole.tokens, pos, group, order)
    return table, {w: others[g] for g, w in enumerate(workloads)}


def crossfit_rows(
    runs: list[TokenRun], cfg: TrainConfig, others: dict[str, NGramTable]
) -> dict[int, np.ndarray]:
    """The positions whose n-gram features come from the other workloads' table (`others`, per
    workload: training_tables): per run index, the rows of a `cfg.model.ngram_crossfit` share of
    its blocks of ten contexts, drawn with cfg.seed, workload by workload."""
    rng = np.random.default_rng(cfg.seed)
    block = 10 * cfg.context
    chosen_rows: dict[int, np.ndarray] = {}
    for w in sorted(others):
        for i in (i for i, r in enumerate(runs) if r.workload == w):
            n = runs[i].n_tokens
            chosen = np.flatnonzero(rng.random(-(-n // block)) < cfg.model.ngram_crossfit)
            if not len(chosen):
                continue
            rows = (chosen[:, None] * block + np.arange(block)[None, :]).ravel()
            chosen_rows[i] = rows[rows < n]
    return chosen_rows


def crossfit_features(
    feats: np.ndarray,
    runs: list[TokenRun],
    cfg: TrainConfig,
    others: dict[str, NGramTable],
    chosen: dict[int, np.ndarray] | None = None,
) -> int:
    """Replace, in place, the n-gram features of the cross-fitted positions (`chosen`, else
    crossfit_rows) by those of a table fitted on the other training workloads only; returns how
    many positions were replaced.

    Leave-one-out features on the table's own runs say what the n-gram knows about a workload it
    was trained on; on a program it never saw, its contexts come from other programs and are
    often confidently wrong. Trained on the first kind alone, the network trusts them on the
    second (studies/model_variants/model_variants.json); cross-fitted blocks teach it when not to.
    """
    if chosen is None:
        chosen = crossfit_rows(runs, cfg, others)
    starts = np.cumsum([0] + [r.n_tokens for r in runs])
    replaced = 0
    for i, rows in chosen.items():
        r = runs[i]
        feats[starts[i] + rows] = others[r.workload].features(
            r.tokens, r.position_in_thread(), leave_one_out=False, rows=rows
        )
        replaced += len(rows)
    return replaced


def training_features(
    table: NGramTable,
    others: dict[str, NGramTable] | None,
    runs: list[TokenRun],
    whole: TokenRun,
    pos: np.ndarray,
    cfg: TrainConfig,
) -> np.ndarray:
    """The training positions' n-gram features: the cross-fitted rows' (crossfit_features) from
    the other workloads' tables, every other row's leave-one-out from `table`, each row looked up
    in its one table only (before, every row was looked up in both, and half of each thrown
    away: ~30 s of the full config's train stage). The same features as the leave-one-out of
    all rows overwritten by crossfit_features (tests/tasks/learning/test_train.py)."""
    # deferred: imported on first use, for start-up time (as in training_tables)
    from tasks.learning.nextcall.model import NGRAM_FEATURES

    feats = np.empty((whole.n_tokens, NGRAM_FEATURES), np.uint8)
    own = np.ones(whole.n_tokens, bool)
    if others is not None:
        chosen = crossfit_rows(runs, cfg, others)
        starts = np.cumsum([0] + [r.n_tokens for r in runs])
        for i, rows in chosen.items():
            own[starts[i] + rows] = False
        crossfit_features(feats, runs, cfg, others, chosen)
    own_rows = np.flatnonzero(own)
    feats[own_rows] = table.features(whole.tokens, pos, leave_one_out=True, rows=own_rows)
    return feats


def training_inputs(cfg: TrainConfig, split: Split) -> TrainingInputs:
    """What cfg's network trains on: the training and validation runs, each concatenated, with
    their feature columns (n-gram, then online counter) and the n-gram table of the training runs."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import online_feature_matrix

    train_run = concat_runs(split.train)
    val_run = concat_runs(split.validation)
    table = train_feats = val_feats = None
    if cfg.model.ngram_features:
        # the table from the training runs only; leave-one-out features on those runs,
        # plain lookups on validation (not in the table), as the in-graph layer computes
        pos_train = train_run.position_in_thread()
        table, others = training_tables(split.train, train_run, pos_train, cfg)
        train_feats = training_features(table, others, split.train, train_run, pos_train, cfg)
        val_feats = table.features(
            val_run.tokens, val_run.position_in_thread(), leave_one_out=False
        )
    if cfg.model.online_features:
        # causal by construction: the same features in training, evaluation and streaming
        orders, ranks = cfg.model.online_orders, cfg.model.online_ranks
        on_train = online_feature_matrix(train_run, orders, ranks)
        on_val = online_feature_matrix(val_run, orders, ranks)
        train_feats = on_train if train_feats is None else np.hstack([train_feats, on_train])
        val_feats = on_val if val_feats is None else np.hstack([val_feats, on_val])
    stacks = {}
    if cfg.model.frame_depth:  # each call's frames, the training's and the validation's
        parts = {"train_stacks": split.train, "val_stacks": split.validation}
        stacks = {k: stack_input(runs, cfg.model.frame_depth) for k, runs in parts.items()}
    names = [r.name for r in split.train]
    return TrainingInputs(train_run, val_run, train_feats, val_feats, table, names, **stacks)


def export_bundle(root: Root, cfg: TrainConfig, path: Path) -> tuple[int, TrainingBundle]:
    """The training bundle of `root`'s split under `cfg` (tasks/learning/nextcall/bundle.py), written to
    `path`; returns its size in bytes and the bundle."""
    if cfg.model.frame_depth:
        raise ValueError(
            "heapcast bundle: a bundle does not carry each call's stack yet; export it with "
            "model.frame_depth: 0 (the config's stack input is trained on this machine only)"
        )
    split = load_split(root, cfg.data)
    if not split.train:
        raise ValueError(f"{root.url}: the split has no training run")
    bundle = TrainingBundle(cfg, training_inputs(cfg, split), list(split.evaluation), root.url)
    return write_bundle(bundle, path), bundle


def fit_model(
    cfg: TrainConfig,
    split: Split,
    ckpt: Path,
    callbacks: list[Any] | tuple = (),
    verbose: int = 2,
) -> tuple[Any, dict[str, Any]]:
    """Train cfg's model on split.train, early stopping on split.validation; resume from `ckpt`.

    Returns (model, facts): facts holds history, predictions_per_second, seconds, initial_epoch.
    """
    return fit_inputs(cfg, training_inputs(cfg, split), ckpt, callbacks, verbose)


def evaluate_model(
    model: Any, cfg: TrainConfig, split: Split, keep: list[RunAnswers] | None = None
) -> tuple[Evaluation, Baselines]:
    """Baselines fitted on split.train (n-gram order on split.validation); every predictor scored
    at eval_positions of each evaluation and held-out run."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import as_sequence_model

    baselines = Baselines.fit(
        split.train, split.validation, cfg.ngram.max_order, cfg.ngram.smoothing
    )
    seq_model = as_sequence_model(model, cfg)
    builder = EvaluationBuilder(
        details={
            "ngram": {
                "order": baselines.ngram.order,
                "max_order": cfg.ngram.max_order,
                "smoothing": cfg.ngram.smoothing,
            },
            MODEL: {"mode": cfg.mode, "kind": cfg.model.kind, "context": cfg.context},
        }
    )
    tables = (
        (UNSEEN_RUNS, split.evaluation),
        (UNSEEN_PROGRAMS, split.unseen_programs),
        (HELDOUT_WORKLOADS, split.heldout),
    )
    _score_runs(builder, tables, seq_model, cfg, baselines, keep)
    return builder.build(), baselines


def score_model_on_unseen_runs(model: Any, cfg: TrainConfig, split: Split) -> Evaluation:
    """The model alone, on the unseen-runs table: all that promotion compares (the champion's
    score, tasks/registry/champion.py: score_of). A champion re-scored on today's split needs
    no baselines (the candidate's are the same: same split, same n-gram settings) and no other
    table; scoring them doubled a quick night's registration (measured: 78 s)."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import as_sequence_model

    builder = EvaluationBuilder(
        details={MODEL: {"mode": cfg.mode, "kind": cfg.model.kind, "context": cfg.context}},
        predictors=(MODEL,),
    )
    seq_model = as_sequence_model(model, cfg)
    _score_runs(builder, ((UNSEEN_RUNS, split.evaluation),), seq_model, cfg, None)
    return builder.build()


def _score_runs(
    builder,
    tables,
    seq_model,
    cfg: TrainConfig,
    baselines: Baselines | None,
    keep: list[RunAnswers] | None = None,
):
    """Every predictor's answers at eval_positions of each run of each (table, runs) (a model
    that reads the stack: with each run's TokenRun.stacks); the model's top-5 on
    each run appended to `keep` when given. With the baselines, the network's
    and the counter's whole distributions are read once and their per-thread mixture with the
    majority (tasks/learning/nextcall/hedge.py) is scored as HEDGED_NEXT."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import predict_distribution, predict_positions

    for table, runs in tables:
        for run in runs:
            pos = eval_positions(run)
            if not len(pos):
                continue
            y = run.tokens[pos]
            if baselines is None:
                answers = {
                    MODEL: predict_positions(seq_model, run, cfg.context, cfg.eval_batch_size)
                }
            else:
                answers, counter = baselines.predict_with_counter(run, pos)
                net = predict_distribution(seq_model, run, cfg.context, cfg.eval_batch_size)
                answers[MODEL] = ranked(net, y)
                answers[HEDGED_NEXT] = hedged_next(
                    [net, counter, baselines.majority.probs],
                    thread_of(run.offsets, pos),
                    y,
                    candidates=[answers[ONLINE_COUNTER].top, answers[MODEL].top],
                )
                del net, counter
            builder.add(table, run.workload, y, answers)
            if keep is not None:
                keep.append(
                    RunAnswers(run.workload, run.run, tokens_digest(run), top=answers[MODEL].top)
                )


def input_example(
    run: TokenRun,
    context: int,
    online_orders: list[int] | None = None,
    online_ranks: int = 1,
    frame_depth: int = 0,
) -> np.ndarray | dict[str, np.ndarray]:
    """int32 [1, context]: the first tokens of a run's longest thread (zero-padded); with
    `online_orders`, {"tokens": that, "online": int32 [1, context, online_width]} (the online
    features, with the counter's top `online_ranks` candidates); with `frame_depth`, "frames"
    besides: int32 [1, context, frame_depth, FRAME_PIECES] of padding (calls without a stack)."""
    example = _token_example(run, context, online_orders, online_ranks)
    if not frame_depth:
        return example
    out = example if isinstance(example, dict) else {"tokens": example}
    return {**out, "frames": np.zeros((1, context, frame_depth, FRAME_PIECES), np.int32)}


def _token_example(
    run: TokenRun, context: int, online_orders: list[int] | None, online_ranks: int
) -> np.ndarray | dict[str, np.ndarray]:
    longest = int(np.argmax(run.thread_lengths())) if run.n_threads else 0
    start = int(run.offsets[longest]) if run.n_threads else 0
    n = min(context, int(run.thread_lengths()[longest])) if run.n_threads else 0
    out = np.zeros((1, context), np.int32)
    out[0, :n] = run.tokens[start : start + n]
    if online_orders is None:
        return out
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import online_feature_matrix, online_width

    thread = TokenRun(run.workload, run.run, run.tokens[start : start + n], np.array([0, n]))
    online = np.zeros((1, context, online_width(online_ranks)), np.int32)
    online[0, :n] = online_feature_matrix(thread, online_orders, online_ranks)
    return {"tokens": out, "online": online}


class EvaluationTooSmall(ValueError):
    """The evaluation runs hold fewer scored positions than data.min_eval_positions."""


def require_evaluation(split: Split, minimum: int, where: str) -> int:
    """The scored positions of the evaluation runs (the unseen-runs table); EvaluationTooSmall
    when fewer than `minimum`: broken data (replays cut short, an input that traced nothing)
    would score a model on a handful of calls, so nothing is trained or registered."""
    n = sum(len(eval_positions(r)) for r in split.evaluation)
    if n < minimum:
        runs = ", ".join(f"{r.workload}/{r.run}" for r in split.evaluation) or "none"
        raise EvaluationTooSmall(
            f"{where}: the evaluation runs ({runs}) hold {n:,} scored positions, fewer than "
            f"data.min_eval_positions={minimum:,}: nothing trained or registered, the champion "
            "is left alone"
        )
    return n
