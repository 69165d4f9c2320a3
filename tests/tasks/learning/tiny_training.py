"""The tiny training the learning and registry tests train: a few steps of a small network on
synthetic events, `gamma` held out (an unseen program), checkpoints in a folder of the test's."""

from __future__ import annotations

from pathlib import Path

from tasks.learning.train_config import TrainConfig

# the synthetic workloads it trains on (runs each); gamma is the held-out one
TINY_WORKLOADS = {"alpha": 3, "beta": 2, "gamma": 2}
TINY_TRAINING = {
    "data": {"heldout_workloads": ["gamma"]},
    "context": 10,
    "model": {"units": [8]},
    "batch_size": 8,
    "epochs": 2,
    "steps_per_epoch": 3,
    "eval_batch_size": 32,
    "ngram": {"max_order": 4},
}


def tiny_train_config(checkpoint_dir: Path, **overrides) -> TrainConfig:
    """TINY_TRAINING with `overrides` (top-level keys replaced whole), checkpoints in
    `checkpoint_dir`."""
    return TrainConfig.model_validate(
        {**TINY_TRAINING, "checkpoint_dir": str(checkpoint_dir), **overrides}
    )
