"""The layer's table file, format 4 (native/TABLE.md "Context entries"): the (allocation context,
class) keys counted from the training frees joined to their allocations, written and read back
as the layer reads them; a file the layer would refuse is refused here too."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.sites import call_sites
from tasks.format.trace_reader import Op
from tasks.learning.labels import REUSE_CLASSES, allocator_labels
from tasks.learning.table.distill import CONTEXT_DEPTH, ClassTable, ContextCounts, class_table
from tasks.learning.table.layer_file import (
    HEADER,
    fnv1a64,
    layer_entries,
    read_table_file,
    write_layer_table,
)

BIG = 300_000  # class 19


def _run() -> tuple[pa.Table, np.ndarray]:
    """One process: blocks from contexts 11 and 22 freed (rows 2, 3), one from 11 again never
    freed, a small one from 33 freed; each row's context key (frees: none)."""
    op = [Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE, Op.MALLOC, Op.MALLOC, Op.FREE]
    size = [BIG, BIG, 0, 0, BIG, 100, 0]
    addr = [0x1000, 0x9000, 0x1000, 0x9000, 0x1000, 0x20, 0x20]
    freed = [None, None, BIG, BIG, None, None, 100]
    life = [2, 2, None, None, None, 1, None]
    ctx = np.array([11, 22, -1, -1, 11, 33, -1], np.int64)
    n = len(op)
    table = pa.table(
        {
            "pid": pa.array(np.full(n, 7, np.uint32)),
            "thread": pa.array(np.zeros(n, np.uint16)),
            "seq": pa.array(np.arange(n, dtype=np.uint64)),
            "time_ns": pa.array(np.arange(n, dtype=np.int64) * 10),
            "op": pa.array(np.array([int(o) for o in op], np.uint8)),
            "size": pa.array(np.array(size, np.uint64)),
            "addr": pa.array(np.array(addr, np.uint64)),
            "freed_size": pa.array(freed, pa.uint64()),
            "lifetime_ns": pa.array([None if v is None else 10 * v for v in life], pa.int64()),
            "lifetime_calls": pa.array(life, pa.int64()),
        }
    )
    return table, ctx


def test_the_frees_are_counted_by_their_allocations_context():
    # GIVEN a run whose frees carry no stack, and each allocation's context
    table, ctx = _run()
    reuse = allocator_labels(table).reuse
    # WHEN the table is counted with the run's contexts
    t = class_table([table, table], np.full(REUSE_CLASSES, 0.2), [ctx, None])
    c = t.context_counts
    # THEN each free counts under its allocation's (context, class), the run without stacks
    # under none
    assert c.depth == CONTEXT_DEPTH
    assert list(zip(c.context.tolist(), c.cls.tolist(), strict=True)) == [
        (11, 19),
        (22, 19),
        (33, 7),
    ]
    want = np.zeros((3, REUSE_CLASSES))
    want[0, reuse[2]] = want[1, reuse[3]] = want[2, reuse[6]] = 1
    np.testing.assert_array_equal(c.counts, want)


def _table() -> ClassTable:
    counts = np.ones((32, REUSE_CLASSES))
    sites = np.zeros((4096, 32, REUSE_CLASSES))
    sites[5, 19, 0] = 3
    per = np.zeros((3, REUSE_CLASSES))
    per[0, 0] = per[1, REUSE_CLASSES - 1] = per[2, 1] = 10
    ctx = ContextCounts(4, np.array([2**62 + 1, 7, 7]), np.array([19, 20, 19]), per)
    return ClassTable(counts, np.full(REUSE_CLASSES, 0.2), sites, ctx)


