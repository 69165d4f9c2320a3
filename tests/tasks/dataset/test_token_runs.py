"""A run's token sequences from the events dataset, and the rows a capped run keeps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from tasks.core.storage import Root
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.synthetic_events import events_table
from tasks.dataset.token_runs import (
    CallStacks,
    call_stack_rows,
    head_events,
    head_rows,
    list_runs,
    read_run,
    thread_order,
    token_run,
)
from tests.tasks.dataset.test_frame_tokens import stacks_table


def test_read_run_orders_threads_by_seq(tmp_path):
    # GIVEN a process whose rows are written shuffled
    import pyarrow.parquet as pq

    threads = [np.array([1, 2, 3, 4], np.uint8), np.array([40, 41], np.uint8)]
    table = events_table(threads, pid=7)
    table = table.take(np.array([5, 0, 3, 4, 1, 2]))
    root = Root.from_url(str(tmp_path))
    path = root.events_run("w", "r0")
    root.fs.makedirs(path)
    pq.write_table(table, f"{path}/part-0.parquet")
    # WHEN read
    run = read_run(root, "w", "r0")
    # THEN threads come back whole and in call order
    assert run.tokens.tolist() == [1, 2, 3, 4, 40, 41]
    assert run.offsets.tolist() == [0, 4, 6]
    assert list_runs(root) == {"w": ["r0"]}


def test_head_rows_are_the_rows_of_the_capped_token_run():
    # GIVEN two processes of two threads each, their rows interleaved as a trace writes them

    rng = np.random.default_rng(3)
    a = events_table([rng.integers(0, 64, 50), rng.integers(0, 64, 30)], pid=7)
    b = events_table([rng.integers(0, 64, 40), rng.integers(0, 64, 20)], pid=3)
    table = pa.concat_tables([a, b]).take(rng.permutation(140))
    whole = token_run(table, "w", "r")
    for cap in (1, 39, 40, 75, 139):
        # WHEN the rows are capped as the evaluation caps the tokens
        rows = head_rows(table, cap)
        # THEN their tokens are exactly the capped run's (threads whole in order, the last cut),
        # in the table's own row order
        capped = token_run(rows, "w", "r")
        np.testing.assert_array_equal(capped.tokens, whole.head(cap).tokens)
        np.testing.assert_array_equal(capped.offsets, whole.head(cap).offsets)

        def keys(t):
            return list(zip(*(t.column(c).to_pylist() for c in ("pid", "thread", "seq"))))

        where = {k: i for i, k in enumerate(keys(table))}
        at = [where[k] for k in keys(rows)]
        assert at == sorted(at)
    assert head_rows(table, 140) is table and head_rows(table, None) is table


def test_head_events_reads_each_run_when_asked_and_only_those_named(tmp_path):
    # GIVEN a root with one run of 10 calls on one thread
    import pyarrow.parquet as pq
    import pytest

    root = Root.from_url(str(tmp_path))
    path = root.events_run("w", "r")
    root.fs.makedirs(path)
    pq.write_table(events_table([np.arange(10, dtype=np.uint8)], pid=7), f"{path}/part-0.parquet")
    # WHEN a mapping names it twice, capped at 4 calls
    events = head_events(root, [("w", "r"), ("w", "r")], ["pid", "thread", "seq", "op"], 4)
    # THEN it names the run once, reads its first 4 calls, and refuses a run it does not name
    assert list(events) == [("w", "r")] and len(events) == 1 and ("w", "r") in events
    got = events[("w", "r")]
    assert got.num_rows == 4 and got.column_names == ["pid", "thread", "seq", "op"]
    assert sorted(got.column("seq").to_pylist()) == sorted(
        head_rows(events_table([np.arange(10, dtype=np.uint8)], pid=7), 4).column("seq").to_pylist()
    )
    with pytest.raises(KeyError):
        events[("w", "other")]


def _stack_events() -> pa.Table:
    """One process, two threads, in the order a trace writes them (by time): thread 0 allocates
    with stack 5 (freed 2 calls later, by thread 1) and with stack 9 (never freed); thread 1
    frees the first block (no stack at a free), then reallocs with its own stack 9."""
    return pa.table(
        {
            "pid": pa.array([7, 7, 7, 7], pa.uint32()),
            "thread": pa.array([0, 0, 1, 1], pa.uint16()),
            "seq": pa.array([0, 1, 0, 1], pa.uint64()),
            "time_ns": pa.array([10, 20, 30, 40], pa.int64()),
            "lifetime_calls": pa.array([2, None, None, None], pa.int64()),
            "stack": pa.array([5, 9, None, 9], pa.uint64()),
            "token": pa.array([3, 4, 35, 6], pa.uint8()),
        }
    )


def _frames() -> StackFrames:
    return StackFrames.of_table(
        stacks_table({5: [(None, 0, "xmalloc")], 9: [(None, 0, "g_malloc")]})
    )


def test_a_free_reads_its_blocks_allocation_stack():
    # GIVEN a free without a stack whose block was allocated at stack 5 (row 1 of the tokens)
    rows = call_stack_rows(_stack_events(), _frames())
    # THEN each call reads its own stack, the free its block's allocation's
    assert rows.tolist() == [1, 2, 1, 2]


def test_call_stacks_are_cut_with_their_token_run():
    table = _stack_events().take(np.array([3, 0, 2, 1]))  # written shuffled
    order = thread_order(table)
    stacks = CallStacks(call_stack_rows(table, _frames())[order], _frames())
    run = replace(token_run(table, "w", "r"), stacks=stacks)
    # the rows follow the tokens' order (thread 0: 3, 4; thread 1: 35, 6)
    assert run.tokens.tolist() == [3, 4, 35, 6] and run.stacks.rows.tolist() == [1, 2, 1, 2]
    assert run.head(3).stacks.rows.tolist() == [1, 2, 1]
    head, tail = run.split_tail(0.5)
    assert (head.tokens.tolist(), head.stacks.rows.tolist()) == ([3, 35], [1, 1])
    assert (tail.tokens.tolist(), tail.stacks.rows.tolist()) == ([4, 6], [2, 2])
    # and rows that do not match the tokens are refused
    with pytest.raises(ValueError, match="w/r: 3 stack rows"):
        replace(run, stacks=CallStacks(stacks.rows[:3], stacks.frames))
