"""Fitting the next-call network on prepared inputs: on whichever backend and devices this process
has (tasks/learning/nextcall/backend.py), resuming a killed training from its checkpoints.

No Prefect or MLflow here: a machine lent for its accelerator runs this module on an exported
training bundle (tasks/learning/nextcall/bundle.py, scripts/gpu_check.sh) with only Keras carried to it.
`train.training_inputs` builds the inputs from a night's split.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.dataset.token_runs import TokenRun
from tasks.learning.nextcall.backend import data_parallel, out_of_memory, placement
from tasks.learning.nextcall.stack_input import StackInput
from tasks.learning.train_config import TrainConfig

if TYPE_CHECKING:  # deferred at run time: the model module imports Keras at its top
    from tasks.learning.nextcall.model import NGramTable


@dataclass
class TrainingInputs:
    """What the network trains on; features row i describes token i+1 (model.py's rule)."""

    train_run: TokenRun  # the training runs, concatenated
    val_run: TokenRun  # the validation runs, concatenated
    train_feats: np.ndarray | None  # uint8 [train tokens, F]: n-gram (leave-one-out), online
    val_feats: np.ndarray | None  # uint8 [validation tokens, F]: n-gram (plain), online
    table: NGramTable | None  # the training runs' n-gram table (model.ngram_features)
    train_names: list[str]  # the training runs' names, for messages
    # each call's stack (model.frame_depth > 0), rows aligned with train_run / val_run
    train_stacks: StackInput | None = None
    val_stacks: StackInput | None = None


class TrainingOutOfMemory(RuntimeError):
    """The accelerator ran out of memory; the message names the batch size to lower."""


def backup_readable(backup: Path) -> bool:
    """Whether keras.callbacks.BackupAndRestore can resume from `backup`: a process killed
    while writing it leaves a truncated weights file or metadata, which would fail every later
    training of the same config and data."""

    # deferred: imported on first use, for start-up time
    import h5py

    try:
        epoch = json.loads((backup / "training_metadata.json").read_text())["epoch"]
        with h5py.File(backup / "latest.weights.h5", "r"):
            pass
        return isinstance(epoch, int)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _read_history(path: Path) -> dict[str, list[float]]:
    if not path.exists():
        return {}
    with path.open() as f:
        rows = list(csv.DictReader(f))
    keys = [k for k in (rows[0] if rows else {}) if k != "epoch"]
    return {k: [float(r[k]) for r in rows] for k in keys}


def fit_inputs(
    cfg: TrainConfig,
    inputs: TrainingInputs,
    ckpt: Path,
    callbacks: list[Any] | tuple = (),
    verbose: int = 2,
) -> tuple[Any, dict[str, Any]]:
    """Train cfg's model on `inputs`, early stopping on their validation run; resume from `ckpt`.

    Returns (model, facts): facts holds history, predictions_per_second, seconds, initial_epoch,
    where it trained (placement) and the batch size it used.
    """
    # deferred: imported on first use, for start-up time
    import keras

    from tasks.learning.nextcall.model import build_hybrid, build_model

    keras.utils.set_random_seed(cfg.seed)
    table, b = inputs.table, cfg.batch_size
    where = placement()
    if where.on_gpu and cfg.gpu_batch_size:
        b = cfg.gpu_batch_size  # the batch an accelerator prefers (configs/train.yaml)
    train_ds, n, val_ds, n_val, per_batch = _datasets(cfg, inputs, b)
    steps = train_ds.steps = cfg.steps_per_epoch or max(1, n // b)
    monitor = "val_loss" if n_val else "loss"

    backup, history_csv, discarded = _resumable(ckpt)
    meter = _throughput_meter(per_batch)
    start_epoch = _epoch_recorder()
    with data_parallel(where, b):  # over every device the backend sees (one: as it is)
        if cfg.model.ngram_features or cfg.model.online_features or cfg.model.frame_depth:
            model, full = build_hybrid(cfg, table, total_steps=cfg.epochs * steps)
        else:
            model = full = build_model(cfg, total_steps=cfg.epochs * steps)
        _fit(
            model,
            train_ds,
            val_ds if n_val else None,
            cfg,
            where,
            b,
            per_batch,
            verbose,
            [
                *_checkpoints(cfg, ckpt, backup, history_csv, monitor, train_ds),
                meter,
                start_epoch,
                *callbacks,
            ],
        )
    facts = {
        "history": _read_history(history_csv),
        "predictions_per_second": meter.rate(),
        "seconds": meter.seconds,
        "predictions": meter.predictions,
        "initial_epoch": start_epoch.first if start_epoch.first is not None else 0,
        "steps_per_epoch": steps,
        "train_units": n,
        "discarded_backup": discarded,
        "placement": where,
        "batch_size": b,
    }
    if table is not None:
        facts["ngram_table_keys"] = int(len(table.keys))
    return full, facts


def _datasets(cfg: TrainConfig, inputs: TrainingInputs, b: int) -> tuple[Any, int, Any, int, int]:
    """(train batches, training units, validation batches, validation units, predictions per
    batch) for cfg's mode; ValueError when the runs give less than one batch."""
    # deferred: Keras at its top, imported on first use
    from tasks.learning.nextcall.token_data import sequence_dataset, windows_dataset

    c, train_run, val_run = cfg.context, inputs.train_run, inputs.val_run
    if cfg.mode == "sequence":
        chunk = c * cfg.train_chunk_contexts
        train_ds, n = sequence_dataset(
            train_run,
            chunk,
            b,
            seed=cfg.seed,
            features=inputs.train_feats,
            stacks=inputs.train_stacks,
        )
        val_ds, n_val = sequence_dataset(
            val_run,
            chunk,
            b,
            shuffle=False,
            repeat=False,
            features=inputs.val_feats,
            stacks=inputs.val_stacks,
        )
        per_batch = b * chunk
    else:
        train_ds, n = windows_dataset(train_run, c, b, seed=cfg.seed)
        val_ds, n_val = windows_dataset(
            val_run, c, b, shuffle=False, repeat=False, max_windows=cfg.validation_windows
        )
        per_batch = b
    if n < b:
        raise ValueError(
            f"{n} training {'chunks' if cfg.mode == 'sequence' else 'windows'} of context {c} "
            f"in {inputs.train_names}: fewer than one batch of {b}; "
            f"lower batch_size or context, or add runs"
        )
    return train_ds, n, val_ds, n_val, per_batch


def _resumable(ckpt: Path) -> tuple[Path, Path, bool]:
    """(the backup folder, the curves' CSV, whether an unreadable backup was discarded): a
    backup torn by a kill while it was written cannot be resumed from, so training starts over;
    curves without a backup belong to an earlier training and start anew."""
    ckpt.mkdir(parents=True, exist_ok=True)
    backup = ckpt / "backup"
    history_csv = ckpt / "history.csv"
    resuming = backup.exists() and any(backup.iterdir())
    discarded = resuming and not backup_readable(backup)
    if discarded:
        shutil.rmtree(backup)
        resuming = False
    if not resuming and history_csv.exists():
        history_csv.unlink()
    return backup, history_csv, discarded


def _checkpoints(cfg, ckpt: Path, backup: Path, history_csv: Path, monitor: str, train_ds) -> list:
    """The callbacks that make a training resumable and keep its best weights and curves."""
    import keras  # deferred: imported on first use, for start-up time

    return [
        # order matters: the backup is written before any later callback can fail
        keras.callbacks.BackupAndRestore(str(backup)),
        keras.callbacks.ModelCheckpoint(
            str(ckpt / "best.weights.h5"),
            monitor=monitor,
            save_best_only=True,
            save_weights_only=True,
        ),
        keras.callbacks.EarlyStopping(
            monitor=monitor, patience=cfg.patience, restore_best_weights=True
        ),
        keras.callbacks.CSVLogger(str(history_csv), append=True),
        # a resumed training draws the batches an uninterrupted one would have
        keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: setattr(train_ds, "epoch", epoch)
        ),
    ]


def _fit(model, train_ds, val_ds, cfg, where, b: int, per_batch: int, verbose: int, callbacks):
    """model.fit; an accelerator out of memory is one line naming the batch size to lower."""
    try:
        model.fit(
            train_ds,
            epochs=cfg.epochs,
            validation_data=val_ds,
            verbose=verbose,
            callbacks=callbacks,
        )
    except Exception as e:
        if out_of_memory(e):
            raise TrainingOutOfMemory(
                f"training on {where.line()} ran out of memory at batch size {b} "
                f"({per_batch:,} positions a step): lower "
                f"{'gpu_batch_size' if where.on_gpu and cfg.gpu_batch_size else 'batch_size'} "
                "in the training config and run again"
            ) from e
        raise


def placement_facts(where: Any, batch_size: int) -> dict[str, str]:
    """What a run logs of where it trained (params `train.backend`, `train.device`, ...)."""
    return {
        "backend": where.backend,
        "device": where.device,
        "replicas": str(where.replicas),
        "precision": where.precision,
        "batch_size": str(batch_size),
    }


def _throughput_meter(per_batch: int):
    """A callback timing training steps (data, forward, backward, update), not validation."""
    # deferred: imported on first use, for start-up time
    import keras

    class ThroughputMeter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds = 0.0
            self.batches = 0
            self._t0 = 0.0
            self._seen = 0

        def on_train_batch_begin(self, batch, logs=None):
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self._seen += 1
            if self._seen <= 2:  # the first steps trace and compile the graph
                return
            self.seconds += time.perf_counter() - self._t0
            self.batches += 1

        @property
        def predictions(self) -> int:
            return self.batches * per_batch

        def rate(self) -> float:
            return self.predictions / self.seconds if self.seconds > 0 else float("nan")

    return ThroughputMeter()


def _epoch_recorder():
    # deferred: imported on first use, for start-up time
    import keras

    class EpochRecorder(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.first: int | None = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.first is None:
                self.first = int(epoch)

    return EpochRecorder()
