"""The champion in streaming form (tasks/learning/serving/streaming.py)."""

from __future__ import annotations

import numpy as np
import pytest

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

keras = pytest.importorskip("keras")

from tasks.learning.nextcall.model import build_hybrid, build_model  # noqa: E402
from tasks.learning.serving.streaming import StreamingPredictor, predict_window  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402


def _model(online: bool, ranks: int = 1):
    model = {"units": [8], "online_features": online, "online_orders": [4, 2, 1]}
    if ranks > 1:
        model.update(copy_path=True, online_ranks=ranks)
    cfg = TrainConfig.model_validate({"context": 8, "batch_size": 4, "model": model})
    return build_hybrid(cfg, None)[1] if online else build_model(cfg)


@pytest.mark.parametrize("online,ranks", [(True, 1), (True, 5), (False, 1)])
def test_streaming_equals_the_batch_prediction_of_each_thread(online, ranks):
    # GIVEN two interleaved threads of different lengths, both past the window of 8 by more
    # than a window, fed call by call
    rng = np.random.default_rng(7)
    threads = {
        "a": (np.arange(20) % 5 + 2).astype(np.uint8),
        "b": rng.integers(0, 64, 17).astype(np.uint8),
    }
    model = _model(online, ranks)
    sp = StreamingPredictor(model, context=8)
    for i in range(20):
        calls = {t: int(toks[i]) for t, toks in threads.items() if i < len(toks)}
        got = sp.step(calls)
        # THEN after every call each thread's distribution is the batch one on its calls so far
        for t in calls:
            want = predict_window(model, threads[t][: i + 1], context=8)
            np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-6)
            assert got[t].shape == (64,) and abs(float(got[t].sum()) - 1.0) < 1e-4


def test_streaming_keeps_history_beyond_the_window():
    # the online counter sees the whole thread: two threads with the same last `context` calls
    # but different pasts get different online features, hence different answers
    model = _model(True)
    sp = StreamingPredictor(model, context=8)
    tail = [3] * 8
    for tok in [5, 9] * 30 + tail:
        sp.observe("x", tok)
    for tok in [7, 7, 7, 1] * 15 + tail:
        sp.observe("y", tok)
    p = sp.predict(["x", "y"])
    assert not np.allclose(p["x"], p["y"])


def test_bad_calls_are_named():
    sp = StreamingPredictor(_model(True), context=8)
    with pytest.raises(ValueError, match="thread 'q': token 64"):
        sp.observe("q", 64)
    with pytest.raises(KeyError, match="no observed call"):
        sp.predict(["nobody"])


@pytest.mark.parametrize("online", [True, False])
def test_threads_of_different_ages_batched_equal_each_threads_own_prediction(online):
    # GIVEN an old thread and a young one that starts while the old one's window is full
    rng = np.random.default_rng(3)
    old = rng.integers(1, 64, 30).astype(np.uint8)
    young = rng.integers(1, 64, 12).astype(np.uint8)
    model = _model(online)
    sp = StreamingPredictor(model, context=8)
    for tok in old[:18]:
        sp.observe("old", int(tok))
    # WHEN both are stepped in one batch, call by call
    for i in range(len(young)):
        got = sp.step({"old": int(old[18 + i]), "young": int(young[i])})
        # THEN the young thread's answer is its own window's, not one left-padded with malloc(0)
        want = predict_window(model, young[: i + 1], context=8)
        np.testing.assert_allclose(got["young"], want, rtol=1e-5, atol=1e-6)
        want_old = predict_window(model, old[: 19 + i], context=8)
        np.testing.assert_allclose(got["old"], want_old, rtol=1e-5, atol=1e-6)


# --- the hedged stream --------------------------------------------------------------------------


