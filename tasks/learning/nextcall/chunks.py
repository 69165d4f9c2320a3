"""Where a run's flat token array is cut: the training chunks, the article's windows and the
evaluation chunks, as index arrays into the array (no window is materialised). No Keras here: the
batches that read them are tasks/learning/nextcall/token_data.py.
"""

from __future__ import annotations

import numpy as np

from tasks.dataset.token_runs import TokenRun


def train_chunks(run: TokenRun, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Training chunks of `context + 1` tokens inside threads, stride `context`.

    Returns (starts, first_scored): chunk i covers tokens[starts[i] : starts[i] + context + 1]
    (inputs = the first `context`, targets = the last `context`). A thread's last chunk is
    aligned to its end so its tail is not lost; the targets it shares with the chunk before are
    weighted 0 (`first_scored` is the first target index that counts). Threads shorter than
    `context + 1` tokens give no chunk.
    """
    lengths = run.thread_lengths()
    ok = lengths >= context + 1
    starts_t, lengths = run.offsets[:-1][ok], lengths[ok]
    if not len(lengths):
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    n_full = (lengths - 1) // context  # chunks of stride `context` that fit entirely
    rem = (lengths - 1) - n_full * context  # targets left after them
    n_chunks = n_full + (rem > 0)
    thread_of = np.repeat(np.arange(len(lengths)), n_chunks)
    k = np.arange(n_chunks.sum()) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    starts = starts_t[thread_of] + k * context
    first = np.zeros(len(starts), np.int32)
    last = k == n_full[thread_of]  # the extra, end-aligned chunk
    end = starts_t[thread_of] + lengths[thread_of]
    starts = np.where(last, end - context - 1, starts)
    first[last] = (context - rem[thread_of][last]).astype(np.int32)
    return starts.astype(np.int64), first


def window_starts(run: TokenRun, context: int) -> np.ndarray:
    """The article's windows: every start whose `context` tokens and next token lie in one thread,
    that is, every token i with i + context before its thread's end (the run's offsets)."""
    ends = np.repeat(run.offsets[1:], np.diff(run.offsets))
    return np.flatnonzero(np.arange(len(run.tokens)) + context < ends).astype(np.int64)


def eval_chunks(run: TokenRun, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stateless evaluation chunks of `2 * context` input tokens with a warm-up prefix.

    Chunk k of a thread starts at thread_start + k * context. Output i of a chunk predicts token
    start + i + 1. Chunk 0 scores outputs 0 .. 2c-1 (all the context the thread has); chunk
    k >= 1 scores outputs c .. 2c-1, so every scored position beyond the thread's first 2c tokens
    has at least `context` previous tokens in view. Together they score exactly
    `eval_positions(run)`, in that order.

    Returns (starts, lo, hi): chunk i scores outputs lo[i] <= o < hi[i].
    """
    lengths = run.thread_lengths()
    n_targets = lengths - 1
    # chunk 0 covers targets 1..2c; chunk k covers (k+1)c+1 .. (k+2)c
    n_chunks = np.where(n_targets <= 0, 0, np.maximum(1, -(-(n_targets - context) // context)))
    thread_of = np.repeat(np.arange(len(lengths)), n_chunks)
    k = np.arange(n_chunks.sum()) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    starts = run.offsets[:-1][thread_of] + k * context
    lo = np.where(k == 0, 0, context)
    hi = np.minimum(2 * context, n_targets[thread_of] - k * context)
    return starts.astype(np.int64), lo.astype(np.int32), hi.astype(np.int32)
