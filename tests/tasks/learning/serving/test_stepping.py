"""The model stepped one call at a time (tasks/learning/serving/stepping.py, streaming.StatefulStream)."""

from __future__ import annotations

import numpy as np
import pytest

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

keras = pytest.importorskip("keras")

from tasks.dataset.token_runs import TokenRun, eval_positions  # noqa: E402
from tasks.learning.nextcall.model import NGramTable, build_hybrid, build_model  # noqa: E402
from tasks.learning.serving.streaming import StatefulStream, predict_chunked  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402

C = 6


def _patterned(n: int, seed: int) -> np.ndarray:
    """Calls from 6 fixed routines in an order drawn with `seed`: the n-gram table (fitted on
    seed 1) knows long contexts of every stream, its hashed orders (> 9) included."""
    routines = np.random.default_rng(0).integers(0, 64, (6, 13)).astype(np.uint8)
    return np.concatenate([routines[i] for i in np.random.default_rng(seed).integers(0, 6, n)])[:n]


def _model(kind: str, ngram: bool, online: bool, copy: bool, ranks: int = 1, units=(8, 4)):
    cfg = TrainConfig.model_validate(
        {
            "context": C,
            "batch_size": 4,
            "model": {
                "kind": kind,
                "units": list(units),
                "ngram_features": ngram,
                "ngram_order": 12,
                "online_features": online,
                "online_orders": [4, 2, 1],
                "copy_path": copy,
                "online_ranks": ranks,
            },
        }
    )
    if not (ngram or online):
        return build_model(cfg)
    train = _patterned(3000, 1)
    table = NGramTable.fit(train, np.arange(len(train)), 12) if ngram else None
    core, model = build_hybrid(cfg, table)
    for r in range(2, ranks + 1):
        # gates well open: a candidate read from the wrong column would move the answers
        gate = core.get_layer(f"online_rank{r}_gate")
        kernel, bias = gate.get_weights()
        gate.set_weights([kernel, bias + 2.0 * r])
    return model


VARIANTS = {
    "lstm-ngram-online-copy": ("lstm", True, True, True),
    "gru-ngram-online-copy": ("gru", True, True, True),
    "gru-online-copy-5ranks": ("gru", False, True, True, 5),
    "lstm-ngram-online-copy-3ranks": ("lstm", True, True, True, 3),
    "gru-online": ("gru", False, True, False),
    "gru-plain": ("gru", False, False, False),
}


