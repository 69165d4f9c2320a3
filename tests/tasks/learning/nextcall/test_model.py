"""Keras models and their batches, on whichever backend KERAS_BACKEND names (tiny sizes: these
tests run on 2 shared cores)."""

from __future__ import annotations

import numpy as np
import pytest

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

keras = pytest.importorskip("keras")

from tasks.dataset.token_runs import TokenRun, eval_positions  # noqa: E402
from tasks.learning.nextcall.model import (  # noqa: E402
    as_sequence_model,
    build_model,
    learning_rate,
    predict_distribution,
    predict_positions,
    set_precision_policy,
)
from tasks.learning.nextcall.token_data import eval_batches, sequence_dataset, windows_dataset  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402


def tiny(**kw) -> TrainConfig:
    base = {"context": 6, "model": {"units": [8, 4]}, "batch_size": 4}
    base.update(kw)
    return TrainConfig.model_validate(base)


RUN = TokenRun("w", "r", (np.arange(60) % 7 + 1).astype(np.uint8), np.array([0, 40, 60]))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sequence_model_predicts_at_every_position_of_any_length(kind):
    model = build_model(tiny(model={"kind": kind, "units": [8, 4]}))
    for length in (6, 13):
        out = model.predict(np.zeros((2, length), np.int32), verbose=0)
        assert out.shape == (2, length, 64)
        assert np.allclose(out.sum(-1), 1.0, atol=1e-4)


def test_windows_model_predicts_once_per_window():
    model = build_model(tiny(mode="windows"))
    assert model.predict(np.zeros((3, 6), np.int32), verbose=0).shape == (3, 64)


def test_layers_keep_cudnn_conditions_and_a_frozen_onehot():
    model = build_model(tiny(model={"kind": "lstm", "units": [8, 4], "dropout": 0.1}))
    emb = model.get_layer("onehot")
    assert not emb.trainable
    assert np.array_equal(emb.get_weights()[0], np.eye(64))
    for layer in (model.get_layer("lstm_0"), model.get_layer("lstm_1")):
        assert layer.activation.__name__ == "tanh"
        assert layer.recurrent_activation.__name__ == "sigmoid"
        assert layer.recurrent_dropout == 0 and not layer.unroll and layer.use_bias
    assert model.get_layer("next").dtype_policy.compute_dtype == "float32"
    # no GPU on the test machine: float32 everywhere
    assert set_precision_policy() == "float32"


def test_sequence_dataset_cuts_shifted_chunks_from_the_flat_trace():
    ds, n = sequence_dataset(RUN, 6, 4, shuffle=False, repeat=False)
    x, y, w = ds[0]
    assert x.shape == (4, 6) and y.shape == (4, 6) and w.shape == (4, 6)
    assert x[0].tolist() == RUN.tokens[0:6].tolist()
    assert y[0].tolist() == RUN.tokens[1:7].tolist()
    assert n == 7 + 4  # thread of 40: 6 full + 1 end-aligned; thread of 20: 3 + 1
    assert len(ds) == 3 and len(ds[2][0]) == 3  # one pass, the last batch partial


def test_windows_dataset_pairs_a_window_with_its_next_token():
    ds, n = windows_dataset(RUN, 6, 4, shuffle=False, repeat=False)
    x, y = ds[0]
    assert n == (40 - 6) + (20 - 6)
    assert x[1].tolist() == RUN.tokens[1:7].tolist() and int(y[1]) == RUN.tokens[7]


def test_eval_dataset_and_predictions_cover_the_eval_positions():
    cfg = tiny()
    ds, lo, hi = eval_batches(RUN, 6, 4)
    assert sum(int(x.shape[0]) for x, _ in ds) == len(lo)
    pred = predict_positions(build_model(cfg), RUN, cfg.context, 4)
    assert len(pred) == len(eval_positions(RUN))
    assert pred.top.shape == (len(pred), 5) and np.all((pred.p_true > 0) & (pred.p_true <= 1))


