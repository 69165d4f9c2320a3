"""The next-call network that reads each call's stack (model.frame_depth): causal, wired in,
scored with the run's stacks, refused where a path cannot give them (tiny sizes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytestmark = [pytest.mark.backends, pytest.mark.slow]

keras = pytest.importorskip("keras")

from tasks.dataset.events_reader import StackFrames  # noqa: E402
from tasks.dataset.frame_tokens import FRAME_PIECES  # noqa: E402
from tasks.dataset.token_runs import CallStacks, TokenRun, eval_positions  # noqa: E402
from tasks.learning.nextcall.model import (  # noqa: E402
    ONLINE_FEATURES,
    build_hybrid,
    frame_depth_of,
    predict_distribution,
    predict_positions,
    takes_frames,
)
from tasks.learning.nextcall.stack_input import StacksMissing  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402
from tests.tasks.dataset.test_frame_tokens import stacks_table  # noqa: E402

DEPTH = 3


def stack_cfg(**model) -> TrainConfig:
    base = {"units": [8], "online_features": True, "online_orders": [3, 2, 1], "frame_depth": DEPTH}
    return TrainConfig.model_validate({"context": 6, "batch_size": 4, "model": {**base, **model}})


def _x(rng, calls: int = 12) -> dict[str, np.ndarray]:
    return {
        "tokens": rng.integers(0, 64, (2, calls)).astype(np.int32),
        "online": rng.integers(0, 4, (2, calls, ONLINE_FEATURES)).astype(np.int32),
        "frames": rng.integers(1, 5000, (2, calls, DEPTH, FRAME_PIECES)).astype(np.int32),
    }


def _trained_encoder(full) -> None:
    """Random weights in the frame embeddings (they start at zero: an untrained network would
    not read the stack at all, and every check below would hold trivially)."""
    layer = next(x for x in full.get_layer(index=-1).layers if x.name == "frame_pieces")
    w = layer.get_weights()[0]
    layer.set_weights([np.random.default_rng(0).normal(size=w.shape).astype(w.dtype)])


@pytest.mark.parametrize("copy", [False, True])
def test_a_position_never_reads_the_stack_of_the_call_it_predicts(copy):
    # GIVEN a network that reads the stack, its frame embeddings away from zero
    _, full = build_hybrid(stack_cfg(copy_path=copy), None)
    _trained_encoder(full)
    x = _x(np.random.default_rng(1))
    before = full.predict(x, verbose=0)
    # WHEN the stack of call t + 1 (and of every later call) changes
    t = 5
    later = {**x, "frames": x["frames"].copy()}
    later["frames"][:, t + 1 :] = np.random.default_rng(2).integers(
        1, 5000, later["frames"][:, t + 1 :].shape
    )
    after = full.predict(later, verbose=0)
    # THEN the answers at positions <= t (each predicting the call after it) are unchanged
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], atol=1e-6)
    # and the stack is read: the later answers move, and so does t's when call t's stack does
    assert not np.allclose(after[:, t + 1 :], before[:, t + 1 :])
    own = {**x, "frames": x["frames"].copy()}
    own["frames"][:, t] = 7
    assert not np.allclose(full.predict(own, verbose=0)[:, t], before[:, t])


def test_a_stack_model_saves_and_loads_with_its_depth(tmp_path):
    _, full = build_hybrid(stack_cfg(ngram_features=False), None)
    _trained_encoder(full)
    assert takes_frames(full) and frame_depth_of(full) == DEPTH
    x = _x(np.random.default_rng(3))
    path = tmp_path / "stack.keras"
    full.save(path)
    loaded = keras.models.load_model(path)
    assert takes_frames(loaded) and frame_depth_of(loaded) == DEPTH
    np.testing.assert_allclose(loaded.predict(x, verbose=0), full.predict(x, verbose=0), atol=1e-6)


RUN = TokenRun("w", "r", (np.arange(60) % 7 + 1).astype(np.uint8), np.array([0, 40, 60]))


def _run_stacks() -> CallStacks:
    frames = StackFrames.of_table(
        stacks_table(
            {
                5: [(None, 0, "xmalloc"), (None, 0, "parse_expr")],
                9: [(None, 0, "PyMem_Malloc"), (None, 0, "list_append")],
            }
        )
    )
    rows = np.where(np.arange(60) % 3 == 0, 0, 1 + np.arange(60) % 2).astype(np.int32)
    return CallStacks(rows, frames)


def test_a_stack_model_is_scored_with_the_runs_stacks_and_refused_without():
    # GIVEN a network that reads the stack, and a run with its stacks
    _, full = build_hybrid(stack_cfg(), None)
    _trained_encoder(full)
    stacks = _run_stacks()
    run = replace(RUN, stacks=stacks)
    # WHEN scored with them
    pred = predict_positions(full, run, 6, 4)
    d = predict_distribution(full, run, 6, 4)
    # THEN at every scored position, the distribution's true token is p(true)
    pos = eval_positions(RUN)
    assert len(pred) == len(pos) and d.shape == (len(pos), 64)
    np.testing.assert_allclose(d[np.arange(len(pos)), RUN.tokens[pos]], pred.p_true, atol=1e-5)
    # and the stacks change the answers (another run's stacks, all padding, answer otherwise)
    blind = replace(RUN, stacks=CallStacks(np.zeros(60, np.int32), stacks.frames))
    assert not np.allclose(predict_distribution(full, blind, 6, 4), d)
    # and without them it is one clear error
    with pytest.raises(StacksMissing, match="w/r: the network reads each call's stack"):
        predict_positions(full, RUN, 6, 4)


def test_the_serving_paths_refuse_a_stack_model_with_one_clear_error():
    from tasks.learning.serving.stepping import step_weights
    from tasks.learning.serving.streaming import StreamingPredictor, predict_window

    _, full = build_hybrid(stack_cfg(), None)
    for serve in (StreamingPredictor, step_weights, lambda m: predict_window(m, RUN.tokens)):
        with pytest.raises(ValueError, match="reads each call's stack .* frame_depth: 0"):
            serve(full)


def test_training_batches_gather_each_calls_stack_and_drop_some_in_training_only():
    from tasks.learning.nextcall.stack_input import stack_input
    from tasks.learning.nextcall.token_data import eval_batches, sequence_dataset

    # GIVEN a run's stacks as the network reads them (row i: call i's frames)
    held = stack_input([replace(RUN, stacks=_run_stacks())], DEPTH)
    want = held.tokens[held.rows]  # [calls, depth, pieces], only for this check
    # WHEN cut into validation batches (no drops) and evaluation batches
    val, _ = sequence_dataset(RUN, 6, 4, shuffle=False, repeat=False, stacks=held)
    (tokens, frames), _, _ = val[0]
    (e_tokens, e_frames), _ = next(eval_batches(RUN, 6, 4, stacks=held)[0])
    # THEN each position's frames are its own call's, beside its token
    assert frames.shape == (4, 6, DEPTH, FRAME_PIECES)
    starts = np.asarray(val.starts[:4])
    np.testing.assert_array_equal(frames, want[starts[:, None] + np.arange(6)])
    np.testing.assert_array_equal(e_frames[0, :12], want[:12])
    # and training drops whole stacks and pieces (padding), the same drops for the same batch
    train, _ = sequence_dataset(RUN, 6, 4, stacks=held)
    (_, a), _, _ = train[0]
    (_, b), _, _ = train[0]
    np.testing.assert_array_equal(a, b)
    starts = np.asarray(train.starts[train._order_of_pass(0)[:4]])
    full = want[starts[:, None] + np.arange(6)]
    assert ((a == full) | (a == 0)).all()
    assert (a == 0).all(axis=(2, 3)).sum() > (full == 0).all(axis=(2, 3)).sum()


def test_a_stack_config_trains_from_a_split_read_with_stacks(events_root, tmp_path):
    from tasks.learning.nextcall.fitting import fit_inputs
    from tasks.learning.nextcall.training import evaluate_model, training_inputs
    from tasks.learning.split import load_split

    # GIVEN a config that reads the stack and the split read with its stacks
    cfg = stack_cfg(units=[4]).model_copy(
        update={"epochs": 1, "steps_per_epoch": 2, "data": TrainConfig().data.model_copy(
            update={"heldout_workloads": ["gamma"], "max_train_tokens": 1500,
                    "max_eval_tokens": 300, "call_stacks": True})}
    )  # fmt: skip
    split = load_split(events_root, cfg.data)  # call_stacks: set by model.frame_depth
    # WHEN trained and scored as the night does
    model, _ = fit_inputs(cfg, training_inputs(cfg, split), tmp_path / "ckpt", verbose=0)
    evaluation, _ = evaluate_model(model, cfg, split)
    # THEN the registered model reads the stack and every table was scored
    assert takes_frames(model) and frame_depth_of(model) == DEPTH
    assert evaluation.get("model").positions > 0
    # and a split read without stacks is refused by name
    plain = cfg.data.model_copy(update={"call_stacks": False})
    with pytest.raises(StacksMissing, match="data.call_stacks"):
        training_inputs(cfg, load_split(events_root, plain))


def test_a_bundle_of_a_stack_config_is_refused_by_name(events_root, tmp_path):
    from tasks.learning.nextcall.training import export_bundle

    with pytest.raises(ValueError, match="does not carry each call's stack"):
        export_bundle(events_root, stack_cfg(), tmp_path / "b.npz")
    assert not (tmp_path / "b.npz").exists()
