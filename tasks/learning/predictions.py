"""What every predictor answers: its top-5 tokens per position and the probability of the truth.

One format for the model, the baselines and the online counter (tasks.learning.evaluate scores
them side by side), and the training ranking they fall back on when a context says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

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
    """uint8 [n, 5]: each row's most probable tokens, best first (ties: the lower token), as a
    stable argsort of -probs would give them, in one compiled pass over the rows (the argsort
    sorted all 64 columns of every row of every evaluation)."""
    probs = np.ascontiguousarray(probs)
    if probs.dtype not in (np.float32, np.float64):
        probs = probs.astype(np.float64)
    out = np.empty((len(probs), min(TOP_K, probs.shape[1])), np.uint8)
    _top_rows(probs, out)
    return out


@njit(cache=True)
def _top_rows(p, out):
    for r in range(p.shape[0]):
        top_row(p[r], out[r])


@njit(cache=True)
def top_row(p, out):
    """out: p's most probable columns, best first, ties the lower column first (top_of's row;
    the serving stream's too).

    One pass: each column, in order, is inserted below every kept one of at least its value (so
    a tie keeps the lower column first) and the list is cut at its length."""
    k = out.shape[0]
    n = 0
    for j in range(p.shape[0]):
        v = p[j]
        if n == k and not v > p[out[k - 1]]:
            continue
        q = min(n, k - 1)
        while q > 0 and v > p[out[q - 1]]:
            out[q] = out[q - 1]
            q -= 1
        out[q] = j
        n = min(n + 1, k)


def fill_top(candidates: np.ndarray, fallback: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """First k distinct tokens of each row of `candidates` followed by `fallback` (NONE skipped).

    candidates: uint8 [n, m] (NONE = no candidate); fallback: uint8 [k'] (e.g. global ranking).
    Rows with fewer than k distinct tokens end in NONE.
    """
    candidates = np.ascontiguousarray(candidates, dtype=np.uint8)
    fallback = np.ascontiguousarray(fallback, dtype=np.uint8)
    out = np.empty((len(candidates), k), np.uint8)
    _fill_rows(candidates, fallback, out)
    return out


@njit(cache=True)
def _fill_rows(cand, fallback, out):
    k = out.shape[1]
    none = np.uint8(255)
    for r in range(cand.shape[0]):
        got = 0
        for j in range(cand.shape[1] + fallback.shape[0]):
            if got == k:
                break
            t = cand[r, j] if j < cand.shape[1] else fallback[j - cand.shape[1]]
            if t == none:
                continue
            seen = False
            for q in range(got):
                if out[r, q] == t:
                    seen = True
                    break
            if not seen:
                out[r, got] = t
                got += 1
        for q in range(got, k):
            out[r, q] = none


def token_counts(train: list[TokenRun]) -> np.ndarray:
    """float64 [64]: how often each token occurs in the training runs."""
    counts = np.zeros(N_TOKENS, np.float64)
    for r in train:
        counts += np.bincount(r.tokens, minlength=N_TOKENS)
    return counts


def ranking(counts: np.ndarray) -> np.ndarray:
    """uint8 [64]: tokens most frequent first (ties: the lower token)."""
    return np.argsort(-counts, kind="stable").astype(np.uint8)