def test_training_batches_shuffle_each_pass_and_resume_where_an_epoch_left_off():
    # GIVEN 11 chunks in batches of 4: two full batches a pass, three steps an epoch
    ds, n = sequence_dataset(RUN, 6, 4, seed=3)
    ds.steps = 3
    first = lambda b: tuple(b[0][:, 0].tolist())  # noqa: E731  (a batch's first tokens)
    # WHEN two epochs are drawn in order, and again from a fresh dataset told its epoch
    drawn = []
    for _ in range(2):
        drawn += [first(ds[i]) for i in range(len(ds))]
        ds.on_epoch_end()
    again, _ = sequence_dataset(RUN, 6, 4, seed=3)
    again.steps, again.epoch = 3, 1
    # THEN every batch is full, a pass holds no chunk twice, and the resumed epoch is the same
    assert all(len(b) == 4 for b in drawn)
    assert [first(again[i]) for i in range(3)] == drawn[3:]
    # worker threads cut batches in any order: the same batches whatever the order asked
    shuffled, _ = sequence_dataset(RUN, 6, 4, seed=3)
    shuffled.steps = 6
    assert [first(shuffled[i]) for i in (5, 0, 3, 1, 4, 2)] == [
        drawn[i] for i in (5, 0, 3, 1, 4, 2)
    ]
    whole_pass = ds.starts[ds._order_of_pass(0)[:8]]
    assert len(set(whole_pass.tolist())) == 8


def test_windows_weights_run_as_a_sequence_model():
    cfg = tiny(mode="windows")
    model = build_model(cfg)
    twin = as_sequence_model(model, cfg)
    x = RUN.tokens[None, :6].astype(np.int32)
    # the last step of the sequence twin is the windows model's answer
    assert np.allclose(twin.predict(x, verbose=0)[0, -1], model.predict(x, verbose=0)[0], atol=1e-5)


def test_cosine_schedule_decays_to_its_floor_and_constant_stays():
    cfg = tiny(learning_rate=0.01, lr_schedule="cosine", lr_floor=0.1, clipnorm=1.0)
    schedule = learning_rate(cfg, total_steps=100)
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(50)) < 0.01
    assert float(schedule(100)) == pytest.approx(0.001)
    assert learning_rate(tiny(learning_rate=0.01), total_steps=100) == 0.01
    model = build_model(cfg, total_steps=100)
    assert model.optimizer.clipnorm == 1.0
    model.fit(np.ones((4, 6), np.int32), np.ones((4, 6), np.int32), epochs=1, verbose=0)


# --- hybrid: n-gram features ----------------------------------------------------------------------

from tasks.learning.nextcall.model import NGramFeatures, NGramTable, build_hybrid  # noqa: E402


def _reference_features(train_threads, threads, max_order, leave_one_out):
    """Dict-and-loop reference of NGramTable.features (tests only)."""
    from collections import Counter, defaultdict

    counts = defaultdict(Counter)
    for th in train_threads:
        for i in range(len(th) - 1):
            for k in range(1, min(max_order, i + 1) + 1):
                counts[tuple(th[i - k + 1 : i + 1])][int(th[i + 1])] += 1
    out = []
    for th in threads:
        for i in range(len(th)):
            ans = (64, 0, 0, 0)
            for k in range(1, min(max_order, i + 1) + 1):
                c = Counter(counts.get(tuple(th[i - k + 1 : i + 1]), {}))
                if leave_one_out and i + 1 < len(th):
                    c[int(th[i + 1])] -= 1
                c = {t: n for t, n in c.items() if n > 0}
                if not c:
                    continue
                tot = sum(c.values())
                top = min(c, key=lambda t: (-c[t], t))
                cb = sum(tot >= 2**j for j in range(1, 8))
                sb = sum(4 * c[top] >= j * tot for j in range(1, 4))
                ans = (top, k, cb, sb)
            out.append(ans)
    return np.array(out, np.uint8)


