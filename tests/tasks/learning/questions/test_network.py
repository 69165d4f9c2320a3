"""The allocator's questions' network (tasks/learning/questions/network.py): causal, windowed per
process, distilled into the layer's table, and loadable as the registry logs it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.events_reader import StackFrames
from tasks.dataset.frame_tokens import RunStacks
from tasks.format.trace_reader import Op
from tasks.learning.labels import LIFETIME_CLASSES, NO_LABEL, REUSE_CLASSES
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_majority
from tasks.learning.questions.network import (
    N_FEATURES,
    WINDOW,
    QuestionNetwork,
    _windows,
    build_network,
    distilled_table,
    frame_depth_of,
    load_question_network,
    question_inputs,
    train_network,
)
from tasks.learning.questions.reuse import majority_of, reuse_answers
from tasks.learning.train_config import QuestionsConfig
from tests.tasks.dataset.test_frame_tokens import stacks_table
from tests.tasks.learning.questions.test_reuse import _with_callers
from tests.tasks.learning.test_labels import _events

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


# a run's stacks: two programs' allocation wrappers over callers, one frame unnamed
FRAMES = StackFrames.of_table(
    stacks_table(
        {
            1: [("/bin/p", 0x10, "xmalloc"), ("/bin/p", 0x400, "parse_line")],
            2: [("/bin/p", 0x10, "xmalloc"), ("/bin/p", 0x9000, "")],
            3: [("/lib/libpython.so", 0x20, "PyUnicode_New"), ("/lib/libpython.so", 0x90, "main")],
            4: [("/lib/libc.so.6", 0x30, "strdup")],
        }
    )
)


def _inputs(t: pa.Table, frames: StackFrames | None = FRAMES, depth: int = 8):
    maj, life = majority_of([t]), lifetime_majority([t])
    answers = {"reuse": reuse_answers(t, maj), **lifetime_answers(t, life)}
    return question_inputs(t, answers, None if frames is None else RunStacks.of(frames, depth))


def _with_stacks(t: pa.Table, seed: int) -> pa.Table:
    """`t` with a stack (one of FRAMES' four) at every call but a free."""
    rng = np.random.default_rng(seed)
    free = t.column("op").to_numpy() == int(Op.FREE)
    ids = rng.integers(1, 5, t.num_rows).astype(np.uint64)
    return t.append_column("stack", pa.array(ids, mask=free))


def _one_process(seed: int, n: int) -> pa.Table:
    t = _with_stacks(_with_callers(_events(seed, n=n), seed), seed)
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
    np.testing.assert_array_equal(a.stack_rows[:cut], b.stack_rows[:cut])
    assert not np.array_equal(a.stack_rows[cut:], b.stack_rows[cut:])
    # AND so is the network's answer there, every question (an untrained network's weights are
    # random, not zero: any path from a later call would show)
    import keras

    keras.utils.set_random_seed(1)
    net = QuestionNetwork(build_network(16), 0, 0, 0.0)
    pieces = net.model.get_layer("frame_pieces")  # zeros until trained: made to read the stacks
    pieces.embeddings.assign(np.random.default_rng(2).normal(size=pieces.embeddings.shape))
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


def test_a_free_reads_its_blocks_allocation_stack():
    # GIVEN one process: a malloc from stack 3, a malloc from stack 1, then the free of the
    # first block (its lifetime: 2 calls) and a free of a block not allocated here
    t = _one_process(0, 4)
    t = t.set_column(t.schema.get_field_index("op"), "op", pa.array(
        [int(Op.MALLOC), int(Op.MALLOC), int(Op.FREE), int(Op.FREE)], pa.uint8()))  # fmt: skip
    t = t.set_column(t.schema.get_field_index("size"), "size", pa.array([8, 8, 0, 0], pa.uint64()))
    t = t.set_column(t.schema.get_field_index("freed_size"), "freed_size",
                     pa.array([None, None, 8, 8], pa.uint64()))  # fmt: skip
    t = t.set_column(t.schema.get_field_index("lifetime_calls"), "lifetime_calls",
                     pa.array([2, None, None, None], pa.int64()))  # fmt: skip
    t = t.set_column(t.schema.get_field_index("stack"), "stack",
                     pa.array([3, 1, None, None], pa.uint64()))  # fmt: skip
    rows = _inputs(t).stack_rows
    # THEN the first free reads stack 3's row, the unpaired free no stack
    assert rows[2] == rows[0] and rows[0] != rows[1] and rows[3] == 0
    # AND without the run's stacks there is no stack row at all
    assert _inputs(t, None).stack_rows is None


def test_the_network_trains_answers_distributions_and_is_distilled_into_the_table(tmp_path):
    t1, t2 = _one_process(5, 600), _events(6, n=500)  # the second without callers nor stacks
    inputs = [_inputs(t1, depth=2), _inputs(t2)]  # the network reads the depth it is given
    assert inputs[1].sites.max() == 0 and inputs[0].features.shape[1] == N_FEATURES
    assert inputs[1].stack_rows is None and inputs[0].stack_rows.max() > 0
    cfg = QuestionsConfig(units=8, epochs=1, batch_size=4)
    net = train_network(inputs, cfg, seed=0)
    assert net.train_calls == 1100 and net.seconds > 0 and frame_depth_of(net.model) == 2
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
    # AND it reads the stacks: the same run without them (all padding) is answered, otherwise
    blind = net.answer(_inputs(t1, None))
    for q, p in blind.items():
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
        assert not np.allclose(p, answers[0][q])


def test_a_network_answers_inputs_made_at_another_depth():
    # GIVEN inputs of 8 frames a call and a network of 2 (and one of 12)
    t = _one_process(8, 300)
    inputs = _inputs(t)
    assert inputs.stack_tokens.shape[1] == 8
    for depth in (2, 12):
        keras_net = build_network(8, frame_depth=depth)
        got = QuestionNetwork(keras_net, 0, 0, 0.0).answer(inputs)
        # THEN each reads its own depth (cut, or padded), and answers every call
        assert got["reuse"].shape == (300, REUSE_CLASSES)
        np.testing.assert_allclose(got["lifetime_calls"].sum(axis=1), 1.0, rtol=1e-5)
        # AND at any batch size (its last batch filled with copies, their answers dropped)
        for batch_size in (1, 7):
            again = QuestionNetwork(keras_net, 0, 0, 0.0).answer(inputs, batch_size=batch_size)
            for q, p in got.items():
                np.testing.assert_allclose(again[q], p, rtol=1e-5, atol=1e-6)


def test_a_bad_setting_is_refused_with_its_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="epochs"):
        QuestionsConfig(epochs=0)


