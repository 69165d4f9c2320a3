"""The what-if stage's default guided decision is causal: what a live cache has at the free.

GIVEN random traces (several processes and threads, frees, reallocs) and per-row predictions
WHEN  every event after a free (in time, any process) is changed, and so is every prediction
      made after it
THEN  the causal decision at that free (the model's path: keep_at_free of the top-k made at the
      free; the online counter: the night's predictions_for at horizon 1) is unchanged, while the optimistic paths (the thread's true future, top-k read 16 calls ahead) do change
      on these traces (so the perturbation reaches what a peeking decision reads).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.token_runs import TokenRun
from tasks.whatif.guided import (
    NONE_TOKEN,
    _free_class,
    keep_at_free,
    next_call_top,
    predictions_from_topk,
    reuse_labels,
)
from tasks.whatif.night import THREAD_FUTURE, predictions_for
from tests.tasks.whatif.reference import random_events

SEEDS = range(6)


def _trace(seed: int) -> pa.Table:
    # min_step=1: no two calls of a process at the same ns, so "after the free" is strict
    return random_events(seed, n_proc=2, n_events=300, time_step=3, min_step=1)


def _token_run(table: pa.Table) -> TokenRun:
    """The run's tokens as tasks.dataset.token_runs.read_run orders them."""
    key = (table.column("pid").to_numpy().astype(np.uint64) << np.uint64(16)) | table.column(
        "thread"
    ).to_numpy().astype(np.uint64)
    order = np.lexsort((table.column("seq").to_numpy(), key))
    k = key[order]
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    offsets = np.concatenate([starts, [len(k)]]).astype(np.int64)
    tokens = table.column("token").to_numpy().astype(np.uint8)[order]
    return TokenRun("w", "r", tokens, offsets)


