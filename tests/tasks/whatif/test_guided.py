"""Prediction arrays for the guided policy, on a hand-made two-thread trace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.events_schema import CALLER_MODULE_TYPE, EVENTS_SCHEMA
from tasks.format.trace_reader import Op
from tasks.whatif.guided import (
    NONE_TOKEN,
    align_token_run,
    predictions_from_topk,
    reuse_labels,
    reuse_tiers,
    tiers_from_topk,
)

# (thread, op, size, addr, freed_size); one call every ns
CALLS = [
    (0, Op.MALLOC, 100, 0xA0, None),  # r0
    (1, Op.MALLOC, 100, 0xB0, None),  # r1
    (0, Op.FREE, 0, 0xA0, 100),  # r2: thread 0 frees class 7
    (1, Op.FREE, 0, 0xB0, 100),  # r3: thread 1 frees class 7
    (1, Op.MALLOC, 50, 0xC0, None),  # r4: class 6
    (0, Op.MALLOC, 110, 0xD0, None),  # r5: class 7, thread 0's next call
    (1, Op.MALLOC, 120, 0xE0, None),  # r6: class 7, thread 1's second call after its free
]


def _table(order=None) -> pa.Table:
    n = len(CALLS)
    th, op, size, addr, freed = zip(*CALLS)
    seq = np.zeros(n, np.uint64)
    count = {0: 0, 1: 0}
    for i, t in enumerate(th):
        seq[i] = count[t]
        count[t] += 1
    t = pa.table(
        {
            "pid": np.full(n, 9, np.uint32),
            "ppid": np.ones(n, np.uint32),
            "thread": np.array(th, np.uint16),
            "tid": np.array(th, np.uint32) + 9,
            "seq": seq,
            "time_ns": np.arange(n, dtype=np.int64),
            "op": np.array([int(o) for o in op], np.uint8),
            "size": np.array(size, np.uint64),
            "alignment": pa.nulls(n, pa.uint64()),
            "addr": np.array(addr, np.uint64),
            "freed_addr": pa.nulls(n, pa.uint64()),
            "freed_size": pa.array(freed, pa.uint64()),
            "caller": pa.nulls(n, pa.uint64()),
            "lifetime_ns": pa.nulls(n, pa.int64()),
            "lifetime_calls": pa.nulls(n, pa.int64()),
            "token": np.zeros(n, np.uint8),
            "caller_module": pa.nulls(n, CALLER_MODULE_TYPE),
            "caller_offset": pa.nulls(n, pa.uint64()),
            "stack": pa.nulls(n, pa.uint64()),
        },
        schema=EVENTS_SCHEMA,
    )
    return t if order is None else t.take(pa.array(order))


def test_reuse_labels_thread_and_process():
    t = _table()
    assert reuse_labels(t, 1).tolist() == [0, 0, 1, 0, 0, 0, 0]
    assert reuse_labels(t, 2).tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert reuse_labels(t, 1, scope="process").tolist() == [0] * 7
    assert reuse_labels(t, 2, scope="process").tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert reuse_labels(t, 3, scope="process").tolist() == [0, 0, 1, 1, 0, 0, 0]
    # rows in any order: labels follow their rows
    perm = np.array([6, 2, 0, 5, 3, 1, 4])
    assert reuse_labels(_table(perm), 2).tolist() == reuse_labels(t, 2)[perm].tolist()
    with pytest.raises(ValueError, match="horizon"):
        reuse_labels(t, 0)


def test_predictions_from_topk():
    t = _table()
    top = np.full((7, 5), NONE_TOKEN, np.uint8)
    top[5, 0] = 7  # thread 0's next call after its free: class 7 predicted
    top[4, :2] = [6, 38]  # thread 1's next call: class 6 (and a free of class 6)
    top[6, 0] = 9
    assert predictions_from_topk(t, top, 1).tolist() == [0, 0, 1, 0, 0, 0, 0]
    assert predictions_from_topk(t, top, 2).tolist() == [0, 0, 1, 0, 0, 0, 0]
    top[6, 3] = 7
    assert predictions_from_topk(t, top, 2).tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert predictions_from_topk(t, top[:, 0], 1).tolist() == [0, 0, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="rows"):
        predictions_from_topk(t, top[:3], 1)


def test_align_token_run_order():
    t = _table()
    # read_run order: thread 0 (r0, r2, r5) then thread 1 (r1, r3, r4, r6)
    per_position = np.array([0, 2, 5, 1, 3, 4, 6])
    assert align_token_run(t, per_position).tolist() == list(range(7))


def test_tiers_are_labels_at_several_horizons():
    t = _table()
    # thread 0's free (r2): class 7 one call later; thread 1's (r3): two calls later
    assert reuse_tiers(t, (1, 2, 5)).tolist() == [0, 0, 3, 2, 0, 0, 0]
    assert reuse_tiers(t, (2,)).astype(bool).tolist() == reuse_labels(t, 2).tolist()
    assert reuse_tiers(t, (1, 2), scope="process").tolist() == [0, 0, 0, 1, 0, 0, 0]
    top = np.full((7, 5), NONE_TOKEN, np.uint8)
    top[5, 0] = 7
    top[6, 3] = 7
    assert tiers_from_topk(t, top, (1, 2, 5)).tolist() == [0, 0, 3, 2, 0, 0, 0]
    assert (
        tiers_from_topk(t, top, (1,)).astype(bool).tolist()
        == predictions_from_topk(t, top, 1).tolist()
    )
    with pytest.raises(ValueError, match="horizons"):
        reuse_tiers(t, ())
