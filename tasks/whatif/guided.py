"""Prediction arrays for the guided policy: keep a freed block or give it back.

At a free of class c: "is class c among the next k calls of this thread?". Causal
(`keep_at_free`, `next_call_top`, `predictions_from_topk` at horizon 1) reads nothing after the
free; optimistic (`reuse_labels`, `reuse_tiers`, top-k at horizon > 1) reads later events.
`align_token_run` maps learning-stage arrays to rows. Compiled loops (numba).

The decision, each function, causal vs optimistic: docs/whatif-policies.md#guided-predictions
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from tasks.dataset.tokens import size_class
from tasks.whatif.events import _DEFINES, N_CLASSES, NEVER

NONE_TOKEN = 255  # an empty top-k slot (tasks.learning.counters.baselines.NONE)


def _stream_order(table: pa.Table, scope: str) -> tuple[np.ndarray, np.ndarray]:
    """(order of rows by stream then call, stream start flags in that order)."""
    if scope not in ("thread", "process"):
        raise ValueError(f"scope must be 'thread' or 'process', not {scope!r}")
    names = table.column_names
    proc = table.column("image" if "image" in names else "pid").to_numpy().astype(np.uint64)
    thread = table.column("thread").to_numpy().astype(np.uint64)
    time = table.column("time_ns").to_numpy()
    seq = table.column("seq").to_numpy()
    if scope == "thread":
        key = (proc << np.uint64(16)) | thread
        order = np.lexsort((seq, key))
    else:
        key = proc
        order = np.lexsort((seq, thread, time, key))
    k = key[order]
    starts = np.concatenate([[True], k[1:] != k[:-1]]) if len(k) else np.zeros(0, bool)
    return order, starts


def _free_class(table: pa.Table) -> np.ndarray:
    """Size class of the block each row frees, -1 where it frees none known."""
    freed = table.column("freed_size")
    has = ~np.asarray(freed.is_null().to_numpy(zero_copy_only=False))
    size = freed.fill_null(0).to_numpy().astype(np.uint64)
    return np.where(has, size_class(size).astype(np.int64), -1)


def _request_class(table: pa.Table) -> np.ndarray:
    """Size class of the block each row defines, -1 where it defines none."""

    op = table.column("op").to_numpy()
    addr = table.column("addr").to_numpy()
    size = table.column("size").to_numpy().astype(np.uint64)
    return np.where(_DEFINES[op] & (addr != 0), size_class(size).astype(np.int64), -1)


@njit(cache=True)
def _distance(starts, free_cls, marks):
    """Per row freeing class c: calls of its stream to the next call whose `marks` [n, k] hold c
    (NEVER: none). With marks = the class each call requests, the true reuse distance; with a
    predictor's top-k, the distance to the first call predicted to request c."""
    n = len(free_cls)
    out = np.full(n, NEVER, np.int64)
    nxt = np.full(N_CLASSES, -1, np.int64)
    for i in range(n - 1, -1, -1):
        c = free_cls[i]
        if c >= 0 and nxt[c] >= 0:
            out[i] = nxt[c] - i
        for j in range(marks.shape[1]):
            tok = marks[i, j]
            if 0 <= tok < N_CLASSES:
                nxt[tok] = i
        if starts[i]:
            nxt[:] = -1
    return out


def _in_table_order(table: pa.Table, order: np.ndarray, per_stream: np.ndarray) -> np.ndarray:
    out = np.empty(per_stream.shape, per_stream.dtype)
    out[order] = per_stream
    return out


def _label_distance(table: pa.Table, scope: str) -> np.ndarray:
    """Per row of `table`: the true distance (calls of its thread or process) to the next
    request of the class the row frees."""
    order, starts = _stream_order(table, scope)
    req = np.ascontiguousarray(_request_class(table)[order][:, None])
    return _in_table_order(table, order, _distance(starts, _free_class(table)[order], req))


def _top_rows(table: pa.Table, top: np.ndarray) -> np.ndarray:
    """`top` as [rows, k] (a column of classes: k = 1), one row per row of `table`."""
    top = np.asarray(top)
    if top.ndim == 1:
        top = top[:, None]
    if len(top) != table.num_rows:
        raise ValueError(f"top has {len(top)} rows, the table {table.num_rows}")
    return top


def _topk_distance(table: pa.Table, top: np.ndarray) -> np.ndarray:
    """Per row of `table`: the distance (calls of its thread) to the next call whose `top`
    [rows, k] holds the class the row frees."""
    top = _top_rows(table, top)
    order, starts = _stream_order(table, "thread")
    topo = np.ascontiguousarray(top[order].astype(np.int64))
    return _in_table_order(table, order, _distance(starts, _free_class(table)[order], topo))