def test_the_written_file_reads_back_as_the_layer_reads_it(tmp_path):
    # GIVEN a table with class scores, one site entry and three context entries (unsorted)
    table = _table()
    # WHEN written and read back
    path = write_layer_table(tmp_path / "t.hcltab", table, 9)
    raw = path.read_bytes()
    _, fmt, model, _, n, _ = HEADER.unpack_from(raw)
    got = layer_entries(fmt, raw[HEADER.size :])
    # THEN it is format 4, its checks pass, and it holds every key, (context, class) rising
    assert (fmt, model, n) == (4, 9, len(raw) - HEADER.size)
    assert read_table_file(path).version == 9
    np.testing.assert_array_equal(got.keep_scores, table.keep_scores())
    assert got.depth == 4
    assert [int(w >> 8) for w in got.sites] == [5 * 32 + 19]
    scores = table.context_counts.keep_scores()
    assert [
        (int(e["context"]), int(e["word"] >> 8), int(e["word"] & 0xFF)) for e in got.contexts
    ] == [
        (7, 19, scores[2]),
        (7, 20, scores[1]),
        (2**62 + 1, 19, scores[0]),
    ]
    assert scores[0] > 200 and scores[1] < 50
    # AND a table without contexts is written as format 3, as before
    plain = ClassTable(table.reuse_counts, table.majority, table.site_counts)
    raw3 = write_layer_table(tmp_path / "t3.hcltab", plain, 9).read_bytes()
    assert HEADER.unpack_from(raw3)[1] == 3
    assert layer_entries(3, raw3[HEADER.size :]).contexts.size == 0


def test_a_format_4_file_the_layer_would_refuse_is_refused(tmp_path):
    path = write_layer_table(tmp_path / "t.hcltab", _table(), 9)
    raw = bytearray(path.read_bytes())
    # GIVEN its depth made 1 (the checksum made right again)
    at = HEADER.size + 4096
    struct.pack_into("<I", raw, at, 1)
    payload = bytes(raw[HEADER.size :])
    struct.pack_into("<Q", raw, 24, fnv1a64(payload))
    path.write_bytes(bytes(raw))
    # THEN the reader says so, naming the file
    with pytest.raises(ValueError, match=r"t\.hcltab: context depth 1"):
        read_table_file(path)


def _shared_site_table() -> ClassTable:
    """Class 19 freed at call site 5 from two allocation contexts: 11's blocks reused at once,
    22's never; the site's own entry, their mix, says neither."""
    counts = np.ones((32, REUSE_CLASSES))
    sites = np.zeros((4096, 32, REUSE_CLASSES))
    sites[5, 19, 0] = sites[5, 19, REUSE_CLASSES - 1] = 10
    per = np.zeros((2, REUSE_CLASSES))
    per[0, 0] = per[1, REUSE_CLASSES - 1] = 10
    ctx = ContextCounts(CONTEXT_DEPTH, np.array([11, 22]), np.array([19, 19]), per)
    return ClassTable(counts, np.full(REUSE_CLASSES, 0.2), sites, ctx)


def test_a_free_is_answered_by_its_allocations_context_before_its_call_site():
    # GIVEN a table whose site 5 (class 19) is shared by contexts 11 (reused soon) and 22 (not)
    table = _shared_site_table()
    site = np.array([5, 5, 5, 5, 6])
    cls = np.array([19, 19, 19, 20, 19])
    ctx = np.array([11, 22, 33, 11, -1])  # 33: a context training never saw; -1: none
    counter = np.full((5, REUSE_CLASSES), 1.0 / REUSE_CLASSES)
    # WHEN the table answers, as the layer asks it
    probs, at_site, at_context = table.answer(site, cls, 0.1, counter, ctx)
    # THEN the two contexts' frees get their own, opposite answers
    assert probs[0].argmax() == 0 and probs[1].argmax() == REUSE_CLASSES - 1
    assert at_context.tolist() == [True, True, False, False, False]
    # AND an unknown context, or a class the context has no entry for, asks the site
    assert at_site.tolist() == [False, False, True, False, False]
    np.testing.assert_allclose(probs[2, [0, -1]], [0.5, 0.5], atol=0.01)
    # AND a key neither holds (no entry of class 20 at site 5; site 6 unknown) asks the
    # counter (the layer's own)
    np.testing.assert_array_equal(probs[3:], counter[3:])
    # AND without the blocks' contexts the two frees are answered alike, by the site
    blind, _, none = table.answer(site, cls, 0.1, counter)
    np.testing.assert_array_equal(blind[0], blind[1])
    assert not none.any()


