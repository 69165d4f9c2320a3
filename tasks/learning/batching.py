"""Answering a Keras model at one batch shape.

A call whose batch is shorter than the others makes the backend trace (TensorFlow) or compile
(JAX, once per shape, on a GPU too) the model once more: ~6 CPU s for the quick night's next-call
model, for a few rows. The last batch is filled up to the full size with copies of its last row,
answered, and the copies' answers dropped.
"""

from __future__ import annotations

import numpy as np


def filled(a: np.ndarray, rows: int) -> np.ndarray:
    """`a` [b, ...] with its last row repeated up to `rows` rows (b >= 1)."""
    a = np.asarray(a)
    if len(a) >= rows:
        return a
    return np.concatenate([a, np.repeat(a[-1:], rows - len(a), axis=0)])


def full_batches(rows: int, batch_size: int) -> int:
    """The rows `rows` rows take once their last batch is filled to `batch_size`."""
    return -(-rows // batch_size) * batch_size
