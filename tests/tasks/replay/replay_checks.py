"""Checks on replayed traces shared by the runner and docker tests (vectorised, no per-event
Python loops), and the tracer every replay test uses."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, Trace


def tracer_path() -> Path:
    """The tracer the project builds (HEAPCAST_TRACER overrides it)."""
    if os.environ.get("HEAPCAST_TRACER"):
        return Path(os.environ["HEAPCAST_TRACER"])
    from tasks.format.build import build_tracer

    return Path(build_tracer.fn())


def unpaired_frees(trace: Trace) -> int:
    """Frees (and reallocs' releases) not preceded, at their address, by a live allocation.

    Each allocation is an event (addr, +), each release an event (addr, -); in call order per
    address the events must alternate +, -, +, ... with no release first."""
    order = np.argsort(trace.time_ns, kind="stable")
    op, addr, arg, size = (trace.op[order], trace.addr[order], trace.arg[order], trace.size[order])
    pos = np.arange(len(op), dtype=np.int64) * 2
    is_alloc = np.isin(op, np.array(ALLOCATING_OPS, dtype=np.uint8)) & (addr != 0)
    is_re = np.isin(op, np.array(REALLOCATING_OPS, dtype=np.uint8))
    re_new = is_re & (addr != 0)
    # realloc releases its old block when it returns a new one, or when it frees (size 0)
    re_old = is_re & (arg != 0) & ((addr != 0) | (size == 0))
    is_free = op == Op.FREE
    a_addr = np.concatenate([addr[is_alloc | re_new], arg[re_old], addr[is_free]])
    a_when = np.concatenate([pos[is_alloc | re_new] + 1, pos[re_old], pos[is_free]])
    a_kind = np.concatenate(
        [
            np.zeros((is_alloc | re_new).sum(), np.int8),
            np.ones(re_old.sum(), np.int8),
            np.ones(is_free.sum(), np.int8),
        ]
    )
    idx = np.lexsort((a_when, a_addr))
    a_addr, a_kind = a_addr[idx], a_kind[idx]
    prev_same = np.concatenate([[False], a_addr[1:] == a_addr[:-1]])
    prev_alloc = np.concatenate([[False], a_kind[:-1] == 0])
    released = a_kind == 1
    return int((released & ~(prev_same & prev_alloc)).sum())


def op_counts(traces: list[Trace]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in traces:
        for k, v in t.counts_by_op().items():
            out[k] = out.get(k, 0) + v
    return out