def _perturbed(table: pa.Table, after: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """Every row in `after`: another requested size, freed size and token."""
    n = table.num_rows
    size = table.column("size").to_numpy().copy()
    size[after] = rng.integers(1, 1 << 20, after.sum())
    freed = table.column("freed_size")
    has = ~np.asarray(freed.is_null().to_numpy(zero_copy_only=False))
    fsize = freed.fill_null(0).to_numpy().copy()
    fsize[after & has] = rng.integers(1, 1 << 20, (after & has).sum())
    token = table.column("token").to_numpy().copy()
    token[after] = rng.integers(0, 64, after.sum())
    cols = {
        "size": pa.array(size, pa.uint64()),
        "freed_size": pa.array(fsize, pa.uint64(), mask=~has),
        "token": pa.array(token, pa.uint8()),
    }
    for name, col in cols.items():
        table = table.set_column(table.schema.get_field_index(name), name, col)
    assert table.num_rows == n
    return table


def _frees(table: pa.Table, rng: np.random.Generator, k: int = 12) -> np.ndarray:
    rows = np.flatnonzero(_free_class(table) >= 0)
    return rng.choice(rows, size=min(k, len(rows)), replace=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_decision_at_a_free_ignores_every_later_event_and_prediction(seed):
    rng = np.random.default_rng(seed)
    table = _trace(seed)
    time = table.column("time_ns").to_numpy()
    top = rng.integers(0, 40, (table.num_rows, 5)).astype(np.uint8)  # made for each row
    at_free = next_call_top(table, top)
    keep = keep_at_free(table, at_free)
    causal = predictions_for(table, _token_run(table), None, horizon=1)[0]
    future = reuse_labels(table, horizon=16)
    peek = predictions_from_topk(table, top, horizon=16)
    changed_future = changed_peek = 0
    for i in _frees(table, rng):
        after = time > time[i]
        other = _perturbed(table, after, rng)
        # the model's path: rows after the free get other events AND other predictions
        at_free2 = at_free.copy()
        at_free2[after] = rng.integers(0, 40, (after.sum(), at_free.shape[1]))
        assert keep_at_free(other, at_free2)[i] == keep[i], i
        # the online counter's path, end to end from the events
        causal2 = predictions_for(other, _token_run(other), None, horizon=1)[0]
        assert causal2["online"][i] == causal["online"][i], i
        top2 = top.copy()
        top2[after] = rng.integers(0, 40, (after.sum(), top.shape[1]))
        changed_future += reuse_labels(other, horizon=16)[i] != future[i]
        changed_peek += predictions_from_topk(other, top2, horizon=16)[i] != peek[i]
    # the perturbation reaches what the optimistic paths read (the test has teeth)
    assert changed_future + changed_peek > 0


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_the_reuse_networks_decision_at_a_free_ignores_every_later_event(seed):
    import keras

    from tasks.learning.questions.network import build_network, soon_probability
    from tasks.whatif.night import Predictor

    # GIVEN the questions' network (untrained: random weights, so any path from a later call
    # would show) as the night's `questions` predictor
    keras.utils.set_random_seed(seed)
    predictor = Predictor(questions=build_network(16))
    rng = np.random.default_rng(200 + seed)
    table = _trace(200 + seed)
    time = table.column("time_ns").to_numpy()
    keep, notes = predictions_for(table, _token_run(table), predictor, horizon=1)
    p = soon_probability(table, predictor.questions)
    assert keep["questions"].tolist() == (np.nan_to_num(p) >= 0.5).tolist()
    assert any("no `model` predictor" in n for n in notes)
    # WHEN every event after a free changes THEN its answer at that free does not
    changed = 0
    for i in _frees(table, rng, k=6):
        other = _perturbed(table, time > time[i], rng)
        again = predictions_for(other, _token_run(other), predictor, horizon=1)[0]
        assert again["questions"][i] == keep["questions"][i], i
        p2 = soon_probability(other, predictor.questions)
        np.testing.assert_allclose(p2[i], p[i], rtol=1e-5)
        changed += not np.allclose(np.nan_to_num(p2), np.nan_to_num(p))
    assert changed  # the perturbation reaches the network's later answers (the test has teeth)


@pytest.mark.parametrize("seed", SEEDS)
def test_causal_keep_equals_the_prediction_for_the_next_call(seed):
    """keep_at_free(next_call_top(top)) is predictions_from_topk at horizon 1: the same
    decision, stated as what the predictor has at the free."""
    rng = np.random.default_rng(100 + seed)
    table = _trace(100 + seed)
    top = rng.integers(0, 40, (table.num_rows, 3)).astype(np.uint8)
    top[rng.random(table.num_rows) < 0.1] = NONE_TOKEN
    causal = keep_at_free(table, next_call_top(table, top))
    assert causal.tolist() == predictions_from_topk(table, top, horizon=1).tolist()
    assert causal.any() and not causal.all()


def test_night_names_every_peeking_predictor_optimistic():
    table = _trace(7)
    run = _token_run(table)
    causal, _ = predictions_for(table, run, None, horizon=1)
    assert sorted(causal) == sorted(["online", THREAD_FUTURE])
    peeking, _ = predictions_for(table, run, None, horizon=16)
    assert sorted(peeking) == sorted(["online_optimistic", THREAD_FUTURE])
    assert THREAD_FUTURE.endswith("_optimistic")


def test_next_call_top_checks_its_rows():
    table = _trace(8)
    with pytest.raises(ValueError, match="rows"):
        next_call_top(table, np.zeros((table.num_rows - 1, 5), np.uint8))
    with pytest.raises(ValueError, match="rows"):
        keep_at_free(table, np.zeros((3, 5), np.uint8))


def test_a_trace_without_call_sites_is_said_so_where_the_questions_answer():
    from tasks.whatif.night import Predictor

    # GIVEN a run traced with --no-caller (its caller columns null, as the events reader reads them)
    table = _trace(300)
    assert table.column("caller_offset").null_count == table.num_rows
    _, notes = predictions_for(table, _token_run(table), Predictor(), horizon=1)
    # THEN the replay's notes say it plainly
    said = "w/r: this trace has no call sites (recorded with --no-caller): site_online answers"
    assert any(n.startswith(said) for n in notes), notes
    # AND with callers recorded, nothing of it; without a predictor nothing reads them
    n = table.num_rows
    traced = table
    for name, col in (
        ("caller_module", pa.array(["/usr/bin/prog"] * n)),
        ("caller_offset", pa.array(np.arange(n, dtype=np.uint64) * 16)),
    ):
        traced = traced.set_column(traced.schema.get_field_index(name), name, col)
    _, notes = predictions_for(traced, _token_run(traced), Predictor(), horizon=1)
    assert not any("no call sites" in n for n in notes), notes
    assert predictions_for(table, _token_run(table), None, horizon=1)[1] == []