def _threads(rng, n, length, vocab):
    base = rng.integers(0, vocab, 13)
    return [
        np.where(
            rng.random(length) < 0.2,
            rng.integers(0, vocab, length),
            np.tile(base, length // 13 + 1)[:length],
        ).astype(np.uint8)
        for _ in range(n)
    ]


def _tiny_hybrid(rng):
    """An order-3 n-gram table of two random threads, and the tiny hybrid network over it."""
    table = NGramTable.fit(*_flat(_threads(rng, 2, 80, 6)), 3)
    _, full = build_hybrid(
        tiny(model={"units": [8], "ngram_features": True, "ngram_order": 3}), table
    )
    return table, full


def _flat(threads):
    return np.concatenate(threads), np.concatenate([np.arange(len(t)) for t in threads])


@pytest.mark.parametrize("order", [4, 12])  # 12: orders 10..12 are hashed keys
def test_ngram_table_features_match_a_reference_with_and_without_leave_one_out(order):
    rng = np.random.default_rng(1)
    train, other = _threads(rng, 3, 120, 3), _threads(rng, 2, 60, 4)
    table = NGramTable.fit(*_flat(train), order)
    assert np.all(np.diff(table.keys) > 0)
    assert np.array_equal(
        table.features(*_flat(train), leave_one_out=True),
        _reference_features(train, train, order, True),
    )
    assert np.array_equal(
        table.features(*_flat(other), leave_one_out=False),
        _reference_features(train, other, order, False),
    )


@pytest.mark.parametrize("order", [3, 12])
def test_tables_leaving_out_a_group_answer_as_tables_fitted_without_it(order):
    # what cross-fitting relies on: each group's table from one pass over everything answers, on
    # the group's own positions, exactly as a table fitted on the other groups alone; groups of
    # several threads, a group sharing every context with the others, one sharing none
    rng = np.random.default_rng(7)
    groups = [_threads(rng, 3, 90, 3), _threads(rng, 2, 70, 3), _threads(rng, 1, 50, 4)]
    groups.append([np.full(40, 9, np.uint8)])  # token 9: no other group has its contexts
    tokens, pos = _flat([t for g in groups for t in g])
    group = np.repeat(np.arange(len(groups)), [sum(len(t) for t in g) for g in groups])
    whole, tables = NGramTable.fit_leaving_out(tokens, pos, group, order)
    assert sorted(tables) == [0, 1, 2, 3]
    # the same pass gives the table of everything, as `fit` does
    every = NGramTable.fit(tokens, pos, order)
    for name in ("keys", "top1", "count1", "total", "top2", "count2"):
        assert np.array_equal(getattr(whole, name), getattr(every, name)), name
    for g, mine in enumerate(groups):
        others = [t for h, o in enumerate(groups) if h != g for t in o]
        alone = NGramTable.fit(*_flat(others), order)
        got = tables[g].features(*_flat(mine), leave_one_out=False)
        assert np.array_equal(got, alone.features(*_flat(mine), leave_one_out=False))
        assert np.array_equal(got, _reference_features(others, mine, order, False))
    assert (tables[3].features(*_flat(groups[3]), leave_one_out=False)[:, 1] == 0).all()
    assert (tables[0].features(*_flat(groups[0]), leave_one_out=False)[:, 1] > 1).any()


def test_ngram_lookup_layer_matches_numpy_with_hashed_orders():
    rng = np.random.default_rng(4)
    threads = _threads(rng, 3, 150, 3)
    table = NGramTable.fit(*_flat(threads), 14)
    x = np.stack([threads[0][:40], threads[2][50:90]])
    layer = NGramFeatures(len(table.keys), 14)
    layer.build((None, None))
    layer.set_table(table)
    out = np.asarray(layer(x.astype(np.int32)))
    assert (out[..., 1] > 9).any()  # some answers come from hashed orders
    for row, th in zip(out, x):
        assert np.array_equal(row, table.features(th, np.arange(len(th)), leave_one_out=False))


def test_ngram_lookup_layer_backs_off_on_a_hand_made_table():
    # thread "1 2 3 1 2 4 1 2 3": after (1, 2) -> 3 (2 of 3); after 3 -> 1; after 2 alone -> 3
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3], np.uint8)
    table = NGramTable.fit(tokens, np.arange(9), 3)
    layer = NGramFeatures(len(table.keys), 3)
    layer.build((None, None))
    layer.set_table(table)
    query = np.array([[5, 2, 1, 2, 4]], np.int32)
    out = np.asarray(layer(query))[0]
    assert out[0].tolist() == [64, 0, 0, 0]  # 5 never seen
    assert out[1].tolist() == [3, 1, 1, 2]  # (5, 2) unseen -> order 1: after 2, 3 in 2 of 3
    assert out[2].tolist() == [2, 1, 1, 3]  # (2, 1) unseen -> after 1: 2, 3 of 3 (share >= .75)
    assert out[3].tolist() == [3, 2, 1, 2]  # (2, 1, 2) unseen -> (1, 2): 3 in 2 of 3
    assert out[4].tolist() == [1, 3, 0, 3]  # (1, 2, 4) seen once -> 1
    assert np.array_equal(out, table.features(query[0].astype(np.uint8), np.arange(5), False))