def test_a_table_of_context_entries_alone_asks_the_counter_elsewhere():
    # GIVEN a table with context entries and no site entries (the layer's hl_use_sites is set)
    t = _shared_site_table()
    table = ClassTable(t.reuse_counts, t.majority, None, t.context_counts)
    counter = np.full((2, REUSE_CLASSES), 1.0 / REUSE_CLASSES)
    probs, at_site, at_context = table.answer(
        np.array([5, 5]), np.array([19, 19]), 0.1, counter, np.array([11, 99])
    )
    # THEN the known context answers, the other free asks the counter, not the class score
    assert at_context.tolist() == [True, False] and not at_site.any()
    assert probs[0].argmax() == 0
    np.testing.assert_array_equal(probs[1], counter[1])


def test_the_evaluations_table_answer_reads_the_freed_blocks_allocation_context():
    # GIVEN the run above (contexts 11 and 22 allocate class 19 blocks, freed at rows 2 and 3
    # from one call site: free rows carry no stack) and the table of the two contexts
    from tasks.learning.questions.context import CONTEXT_DEPTHS
    from tasks.learning.questions.reuse import reuse_answers

    run, ctx = _run()
    n = run.num_rows
    run = run.append_column(
        "caller_module", pa.array(["/usr/bin/prog"] * n).dictionary_encode()
    ).append_column("caller_offset", pa.array(np.full(n, 0x40, np.uint64)))
    site = int(call_sites(run)[2])
    t = _shared_site_table()
    sites = np.zeros_like(t.site_counts)
    sites[site] = t.site_counts[5]
    table = ClassTable(t.reuse_counts, t.majority, sites, t.context_counts)
    # WHEN the evaluation's reuse answers are made with the run's contexts
    got = reuse_answers(
        run, np.full(REUSE_CLASSES, 0.2), known=table, contexts={d: ctx for d in CONTEXT_DEPTHS}
    )
    # THEN the free of 11's block is answered soon, the free of 22's late, both by context
    at = {int(r): i for i, r in enumerate(got.rows)}
    p = got.probs["table"]
    assert p[at[2]].argmax() == 0 and p[at[3]].argmax() == REUSE_CLASSES - 1
    assert got.table_at_context[at[2]] and got.table_at_context[at[3]]
    # AND without the contexts both are the site's answer
    blind = reuse_answers(run, np.full(REUSE_CLASSES, 0.2), known=table)
    np.testing.assert_array_equal(blind.probs["table"][at[2]], blind.probs["table"][at[3]])


def test_the_nights_context_keys_are_those_with_enough_frees_and_bounded():
    # GIVEN keys with 3, 10, 20 and 9 training frees
    counts = np.zeros((4, REUSE_CLASSES))
    counts[:, 0] = [3, 10, 20, 9]
    c = ContextCounts(CONTEXT_DEPTH, np.array([1, 2, 2, 5]), np.array([19, 3, 19, 19]), counts)
    # WHEN trimmed to 8 frees and at most two keys
    b = c.bounded(min_frees=8, cap=2)
    # THEN the two with most frees are kept, still in (context, class) order
    assert list(zip(b.context.tolist(), b.cls.tolist(), strict=True)) == [(2, 3), (2, 19)]
    assert b.depth == CONTEXT_DEPTH
    # AND a key's index is found by (context, class), -1 where not held
    got = b.lookup(np.array([2, 2, 2, 5, -1]), np.array([19, 3, 4, 19, 19]))
    assert got.tolist() == [1, 0, -1, -1, -1]
