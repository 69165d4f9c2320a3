"""Baselines: exact answers on hand-made sequences."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.learning.counters.baselines import NONE, Baselines, Majority, NGram, RepeatLast, fill_top


def run_of(*threads: list[int], name: str = "r") -> TokenRun:
    tokens = np.concatenate([np.asarray(t, np.uint8) for t in threads])
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in threads])]).astype(np.int64)
    return TokenRun("w", name, tokens, offsets)


def top1(y: np.ndarray, pred) -> float:
    return float((pred.top1 == y).mean())


def test_repeat_last_scores_two_thirds_on_1_2_2_2():
    # GIVEN a thread 1 2 2 2 (3 scored positions: 2, 2, 2 after 1, 2, 2)
    r = run_of([1, 2, 2, 2])
    pos = eval_positions(r)
    # WHEN the previous token is repeated
    pred = RepeatLast.fit([r]).predict(r, pos)
    # THEN 2 of 3 are right and the next candidates are the older tokens
    assert top1(r.tokens[pos], pred) == pytest.approx(2 / 3)
    assert pred.top[1, :2].tolist() == [2, 1]


def test_repeat_last_never_looks_into_another_thread():
    r = run_of([7, 7], [3, 3])
    pred = RepeatLast.fit([r]).predict(r, eval_positions(r))
    assert pred.top1.tolist() == [7, 3]


def test_majority_is_exact_and_smoothed():
    train = run_of([5, 5, 5, 7])
    ev = run_of([5, 7, 5])
    pos = eval_positions(ev)  # labels 7, 5
    pred = Majority.fit([train], smoothing=0.5).predict(ev, pos)
    assert pred.top1.tolist() == [5, 5]
    assert pred.top[0, 1] == 7
    assert top1(ev.tokens[pos], pred) == 0.5
    # p(7) = (1 + 0.5) / (4 + 64 * 0.5)
    assert pred.p_true[0] == pytest.approx(1.5 / 36)


def test_ngram_is_perfect_on_a_periodic_sequence():
    # GIVEN a period where the token after 3 depends on the two before (3 5 7 | 3 5 11)
    period = [3, 5, 7, 9, 3, 5, 11]
    train = run_of(period * 30)
    ev = run_of(period * 10, name="other")
    pos = eval_positions(ev)
    ngram = NGram.fit([train], max_order=8)
    order = ngram.choose_order([train], [eval_positions(train)])
    # WHEN predicting with back-off at the chosen order
    pred = ngram.predict(ev, pos)
    y = ev.tokens[pos]
    # THEN every position past the first few is right, the low orders are not enough
    assert order >= 3
    assert ngram.validation_top1[2] < 1.0 and ngram.validation_top1[order] > 0.98
    assert top1(y[order:], type(pred)(pred.top[order:], pred.p_true[order:])) == 1.0
    assert np.all(np.isfinite(np.log(pred.p_true)))


def test_ngram_backs_off_and_respects_thread_boundaries():
    # GIVEN threads [1 2] and [3 4]: in a flat array 2 would be followed by 3
    train = run_of([1, 2], [3, 4], [1, 2])
    ev = run_of([2, 3])
    ngram = NGram.fit([train], max_order=2)
    pred = ngram.predict(ev, eval_positions(ev), order=2)
    # THEN context [2] is unknown (nothing follows 2 in a thread): the unigram answers
    assert pred.top1[0] == 1  # most frequent training token (1 and 2 tie; 1 first)
    assert pred.p_true[0] == pytest.approx(ngram.majority.probs[3])


def test_ngram_top5_is_filled_and_distinct():
    train = run_of([1, 2, 1, 3] * 5)
    ev = run_of([1, 2, 1, 3])
    pred = NGram.fit([train], max_order=2).predict(ev, eval_positions(ev), order=2)
    for row in pred.top:
        assert NONE not in row and len(set(row.tolist())) == 5


def test_fill_top_dedupes_in_order():
    cand = np.array([[4, 4, NONE, 2], [NONE, NONE, NONE, NONE]], np.uint8)
    top = fill_top(cand, np.array([2, 9, 4, 8, 1], np.uint8), k=4)
    assert top.tolist() == [[4, 2, 9, 8], [2, 9, 4, 8]]


def test_baselines_answer_the_same_positions():
    train = run_of([1, 2, 3] * 20, [4, 5] * 10)
    val = run_of([1, 2, 3] * 5)
    ev = run_of([1, 2, 3] * 4, [4, 5, 4])
    b = Baselines.fit([train], [val], max_order=4)
    pos = eval_positions(ev)
    answers = b.predict(ev, pos)
    assert set(answers) == {"majority", "repeat_last", "ngram", "ngram_online"}
    assert all(len(p) == len(pos) for p in answers.values())
    truth = ev.tokens[pos]
    assert top1(truth, answers["ngram"]) > top1(truth, answers["majority"])
    # the online counter learns each run from its own past: the repeated pattern is soon exact
    assert top1(truth, answers["ngram_online"]) > top1(truth, answers["majority"])


def test_top_of_is_the_stable_argsort_of_every_row_ties_lower_token_first():
    """The evaluation's top-5 of a distribution: the stable argsort's, for float32 and float64,
    with ties (equal values, zeros) answered lower token first."""
    from tasks.learning.predictions import top_of

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        p = rng.dirichlet(np.full(64, 0.3), 2000).astype(dtype)
        p[:300] = np.round(p[:300], 1)  # many ties
        p[300:310] = 0
        want = np.argsort(-p, axis=1, kind="stable")[:, :5].astype(np.uint8)
        assert np.array_equal(top_of(p), want)
    assert top_of(np.array([[0.1, 0.3, 0.3, 0.3]])).tolist() == [[1, 2, 3, 0]]


def test_fill_top_matches_a_row_by_row_reading():
    rng = np.random.default_rng(1)
    cand = rng.integers(0, 64, (500, 12)).astype(np.uint8)
    cand[rng.random(cand.shape) < 0.5] = NONE
    fallback = np.array([7, 3, 7, 9, 1], np.uint8)
    want = []
    for row in cand:
        seen = [t for t in dict.fromkeys([*row.tolist(), *fallback.tolist()]) if t != NONE][:5]
        want.append(seen + [NONE] * (5 - len(seen)))
    assert fill_top(cand, fallback).tolist() == want