def test_hybrid_saves_loads_and_predicts_from_tokens_alone(tmp_path):
    rng = np.random.default_rng(2)
    table, full = _tiny_hybrid(rng)
    x = np.asarray(_threads(rng, 2, 12, 6), np.int32)
    before = full.predict(x, verbose=0)
    assert before.shape == (2, 12, 64) and np.allclose(before.sum(-1), 1.0, atol=1e-4)
    assert not any(w.trainable for w in full.get_layer("ngram_lookup").weights)
    path = tmp_path / "hybrid.keras"
    full.save(path)
    loaded = keras.models.load_model(path)
    assert np.allclose(loaded.predict(x, verbose=0), before, atol=1e-6)
    assert np.array_equal(
        loaded.get_layer("ngram_lookup").keys.numpy(), table.keys
    )  # 62-bit keys on every backend


def test_build_model_refuses_ngram_features_without_a_table():
    with pytest.raises(ValueError, match="build_hybrid"):
        build_model(tiny(model={"units": [8], "ngram_features": True}))


def test_hybrid_round_trips_through_mlflow_keras_and_pyfunc(tmp_path):
    mlflow_keras = pytest.importorskip("mlflow.keras")
    import mlflow.pyfunc

    rng = np.random.default_rng(3)
    _, full = _tiny_hybrid(rng)
    x = np.asarray(_threads(rng, 3, 10, 6), np.int32)
    expected = full.predict(x, verbose=0)
    path = str(tmp_path / "model")
    mlflow_keras.save_model(full, path)
    np.testing.assert_allclose(
        mlflow_keras.load_model(path).predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6
    )
    p = np.asarray(mlflow.pyfunc.load_model(path).predict(x))
    np.testing.assert_allclose(p, expected, rtol=1e-5, atol=1e-6)


# --- online features ------------------------------------------------------------------------------


def test_online_feature_rows_answer_the_next_call_of_their_own_thread():
    from tasks.learning.counters.online import online_features
    from tasks.learning.nextcall.model import ONLINE_FEATURES, online_feature_matrix

    # GIVEN two threads; row i must be the counter's answer for position i+1 of i's thread
    run = TokenRun("w", "r", (np.arange(30) % 3 + 1).astype(np.uint8), np.array([0, 18, 30]))
    rows = online_feature_matrix(run, (2, 1))
    assert rows.shape == (30, ONLINE_FEATURES) and rows.dtype == np.uint8
    f = online_features(run.tokens, run.offsets, (2, 1))
    for i in (0, 5, 16, 20, 28):  # inside a thread: the answer at i+1
        assert rows[i, 0] == f["top1"][i + 1] and rows[i, 1] == f["order"][i + 1]
    # a periodic thread is learnt: after its first period the answer is the true next call
    assert all(rows[i, 0] == run.tokens[i + 1] for i in range(6, 17))
    # the LAST row of a thread answers after its last call (what streaming predicts from) and
    # does not depend on the next thread
    assert rows[17, 0] == run.tokens[15] and rows[29, 0] == (run.tokens[29] % 3) + 1
    other = TokenRun("w", "r", run.tokens[:18].copy(), np.array([0, 18]))
    assert np.array_equal(online_feature_matrix(other, (2, 1)), rows[:18])


