"""tf.data pipelines over a run's flat token array (imports TensorFlow; keep it out of cheap paths).

The data in memory is the trace itself (uint8, one byte per call) plus an int64 start per
chunk: a batch is cut out of the flat array with one `tf.gather` of `starts[:, None] + range`,
so neither the article's window matrix (context x trace) nor one Python step per sample exists.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tasks.learning.sequences import TokenRun, eval_chunks, train_chunks, window_starts

AUTOTUNE = tf.data.AUTOTUNE


def _padded(tokens: np.ndarray, pad: int) -> tf.Tensor:
    return tf.constant(np.concatenate([tokens, np.zeros(pad, np.uint8)]), dtype=tf.uint8)


def sequence_dataset(
    run: TokenRun,
    context: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    features: np.ndarray | None = None,
) -> tuple[tf.data.Dataset, int]:
    """(dataset of (x [B, c] int32, y [B, c] int32, weight [B, c] float32), number of chunks).

    `features` (uint8 [n_tokens, F], aligned with run.tokens: row i describes token i+1, e.g.
    the n-gram features of tasks.learning.model.NGramTable): x becomes (tokens, features [B, c, F]).

    Chunks come from tasks.learning.sequences.train_chunks: a loss at every position of every chunk,
    weight 0 only where an end-aligned chunk repeats targets of the chunk before it. With
    `repeat`, batches are full (drop_remainder) and the stream is endless: give Keras a
    steps_per_epoch.
    """
    starts, first = train_chunks(run, context)
    tokens = _padded(run.tokens, context + 1)
    offsets = tf.range(context + 1, dtype=tf.int64)
    positions = tf.range(context, dtype=tf.int32)
    feats = None
    if features is not None:
        if len(features) != len(run.tokens):
            raise ValueError(f"{len(features)} feature rows for {len(run.tokens)} tokens")
        pad = np.zeros((context + 1, features.shape[1]), np.uint8)
        feats = tf.constant(np.concatenate([features, pad]), dtype=tf.uint8)
    ds = tf.data.Dataset.from_tensor_slices((starts, first))
    if shuffle and len(starts):
        ds = ds.shuffle(len(starts), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    def cut(s, f):
        idx = s[:, None] + offsets[None, :]
        chunk = tf.cast(tf.gather(tokens, idx), tf.int32)
        weight = tf.cast(positions[None, :] >= f[:, None], tf.float32)
        if feats is None:
            return chunk[:, :-1], chunk[:, 1:], weight
        x_feat = tf.cast(tf.gather(feats, idx[:, :-1]), tf.int32)
        return (chunk[:, :-1], x_feat), chunk[:, 1:], weight

    ds = ds.batch(batch_size, drop_remainder=repeat).map(cut, num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE), len(starts)


def windows_dataset(
    run: TokenRun,
    context: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    max_windows: int | None = None,
) -> tuple[tf.data.Dataset, int]:
    """The article's formulation: (x [B, c] int32, y [B] int32), one window per label.

    Still cut from the flat array (one start per window), never a materialised matrix.
    `max_windows` keeps an evenly spaced sample (validation).
    """
    starts = window_starts(run, context)
    if max_windows is not None and len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).astype(np.int64)]
    tokens = _padded(run.tokens, context + 1)
    offsets = tf.range(context, dtype=tf.int64)
    ds = tf.data.Dataset.from_tensor_slices(starts)
    if shuffle and len(starts):
        ds = ds.shuffle(min(len(starts), 1_000_000), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    def cut(s):
        x = tf.cast(tf.gather(tokens, s[:, None] + offsets[None, :]), tf.int32)
        y = tf.cast(tf.gather(tokens, s + context), tf.int32)
        return x, y

    ds = ds.batch(batch_size, drop_remainder=repeat).map(cut, num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE), len(starts)


def eval_dataset(
    run: TokenRun, context: int, batch_size: int, features: np.ndarray | None = None
) -> tuple[tf.data.Dataset, np.ndarray, np.ndarray]:
    """Evaluation chunks (tasks.learning.sequences.eval_chunks) as (x [B, 2c], y [B, 2c]) int32.

    Returns the dataset and each chunk's scored output range (lo, hi). Inputs beyond a thread's
    end are padding or the next thread: the model is causal and those outputs are not scored.
    `features` (uint8 [n_tokens, F], row i describing token i+1, e.g. the online counter's
    answers over the whole thread so far): x becomes (tokens, features [B, 2c, F]).
    """
    starts, lo, hi = eval_chunks(run, context)
    width = 2 * context
    tokens = _padded(run.tokens, width + 1)
    offsets = tf.range(width + 1, dtype=tf.int64)
    feats = None
    if features is not None:
        if len(features) != len(run.tokens):
            raise ValueError(f"{len(features)} feature rows for {len(run.tokens)} tokens")
        pad = np.zeros((width + 1, features.shape[1]), np.uint8)
        feats = tf.constant(np.concatenate([features, pad]), dtype=tf.uint8)

    def cut(s):
        idx = s[:, None] + offsets[None, :]
        chunk = tf.cast(tf.gather(tokens, idx), tf.int32)
        if feats is None:
            return chunk[:, :-1], chunk[:, 1:]
        return (chunk[:, :-1], tf.cast(tf.gather(feats, idx[:, :-1]), tf.int32)), chunk[:, 1:]

    ds = (
        tf.data.Dataset.from_tensor_slices(starts)
        .batch(batch_size)
        .map(cut, num_parallel_calls=AUTOTUNE)
    )
    return ds.prefetch(AUTOTUNE), lo, hi
