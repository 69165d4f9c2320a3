"""The top-1 headroom (tasks/learning/nextcall/headroom.py): the hindsight n-gram against a plain-Python
reference of its rule, and the counts the scaling study reports."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.learning.nextcall.headroom import Headroom, hindsight_top1


def reference(tokens, offsets, positions, orders):
    """The rule in words: per position, the longest order whose context occurs at another
    position of the same thread; the most frequent next token there (ties: the lower), the
    position's own call left out; -1 if none."""
    thread_of = np.searchsorted(offsets, positions, side="right") - 1
    out = []
    for p, t in zip(positions, thread_of):
        a, b = int(offsets[t]), int(offsets[t + 1])
        seq = [int(x) for x in tokens[a:b]]
        i = p - a
        answer = -1
        for k in sorted(orders, reverse=True):
            if i < k:
                continue
            ctx = seq[i - k : i]
            counts: dict[int, int] = {}
            for j in range(k, len(seq)):
                if j != i and seq[j - k : j] == ctx:
                    counts[seq[j]] = counts.get(seq[j], 0) + 1
            if counts:
                answer = min(counts, key=lambda tok: (-counts[tok], tok))
                break
        out.append(answer)
    return np.array(out)


def run_of(threads: list[list[int]]) -> TokenRun:
    tokens = np.array([t for th in threads for t in th], np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(th) for th in threads])]).astype(np.int64)
    return TokenRun("w", "r", tokens, offsets)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hindsight_matches_the_rule_on_random_threads(seed):
    rng = np.random.default_rng(seed)
    # few distinct tokens so that contexts repeat, several threads of uneven length
    threads = [list(rng.integers(0, 4, size=n)) for n in (1, 40, 300, 7)]
    run = run_of(threads)
    pos = eval_positions(run)
    got = hindsight_top1(run, pos, orders=(4, 2, 1))
    assert got.tolist() == reference(run.tokens, run.offsets, pos, (4, 2, 1)).tolist()
    assert (got >= 0).mean() > 0.9  # contexts repeat: the test compares answers, not -1s


def test_hindsight_never_reads_the_call_it_answers():
    # at position 3 the context (5) is followed by 9 elsewhere and by 7 at the call itself:
    # counting the call itself would tie 7 and 9 and answer 7 (the lower)
    run = run_of([[5, 9, 5, 7]])
    assert hindsight_top1(run, np.array([3]), orders=(1,)).tolist() == [9]


def test_hindsight_reads_the_future_and_keeps_threads_apart():
    # thread 0's first "1 -> 2" is answered from its later one (the future: an optimistic bound);
    # thread 1 says "1 -> 3" many times, and none of it reaches thread 0
    run = run_of([[1, 2, 0, 1, 2], [1, 3, 1, 3, 1, 3, 1, 3]])
    got = hindsight_top1(run, np.array([1, 4]), orders=(1,))
    assert got.tolist() == [2, 2]
    # a context seen nowhere else in its thread has no answer
    assert hindsight_top1(run_of([[1, 2, 3]]), np.array([1, 2]), orders=(1,)).tolist() == [-1, -1]


def test_headroom_counts_and_the_better_of_two():
    truth = np.array([1, 1, 2, 3, 4])
    counter = np.array([1, 1, 0, 0, 4])
    network = np.array([1, 0, 2, 0, 0])
    hindsight = np.array([1, 1, 2, 3, -1])
    h = Headroom.of(truth, counter, network, hindsight)
    assert (h.counter, h.network, h.agree, h.counter_alone, h.network_alone) == (3, 2, 2, 2, 1)
    r = (h + h).rates()
    assert r["positions"] == 10
    assert r["better_of_two"] == 0.8  # the counter's 3 and the network's one alone, of 5
    assert r["hindsight"] == 0.8
    with pytest.raises(ValueError, match="4 counter answers"):
        Headroom.of(truth, counter[:4], network, hindsight)
