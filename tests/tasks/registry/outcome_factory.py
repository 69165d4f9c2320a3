"""Hand-made TrainOutcomes around a tiny real Keras model, for the registration tests.

The model is real (Embedding 64 -> GRU 8 -> Dense 64 softmax, sequence mode: [batch, time, 64]),
the evaluation is small and made by hand so a test can choose which model wins.
"""

from __future__ import annotations

import numpy as np

from tasks.core.storage import Root
from tasks.learning.outcome import DatasetRef, TrainOutcome
from tasks.learning.scores import (
    BASELINES,
    HEDGED_NEXT,
    MODEL,
    OVERALL,
    Evaluation,
    PredictorScores,
)

CONTEXT = 12
WORKLOADS = ("sqlite3", "redis")
HELDOUT = ("git",)
USED = np.array([3, 4, 5, 6, 7, 9, 35, 36, 37, 38, 39, 41])  # classes that occur
BASELINE_TOP1 = {"majority": 0.21, "repeat_last": 0.34, "ngram": 0.90, "ngram_online": 0.88}
HEDGED_TOP1 = 0.905  # the network mixed with the counter per thread


def tiny_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = keras.layers.Embedding(64, 8)(inputs)
    x = keras.layers.GRU(8, return_sequences=True)(x)
    outputs = keras.layers.Dense(64, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def scores_for(predictor: str, slice_: str, table: str, top1: float, rng) -> PredictorScores:
    per_class = np.full(64, np.nan)
    per_class[USED] = np.clip(top1 + rng.normal(0, 0.05, USED.size), 0, 1)
    detail = {"order": 7} if predictor == "ngram" else {}
    return PredictorScores(
        predictor=predictor,
        slice=slice_,
        table=table,
        positions=1000 if slice_ == OVERALL else 500,
        top1=top1,
        top5=min(1.0, top1 + 0.08),
        log_loss=float(-np.log(max(top1, 1e-3))),
        per_class_accuracy=per_class,
        detail=detail,
    )


def make_evaluation(model_top1: float, seed: int = 0) -> Evaluation:
    rng = np.random.default_rng(seed)
    scores = []
    for table, slices in (
        ("unseen_runs", (OVERALL, *WORKLOADS)),
        ("heldout_workloads", (OVERALL, *HELDOUT)),
    ):
        for s in slices:
            scores.append(scores_for(MODEL, s, table, model_top1, rng))
            scores.append(scores_for(HEDGED_NEXT, s, table, HEDGED_TOP1, rng))
            for b in BASELINES:
                scores.append(scores_for(b, s, table, BASELINE_TOP1[b], rng))
    confusion = np.zeros((64, 64), dtype=np.int64)
    for t in USED:
        row = rng.multinomial(100, rng.dirichlet(np.ones(USED.size)))
        confusion[t, USED] = row
        confusion[t, t] += 300
    return Evaluation(scores=tuple(scores), confusion=confusion)


def make_outcome(
    model, model_top1: float, content_hash: str = "c0ffee" * 6, seed: int = 0
) -> TrainOutcome:
    hist = np.zeros(64, dtype=np.int64)
    hist[USED] = np.arange(1, USED.size + 1) * 1000
    dataset = DatasetRef(
        root=Root.from_url("/tmp/heapcast-test-root"),
        train_runs=(("sqlite3", "r1"), ("redis", "r1")),
        eval_runs=(("sqlite3", "r2"), ("redis", "r2")),
        heldout_runs=(("git", "r1"),),
        validation_runs=(("sqlite3", "r3"),),
        train_tokens=int(hist.sum()),
        eval_tokens=4000,
        content_hash=content_hash,
        token_histogram=hist,
    )
    config = {
        "data": {
            "workloads": list(WORKLOADS),
            "heldout_workloads": list(HELDOUT),
            "runs": {"sqlite3": {"train": ["r1"], "evaluation": ["r2"]}},
            "max_train_tokens": None,
        },
        "model": {"kind": "gru", "units": [8], "dropout": 0.0},
        "context": CONTEXT,
        "epochs": 3,
        "learning_rate": 0.001,
        "seed": seed,
    }
    history = {
        "loss": [2.1, 1.5, 1.2],
        "val_loss": [2.0, 1.6, 1.4],
        "accuracy": [0.4, 0.6, 0.7],
        "val_accuracy": [0.42, 0.58, 0.66],
    }
    example = np.random.default_rng(seed).integers(0, 64, size=(2, CONTEXT)).astype(np.int32)
    return TrainOutcome(
        model=model,
        config=config,
        dataset=dataset,
        history=history,
        evaluation=make_evaluation(model_top1, seed),
        predictions_per_second=12345.0,
        seconds=3.5,
        input_example=example,
        notes=[f"validation of redis/r1 is the last 10% of its threads (seed {seed})"],
        placement={
            "backend": "jax",
            "device": "gpu: NVIDIA H200",
            "replicas": "1",
            "precision": "mixed_bfloat16",
            "batch_size": "1024",
        },
    )
