"""The champion in streaming form (tasks/learning/streaming.py)."""

from __future__ import annotations

import numpy as np
import pytest

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

keras = pytest.importorskip("keras")

from tasks.learning.model import build_hybrid, build_model  # noqa: E402
from tasks.learning.streaming import StreamingPredictor, predict_window  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402


def _model(online: bool):
    cfg = TrainConfig.model_validate(
        {
            "context": 8,
            "batch_size": 4,
            "model": {"units": [8], "online_features": online, "online_orders": [4, 2, 1]},
        }
    )
    return build_hybrid(cfg, None)[1] if online else build_model(cfg)


@pytest.mark.parametrize("online", [True, False])
def test_streaming_equals_the_batch_prediction_of_each_thread(online):
    # GIVEN two interleaved threads of different lengths, fed call by call
    rng = np.random.default_rng(7)
    threads = {
        "a": (np.arange(40) % 5 + 2).astype(np.uint8),
        "b": rng.integers(0, 64, 25).astype(np.uint8),
    }
    model = _model(online)
    sp = StreamingPredictor(model, context=8)
    for i in range(40):
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
