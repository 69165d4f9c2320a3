"""Keras models and tf.data pipelines (tiny sizes: these tests run on 2 shared cores)."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tasks.model import (  # noqa: E402
    as_sequence_model,
    build_model,
    learning_rate,
    predict_positions,
    set_precision_policy,
)
from tasks.sequences import TokenRun, eval_positions  # noqa: E402
from tasks.token_data import eval_dataset, sequence_dataset, windows_dataset  # noqa: E402
from tasks.train_config import TrainConfig  # noqa: E402


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
    assert set_precision_policy() in {"float32", "mixed_float16"}


def test_sequence_dataset_cuts_shifted_chunks_from_the_flat_trace():
    ds, n = sequence_dataset(RUN, 6, 4, shuffle=False, repeat=False)
    x, y, w = next(iter(ds))
    assert x.shape == (4, 6) and y.shape == (4, 6) and w.shape == (4, 6)
    assert x.numpy()[0].tolist() == RUN.tokens[0:6].tolist()
    assert y.numpy()[0].tolist() == RUN.tokens[1:7].tolist()
    assert n == 7 + 4  # thread of 40: 6 full + 1 end-aligned; thread of 20: 3 + 1


def test_windows_dataset_pairs_a_window_with_its_next_token():
    ds, n = windows_dataset(RUN, 6, 4, shuffle=False, repeat=False)
    x, y = next(iter(ds))
    assert n == (40 - 6) + (20 - 6)
    assert x.numpy()[1].tolist() == RUN.tokens[1:7].tolist() and int(y[1]) == RUN.tokens[7]


def test_eval_dataset_and_predictions_cover_the_eval_positions():
    cfg = tiny()
    ds, lo, hi = eval_dataset(RUN, 6, 4)
    assert sum(int(x.shape[0]) for x, _ in ds) == len(lo)
    pred = predict_positions(build_model(cfg), RUN, cfg.context, 4)
    assert len(pred) == len(eval_positions(RUN))
    assert pred.top.shape == (len(pred), 5) and np.all((pred.p_true > 0) & (pred.p_true <= 1))


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