def _three_threads() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Three threads of one program (a cycle, a cycle with noise, noise) and the training data's
    token counts (a majority that knows tokens 0..15 only)."""
    rng = np.random.default_rng(11)
    noisy = (np.arange(150) % 6).astype(np.uint8)
    noisy[rng.random(150) < 0.2] = 40
    threads = {
        "cycle": (np.arange(220) % 9 + 20).astype(np.uint8),
        "noisy": noisy,
        "noise": rng.integers(0, 64, 90).astype(np.uint8),
    }
    counts = np.zeros(64)
    counts[:16] = np.arange(16, 0, -1) * 100
    return threads, counts


def _feed(streams, threads: dict[str, np.ndarray]) -> dict[str, list]:
    """Feed the threads' calls interleaved (a thread per step while it lasts) to each stream;
    per stream, per thread, its answers after each call but the last."""
    got = [{t: [] for t in threads} for _ in streams]
    for i in range(max(map(len, threads.values())) - 1):
        calls = {t: int(toks[i]) for t, toks in threads.items() if i < len(toks) - 1}
        for s, g in zip(streams, got):
            out = s.step(calls)
            for t in calls:
                g[t].append((out[t], s.top(t) if hasattr(s, "top") else None))
    return got


@pytest.mark.parametrize("online", [True, False])
def test_the_hedged_stream_answers_what_the_tables_score_as_the_hedged_mix(online):
    # GIVEN a network (with and without the online counter as its input) and three threads
    from tasks.dataset.token_runs import TokenRun, eval_positions
    from tasks.learning.counters.online import OnlineCounter
    from tasks.learning.nextcall.hedge import hedged_next, thread_of
    from tasks.learning.nextcall.model import predict_distribution
    from tasks.learning.predictions import ranking, top_of
    from tasks.learning.serving.streaming import HedgedStream, StatefulStream

    threads, counts = _three_threads()
    model = _model(online)
    # WHEN they are streamed through the hedged stream (and the network's own stream)
    hedged, net = _feed(
        [HedgedStream(model, counts, 0.1, context=8), StatefulStream(model, 8)], threads
    )
    # THEN its answers are hedged_next's over the run's scored calls, bit for bit, given the same
    # network answers: the counter, the majority and the per-thread weights are the batch's
    run = TokenRun("w", "r", np.concatenate(list(threads.values())),
                   np.cumsum([0, *map(len, threads.values())]))  # fmt: skip
    pos = eval_positions(run)
    y = run.tokens[pos]
    counter = OnlineCounter(smoothing=0.1, fallback=ranking(counts))
    counter_answers, counter_dist = counter.predict_distribution(run, pos)
    rows = np.vstack([np.stack([d for d, _ in net[t]]) for t in threads])
    want = hedged_next(
        [rows, counter_dist, (counts + 0.1) / (counts.sum() + 6.4)],
        thread_of(run.offsets, pos),
        y,
        candidates=[counter_answers.top, top_of(rows)],
    )
    mixed = np.vstack([np.stack([d for d, _ in hedged[t]]) for t in threads])
    np.testing.assert_array_equal(mixed[np.arange(len(y)), y], want.p_true)
    np.testing.assert_array_equal(np.vstack([np.stack([k for _, k in hedged[t]]) for t in threads]),
                                  want.top)  # fmt: skip
    np.testing.assert_allclose(mixed.sum(axis=1), 1.0, rtol=1e-6)  # float32 rows
    # and the network's answers are the ones the night reads (predict_distribution)
    np.testing.assert_allclose(rows, predict_distribution(model, run, 8, 4), rtol=2e-5, atol=2e-6)


def test_the_hedged_stream_outweighs_a_confidently_wrong_network_within_the_thread():
    # GIVEN a network that says "token 63" with certainty whatever it has seen, on a program that
    # never makes that call
    from tasks.dataset.token_runs import TokenRun, eval_positions
    from tasks.learning.counters.online import OnlineCounter
    from tasks.learning.predictions import ranking
    from tasks.learning.serving.streaming import HedgedStream

    threads, counts = _three_threads()
    model = _model(False)
    dense = model.get_layer("next")
    bias = np.full(64, -10.0, np.float32)
    bias[63] = 10.0
    dense.set_weights([np.zeros_like(dense.get_weights()[0]), bias])
    # WHEN streamed through the hedged stream
    (hedged,) = _feed([HedgedStream(model, counts, 0.1, context=8)], threads)
    run = TokenRun("w", "r", np.concatenate(list(threads.values())),
                   np.cumsum([0, *map(len, threads.values())]))  # fmt: skip
    pos = eval_positions(run)
    y = run.tokens[pos]
    p = np.concatenate(
        [[d[toks[i + 1]] for i, (d, _) in enumerate(hedged[t])] for t, toks in threads.items()]
    )
    top1 = np.concatenate([np.array([k[0] for _, k in hedged[t]]) for t in threads])
    counter = OnlineCounter(smoothing=0.1, fallback=ranking(counts)).predict(run, pos)
    majority = (counts + 0.1) / (counts.sum() + 6.4)
    # THEN the mix's log-loss is below the majority's (the network's is about 20 nats), and its
    # top-1 within 0.02 of the online counter's
    assert -np.mean(np.log(p)) < -np.mean(np.log(majority[y]))
    assert np.mean(top1 == y) >= np.mean(counter.top[:, 0] == y) - 0.02
    assert np.mean(top1 == y) > 0.5


def test_a_forgotten_thread_restarts_its_hedge_as_a_new_thread():
    # GIVEN a hedged stream that has learnt one thread, which ends
    from tasks.learning.serving.streaming import HedgedStream

    threads, counts = _three_threads()
    model = _model(True)
    hs = HedgedStream(model, counts, 0.1, context=8)
    _feed([hs], {"cycle": threads["cycle"]})
    hs.forget("cycle")
    # WHEN another thread takes its slot
    (again,) = _feed([hs], {"next": threads["noisy"]})
    (fresh,) = _feed([HedgedStream(model, counts, 0.1, context=8)], {"next": threads["noisy"]})
    # THEN it answers as in a fresh stream: no weight, hit or counter of the old thread is left
    np.testing.assert_array_equal(np.stack([d for d, _ in again["next"]]),
                                  np.stack([d for d, _ in fresh["next"]]))  # fmt: skip
    np.testing.assert_array_equal(np.stack([k for _, k in again["next"]]),
                                  np.stack([k for _, k in fresh["next"]]))  # fmt: skip


def test_a_hedged_stream_needs_the_training_datas_token_counts():
    from tasks.learning.serving.streaming import HedgedStream

    with pytest.raises(ValueError, match=r"token_counts \(63,\).*next_hedge.json"):
        HedgedStream(_model(False), np.ones(63))
    hs = HedgedStream(_model(False), np.ones(64), context=8)
    with pytest.raises(KeyError, match="'t' has no observed call"):
        hs.top("t")


def test_the_registered_champion_streams_hedged_and_an_older_version_says_what_it_lacks(tmp_path):
    # GIVEN a network registered as the night registers it (its hedge settings logged beside it)
    import mlflow

    from tasks.learning.serving.streaming import HedgedStream
    from tasks.registry.register import register_outcome
    from tasks.registry.tracking import TrackingConfig, configure
    from tests.tasks.registry.outcome_factory import make_outcome

    model = _model(False)
    outcome = make_outcome(model, 0.9)
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    assert register_outcome(outcome, tracking).promoted
    configure(tracking)
    # WHEN the champion is streamed from the registry
    threads, _ = _three_threads()
    direct = HedgedStream(model, outcome.dataset.token_histogram, 0.1, context=8)
    loaded = HedgedStream.from_registry(tracking.model_name, context=8)
    a, b = _feed([direct, loaded], threads)
    # THEN it answers as the network and the training data's counts it was registered with
    for t in threads:
        np.testing.assert_allclose(np.stack([d for d, _ in a[t]]), np.stack([d for d, _ in b[t]]),
                                   rtol=1e-5, atol=1e-7)  # fmt: skip
        np.testing.assert_array_equal(
            np.stack([k for _, k in a[t]]), np.stack([k for _, k in b[t]])
        )
    # and a version registered without those settings names itself and says what to do
    client = mlflow.MlflowClient()
    source = client.get_model_version(tracking.model_name, "1").source
    with mlflow.start_run() as bare:
        pass
    old = client.create_model_version(tracking.model_name, source, run_id=bare.info.run_id)
    client.set_registered_model_alias(tracking.model_name, "old", old.version)
    with pytest.raises(LookupError, match=rf"version {old.version} \(old\) has no next_hedge.json"):
        HedgedStream.from_registry(tracking.model_name, "old")
    # unless the training data's token counts are given in its place
    counts = outcome.dataset.token_histogram
    stand_in = HedgedStream.from_registry(tracking.model_name, "old", 8, counts)
    c, d = _feed([stand_in, HedgedStream(model, counts, 0.1, context=8)], threads)
    for t in threads:
        np.testing.assert_array_equal(
            np.stack([k for _, k in c[t]]), np.stack([k for _, k in d[t]])
        )


def _separate_calls_hedged(hs, calls: dict) -> dict:
    """The reference: HedgedStream.step as separate calls, as it was before its step was
    compiled whole (tasks/learning/serving/hedged_step.py): the network's online counter,
    step_calls, the hedge's counter, top_of, HedgeStreams.step."""
    from tasks.learning.counters.online import ANSWER_WIDTH
    from tasks.learning.predictions import top_of
    from tasks.learning.serving.stepping import step_calls

    names = list(calls)
    tokens = np.array([calls[t] for t in names], np.int64)
    idx = np.array([hs._slot(t) for t in names], np.int64)
    if hs._online is not None:
        online = hs._online.push_answer(idx, tokens)
    else:
        online = np.zeros((len(names), ANSWER_WIDTH), np.int64)
    net = step_calls(
        hs.weights, hs.context, hs._n_seen, hs._hist, hs._hs, hs._cs, idx, tokens, online
    )
    counter_top, counter = hs._counter.push_distribution(idx, tokens)
    rows = np.stack([net, counter.astype(np.float32)])
    lists = np.stack([counter_top, top_of(net)])
    mixed, _ = hs._mix.step(idx, tokens, rows, lists)
    return dict(zip(names, mixed, strict=True))


