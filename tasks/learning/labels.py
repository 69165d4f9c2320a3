"""The two questions an allocator asks, as labels computed once from the events dataset.

- REUSE, at a free of a block of size class c: how many calls of the PROCESS until the next
  request of class c, bucketed by REUSE_EDGES (1, 16, 256, 4096 calls; the last class later or
  never).
- LIFETIME, at an allocation: how long its block lives, in calls of the process
  (LIFETIME_CALL_EDGES) and in time (LIFETIME_NS_EDGES); a block never freed in the trace is a
  class of its own (NEVER_FREED_*).

Rows that do not ask a question get NO_LABEL (-1); which rows ask, and the call order:
docs/learning.md#the-questions-labels.

CAUSALITY. Labels are targets: they read the future of the trace by definition. A predictor of them
may read only calls before and at the row it answers for; they must never be an input
(tests/tasks/learning/test_labels.py holds them to a plain-Python reference).

No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from tasks.core.storage import Root
from tasks.dataset.events_reader import read_run
from tasks.dataset.tokens import MAX_SIZE_CLASS, size_class
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op

NO_LABEL = -1
REUSE_EDGES = (1, 16, 256, 4096)  # calls of the process; class len(edges): later or never
LIFETIME_CALL_EDGES = (16, 256, 4096, 65536)  # calls of the process
LIFETIME_NS_EDGES = (10_000, 1_000_000, 100_000_000, 10_000_000_000)  # 10 us, 1 ms, 100 ms, 10 s
REUSE_CLASSES = len(REUSE_EDGES) + 1
LIFETIME_CLASSES = len(LIFETIME_CALL_EDGES) + 2  # the edges' buckets, beyond, never freed
NEVER_FREED = LIFETIME_CLASSES - 1
# each question and its number of classes
QUESTION_CLASSES = {
    "reuse": REUSE_CLASSES,
    "lifetime_calls": LIFETIME_CLASSES,
    "lifetime_time": LIFETIME_CLASSES,
}
LABEL_COLUMNS = [
    "pid", "thread", "seq", "time_ns", "op", "size", "addr", "freed_size", "lifetime_ns",
    "lifetime_calls",
]  # fmt: skip
# what the allocator's questions read of a run's events: the labels' columns, the call site
# (tasks.dataset.sites.call_sites) and the call stack's id (tasks/dataset/stacks_table.py)
QUESTION_COLUMNS = [*LABEL_COLUMNS, "caller_module", "caller_offset", "stack"]
_DEFINING = np.zeros(256, bool)
_DEFINING[[int(o) for o in (*ALLOCATING_OPS, *REALLOCATING_OPS)]] = True
_FREEING = np.zeros(256, bool)
_FREEING[[int(o) for o in (Op.FREE, *REALLOCATING_OPS)]] = True


@dataclass(frozen=True)
class AllocatorLabels:
    """Per row of an events table (its row order): the labels, NO_LABEL where the question does
    not apply, and the raw distances they bucket (for other edges)."""

    reuse: np.ndarray  # int8 [n]: REUSE_EDGES class at a free
    reuse_calls: np.ndarray  # int64 [n]: calls to the next request of the class (max: never)
    lifetime_calls: np.ndarray  # int8 [n]: LIFETIME_CALL_EDGES class at an allocation
    lifetime_time: np.ndarray  # int8 [n]: LIFETIME_NS_EDGES class at an allocation


@njit(cache=True)
def _reuse_distance(proc_start, free_cls, req_cls, n_classes):
    """Per row freeing class c (>= 0): rows of its process to the next row requesting c (the
    int64 maximum: none). Rows in process call order, proc_start[i]: row i starts a process."""
    n = free_cls.shape[0]
    out = np.full(n, np.iinfo(np.int64).max, np.int64)
    nxt = np.full(n_classes, -1, np.int64)
    for i in range(n - 1, -1, -1):
        c = free_cls[i]
        if c >= 0 and nxt[c] >= 0:
            out[i] = nxt[c] - i
        r = req_cls[i]
        if r >= 0:
            nxt[r] = i
        if proc_start[i]:
            nxt[:] = -1
    return out


def _bucket(values: np.ndarray, edges: tuple[int, ...]) -> np.ndarray:
    """Index of the first edge >= value (len(edges) beyond the last)."""
    return np.searchsorted(np.asarray(edges, np.int64), values, side="left").astype(np.int8)


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise ValueError(
            f"events table: column {name!r} missing (expected the events dataset's schema, "
            "tasks/dataset/events_schema.py); rebuild the dataset with the dataset flow"
        )
    return table.column(name)


def request_and_free_classes(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(request class, free class) per row: the size class of the block the row defines / frees
    (the rules in the module doc), -1 where none."""
    op = _column(table, "op").to_numpy().astype(np.int64)
    addr = _column(table, "addr").to_numpy()
    size = _column(table, "size").to_numpy().astype(np.uint64)
    freed = _column(table, "freed_size")
    has_freed = np.asarray(pc.is_valid(freed).to_numpy(zero_copy_only=False), bool)
    frees = _FREEING[op] & has_freed
    free_cls = np.where(
        frees, size_class(freed.fill_null(0).to_numpy().astype(np.uint64)).astype(np.int64), -1
    )
    defines = _DEFINING[op] & (addr != 0)
    req_cls = np.where(defines, size_class(size).astype(np.int64), -1)
    return req_cls, free_cls


