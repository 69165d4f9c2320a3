"""The questions' counters on the calling context (tasks/learning/questions/context.py): a call
without a stack answers as the call-site counter, and a free is keyed on its block's allocation."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.dataset.contexts import NO_CONTEXT
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.events_schema import STACKS_SCHEMA
from tasks.format.trace_reader import Op
from tasks.learning.counters.by_context import NO_KEY
from tasks.learning.counters.by_due import lifetime_due
from tasks.learning.labels import process_order, request_and_free_classes
from tasks.learning.questions.context import (
    CONTEXT_DEPTHS,
    CONTEXT_ONLINE,
    CONTEXT_SURVIVAL,
    CONTEXT_TABLE,
    allocation_levels,
    calls_since_same,
    context_priors,
    previous_allocation,
    reuse_levels,
    run_contexts,
    with_class,
)
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_majority
from tasks.learning.questions.reuse import call_sites, majority_of, reuse_answers
from tests.tasks.learning.questions.test_lifetime import _freed_after
from tests.tasks.learning.questions.test_reuse import _with_callers
from tests.tasks.learning.test_labels import _events


def _no_stacks(t: pa.Table) -> dict[int, np.ndarray]:
    """The contexts of a run recorded without stacks (--frames 0, an older dataset)."""
    t = t.append_column("stack", pa.nulls(t.num_rows, pa.uint64()))
    return run_contexts(StackFrames.of_table(STACKS_SCHEMA.empty_table()), t)


def test_a_run_without_stacks_has_no_context():
    t = _with_callers(_events(3, n=50), 3)
    ctx = _no_stacks(t)
    assert sorted(ctx) == sorted(CONTEXT_DEPTHS)
    assert all((k == NO_CONTEXT).all() for k in ctx.values())


def test_without_stacks_the_context_counters_are_the_call_site_counter():
    # GIVEN a run whose trace has callers but no stacks, and priors learned from another run
    t = _with_callers(_events(8, n=400), 8)
    other = _with_callers(_events(9, n=400), 9)
    ctx = _no_stacks(t)
    priors = context_priors([other], [_no_stacks(other)])
    life = lifetime_answers(t, lifetime_majority([other]), contexts=ctx, priors=priors)
    reuse = reuse_answers(t, majority_of([other]), contexts=ctx, prior=priors["reuse"])
    # THEN the context counters answer exactly as site_online (and site_survival), everywhere
    for a in (*life.values(), reuse):
        for name in (CONTEXT_ONLINE, CONTEXT_TABLE):
            np.testing.assert_array_equal(a.probs[name], a.probs["site_online"])
    for a in life.values():
        np.testing.assert_array_equal(a.probs[CONTEXT_SURVIVAL], a.probs["site_survival"])
    # and without contexts, the questions answer as before (no context counters at all)
    assert (
        CONTEXT_ONLINE
        not in lifetime_answers(t, lifetime_majority([other]))["lifetime_calls"].probs
    )


def test_a_free_is_keyed_on_its_blocks_allocation_context():
    # GIVEN a malloc (context 11) freed two calls later, and a free of a block never seen
    t = pa.table(
        {
            "pid": pa.array([1, 1, 1, 1], pa.uint32()),
            "thread": pa.array([0, 0, 0, 0], pa.uint16()),
            "seq": pa.array([0, 1, 2, 3], pa.uint64()),
            "time_ns": pa.array([0, 1, 2, 3], pa.int64()),
            "op": pa.array(
                [int(Op.MALLOC), int(Op.MALLOC), int(Op.FREE), int(Op.FREE)], pa.uint8()
            ),
            "size": pa.array([64, 64, 0, 0], pa.uint64()),
            "addr": pa.array([0x10, 0x20, 0x10, 0x90], pa.uint64()),
            "freed_size": pa.array([None, None, 64, 64], pa.uint64()),
            "lifetime_ns": pa.array([2, None, None, None], pa.int64()),
            "lifetime_calls": pa.array([2, None, None, None], pa.int64()),
        }
    )
    ctx = {d: np.array([11, 12, NO_CONTEXT, NO_CONTEXT], np.int64) for d in CONTEXT_DEPTHS}
    order, starts = process_order(t)
    _, free_cls = request_and_free_classes(t)
    levels = reuse_levels(ctx, free_cls, call_sites(t), order, lifetime_due(t, order, starts))
    # THEN the first free's keys are the malloc's context, the unpaired free has none
    for lv in levels[2:]:
        assert lv[2] == with_class(np.array([11]), free_cls[2:3])[0]
        assert lv[3] == NO_CONTEXT


def test_contexts_behind_one_call_site_are_told_apart():
    # GIVEN every call through one wrapper site, and stacks whose context decides the lifetime
    t = _events(5, n=3000)
    t = t.append_column("caller_module", pa.array(["/bin/prog"] * t.num_rows).dictionary_encode())
    t = t.append_column("caller_offset", pa.array(np.full(t.num_rows, 16, np.uint64)))
    life = lifetime_majority([t])
    by_class = lifetime_answers(t, life)["lifetime_calls"]
    ctx = np.full(t.num_rows, NO_CONTEXT, np.int64)
    ctx[by_class.rows] = 100 + by_class.labels  # a stack per lifetime class
    got = lifetime_answers(t, life, contexts={d: ctx for d in CONTEXT_DEPTHS})["lifetime_calls"]
    y = got.labels

    def top1(name: str) -> float:
        return float((got.probs[name].argmax(axis=1) == y).mean())

    # THEN the context counters answer better than the one site can
    assert top1(CONTEXT_ONLINE) > top1("site_online") + 0.2
    assert top1(CONTEXT_SURVIVAL) > top1("site_survival") + 0.2


def test_the_context_counters_read_only_what_is_known_before_the_call():
    # GIVEN a run with stacks, and the same run where every block still live at row `cut` of
    # its process lives longer or is never freed; the training counts from a third run
    t = _with_callers(_events(11, n=400), 11)
    cut = 250
    where, never, life, later = _freed_after(t, cut)
    longer = pa.array(np.where(later, life + 5000, life), mask=never | (later & (life % 2 == 0)))
    u = t.set_column(t.column_names.index("lifetime_calls"), "lifetime_calls", longer)
    rng = np.random.default_rng(3)
    ctx = {d: rng.integers(0, 3 * d, t.num_rows).astype(np.int64) for d in CONTEXT_DEPTHS}
    other = _with_callers(_events(12, n=400), 12)
    priors = context_priors([other], [{d: k.copy() for d, k in ctx.items()}])
    maj = lifetime_majority([other])
    a = lifetime_answers(t, maj, contexts=ctx, priors=priors)["lifetime_calls"]
    b = lifetime_answers(u, maj, contexts=ctx, priors=priors)["lifetime_calls"]
    # THEN every context counter's answer at or before the cut is the same, and a later differs
    early = where[a.rows] <= cut
    for name in (CONTEXT_ONLINE, CONTEXT_TABLE, CONTEXT_SURVIVAL):
        np.testing.assert_array_equal(a.probs[name][early], b.probs[name][early])
        assert not np.array_equal(a.probs[name][~early], b.probs[name][~early])


def test_blocks_of_one_stack_are_told_apart_by_their_exact_size():
    # GIVEN every allocation from one stack and of one size class (32..60 bytes), its exact
    # size deciding its lifetime
    t = _events(6, n=3000)
    t = t.append_column("caller_module", pa.array(["/bin/prog"] * t.num_rows).dictionary_encode())
    t = t.append_column("caller_offset", pa.array(np.full(t.num_rows, 16, np.uint64)))
    life = lifetime_majority([t])
    rows = lifetime_answers(t, life)["lifetime_calls"]
    size = np.full(t.num_rows, 40, np.uint64)
    size[rows.rows] = 32 + 4 * rows.labels.astype(np.uint64)
    t = t.set_column(t.column_names.index("size"), "size", pa.array(size))
    ctx = {d: np.full(t.num_rows, 100, np.int64) for d in CONTEXT_DEPTHS}
    priors = context_priors([t], [ctx])
    got = lifetime_answers(t, life, contexts=ctx, priors=priors)["lifetime_calls"]
    assert (got.labels == rows.labels).all()

    def top1(name: str) -> float:
        return float((got.probs[name].argmax(axis=1) == got.labels).mean())

    # THEN the context counters answer by the size, which the site's class cannot
    for name in (CONTEXT_ONLINE, CONTEXT_TABLE):
        assert top1(name) > top1("site_online") + 0.2
    assert top1(CONTEXT_TABLE) > 0.95
    assert top1(CONTEXT_SURVIVAL) > top1("site_survival") + 0.2


def _two_processes() -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """Process 1: malloc, free, malloc, malloc; process 2 (interleaved): malloc, malloc."""
    op = [Op.MALLOC, Op.MALLOC, Op.FREE, Op.MALLOC, Op.MALLOC, Op.MALLOC]
    t = pa.table(
        {
            "pid": pa.array([1, 2, 1, 1, 2, 1], pa.uint32()),
            "thread": pa.array([0] * 6, pa.uint16()),
            "seq": pa.array(range(6), pa.uint64()),
            "time_ns": pa.array(range(6), pa.int64()),
            "op": pa.array([int(o) for o in op], pa.uint8()),
            "size": pa.array([8, 8, 0, 8, 8, 8], pa.uint64()),
            "addr": pa.array([0x10, 0x20, 0x10, 0x30, 0x40, 0x50], pa.uint64()),
            "freed_size": pa.array([None, None, 8, None, None, None], pa.uint64()),
            "lifetime_ns": pa.array([2, None, None, None, None, None], pa.int64()),
            "lifetime_calls": pa.array([2, None, None, None, None, None], pa.int64()),
        }
    )
    order, starts = process_order(t)
    return t, order, starts


def test_the_previous_allocation_is_the_processs_own_and_skips_frees():
    t, order, starts = _two_processes()
    req_cls, _ = request_and_free_classes(t)
    key = np.array([10, 20, NO_CONTEXT, 30, 40, 50], np.int64)
    prev = previous_allocation(key, req_cls >= 0, order, starts)
    # rows 0, 3, 5 are process 1's mallocs (row 2 its free); rows 1, 4 process 2's
    np.testing.assert_array_equal(prev, [NO_KEY, NO_KEY, 10, 10, 20, 30])


def test_the_calls_since_the_same_key_count_the_processs_calls():
    t, order, starts = _two_processes()
    key = np.array([7, 7, NO_KEY, 7, 7, 8], np.int64)
    got = calls_since_same(key, order, starts)
    # process 1 in call order: rows 0 (7), 2 (none), 3 (7: 2 calls later), 5 (8: first)
    np.testing.assert_array_equal(got, [NO_KEY, NO_KEY, NO_KEY, 2, 1, NO_KEY])


def test_the_lifetime_chain_keys_the_stack_with_the_exact_size_and_what_came_before():
    t, order, starts = _two_processes()
    ctx = {d: np.array([5, 5, NO_CONTEXT, 5, 5, 6], np.int64) for d in CONTEXT_DEPTHS}
    levels = allocation_levels(t, ctx, order, starts)
    assert len(levels) == 1 + len(CONTEXT_DEPTHS) + 3
    by_size, after, since = levels[-3:]
    # the same stack and size: one key by size; the one before differs where it came first
    assert by_size[0] == by_size[3] != NO_KEY
    assert after[0] != after[3]  # row 0 the process's first, row 3 after row 0
    assert since[3] != after[3]
    # a free and a call without a stack have none at any context level
    assert all(lv[2] == NO_KEY for lv in levels[1:])
    # another size of the same class and stack is another key
    u = t.set_column(
        t.column_names.index("size"), "size", pa.array([8, 8, 0, 9, 8, 8], pa.uint64())
    )
    assert allocation_levels(u, ctx, order, starts)[-3][3] != by_size[3]
    assert allocation_levels(u, ctx, order, starts)[1][3] == levels[1][3]
