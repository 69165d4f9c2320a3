"""The allocator's questions' network (tasks/learning/questions/network.py): causal, windowed per
process, distilled into the layer's table, and loadable as the registry logs it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.learning.labels import LIFETIME_CLASSES, NO_LABEL, REUSE_CLASSES
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_majority
from tasks.learning.questions.network import (
    N_FEATURES,
    WINDOW,
    QuestionNetwork,
    _windows,
    build_network,
    distilled_table,
    load_question_network,
    question_inputs,
    train_network,
)
from tasks.learning.questions.reuse import majority_of, reuse_answers
from tasks.learning.train_config import QuestionsConfig
from tests.tasks.learning.questions.test_reuse import _with_callers
from tests.tasks.learning.test_labels import _events

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def _inputs(t: pa.Table):
    maj, life = majority_of([t]), lifetime_majority([t])
    return question_inputs(t, {"reuse": reuse_answers(t, maj), **lifetime_answers(t, life)})


def _one_process(seed: int, n: int) -> pa.Table:
    t = _with_callers(_events(seed, n=n), seed)
    return t.set_column(0, "pid", pa.array(np.full(n, 7, np.uint32)))


def _future_changed(t: pa.Table, cut: int, seed: int) -> pa.Table:
    """`t` with every call from `cut` on replaced, and what the first `cut` calls say of the
    future (a lifetime that ends at or after `cut`) redrawn: nothing a program knows before
    call `cut` is kept."""
    other = _one_process(seed, t.num_rows)
    mixed = pa.concat_tables([t.slice(0, cut), other.slice(cut)]).to_pydict()
    rng = np.random.default_rng(seed)
    for j in range(cut):
        life = mixed["lifetime_calls"][j]
        if life is not None and j + life >= cut:
            never = rng.random() < 0.3
            mixed["lifetime_calls"][j] = None if never else cut - j + int(rng.integers(0, 5000))
            mixed["lifetime_ns"][j] = None if never else int(rng.integers(10, 10**11))
    return pa.table(mixed, schema=t.schema)


def test_an_answer_never_reads_the_calls_after_it():
    # GIVEN one process (call order = row order) over three windows, and the same process with
    # every call from 400 on replaced and the early calls' future lifetimes redrawn
    n, cut = 700, 400
    t = _one_process(3, n)
    changed = _future_changed(t, cut, 4)
    a, b = _inputs(t), _inputs(changed)
    assert not np.array_equal(a.features[cut:], b.features[cut:])
    # THEN the features of the first 400 calls are the same
    np.testing.assert_array_equal(a.tokens[:cut], b.tokens[:cut])
    np.testing.assert_array_equal(a.sites[:cut], b.sites[:cut])
    np.testing.assert_array_equal(a.features[:cut], b.features[:cut])
    # AND so is the network's answer there, every question (an untrained network's weights are
    # random, not zero: any path from a later call would show)
    import keras

    keras.utils.set_random_seed(1)
    net = QuestionNetwork(build_network(16), 0, 0, 0.0)
    got_a, got_b = net.answer(a), net.answer(b)
    for q in got_a:
        np.testing.assert_allclose(got_a[q][:cut], got_b[q][:cut], rtol=1e-5, atol=1e-6)
        assert not np.allclose(got_a[q][cut:], got_b[q][cut:])


def test_a_window_never_holds_two_processes():
    starts = np.zeros(WINDOW * 2 + 30, bool)
    starts[[0, 10, 10 + WINDOW + 5]] = True  # processes of 10, WINDOW + 5 and WINDOW + 15 calls
    window, slot, count = _windows(starts)
    proc = np.cumsum(starts) - 1
    assert count == 1 + 2 + 2
    for w in range(count):
        assert len(set(proc[window == w])) == 1
    # each process starts at slot 0, and its calls fill their windows in order
    assert (slot[starts] == 0).all()
    assert len(set(zip(window, slot, strict=True))) == len(starts)


def test_the_network_trains_answers_distributions_and_is_distilled_into_the_table(tmp_path):
    t1, t2 = _one_process(5, 600), _events(6, n=500)  # the second without callers
    inputs = [_inputs(t1), _inputs(t2)]
    assert inputs[1].sites.max() == 0 and inputs[0].features.shape[1] == N_FEATURES
    cfg = QuestionsConfig(units=8, epochs=1, batch_size=4)
    net = train_network(inputs, cfg, seed=0)
    assert net.train_calls == 1100 and net.seconds > 0
    answers = [net.answer(i) for i in inputs]
    for ans in answers:
        for q, k in (("reuse", REUSE_CLASSES), ("lifetime_calls", LIFETIME_CLASSES)):
            assert ans[q].shape[1] == k
            np.testing.assert_allclose(ans[q].sum(axis=1), 1.0, rtol=1e-5)
    # the table holds, per size class, the network's mean answer at the training frees
    table = distilled_table(inputs, answers, majority_of([t1, t2]))
    frees = [
        (i.free_class[k], ans["reuse"][i.order[k]])
        for i, ans in zip(inputs, answers, strict=True)
        for k in np.flatnonzero((i.free_class >= 0) & (i.labels["reuse"] != NO_LABEL))
    ]
    probs = table.reuse_probs(eps=0.0)
    for c in {c for c, _ in frees}:
        want = np.mean([p for cc, p in frees if cc == c], axis=0)
        np.testing.assert_allclose(probs[c], want, rtol=1e-6)
    # AND the file the registry logs answers as the network does
    path = tmp_path / "network.keras"
    net.model.save(path)
    loaded = QuestionNetwork(load_question_network(path), 0, 0, 0.0)
    np.testing.assert_allclose(loaded.answer(inputs[0])["reuse"], answers[0]["reuse"], rtol=1e-5)


def test_a_bad_setting_is_refused_with_its_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="epochs"):
        QuestionsConfig(epochs=0)
