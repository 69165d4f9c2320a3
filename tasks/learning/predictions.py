"""What every predictor answers: its top-5 tokens per position and the probability of the truth.

One format for the model, the baselines and the online counter (tasks.learning.evaluate scores
them side by side), and the training ranking they fall back on when a context says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.dataset.token_runs import TokenRun
from tasks.dataset.tokens import N_TOKENS

TOP_K = 5
NONE = np.uint8(255)  # an empty top-k slot


@dataclass(frozen=True)
class Predictions:
    """One predictor's answers at n positions."""

    top: np.ndarray  # uint8 [n, TOP_K], best first; NONE in unused slots
    p_true: np.ndarray  # float64 [n], probability given to the true token

    @property
    def top1(self) -> np.ndarray:
        return self.top[:, 0]

    def __len__(self) -> int:
        return len(self.p_true)


def ranked(probs: np.ndarray, truth: np.ndarray) -> Predictions:
    """A distribution's answers: probs float [n, 64] -> its top-5 (ties: the lower token
    first, as keras.ops.top_k) and the probability of each row's true token."""
    probs = np.asarray(probs)
    return Predictions(top_of(probs), probs[np.arange(len(probs)), truth].astype(np.float64))


def top_of(probs: np.ndarray) -> np.ndarray:
    """uint8 [n, 5]: each row's most probable tokens, best first (ties: the lower token)."""
    return np.argsort(-np.asarray(probs), axis=1, kind="stable")[:, :TOP_K].astype(np.uint8)


def fill_top(candidates: np.ndarray, fallback: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """First k distinct tokens of each row of `candidates` followed by `fallback` (NONE skipped).

    candidates: uint8 [n, m] (NONE = no candidate); fallback: uint8 [k'] (e.g. global ranking).
    """
    n = len(candidates)
    allc = np.concatenate([candidates, np.broadcast_to(fallback, (n, len(fallback)))], axis=1)
    dup = allc == NONE
    for j in range(1, allc.shape[1]):  # over columns (<= ~25), never over events
        dup[:, j] |= (allc[:, :j] == allc[:, j : j + 1]).any(axis=1)
    order = np.argsort(dup, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(allc, order, axis=1)
    top[np.take_along_axis(dup, order, axis=1)] = NONE
    return top.astype(np.uint8)


def token_counts(train: list[TokenRun]) -> np.ndarray:
    """float64 [64]: how often each token occurs in the training runs."""
    counts = np.zeros(N_TOKENS, np.float64)
    for r in train:
        counts += np.bincount(r.tokens, minlength=N_TOKENS)
    return counts


def ranking(counts: np.ndarray) -> np.ndarray:
    """uint8 [64]: tokens most frequent first (ties: the lower token)."""
    return np.argsort(-counts, kind="stable").astype(np.uint8)
