"""The next-call models (Keras 3), and the model's answers at the scored positions.

The article's network: a frozen one-hot embedding of the 64 tokens, LSTM 128 -> LSTM 64, a
dense softmax over 64. Here the recurrent kind (LSTM or GRU), units, layers and dropout are
settings. In `sequence` mode the last recurrent layer returns sequences and the dense layer
runs at every step (one forward pass, one prediction per position); in `windows` mode it
returns only its last state (the article's one window -> one label).

GPU: the recurrent layers keep cuDNN's conditions (tanh/sigmoid, recurrent_dropout 0,
unroll False, use_bias True), so Keras picks the cuDNN kernel when a GPU is present, and the
float16 mixed policy is set only then; the softmax stays float32 either way. The same code
runs on the CPU.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tasks.baselines import TOP_K, Predictions
from tasks.sequences import TokenRun, eval_positions
from tasks.tokens import N_TOKENS
from tasks.train_config import TrainConfig

OPTIMIZERS = {
    "adam": keras.optimizers.Adam,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}


def gpu_present() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def set_precision_policy() -> str:
    """mixed_float16 where a GPU is present, float32 elsewhere; returns the policy's name."""
    name = "mixed_float16" if gpu_present() else "float32"
    keras.mixed_precision.set_dtype_policy(name)
    return name


def learning_rate(cfg: TrainConfig, total_steps: int | None = None):
    """cfg.learning_rate, or a cosine decay over `total_steps` (lr_schedule: cosine)."""
    if cfg.lr_schedule == "constant" or not total_steps:
        return cfg.learning_rate
    return keras.optimizers.schedules.CosineDecay(
        cfg.learning_rate, decay_steps=int(total_steps), alpha=cfg.lr_floor
    )


def build_model(cfg: TrainConfig, mode: str | None = None, total_steps: int | None = None) -> keras.Model:
    """The network of `cfg.model` for `mode` (default cfg.mode), compiled with cfg's optimizer.

    `total_steps` (the planned training steps) shapes a cosine learning-rate schedule."""
    mode = mode or cfg.mode
    set_precision_policy()
    layer_cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[cfg.model.kind]
    length = None if mode == "sequence" else cfg.context  # a sequence model takes any length
    inputs = keras.Input(shape=(length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(
        N_TOKENS,
        N_TOKENS,
        embeddings_initializer=keras.initializers.Identity(),
        trainable=False,
        name="onehot",
    )(inputs)
    units = cfg.model.units
    for i, n in enumerate(units):
        last = i == len(units) - 1
        x = layer_cls(
            n,
            return_sequences=(mode == "sequence") or not last,
            dropout=cfg.model.dropout,
            recurrent_dropout=0.0,  # cuDNN condition
            unroll=False,  # cuDNN condition
            name=f"{cfg.model.kind}_{i}",
        )(x)
    outputs = keras.layers.Dense(N_TOKENS, activation="softmax", dtype="float32", name="next")(x)
    model = keras.Model(inputs, outputs, name=f"heapcast_{cfg.model.kind}_{mode}")
    model.compile(
        optimizer=OPTIMIZERS[cfg.optimizer](
            learning_rate=learning_rate(cfg, total_steps), clipnorm=cfg.clipnorm
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=TOP_K, name="top5"),
        ],
    )
    return model


def as_sequence_model(model: keras.Model, cfg: TrainConfig) -> keras.Model:
    """A sequence-mode twin with the same weights (a windows model scored at every position).

    The weights of a recurrent layer do not depend on return_sequences, so a model trained on
    windows runs unchanged over evaluation chunks; it then sees up to 2*context previous tokens
    instead of exactly `context`.
    """
    if cfg.mode == "sequence":
        return model
    twin = build_model(cfg, mode="sequence")
    twin.set_weights(model.get_weights())
    return twin


def predict_positions(seq_model: keras.Model, run: TokenRun, context: int, batch_size: int) -> Predictions:
    """A sequence-mode model's top-5 and p(true token) at eval_positions(run), in order.

    Stateless chunks of 2*context with a warm-up prefix (tasks.sequences.eval_chunks): every
    scored position past a thread's first 2*context tokens has >= context tokens in view.
    """
    from tasks.token_data import eval_dataset

    ds, lo, hi = eval_dataset(run, context, batch_size)

    @tf.function(reduce_retracing=True)
    def step(x, y):
        probs = tf.cast(seq_model(x, training=False), tf.float32)
        top = tf.math.top_k(probs, k=TOP_K).indices
        p_true = tf.gather(probs, y, batch_dims=2)
        return top, p_true

    out = np.arange(2 * context)[None, :]
    tops, ps = [], []
    done = 0
    for x, y in ds:  # one step per batch of chunks
        top, p_true = step(x, y)
        b = len(top)
        keep = (out >= lo[done : done + b, None]) & (out < hi[done : done + b, None])
        tops.append(top.numpy()[keep].astype(np.uint8))
        ps.append(p_true.numpy()[keep].astype(np.float64))
        done += b
    top = np.concatenate(tops) if tops else np.zeros((0, TOP_K), np.uint8)
    p = np.concatenate(ps) if ps else np.zeros(0)
    expected = len(eval_positions(run))
    if len(p) != expected:
        raise AssertionError(f"{run.name}: scored {len(p)} positions, expected {expected}")
    return Predictions(top, p)