def _chunk_answers(model, toks: np.ndarray) -> np.ndarray:
    """float32 [n, 64]: after each call i, predict_chunked's answer, all in one model call (each
    prefix's chunk right-padded to 2c: the model is causal, as eval_dataset relies on)."""
    from tasks.learning.nextcall.model import (
        online_feature_matrix,
        online_orders,
        online_ranks,
        takes_online,
    )

    n = len(toks)
    starts = np.maximum(0, np.arange(n) // C - 1) * C
    idx = starts[:, None] + np.arange(2 * C)[None, :]
    valid = idx <= np.arange(n)[:, None]
    x = np.where(valid, toks[np.minimum(idx, n - 1)], 0).astype(np.int32)
    inputs: object = x
    if takes_online(model):
        run = TokenRun("w", "t", toks, np.array([0, n]))
        f = online_feature_matrix(run, online_orders(model), online_ranks(model))
        inputs = {"tokens": x, "online": np.where(valid[..., None], f[np.minimum(idx, n - 1)], 0)}
    out = np.asarray(model(inputs, training=False))
    return out[np.arange(n), np.arange(n) - starts]


@pytest.fixture(params=["one compiled call", "batched products"])
def network_path(request, monkeypatch):
    """Run a test through each of step_calls' two ways to step the network (FEW_THREADS decides
    which one a batch takes)."""
    from tasks.learning.serving import stepping

    monkeypatch.setattr(stepping, "FEW_THREADS", 10**6 if request.param.startswith("one") else 0)
    return request.param


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stream_equals_the_chunk_the_tables_score_for_threads_of_any_age(variant, network_path):
    # GIVEN two threads, the second starting when the first is 9 calls old, fed call by call
    model = _model(*VARIANTS[variant])
    threads = {"old": _patterned(40, 2), "young": _patterned(31, 3)}
    start = {"old": 0, "young": 9}
    want = {t: _chunk_answers(model, toks) for t, toks in threads.items()}
    ss = StatefulStream(model, context=C)
    for step in range(40):
        calls = {
            t: int(toks[step - start[t]])
            for t, toks in threads.items()
            if 0 <= step - start[t] < len(toks)
        }
        got = ss.step(calls)
        # THEN each answer is the model's on the evaluation chunk holding the next call
        for t in calls:
            i = step - start[t]
            np.testing.assert_allclose(got[t], want[t][i], rtol=2e-5, atol=2e-6, err_msg=f"{t}@{i}")
            if variant.startswith("gru-ngram") and i in (0, C, 2 * C, 2 * C + 1, 30):
                np.testing.assert_allclose(
                    got[t], predict_chunked(model, threads[t][: i + 1], C), rtol=2e-5, atol=2e-6
                )


def test_stream_gives_the_probabilities_predict_positions_scores(network_path):
    # GIVEN a run of two threads scored as the tables score it
    from tasks.learning.nextcall.model import predict_positions

    model = _model("gru", True, True, True)
    a, b = _patterned(50, 3), _patterned(23, 4)
    run = TokenRun("w", "r", np.concatenate([a, b]), np.array([0, 50, 73]))
    scored = predict_positions(model, run, C, batch_size=4)
    # WHEN each thread is streamed
    p = []
    for toks in (a, b):
        ss = StatefulStream(model, context=C)
        for i in range(len(toks) - 1):
            p.append(ss.step({"t": int(toks[i])})["t"][toks[i + 1]])
    # THEN p(true next call) at every scored position is the table's
    assert len(p) == len(eval_positions(run))
    np.testing.assert_allclose(np.array(p), scored.p_true, rtol=2e-5, atol=2e-6)


def test_an_answer_depends_only_on_calls_already_observed():
    model = _model("gru", True, True, True)
    same = _patterned(20, 5)
    ss = StatefulStream(model, context=C)
    got_x, got_y = [], []
    for i, tok in enumerate(np.concatenate([same, _patterned(10, 6)])):
        other = int(same[i]) if i < len(same) else (int(tok) + 7) % 64
        out = ss.step({"x": int(tok), "y": other})
        got_x.append(out["x"])
        got_y.append(out["y"])
    # the same first 20 calls give the same 20 answers whatever follows
    np.testing.assert_array_equal(np.array(got_x[:20]), np.array(got_y[:20]))
    assert not np.allclose(got_x[25], got_y[25])


def test_forgotten_thread_restarts_and_bad_tokens_are_named():
    model = _model("gru", False, True, False)
    ss = StatefulStream(model, context=C)
    first = ss.step({"a": 5})["a"].copy()
    ss.step({"a": 9})
    ss.forget("a")
    np.testing.assert_array_equal(ss.step({"b": 5})["b"], first)  # the slot was reset
    assert ss.seen("a") == 0 and ss.seen("b") == 1
    with pytest.raises(ValueError, match="thread 'q': token 64"):
        ss.step({"q": 64})


def test_a_model_that_is_no_next_call_network_is_refused():
    inp = keras.Input(shape=(None,), dtype="int32", name="tokens")
    out = keras.layers.Dense(64)(keras.layers.Embedding(64, 4)(inp))
    with pytest.raises(ValueError, match="cannot be stepped|only heapcast's"):
        StatefulStream(keras.Model(inp, out, name="stranger"), context=C)


def test_a_saved_and_reloaded_model_streams_as_the_original(tmp_path):
    # GIVEN a hybrid model written as the registry writes it (a .keras file) and read back
    import tasks.learning.nextcall.model  # noqa: F401  (heapcast's custom layers, registered)

    model = _model("gru", True, True, True)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    a, b = StatefulStream(model, context=C), StatefulStream(loaded, context=C)
    # THEN the stream built from the loaded weights answers as the original's
    for tok in _patterned(20, 7):
        np.testing.assert_array_equal(a.step({"t": int(tok)})["t"], b.step({"t": int(tok)})["t"])


@pytest.mark.parametrize("variant", ["gru-ngram-online-copy", "lstm-ngram-online-copy-3ranks"])
def test_a_threads_answers_do_not_depend_on_which_threads_step_beside_it(variant, network_path):
    # GIVEN three threads, each also streamed alone
    model = _model(*VARIANTS[variant])
    threads = {"a": _patterned(30, 2), "b": _patterned(30, 3), "c": _patterned(30, 4)}
    alone = {t: StatefulStream(model, context=C) for t in threads}
    want = {t: [alone[t].step({t: int(x)})[t] for x in toks] for t, toks in threads.items()}
    # WHEN they are streamed together: all three in slot order (the states stepped in place),
    # in another order, and some steps only two or one of them (the states gathered)
    ss = StatefulStream(model, context=C)
    orders = [("a", "b", "c"), ("c", "a", "b"), ("b", "c"), ("c",), ("a", "b", "c")]
    done = dict.fromkeys(threads, 0)
    for step in range(60):
        names = [t for t in orders[step % len(orders)] if done[t] < len(threads[t])]
        got = ss.step({t: int(threads[t][done[t]]) for t in names})
        # THEN each answer is the one it gets alone, up to float rounding
        for t in names:
            np.testing.assert_allclose(got[t], want[t][done[t]], rtol=2e-5, atol=2e-6,
                                       err_msg=f"{t}@{done[t]}")  # fmt: skip
            done[t] += 1
    assert min(done.values()) >= 2 * C + 1  # past two chunk starts of each state