@pytest.mark.parametrize(
    "online,orders", [(True, (4, 2, 1)), (True, (12, 8, 6, 4, 3, 2, 1)), (False, (4, 2, 1))]
)
@pytest.mark.parametrize("n_threads", [3, 20])
def test_the_compiled_hedged_step_answers_the_separate_calls_bit_for_bit(online, orders, n_threads):
    # GIVEN one model streamed twice, hedged, over the same calls of a few or many threads (over
    # FEW_THREADS: the batched network), threads of different ages past two windows, the hedge's
    # counter over the network's online orders (4, 2, 1: one counter shared) or others
    from tasks.learning.counters.online import OnlineStreams
    from tasks.learning.serving.streaming import HedgedStream

    rng = np.random.default_rng(5)
    counts = rng.integers(0, 100, 64).astype(np.float64)
    routines = [rng.integers(0, 64, 6) for _ in range(4)]
    runs = [np.concatenate([routines[i] for i in rng.integers(0, 4, 10)]) for _ in range(n_threads)]
    model = _model(online)
    compiled, separate = (
        HedgedStream(model, counts, context=8, counter_orders=orders) for _ in range(2)
    )
    assert (compiled._counter is compiled._online) == (online and orders == (4, 2, 1))
    # the reference's counter its own, as before the network's was shared where their orders are
    separate._counter = OnlineStreams(orders, fallback=separate.majority.ranking)
    for i in range(30):
        calls = {f"t{j}": int(r[i - j % 5]) for j, r in enumerate(runs) if i >= j % 5}
        # WHEN one takes the compiled step and the other the separate calls
        got, want = compiled.step(calls), _separate_calls_hedged(separate, calls)
        # THEN every answer and top-5 is the same, bit for bit
        for t in calls:
            np.testing.assert_array_equal(got[t], want[t], err_msg=f"{t} at call {i}")
            np.testing.assert_array_equal(compiled.top(t), separate.top(t))
