"""tasks/learning/nextcall/hedge.py: the next-call mixture of the network, the online counter and the
majority, weighted per thread by what each predicted of the thread's calls so far."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.learning.nextcall.hedge import LEAD, hedged_next, thread_of

N = 64


def onehot_ish(tokens: np.ndarray, p: float) -> np.ndarray:
    """A predictor that gives `p` to `tokens` (one a row) and the rest evenly."""
    out = np.full((len(tokens), N), (1 - p) / (N - 1))
    out[np.arange(len(tokens)), tokens] = p
    return out


def uniform(n: int) -> np.ndarray:
    return np.full((n, N), 1.0 / N)


def log_loss(p: np.ndarray) -> float:
    return float(-np.mean(np.log(p)))


RNG = np.random.default_rng(0)
TRUTH = RNG.integers(0, 8, 400)
WRONG = (TRUTH + 1) % 8
ONE_THREAD = np.zeros(400, np.int64)


def test_an_answer_reads_only_the_earlier_calls_of_its_thread():
    right, wrong = onehot_ish(TRUTH, 0.9), onehot_ish(WRONG, 0.9)
    thread = np.repeat([0, 1], 200)
    got = hedged_next([right, wrong, uniform(400)], thread, TRUTH)
    # later tokens changed: every earlier answer is the same
    later = TRUTH.copy()
    later[150:200] = (later[150:200] + 3) % 8
    again = hedged_next([right, wrong, uniform(400)], thread, later)
    np.testing.assert_array_equal(got.top[:150], again.top[:150])
    np.testing.assert_allclose(got.p_true[:150], again.p_true[:150])
    # a thread starts afresh: the second thread's first answer does not know the first thread
    assert got.p_true[200] == pytest.approx(got.p_true[0])


def test_the_mixture_follows_the_predictor_that_is_right_on_each_thread():
    # GIVEN two threads: the "network" right on the first, the "counter" on the second
    thread = np.repeat([0, 1], 200)
    net = np.vstack([onehot_ish(TRUTH[:200], 0.9), onehot_ish(WRONG[200:], 0.9)])
    counter = np.vstack([onehot_ish(WRONG[:200], 0.6), onehot_ish(TRUTH[200:], 0.6)])
    got = hedged_next([net, counter, uniform(400)], thread, TRUTH)
    # THEN after a few calls its top-1 is the right one's on both threads
    assert np.mean(got.top[10:200, 0] == TRUTH[10:200]) == 1.0
    assert np.mean(got.top[210:, 0] == TRUTH[210:]) == 1.0
    # and its log-loss is within a few calls' cost of the better predictor's, thread by thread
    best = np.concatenate(
        [net[np.arange(200), TRUTH[:200]], counter[np.arange(200, 400), TRUTH[200:]]]
    )
    assert log_loss(got.p_true) < log_loss(best) + 0.15


def test_a_network_confidently_wrong_costs_little_against_the_majority():
    # GIVEN a network sure of the wrong token at every call, a counter no better, and the majority
    net, counter = onehot_ish(WRONG, 0.999), onehot_ish(WRONG, 0.7)
    majority = np.tile(np.bincount(TRUTH, minlength=N) + 0.1, (400, 1))
    majority /= majority.sum(1, keepdims=True)
    got = hedged_next([net, counter, majority], ONE_THREAD, TRUTH)
    # THEN the mixture is never far worse than the majority, while the network is hopeless
    maj = log_loss(majority[np.arange(400), TRUTH])
    assert log_loss(net[np.arange(400), TRUTH]) > maj + 5
    assert log_loss(got.p_true) < maj + 0.1


def test_its_top5_is_the_counters_where_the_counter_knows_better():
    # GIVEN a counter whose top-5 holds the truth and a network whose top-5 does not
    counter = np.full((400, N), 1e-4)
    for k in range(5):
        counter[np.arange(400), (TRUTH + k * 7) % N] = 0.19
    counter /= counter.sum(1, keepdims=True)
    net = onehot_ish(WRONG, 0.5)
    got = hedged_next([net, counter, uniform(400)], ONE_THREAD, TRUTH)
    in_top5 = (got.top == TRUTH[:, None]).any(1)
    assert in_top5[20:].all()


def test_bad_shapes_are_refused_and_threads_found():
    with pytest.raises(ValueError, match="arrays of"):
        hedged_next([uniform(3), uniform(4)], np.zeros(3), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="arrays of"):
        hedged_next([uniform(3), np.ones(63) / 63], np.zeros(3), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"candidates \[\(2, 5\)\]: lists of \[3, c\]"):
        hedged_next([uniform(3)], np.zeros(3), np.zeros(3, np.int64), candidates=[np.zeros((2, 5))])
    offsets = np.array([0, 5, 5, 9])
    np.testing.assert_array_equal(thread_of(offsets, np.array([0, 4, 5, 8])), [0, 0, 2, 2])


def test_the_counters_candidates_are_ranked_first_by_the_mixture():
    # GIVEN a network sure of one wrong token and a counter whose top-5 holds the truth
    counter = np.full((400, N), 1e-4)
    for k in range(5):
        counter[np.arange(400), (TRUTH + k * 7) % N] = 0.19
    counter /= counter.sum(1, keepdims=True)
    candidates = np.argsort(-counter, axis=1, kind="stable")[:, :5].astype(np.uint8)
    net = onehot_ish(WRONG, 0.99)
    got = hedged_next([net, counter, uniform(400)], ONE_THREAD, TRUTH, candidates=[candidates])
    # THEN its top-5 is the counter's at every call, the first included
    np.testing.assert_array_equal(np.sort(got.top, 1), np.sort(candidates, 1))
    # AND the probabilities are the mixture's: the same as without the candidates
    plain = hedged_next([net, counter, uniform(400)], ONE_THREAD, TRUTH)
    np.testing.assert_allclose(got.p_true, plain.p_true)
    # AND among the candidates the mixture's order holds: a network right on the truth puts it
    # first once it has earned its weight, while the counter spreads its five evenly
    right = hedged_next(
        [onehot_ish(TRUTH, 0.9), counter, uniform(400)], ONE_THREAD, TRUTH, candidates=[candidates]
    )
    assert (right.top[5:, 0] == TRUTH[5:]).all()


def test_the_slots_the_counter_leaves_are_the_mixtures_and_its_favourite_leads():
    net = onehot_ish(TRUTH, 0.9)
    none = np.full((400, 5), 255, np.uint8)
    none[:, 0] = WRONG  # the counter's one candidate
    got = hedged_next([net, uniform(400)], ONE_THREAD, TRUTH, candidates=[none])
    # the candidate kept, the mixture's favourite first
    assert (got.top[:, 0] == TRUTH).all() and (got.top == WRONG[:, None]).any(1).all()


def test_a_fixed_expert_is_the_same_as_its_row_at_every_call():
    net, majority = onehot_ish(WRONG, 0.8), np.bincount(TRUTH, minlength=N) + 1.0
    majority /= majority.sum()
    thread = np.repeat([0, 1], 200)
    fixed = hedged_next([net, majority], thread, TRUTH)
    tiled = hedged_next([net, np.tile(majority, (400, 1))], thread, TRUTH)
    np.testing.assert_array_equal(fixed.top, tiled.top)
    np.testing.assert_allclose(fixed.p_true, tiled.p_true, rtol=1e-6)


def top5_of(p: np.ndarray) -> np.ndarray:
    return np.argsort(-p, axis=1, kind="stable")[:, :5].astype(np.uint8)


def test_per_thread_the_top5_follows_the_list_that_has_been_right():
    # GIVEN two threads: the counter's top-5 holds the truth on the first, the network's on the
    # second (each list the other's misses)
    thread = np.repeat([0, 1], 200)
    holds, misses = onehot_ish(TRUTH, 0.3), onehot_ish(WRONG, 0.3)
    for m in (holds, misses):  # the other four of each list: far from every true token
        m[:, 40:44] = 0.1
        m /= m.sum(1, keepdims=True)
    counter = np.vstack([holds[:200], misses[200:]])
    net = np.vstack([misses[:200], holds[200:]])
    lists = [top5_of(counter), top5_of(net)]
    got = hedged_next([net, counter, uniform(400)], thread, TRUTH, candidates=lists)
    in_top5 = (got.top == TRUTH[:, None]).any(1)
    # THEN its top-5 holds the truth: the counter's list on the first thread (the first list,
    # where it starts), the network's on the second once it has been right LEAD times more
    assert in_top5[:200].all()
    assert not in_top5[200 : 200 + LEAD].any() and in_top5[200 + LEAD :].all()
    # AND a thread starts afresh: the second thread's first call follows the counter again
    np.testing.assert_array_equal(np.sort(got.top[200]), np.sort(lists[0][200]))


def test_streams_fed_call_by_call_answer_exactly_what_the_batch_answers():
    # GIVEN three threads of one run, interleaved in uneven batches as a program makes its calls,
    # with a network right on the first thread only (its list takes the lead there) and a thread
    # that ends and whose slot a fourth thread reuses
    from tasks.learning.nextcall.hedge import HedgeStreams
    from tasks.learning.predictions import top_of

    rng = np.random.default_rng(3)
    lengths = [300, 120, 200, 90]
    truth = [rng.integers(0, 8, n) for n in lengths]
    net = [onehot_ish(truth[0], 0.8)] + [onehot_ish((t + 1) % 8, 0.8) for t in truth[1:]]
    counter = [onehot_ish(np.where(rng.random(len(t)) < 0.6, t, 9), 0.5) for t in truth]
    majority = np.full(N, 1 / N)
    counter_top = [top_of(c) for c in counter]
    net_top = [top_of(x) for x in net]
    # the batch: every thread's scored calls, thread after thread
    want = hedged_next(
        [np.vstack(net), np.vstack(counter), majority],
        np.repeat(np.arange(4), lengths),
        np.concatenate(truth),
        candidates=[np.vstack(counter_top), np.vstack(net_top)],
    )
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # WHEN fed call by call: thread k's i-th call (its token before row i) is followed by row i
    hs = HedgeStreams(2, [majority], 2, capacity=2)
    slot_of = {0: 0, 1: 1, 2: 2, 3: 1}  # thread 3 reuses thread 1's slot once it ended
    done = np.zeros(4, np.int64)
    p_true = np.full(sum(lengths), np.nan)
    top = np.zeros((sum(lengths), 5), np.uint8)
    order = np.concatenate([np.full(n, k) for k, n in enumerate(lengths)])
    rng.shuffle(order[: sum(lengths[:3])])  # threads 0-2 interleaved, then thread 3
    batches, cur = [], []
    for k in order.tolist():  # one call per thread per batch: a thread's next call starts one
        if k in cur or len(cur) == 3:
            batches.append(cur)
            cur = []
        cur.append(k)
    for ks in [*batches, cur]:
        for k in ks:
            if done[k] == 0:
                hs.reset(slot_of[k])
        i = done[ks]
        # the call before row i: any token (row 0's is the thread's first, unscored, call)
        made = np.array([truth[k][j - 1] if j else 0 for k, j in zip(ks, i)])
        mixed, got = hs.step(
            np.array([slot_of[k] for k in ks]),
            made,
            np.array([[net[k][j] for k, j in zip(ks, i)],
                      [counter[k][j] for k, j in zip(ks, i)]], np.float32),
            np.array([[counter_top[k][j] for k, j in zip(ks, i)],
                      [net_top[k][j] for k, j in zip(ks, i)]], np.uint8),
        )  # fmt: skip
        rows = first[ks] + i
        p_true[rows] = mixed[np.arange(len(ks)), [truth[k][j] for k, j in zip(ks, i)]]
        top[rows] = got
        done[ks] += 1
        done[[k for k in ks if done[k] == lengths[k]]] = 10**9  # ended
    # THEN every answer is the batch's, bit for bit, the lead switch on thread 0 included
    np.testing.assert_array_equal(top, want.top)
    np.testing.assert_array_equal(p_true, want.p_true)
    assert np.array_equal(np.sort(want.top[200:300]), np.sort(net_top[0][200:300]))
    assert not np.array_equal(np.sort(want.top[300:]), np.sort(np.vstack(net_top[1:])))


def test_streams_refuse_answers_of_the_wrong_shape():
    from tasks.learning.nextcall.hedge import HedgeStreams

    hs = HedgeStreams(2, [np.full(N, 1 / N)], 2)
    hs.reset(0)
    lists = np.zeros((2, 1, 5), np.uint8)
    with pytest.raises(ValueError, match=r"rows float32\(1, 1, 64\): float32 \[2, 1, 64\]"):
        hs.step(np.array([0]), np.array([3]), np.zeros((1, 1, N), np.float32), lists)
    with pytest.raises(ValueError, match=r"rows float64\(2, 1, 64\)"):
        hs.step(np.array([0]), np.array([3]), np.zeros((2, 1, N)), lists)
    with pytest.raises(ValueError, match=r"lists uint8\(2, 1, 4\): uint8 \[2, 1, 5\]"):
        hs.step(np.array([0]), np.array([3]), np.zeros((2, 1, N), np.float32), lists[..., :4])


def test_the_top5_is_the_counters_list_then_the_mixtures_best_in_the_mixtures_order():
    # GIVEN calls each a thread's first (equal weights: the mixture is the experts' mean), experts
    # on a coarse grid (many ties), the first candidate list with gaps (255: none)
    rng = np.random.default_rng(3)
    n = 3000
    rows = [(rng.integers(0, 4, (n, N)) / 4).astype(np.float32) for _ in range(2)]
    fixed = rng.integers(0, 4, N) / 4
    lists = rng.integers(0, N, (2, n, 5)).astype(np.uint8)
    lists[0][rng.random((n, 5)) < 0.3] = 255
    got = hedged_next([rows[0], rows[1], fixed], np.arange(n), np.zeros(n, np.int64),
                      candidates=list(lists))  # fmt: skip
    # THEN each top-5 is the first list's tokens and the mixture's most probable others (ties:
    # the lower token), all five in the mixture's order (ties: the lower token first)
    w = 1.0 / 3.0
    r0, r1 = (r.astype(np.float64) for r in rows)
    mixed = 0.0 + w * r0 + w * r1 + w * fixed
    for i in range(n):
        listed = sorted({int(t) for t in lists[0, i] if t < N})
        others = sorted((t for t in range(N) if t not in listed), key=lambda t: (-mixed[i, t], t))
        want = sorted(listed + others[: 5 - len(listed)], key=lambda t: (-mixed[i, t], t))
        assert got.top[i].tolist() == want, i
