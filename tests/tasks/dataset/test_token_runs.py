"""A run's token sequences from the events dataset, and the rows a capped run keeps."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import events_table
from tasks.dataset.token_runs import (
    head_events,
    head_rows,
    list_runs,
    read_run,
    token_run,
)


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