def process_order(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(rows in process call order, flags of each process's first row in that order): by pid,
    then time, thread and seq (as tasks.whatif orders a process)."""
    pid = _column(table, "pid").to_numpy().astype(np.int64)
    order = np.lexsort(
        (
            _column(table, "seq").to_numpy(),
            _column(table, "thread").to_numpy(),
            _column(table, "time_ns").to_numpy(),
            pid,
        )
    )
    p = pid[order]
    starts = np.ones(len(p), bool)
    starts[1:] = p[1:] != p[:-1]
    return order, starts


def allocator_labels(table: pa.Table) -> AllocatorLabels:
    """The labels of one run's events (any process interleaving; each process in call order)."""
    n = table.num_rows
    req_cls, free_cls = request_and_free_classes(table)
    defines = req_cls >= 0
    order, starts = process_order(table)
    dist = np.empty(n, np.int64)
    dist[order] = _reuse_distance(
        starts, np.ascontiguousarray(free_cls[order]), np.ascontiguousarray(req_cls[order]),
        MAX_SIZE_CLASS + 1,
    )  # fmt: skip
    reuse = np.where(free_cls >= 0, _bucket(dist, REUSE_EDGES), NO_LABEL).astype(np.int8)

    def lifetime(name: str, edges: tuple[int, ...]) -> np.ndarray:
        col = _column(table, name)
        valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), bool)
        cls = np.where(valid, _bucket(col.fill_null(0).to_numpy(), edges), NEVER_FREED)
        return np.where(defines, cls, NO_LABEL).astype(np.int8)

    return AllocatorLabels(
        reuse=reuse,
        reuse_calls=dist,
        lifetime_calls=lifetime("lifetime_calls", LIFETIME_CALL_EDGES),
        lifetime_time=lifetime("lifetime_ns", LIFETIME_NS_EDGES),
    )


def read_labels(root: Root, workload: str, run: str) -> tuple[pa.Table, AllocatorLabels]:
    """One run's (pid, thread, seq) rows and their labels, read once from the events dataset.

    Align with a TokenRun (read_run's order: (pid, thread) then seq) by sorting on those keys."""
    table = read_run(root, workload, run, LABEL_COLUMNS)
    if table.num_rows == 0:
        raise ValueError(f"{root.url_of('events')}: run {workload}/{run} has no events")
    return table.select(["pid", "thread", "seq"]), allocator_labels(table)