def test_online_rows_with_ranks_carry_the_counters_candidates_without_a_fallback():
    from tasks.learning.counters.online import OnlineState, online_features
    from tasks.learning.nextcall.model import online_feature_matrix, online_width

    # GIVEN a thread that cycles 3 calls then 2 others, and a short second thread
    toks = np.array([1, 2, 3, 1, 2, 3, 9, 9, 1, 2, 3, 1, 2, 4, 4, 4, 5, 1, 2], np.uint8)
    run = TokenRun("w", "r", np.concatenate([toks, [7, 7]]).astype(np.uint8), np.array([0, 19, 21]))
    rows = online_feature_matrix(run, (2, 1), ranks=5)
    assert rows.shape == (21, online_width(5)) == (21, 8)
    # THEN the first four columns are the one-rank rows, unchanged
    assert np.array_equal(rows[:, :4], online_feature_matrix(run, (2, 1)))
    # and columns 4.. are candidates 2..5 of a counter that has seen the thread so far, best
    # first, 64 where it knows fewer tokens (no fallback ranking pads them)
    for t, (a, b) in enumerate([(0, 19), (19, 21)]):
        state = OnlineState((2, 1), fallback=np.zeros(0, np.uint8))
        for i in range(a, b):
            state.push(int(run.tokens[i]))
            top = state.top()
            want = np.where(top[1:5] < 64, top[1:5], 64)
            assert np.array_equal(rows[i, 4:], want), (t, i)
            assert rows[i, 0] == top[0]
    assert rows[19, 4] == 64  # one token seen: no second candidate
    # after "1 2": 3 three times, then 4 once; the thread's other tokens follow
    assert rows[18, 0] == 3 and rows[18, 4] == 4 and set(rows[18, 5:]) <= {1, 2, 5, 9}
    f = online_features(run.tokens, run.offsets, (2, 1), ranked=True)
    assert f["top5"].shape == (21, 5) and f["top5"][0, 0] == 255  # a thread's first call


def test_ranks_need_the_online_features_and_a_copy_path():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="online_ranks 3: .*copy_path"):
        tiny(model={"units": [8], "online_features": True, "online_ranks": 3})
    with pytest.raises(ValidationError, match="online_ranks"):
        tiny(model={"units": [8], "copy_path": True, "online_ranks": 6})


def test_each_rank_has_its_copy_path():
    # GIVEN a hybrid reading the counter's top-3, only the third candidate's gate open
    from tasks.learning.nextcall.model import online_ranks, online_width

    core, full = build_hybrid(_online_cfg(copy_path=True, online_ranks=3), None)
    assert online_ranks(full) == 3
    for name in ("online_gate", "online_rank2_gate", "online_rank3_gate"):
        gate = core.get_layer(name)
        w, b = gate.get_weights()
        gate.set_weights(
            [np.zeros_like(w), np.full_like(b, 50.0 if name.endswith("3_gate") else 0)]
        )
    rng = np.random.default_rng(6)
    online = rng.integers(0, 4, (2, 9, online_width(3))).astype(np.int32)
    online[..., 0] = rng.integers(0, 64, (2, 9))
    online[..., 4] = rng.integers(0, 64, (2, 9))
    online[..., 5] = rng.integers(0, 64, (2, 9))  # the counter's third candidate
    x = {"tokens": rng.integers(0, 64, (2, 9)).astype(np.int32), "online": online}
    # THEN the model answers the third candidate everywhere
    assert (full.predict(x, verbose=0).argmax(-1) == online[..., 5]).all()


def _online_cfg(**model):
    return tiny(model={"units": [8], "online_features": True, "online_orders": [3, 2, 1], **model})


