"""The allocator's two questions as labels (tasks/learning/labels.py), against plain Python."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.format.trace_reader import Op
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    LIFETIME_NS_EDGES,
    NEVER_FREED,
    NO_LABEL,
    REUSE_EDGES,
    allocator_labels,
)


def _events(seed: int, n: int = 400) -> pa.Table:
    """Two interleaved processes of random mallocs, reallocs, frees (paired or not), failures."""
    rng = np.random.default_rng(seed)
    pid = rng.choice([7, 9], n).astype(np.uint32)
    op = rng.choice([int(Op.MALLOC), int(Op.FREE), int(Op.REALLOC), int(Op.CALLOC)], n)
    size = np.where(op == int(Op.FREE), 0, rng.integers(0, 300, n)).astype(np.uint64)
    addr = np.where(rng.random(n) < 0.05, 0, 0x1000 + np.arange(n) * 16).astype(np.uint64)
    freed = np.where(op == int(Op.FREE), rng.integers(1, 300, n), 0)
    freed = np.where(op == int(Op.REALLOC), rng.integers(1, 300, n), freed)
    freed_null = (freed == 0) | (rng.random(n) < 0.1)  # an unpaired free has no size
    life_calls = (10 ** rng.uniform(0, 5.5, n)).astype(np.int64)
    life_ns = (10 ** rng.uniform(2, 11, n)).astype(np.int64)
    never = rng.random(n) < 0.2
    return pa.table(
        {
            "pid": pa.array(pid),
            "thread": pa.array(rng.integers(0, 3, n).astype(np.uint16)),
            "seq": pa.array(np.arange(n, dtype=np.uint64)),
            "time_ns": pa.array(np.arange(n, dtype=np.int64) * 10),  # the rows' order
            "op": pa.array(op.astype(np.uint8)),
            "size": pa.array(size),
            "addr": pa.array(addr),
            "freed_size": pa.array(freed.astype(np.uint64), mask=freed_null),
            "lifetime_ns": pa.array(life_ns.astype(np.int64), mask=never),
            "lifetime_calls": pa.array(life_calls.astype(np.int64), mask=never),
        }
    )


def _cls(n: int) -> int:
    return min(int(n).bit_length(), 31)


def _bucket(v: int, edges) -> int:
    for k, e in enumerate(edges):
        if v <= e:
            return k
    return len(edges)


def _reference(t: pa.Table) -> tuple[list[int], list[int], list[int]]:
    rows = t.to_pylist()
    defining = {int(o) for o in (Op.MALLOC, Op.CALLOC, Op.REALLOC, Op.REALLOCARRAY)}
    requests = [_cls(r["size"]) if r["op"] in defining and r["addr"] != 0 else None for r in rows]
    reuse, calls, time = [], [], []
    for i, r in enumerate(rows):
        if r["freed_size"] is None:
            reuse.append(NO_LABEL)
        else:
            c = _cls(r["freed_size"])
            later = [j for j in range(i + 1, len(rows)) if rows[j]["pid"] == r["pid"]]
            d = next((k + 1 for k, j in enumerate(later) if requests[j] == c), None)
            reuse.append(len(REUSE_EDGES) if d is None else _bucket(d, REUSE_EDGES))
        if requests[i] is None:
            calls.append(NO_LABEL)
            time.append(NO_LABEL)
        elif r["lifetime_calls"] is None:
            calls.append(NEVER_FREED)
            time.append(NEVER_FREED)
        else:
            calls.append(_bucket(r["lifetime_calls"], LIFETIME_CALL_EDGES))
            time.append(_bucket(r["lifetime_ns"], LIFETIME_NS_EDGES))
    return reuse, calls, time


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_labels_equal_the_plain_python_reference(seed):
    t = _events(seed)
    got = allocator_labels(t.take(np.random.default_rng(seed).permutation(t.num_rows)))
    inv = np.argsort(np.random.default_rng(seed).permutation(t.num_rows))
    got = type(got)(
        *(a[inv] for a in (got.reuse, got.reuse_calls, got.lifetime_calls, got.lifetime_time))
    )
    reuse, calls, time = _reference(t)
    assert got.reuse.tolist() == reuse
    assert got.lifetime_calls.tolist() == calls
    assert got.lifetime_time.tolist() == time
    # every class occurs in these sequences, so no bucket goes untested
    assert set(reuse) >= {NO_LABEL, 0, 1, 2, len(REUSE_EDGES)}
    assert set(calls) >= {NO_LABEL, NEVER_FREED, 0, 1, 2, 3, 4}


def test_reuse_is_per_process_and_exact_at_the_edges():
    # GIVEN process 1: free 48 B (class 6), then 15 other calls, then malloc(40) (class 6);
    # process 2 requests class 6 meanwhile (another process's request does not serve the block)
    ops = [Op.FREE] + [Op.MALLOC] * 16
    sizes = [0] + [8] * 15 + [40]
    t = pa.table(
        {
            "pid": pa.array([1] * 17 + [2], pa.uint32()),
            "thread": pa.array([0] * 18, pa.uint16()),
            "seq": pa.array(list(range(17)) + [0], pa.uint64()),
            "time_ns": pa.array(list(range(17)) + [0], pa.int64()),
            "op": pa.array([int(o) for o in ops] + [int(Op.MALLOC)], pa.uint8()),
            "size": pa.array(sizes + [48], pa.uint64()),
            "addr": pa.array([0x10] * 18, pa.uint64()),
            "freed_size": pa.array([48] + [None] * 17, pa.uint64()),
            "lifetime_ns": pa.array([None] * 18, pa.int64()),
            "lifetime_calls": pa.array([None] * 18, pa.int64()),
        }
    )
    # stored with process 2's request first in the table
    t = t.take(pa.array([17] + list(range(17))))
    got = allocator_labels(t)
    # THEN the free's next class-6 request in its process is 16 calls later: class "<= 16"
    assert got.reuse_calls[1] == 16 and got.reuse[1] == 1
    assert got.lifetime_calls[0] == NEVER_FREED


def test_a_table_without_the_events_columns_is_named():
    with pytest.raises(ValueError, match="column 'freed_size' missing"):
        allocator_labels(pa.table({"pid": [1], "op": [1], "size": [8], "addr": [16]}))


def test_labels_are_read_once_from_the_events_dataset(tmp_path):
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events
    from tasks.learning.labels import read_labels

    # GIVEN a run stored with its rows shuffled across processes and threads
    root = Root.from_url(str(tmp_path))
    write_synthetic_events(root, {"alpha": 1}, tokens_per_run=600)
    keys, labels = read_labels(root, "alpha", "r0")
    # THEN every row has its labels, each free's reuse class from its own process's calls
    assert len(labels.reuse) == keys.num_rows > 0
    assert keys.column_names == ["pid", "thread", "seq"]
    frees = labels.reuse != NO_LABEL
    assert frees.any() and (labels.lifetime_calls[frees] == NO_LABEL).all()
    # a run not there: the events reader's error, naming it and what to do
    with pytest.raises(FileNotFoundError, match="no events of run alpha/r9.*convert it"):
        read_labels(root, "alpha", "r9")
