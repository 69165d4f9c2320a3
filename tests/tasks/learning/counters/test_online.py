"""The online counter (tasks/learning/counters/online.py) against a plain-Python dict reference."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.learning.counters.baselines import NONE, TOP_K
from tasks.learning.counters.online import (
    DEFAULT_ORDERS,
    NO_TOKEN,
    OnlineCounter,
    OnlineState,
    check_orders,
    online_features,
)

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

N = 64


# --- the reference: the module doc's rule, one dict per thread ------------------------------------


def reference(tokens, offsets, orders, eps=0.1, fallback=None):
    """{"top", "p", "top1", "order", "count", "total", "dist"} per position, by the rule in
    words ("dist": every token's p).

    counts[(k, context)][y] = [count, last position y followed that context]; tokens ranked by
    count, then most recent first.
    """
    fallback = list(range(N)) if fallback is None else [int(t) for t in fallback]
    ext = list(orders) + [0]
    out = {"top": [], "p": [], "top1": [], "order": [], "count": [], "total": [], "dist": []}
    for a, b in zip(offsets[:-1], offsets[1:]):
        seq = [int(t) for t in tokens[a:b]]
        counts: dict = {}
        for i, y in enumerate(seq):
            cand, answered = [], None
            for e, k in enumerate(ext):
                if k > i:
                    continue
                d = counts.get((k, tuple(seq[i - k : i])))
                if d is None:
                    continue
                ranked = sorted(d, key=lambda t, d=d: (-d[t][0], -d[t][1]))
                if answered is None:
                    answered = (e, d, ranked)
                cand += ranked[:TOP_K]
            top = []
            for t in cand + fallback:
                if t not in top:
                    top.append(t)
            top = (top + [int(NONE)] * TOP_K)[:TOP_K]
            if answered is None:
                p, t1, o, c1, tot = 1 / N, NO_TOKEN, 0, 0, 0
                dist = [1 / N] * N
            else:
                e, d, ranked = answered
                tot = sum(v[0] for v in d.values())
                p = (d.get(y, [0])[0] + eps) / (tot + eps * N)
                dist = [(d.get(t, [0])[0] + eps) / (tot + eps * N) for t in range(N)]
                t1, c1 = ranked[0], d[ranked[0]][0]
                o = e + 1 if e < len(ext) - 1 else 0
            for key, v in zip(
                ("top", "p", "top1", "order", "count", "total", "dist"),
                (top, p, t1, o, c1, tot, dist),
            ):
                out[key].append(v)
            for k in ext:
                if k <= i:
                    d = counts.setdefault((k, tuple(seq[i - k : i])), {})
                    d[y] = [d.get(y, [0])[0] + 1, i]
    return {k: np.array(v) for k, v in out.items()}


def random_run(rng, lengths, alphabet) -> TokenRun:
    tokens = rng.choice(np.asarray(alphabet, np.uint8), size=sum(lengths))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenRun("w", "r", tokens.astype(np.uint8), offsets)


def markov_run(rng, lengths, n_states=64, branching=3) -> TokenRun:
    """Patterned: each token has `branching` likely successors (contexts repeat, ties happen)."""
    succ = rng.integers(0, n_states, (n_states, branching))
    out = []
    for n in lengths:
        t = int(rng.integers(n_states))
        for _ in range(n):
            out.append(t)
            t = (
                int(succ[t, rng.integers(branching)])
                if rng.random() < 0.9
                else int(rng.integers(n_states))
            )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenRun("w", "r", np.array(out, np.uint8), offsets)


def assert_equal_to_reference(run, orders, eps=0.1, fallback=None):
    ref = reference(run.tokens, run.offsets, orders, eps, fallback)
    positions = np.arange(run.n_tokens)
    counter = OnlineCounter(orders, eps, fallback if fallback is not None else np.arange(N))
    pred, dist = counter.predict_distribution(run, positions)
    np.testing.assert_array_equal(pred.top, ref["top"].astype(np.uint8))
    np.testing.assert_allclose(pred.p_true, ref["p"], rtol=1e-12, atol=0)
    # every token's probability, those of contexts with > 5 next tokens from the pair table
    np.testing.assert_allclose(dist, ref["dist"].reshape(-1, N), rtol=1e-12, atol=0)
    f = online_features(run.tokens, run.offsets, orders)
    for key in ("top1", "order", "count", "total"):
        np.testing.assert_array_equal(f[key].astype(np.int64), ref[key], err_msg=key)


# --- (a) exact against the reference ------------------------------------------------------------


@pytest.mark.parametrize(
    "alphabet, orders, seed",
    [
        ([3, 7], (4, 2, 1), 0),
        ([1, 2, 3], DEFAULT_ORDERS, 1),
        ([0, 5, 9, 33, 40, 63], (3, 1), 2),
        (list(range(10)), (6, 3, 2, 1), 3),  # > 5 distinct successors: the pair table is used
        (list(range(N)), DEFAULT_ORDERS, 4),  # all 64 tokens
        (list(range(N)), (1,), 5),
    ],
)
def test_equals_the_dict_reference_on_random_threads(alphabet, orders, seed):
    rng = np.random.default_rng(seed)
    run = random_run(rng, [1, 0, 700, 40, 2, 1500], alphabet)
    assert_equal_to_reference(run, orders)


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_dict_reference_on_patterned_threads(seed):
    rng = np.random.default_rng(10 + seed)
    run = markov_run(rng, [2500, 300, 1200], n_states=12 if seed else 64, branching=4)
    fallback = rng.permutation(N).astype(np.uint8)
    assert_equal_to_reference(run, DEFAULT_ORDERS, eps=0.37, fallback=fallback)


def test_ties_go_to_the_most_recent_token():
    # after context [1], 5 then 6 followed once each: 6 (the more recent) ranks first
    run = TokenRun("w", "r", np.array([1, 5, 1, 6, 1, 9], np.uint8), np.array([0, 6]))
    pred = OnlineCounter((1,)).predict(run, np.array([5]))
    assert pred.top[0, :2].tolist() == [6, 5]
    assert pred.p_true[0] == pytest.approx(0.1 / (2 + 6.4))  # 9 never followed 1


def test_the_top5_grows_exactly_when_counts_pass_each_other():
    # one context, many successors with shifting counts: the pair table's evictions are exact
    rng = np.random.default_rng(3)
    seq = []
    for step in range(600):
        seq += [0, int(rng.choice(12, p=np.roll(np.linspace(1, 3, 12), step // 100) / 24))]
    run = TokenRun("w", "r", np.array(seq, np.uint8), np.array([0, len(seq)]))
    assert_equal_to_reference(run, (1,))


def test_positions_in_any_order_and_repeated():
    run = random_run(np.random.default_rng(6), [200, 100], [1, 2, 3, 4])
    counter = OnlineCounter((3, 1))
    full = counter.predict(run, np.arange(run.n_tokens))
    pos = np.array([250, 3, 3, 0, 199, 200])
    pred = counter.predict(run, pos)
    np.testing.assert_array_equal(pred.top, full.top[pos])
    np.testing.assert_array_equal(pred.p_true, full.p_true[pos])
    assert len(counter.predict(run, np.zeros(0, np.int64))) == 0
    with pytest.raises(IndexError):
        counter.predict(run, np.array([300]))


def test_first_position_falls_back_to_the_given_ranking():
    run = TokenRun("w", "r", np.array([5, 5, 9], np.uint8), np.array([0, 3]))
    ranking = np.array([5, 9] + [t for t in range(N) if t not in (5, 9)], np.uint8)
    counter = OnlineCounter.fit([run])
    np.testing.assert_array_equal(counter.fallback, ranking)
    pred = counter.predict(run, np.arange(3))
    assert pred.top[0].tolist() == ranking[:TOP_K].tolist() and pred.p_true[0] == 1 / N
    # position 1: only the unigram [5] is known, then the ranking without duplicates
    assert pred.top[1].tolist() == [5, 9, 0, 1, 2]


# --- (b) causality ------------------------------------------------------------------------------


def test_changing_a_token_never_changes_earlier_predictions():
    rng = np.random.default_rng(7)
    run = markov_run(rng, [400, 300], n_states=8, branching=2)
    counter = OnlineCounter((6, 3, 1))
    base = counter.predict(run, np.arange(run.n_tokens))
    base_f = online_features(run.tokens, run.offsets, (6, 3, 1))
    for i in [0, 1, 57, 399, 400, 401, 650, 699]:
        tokens = run.tokens.copy()
        tokens[i] = (tokens[i] + 1 + rng.integers(62)) % N
        changed = TokenRun("w", "r", tokens, run.offsets)
        pred = counter.predict(changed, np.arange(run.n_tokens))
        f = online_features(tokens, run.offsets, (6, 3, 1))
        np.testing.assert_array_equal(pred.top[: i + 1], base.top[: i + 1])
        # p_true at i is about the (changed) true token; before i it is untouched
        np.testing.assert_array_equal(pred.p_true[:i], base.p_true[:i])
        for key in f:
            np.testing.assert_array_equal(f[key][: i + 1], base_f[key][: i + 1])


# --- (c) per-thread reset -------------------------------------------------------------------------


def test_each_thread_starts_empty():
    rng = np.random.default_rng(8)
    first = markov_run(rng, [500], n_states=6, branching=2)
    second = markov_run(rng, [300], n_states=6, branching=2)
    both = TokenRun(
        "w", "r", np.concatenate([first.tokens, second.tokens]), np.array([0, 500, 800])
    )
    counter = OnlineCounter((4, 2, 1))
    alone = counter.predict(second, np.arange(300))
    together = counter.predict(both, np.arange(500, 800))
    np.testing.assert_array_equal(together.top, alone.top)
    np.testing.assert_array_equal(together.p_true, alone.p_true)
    # and a different first thread (here the same tokens) changes nothing either
    other = TokenRun(
        "w", "r", np.concatenate([second.tokens, second.tokens]), np.array([0, 300, 600])
    )
    np.testing.assert_array_equal(counter.predict(other, np.arange(300, 600)).top, alone.top)


# --- (d) streaming equals batch ------------------------------------------------------------------


@pytest.mark.parametrize("alphabet_size, orders", [(5, (4, 2, 1)), (64, DEFAULT_ORDERS), (9, (2,))])
def test_streaming_equals_batch(alphabet_size, orders):
    rng = np.random.default_rng(alphabet_size)
    run = markov_run(rng, [1500], n_states=alphabet_size, branching=3)
    fallback = rng.permutation(N).astype(np.uint8)
    counter = OnlineCounter(orders, 0.2, fallback)
    pred = counter.predict(run, np.arange(run.n_tokens))
    with_dist, batch_dist = counter.predict_distribution(run, np.arange(run.n_tokens))
    np.testing.assert_array_equal(with_dist.top, pred.top)
    np.testing.assert_array_equal(with_dist.p_true, pred.p_true)
    f = online_features(run.tokens, run.offsets, orders)
    state = counter.state()  # tables start small here: they grow while streaming
    for p, y in enumerate(run.tokens):
        np.testing.assert_array_equal(state.top(), pred.top[p])
        assert state.answer() == (
            int(f["top1"][p]),
            int(f["order"][p]),
            int(f["count"][p]),
            int(f["total"][p]),
        )
        dist = state.distribution()
        assert dist[y] == pytest.approx(pred.p_true[p], rel=1e-12)
        assert dist.sum() == pytest.approx(1.0)
        # the batch form's whole distribution is the streamed one
        np.testing.assert_allclose(batch_dist[p], dist, rtol=1e-12)
        state.push(int(y))
    assert state.n_seen == run.n_tokens


def test_the_distribution_at_positions_in_any_order():
    run = markov_run(np.random.default_rng(3), [300, 200], n_states=9, branching=3)
    counter = OnlineCounter((3, 1))
    pos = np.array([410, 3, 250, 3, 17])
    pred, dist = counter.predict_distribution(run, pos)
    _, whole = counter.predict_distribution(run, np.arange(run.n_tokens))
    np.testing.assert_array_equal(dist, whole[pos])
    np.testing.assert_allclose(dist[np.arange(5), run.tokens[pos]], pred.p_true, rtol=1e-12)
    assert counter.predict_distribution(run, np.array([], np.int64))[1].shape == (0, N)


def test_streaming_distribution_matches_the_reference_counts():
    seq = np.array([4, 4, 7, 4, 4, 7, 4], np.uint8)
    state = OnlineState((2, 1), smoothing=0.5)
    for y in seq:
        state.push(int(y))
    # context [7, 4] was followed by 4 once: (1 + .5) / (1 + 32) for 4, .5 / 33 elsewhere
    dist = state.distribution()
    assert dist[4] == pytest.approx(1.5 / 33) and dist[7] == pytest.approx(0.5 / 33)
    assert state.answer() == (4, 1, 1, 1) and state.p(4) == pytest.approx(1.5 / 33)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="longest first"):
        check_orders((1, 2))
    with pytest.raises(ValueError, match="longest first"):
        OnlineState((3, 3))
    with pytest.raises(ValueError, match="outside"):
        OnlineState((2, 1)).push(64)
    with pytest.raises(ValueError, match="outside"):
        online_features(np.array([70], np.uint8), np.array([0, 1]))


# --- (e) a repeating pattern is learnt -----------------------------------------------------------


def test_a_repeating_pattern_is_predicted_after_warm_up():
    rng = np.random.default_rng(9)
    pattern = rng.integers(0, N, 37).astype(np.uint8)  # a "loop body" of 37 calls
    tokens = np.tile(pattern, 200)
    run = TokenRun("w", "r", tokens, np.array([0, len(tokens)]))
    pred = OnlineCounter().predict(run, np.arange(len(tokens)))
    warm = slice(3 * len(pattern), None)
    assert (pred.top1[warm] == tokens[warm]).mean() > 0.99
    assert np.median(pred.p_true[warm]) > 0.9
    # the counter answers from its longest order once the pattern has been seen
    f = online_features(tokens, run.offsets)
    assert (f["order"][warm] == 1).mean() > 0.99


def test_tables_that_outgrow_their_first_size_stay_exact():
    # 64 tokens, all orders: ~6 new contexts per position, past a thread's first table size
    rng = np.random.default_rng(11)
    run = random_run(rng, [30_000], list(range(N)))
    assert_equal_to_reference(run, DEFAULT_ORDERS)


def test_many_streams_at_once_answer_as_one_state_per_thread():
    from tasks.learning.counters.online import OnlineStreams

    # GIVEN threads of different lengths, one long and varied enough for its tables to grow
    rng = np.random.default_rng(11)
    threads = [rng.integers(0, 64, 1500), rng.integers(0, 5, 700), np.array([7] * 40)]
    streams = OnlineStreams((6, 3, 1), capacity=2)  # slot 2 needs the store to grow
    states = [OnlineState((6, 3, 1)) for _ in threads]
    for slot in range(3):
        streams.reset(slot)
    # WHEN fed in interleaved batches (a thread leaves the batch when it ends)
    for i in range(1500):
        slots = np.array([s for s, t in enumerate(threads) if i < len(t)])
        got = streams.push_answer(slots, np.array([threads[s][i] for s in slots]))
        # THEN each answer is the single-thread state's
        for b, s in enumerate(slots):
            states[s].push(int(threads[s][i]))
            assert tuple(got[b, :4]) == states[s].answer(), (s, i)
            assert np.array_equal(got[b, 4:], states[s].top()), (s, i)


def test_many_streams_give_the_batch_counters_top5_and_distribution():
    from tasks.learning.counters.online import OnlineStreams

    # GIVEN threads of one run, the counter's fallback a training ranking, a smoothing of 0.3
    rng = np.random.default_rng(12)
    threads = [rng.integers(0, 64, 900), rng.integers(0, 5, 400), np.array([7] * 40)]
    fallback = rng.permutation(N).astype(np.uint8)
    counter = OnlineCounter((6, 3, 1), 0.3, fallback)
    run = TokenRun("w", "r", np.concatenate(threads).astype(np.uint8),
                   np.cumsum([0, *map(len, threads)]))  # fmt: skip
    pos = eval_positions(run)
    want, want_dist = counter.predict_distribution(run, pos)
    streams = OnlineStreams((6, 3, 1), capacity=1, smoothing=0.3, fallback=fallback)
    for slot in range(3):
        streams.reset(slot)
    # WHEN fed interleaved, the answer after each call but a thread's last kept
    top = {s: [] for s in range(3)}
    dist = {s: [] for s in range(3)}
    for i in range(899):
        slots = np.array([s for s, t in enumerate(threads) if i < len(t) - 1])
        t5, d = streams.push_distribution(slots, np.array([threads[s][i] for s in slots]))
        for b, s in enumerate(slots):
            top[s].append(t5[b])
            dist[s].append(d[b])
    # THEN they are the batch counter's at the run's scored positions, exactly
    np.testing.assert_array_equal(np.vstack([np.stack(top[s]) for s in range(3)]), want.top)
    np.testing.assert_array_equal(np.vstack([np.stack(dist[s]) for s in range(3)]), want_dist)
