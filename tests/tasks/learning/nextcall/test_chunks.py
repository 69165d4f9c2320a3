"""The network's training chunks and evaluation chunks, cut from a run's flat token array."""

from __future__ import annotations

import numpy as np

from tasks.dataset.token_runs import (
    TokenRun,
    eval_positions,
)
from tasks.learning.nextcall.chunks import eval_chunks, train_chunks, window_starts


def test_train_chunks_cover_every_target_once():
    run = TokenRun("w", "r", np.arange(37, dtype=np.uint8), np.array([0, 5, 25, 37]))
    starts, first = train_chunks(run, 4)
    covered = np.zeros(37, int)
    for s, f in zip(starts, first):  # a handful of chunks in a test
        covered[s + 1 + f : s + 5] += 1
    # every token but each thread's first is a target exactly once
    expect = np.ones(37, int)
    expect[[0, 5, 25]] = 0
    assert covered.tolist() == expect.tolist()
    assert np.all(starts + 5 <= np.repeat(run.offsets[1:], [1, 5, 3]))


def test_short_threads_give_no_training_chunk():
    run = TokenRun("w", "r", np.zeros(8, np.uint8), np.array([0, 3, 8]))
    starts, _ = train_chunks(run, 4)
    assert starts.tolist() == [3]
    assert window_starts(run, 4).tolist() == [3]


def test_windows_are_every_start_whose_context_and_next_token_lie_in_one_thread():
    # threads of 3, 1, 16 and 20 tokens: the first two are too short for a window of 4 + 1
    run = TokenRun("w", "r", np.zeros(40, np.uint8), np.array([0, 3, 4, 20, 40]))
    assert window_starts(run, 4).tolist() == [*range(4, 16), *range(20, 36)]


def test_eval_chunks_score_exactly_the_eval_positions_with_full_context():
    run = TokenRun("w", "r", np.zeros(250, np.uint8), np.array([0, 1, 30, 250]))
    c = 10
    starts, lo, hi = eval_chunks(run, c)
    scored = np.concatenate([s + 1 + np.arange(a, b) for s, a, b in zip(starts, lo, hi)])
    assert scored.tolist() == eval_positions(run).tolist()
    pos_in = run.position_in_thread()
    in_view = np.concatenate([1 + np.arange(a, b) for a, b in zip(lo, hi)])
    assert np.all(in_view >= np.minimum(pos_in[scored], c))
    assert np.all(in_view <= 2 * c)