@pytest.mark.parametrize("ngram,copy", [(False, False), (True, False), (True, True)])
def test_online_hybrid_takes_tokens_and_online_features_and_round_trips(tmp_path, ngram, copy):
    from tasks.learning.nextcall.model import ONLINE_FEATURES, online_orders, takes_online

    rng = np.random.default_rng(4)
    table = NGramTable.fit(*_flat(_threads(rng, 2, 80, 6)), 3) if ngram else None
    cfg = _online_cfg(ngram_features=ngram, ngram_order=3, copy_path=copy)
    _, full = build_hybrid(cfg, table)
    assert takes_online(full) and online_orders(full) == (3, 2, 1)
    x = {
        "tokens": np.asarray(_threads(rng, 2, 12, 6), np.int32),
        "online": rng.integers(0, 4, (2, 12, ONLINE_FEATURES)).astype(np.int32),
    }
    before = full.predict(x, verbose=0)
    assert before.shape == (2, 12, 64) and np.allclose(before.sum(-1), 1.0, atol=1e-4)
    # the features change the answer (they are wired in, not ignored)
    assert not np.allclose(full.predict({**x, "online": 0 * x["online"]}, verbose=0), before)
    path = tmp_path / "online.keras"
    full.save(path)
    loaded = keras.models.load_model(path)
    assert takes_online(loaded) and online_orders(loaded) == (3, 2, 1)
    assert np.allclose(loaded.predict(x, verbose=0), before, atol=1e-6)


def test_online_model_is_scored_at_the_eval_positions():
    from tasks.learning.nextcall.model import takes_online

    _, full = build_hybrid(_online_cfg(), None)
    assert takes_online(full) and not takes_online(build_model(tiny()))
    pred = predict_positions(full, RUN, 6, 4)
    assert len(pred) == len(eval_positions(RUN))
    assert np.all(pred.p_true > 0) and np.all(pred.p_true <= 1)


@pytest.mark.parametrize("online", [False, True])
def test_the_distribution_is_the_one_the_scores_come_from(online):
    # GIVEN a plain network and an online hybrid (two inputs)
    seq = build_hybrid(_online_cfg(), None)[1] if online else build_model(tiny())
    # WHEN the probabilities of every token are asked at the scored positions
    d = predict_distribution(seq, RUN, 6, 4)
    pred = predict_positions(seq, RUN, 6, 4)
    # THEN one row a scored position, each a distribution whose true token's share is p(true)
    pos = eval_positions(RUN)
    assert d.shape == (len(pos), 64) and np.allclose(d.sum(1), 1.0, atol=1e-4)
    assert np.allclose(d[np.arange(len(pos)), RUN.tokens[pos]], pred.p_true, atol=1e-5)
    # and its best token is the scorer's top-1 wherever the best is not a tie
    best = np.sort(d, axis=1)
    clear = best[:, -1] - best[:, -2] > 1e-5
    assert np.array_equal(d.argmax(1)[clear], pred.top1[clear])


def test_the_copy_path_adds_the_gated_source_token_to_the_logits():
    # GIVEN an online hybrid with a copy path whose online gate is forced to a large constant
    from tasks.learning.nextcall.model import ONLINE_FEATURES

    core, full = build_hybrid(_online_cfg(copy_path=True), None)
    gate = core.get_layer("online_gate")
    w, b = gate.get_weights()
    gate.set_weights([np.zeros_like(w), np.full_like(b, 50.0)])
    rng = np.random.default_rng(5)
    online = rng.integers(0, 4, (2, 9, ONLINE_FEATURES)).astype(np.int32)
    online[..., 0] = rng.integers(0, 64, (2, 9))  # the counter's top-1 at each position
    x = {"tokens": rng.integers(0, 64, (2, 9)).astype(np.int32), "online": online}
    # THEN the model answers the counter's top-1 everywhere (it can copy it exactly)
    top = full.predict(x, verbose=0).argmax(-1)
    assert (top == online[..., 0]).all()