def _check_horizon(horizon: int) -> None:
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, not {horizon}")


TIER_HORIZONS = (16, 256, 4096)  # calls of the thread: tiers 3 (within 16) .. 0 (beyond 4096)


def _tiers(dist: np.ndarray, horizons: tuple[int, ...] | list[int]) -> np.ndarray:
    h = np.asarray(sorted(horizons), np.int64)
    if len(h) < 1 or len(h) > 7 or h[0] < 1:
        raise ValueError(f"horizons must be 1 to 7 values >= 1, not {horizons}")
    return (dist[:, None] <= h[None, :]).sum(axis=1).astype(np.int8)


def reuse_tiers(
    table: pa.Table, horizons: tuple[int, ...] = TIER_HORIZONS, scope: str = "thread"
) -> np.ndarray:
    """Per row: how many of `horizons` the next request of the freed block's class (in its
    thread or process) lies within (0: no free, or no request within the longest)."""
    return _tiers(_label_distance(table, scope), horizons)


def tiers_from_topk(
    table: pa.Table, top: np.ndarray, horizons: tuple[int, ...] = TIER_HORIZONS
) -> np.ndarray:
    """Per row: how many of `horizons` the next call of the thread whose `top` holds the freed
    block's class lies within (optimistic beyond horizon 1, as predictions_from_topk)."""
    return _tiers(_topk_distance(table, top), horizons)


def reuse_labels(table: pa.Table, horizon: int = 1, scope: str = "thread") -> np.ndarray:
    """Per row: it frees a block of class c and one of the next `horizon` calls of its thread
    (or process) allocates class c. Reads the future: optimistic, and not a bound (see
    docs/whatif-policies.md#optimistic)."""
    _check_horizon(horizon)
    return _label_distance(table, scope) <= horizon


def predictions_from_topk(table: pa.Table, top: np.ndarray, horizon: int = 1) -> np.ndarray:
    """Per row: it frees a block of class c and c is in `top` of one of the next `horizon` calls
    of its thread. `top`: [rows, k] tokens per row of `table` (NONE_TOKEN = empty slot).
    Causal at horizon 1 only (= keep_at_free(table, next_call_top(table, top))); beyond, it is
    optimistic (see docs/whatif-policies.md#optimistic)."""
    _check_horizon(horizon)
    return _topk_distance(table, top) <= horizon


def next_call_top(table: pa.Table, top: np.ndarray) -> np.ndarray:
    """`top` [rows, k] per row of `table`, `top[j]` predicted for row j from the earlier calls of
    its thread -> per row i, the top-k predicted for the next call of its thread, which the
    predictor has at row i (it has seen row i). A thread's last row: empty (NONE_TOKEN)."""
    top = _top_rows(table, top)
    order, starts = _stream_order(table, "thread")
    topo = top[order]
    shifted = np.full_like(topo, NONE_TOKEN)
    shifted[:-1] = topo[1:]
    last = np.append(starts[1:], True) if len(starts) else starts
    shifted[last] = NONE_TOKEN
    return _in_table_order(table, order, shifted)


def keep_at_free(table: pa.Table, at_free: np.ndarray) -> np.ndarray:
    """Per row: it frees a block of class c and c is among `at_free[i]` [rows, k], the top-k the
    predictor gives at row i for its thread's next call (next_call_top). Causal: row i's own
    class and prediction only."""
    at_free = np.asarray(at_free)
    if at_free.ndim == 1:
        at_free = at_free[:, None]
    if len(at_free) != table.num_rows:
        raise ValueError(f"at_free has {len(at_free)} rows, the table {table.num_rows}")
    cls = _free_class(table)
    return (cls >= 0) & (at_free.astype(np.int64) == cls[:, None]).any(axis=1)


def align_token_run(table: pa.Table, per_position: np.ndarray) -> np.ndarray:
    """Rows of `per_position` in read_run order (key pid << 16 | thread, then seq) -> per row of
    `table` (same events). Ambiguous only if a pid is reused by two images of one run."""
    per_position = np.asarray(per_position)
    if len(per_position) != table.num_rows:
        raise ValueError(f"{len(per_position)} positions for {table.num_rows} rows")
    pid = table.column("pid").to_numpy().astype(np.uint64)
    thread = table.column("thread").to_numpy().astype(np.uint64)
    order = np.lexsort((table.column("seq").to_numpy(), (pid << np.uint64(16)) | thread))
    out = np.empty_like(per_position)
    out[order] = per_position
    return out