def test_the_table_is_distilled_per_allocation_context_as_per_call_site():
    # GIVEN a run with stacks, its allocation contexts at the table's depth, and answers at
    # every call (any distributions: the distillation averages what it is given)
    from tasks.dataset.contexts import event_contexts
    from tasks.learning.table.distill import CONTEXT_DEPTH, allocation_contexts

    t = _one_process(7, 600)
    inp = _inputs(t)
    rng = np.random.default_rng(0)
    p = rng.random((t.num_rows, REUSE_CLASSES))
    answers = [{"reuse": p / p.sum(axis=1, keepdims=True)}]
    rows = event_contexts(FRAMES, t.column("stack"), (CONTEXT_DEPTH,))[CONTEXT_DEPTH]
    actx = allocation_contexts(t, rows)
    # WHEN distilled with the contexts
    table = distilled_table([inp], answers, majority_of([t]), [actx])
    c = table.context_counts
    # THEN each (allocation context, class) key holds the sum of the answers at its frees
    free_cls = np.full(t.num_rows, -1)
    free_cls[inp.order] = inp.free_class
    label = np.full(t.num_rows, NO_LABEL)
    label[inp.order] = inp.labels["reuse"]
    at = (free_cls >= 0) & (label != NO_LABEL) & (actx >= 0)
    keys = sorted(set(zip(actx[at].tolist(), free_cls[at].tolist(), strict=True)))
    assert list(zip(c.context.tolist(), c.cls.tolist(), strict=True)) == keys
    assert len(keys) > 4  # several contexts, several classes
    for j, (k, cl) in enumerate(keys):
        np.testing.assert_allclose(
            c.counts[j], answers[0]["reuse"][at & (actx == k) & (free_cls == cl)].sum(axis=0)
        )
    # AND without the contexts there are none (format 3), the rest alike
    plain = distilled_table([inp], answers, majority_of([t]))
    assert plain.context_counts is None
    np.testing.assert_array_equal(plain.site_counts, table.site_counts)
