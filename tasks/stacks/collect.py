"""A run's process traces reduced to a StackProfile: per distinct call stack, what its
allocations did (vectorised per event; Python loops run over traces, distinct stacks and
distinct frames only).

The rows, their pairing and their stacks are the converter's (`tasks.dataset.convert`, what
`heapcast report` and the dataset read): a row defines a block when an allocating call returned
an address (a failed call and `realloc(p, 0)` that only frees define none), the row that frees
it is the row `lifetime_calls` later, and its `stack` is the run-level id of its frames
(`tasks.dataset.stacks_table`: the same frames in two processes, one id), whose frames the
process's stacks table gives. The run's peak is the report's (tasks.report.analysis): the
largest total of live bytes over all processes merged by time, a process's heap released after
its last call; `peak` is each stack's bytes live at that instant (summed, the report's peak).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dataset.convert import convert_groups
from tasks.dataset.stacks_table import FRAMES_SCHEMA, ProcessStacks
from tasks.format.frames import Frames, frame_names
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Trace
from tasks.stacks.profile import StackProfile

_IS_DEF = np.zeros(256, dtype=bool)  # ops that may define a block (when they return an address)
_IS_DEF[list(ALLOCATING_OPS) + list(REALLOCATING_OPS)] = True


@dataclass
class _Rows:
    """One process image's rows in the converter's order (call order): what the profile needs."""

    time: np.ndarray  # int64 ns
    defines: np.ndarray  # bool: the row defines a block
    size: np.ndarray  # int64: its size (0 where it defines none)
    freed: np.ndarray  # int64: bytes of the paired block it frees (0: none)
    free_row: np.ndarray  # int64: the row freeing the block it defines, -1: never freed
    thread: np.ndarray  # uint16: the record's thread number
    stack: np.ndarray  # uint64: the run-level id of its stack, where `has_stack`
    has_stack: np.ndarray  # bool
    caller: np.ndarray  # uint64: malloc's caller (0: not recorded)
    frames: pa.Table  # FRAMES_SCHEMA: the frames of the stacks its rows name


def _rows(trace: Trace) -> _Rows:
    """The rows of one trace, paired and given their stacks by the converter; each column is
    filled a row group at a time into one array (no list of groups then a copy)."""
    stacks = ProcessStacks.of_trace(trace)
    tables, stats = convert_groups(trace, stacks)
    n = stats.rows  # known before the groups are read
    nulls = {"lifetime_calls": -1}  # never freed; other nulls are 0
    names = ("time_ns", "op", "size", "addr", "freed_size", "lifetime_calls", "thread", "stack")
    dtypes = (np.int64, np.uint8, np.int64, np.uint64, np.int64, np.int64, np.uint16, np.uint64)
    a = {c: np.empty(n, dt) for c, dt in zip(names, dtypes)}
    a["caller"], a["has_stack"] = np.empty(n, np.uint64), np.empty(n, bool)
    at = 0
    for t in tables:  # a loop over row groups of up to 1 M rows
        e = at + t.num_rows
        for c in (*names, "caller"):
            a[c][at:e] = t[c].fill_null(nulls.get(c, 0)).to_numpy()
        a["has_stack"][at:e] = t["stack"].is_valid().to_numpy()
        at = e
    defines = np.take(_IS_DEF, a["op"]) & (a["addr"] != 0)
    lt = a["lifetime_calls"]
    free_row = np.where(defines & (lt >= 0), np.arange(n, dtype=np.int64) + lt, -1)
    return _Rows(
        time=a["time_ns"],
        defines=defines,
        size=np.where(defines, a["size"], 0),
        freed=a["freed_size"],
        free_row=free_row,
        thread=a["thread"],
        stack=a["stack"],
        has_stack=a["has_stack"],
        caller=a["caller"],
        frames=stacks.table() if stacks is not None else FRAMES_SCHEMA.empty_table(),
    )


def _temporaries(rows: _Rows, alloc: np.ndarray) -> np.ndarray:
    """Which of the allocation rows `alloc` (ascending) made a temporary (heaptrack's word): a
    block freed before its thread's next allocation (the realloc that frees it may be that
    allocation: its free comes first)."""
    n = len(rows.time)
    th = rows.thread[alloc]
    nxt = np.append(alloc[1:], n)  # the next allocation row (n: none)
    if len(th) and th.min() != th.max():  # the thread's next: by thread (a radix sort), then row
        order = np.argsort(th, kind="stable")
        t_s = th[order]
        nxt_s = np.append(alloc[order][1:], n)
        nxt_s[:-1][t_s[1:] != t_s[:-1]] = n
        nxt = np.empty_like(nxt_s)
        nxt[order] = nxt_s
    f = rows.free_row[alloc]
    return (f >= 0) & (f <= nxt)


def _peak_rows(images: list[_Rows]) -> list[int]:
    """For each image, its last row at the run's peak (-1: none yet, or its heap released):
    live bytes of all images merged by time (at one ns: images in order, then releases)."""
    times, deltas, src = [], [], []
    for i, r in enumerate(images):
        delta = np.where(r.defines, r.size, 0) - r.freed
        times.append(r.time)
        deltas.append(delta)
        src.append(np.full(len(r.time), i, np.int64))
    for i, (r, d) in enumerate(zip(images, deltas)):
        final = int(d.sum())
        if final and len(r.time):  # its heap released after its last call
            times.append(r.time[-1:])
            deltas.append(np.array([-final]))
            src.append(np.array([len(images) + i]))
    t = np.concatenate(times)
    if len(t) == 0:
        return [-1] * len(images)
    perm = np.argsort(t, kind="stable")
    total = np.cumsum(np.concatenate(deltas)[perm])
    k = int(np.argmax(total))
    upto = np.bincount(np.concatenate(src)[perm[: k + 1]], minlength=2 * len(images))
    return [-1 if upto[len(images) + i] else int(upto[i]) - 1 for i in range(len(images))]


class _Interner:
    """Distinct frames (module path, offset) and stacks (tuples of frame rows) over a run."""

    def __init__(self) -> None:
        self.frames: dict[tuple[str, int], int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}

    def _frame_rows(self, modules: list[str], offsets: np.ndarray) -> np.ndarray:
        out = np.empty(len(modules), np.int64)
        for j, key in enumerate(zip(modules, offsets.tolist())):  # a loop over distinct frames
            out[j] = self.frames.setdefault(key, len(self.frames))
        return out

    def _stack_row(self, frames: tuple[int, ...]) -> int:
        return self.stacks.setdefault(frames, len(self.stacks))

    def by_id(self, ids: np.ndarray, frames: pa.Table) -> np.ndarray:
        """The stack row of each distinct stack id (ascending), from the stacks table
        (FRAMES_SCHEMA) holding their frames."""
        t = frames.combine_chunks()
        stack = t["stack"].to_numpy()
        order = np.lexsort((t["depth"].to_numpy(), stack))
        mod = t["module"]
        mod = mod.chunk(0) if mod.num_chunks else pa.array([], type=t.schema.field("module").type)
        paths = [*mod.dictionary.to_pylist(), ""]  # index -1: no module
        idx = mod.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        # distinct (module, offset) of the table's rows, each interned once: one uint64 key
        # (module + 1 above bit 48; user-space addresses and offsets are below 2^47)
        offset = t["offset"].to_numpy()
        if len(offset) and (int(offset.max()) >> 48 or len(paths) >= 1 << 15):
            raise ValueError(f"frames beyond 2^48 or {len(paths)} modules: not a user-space stack")
        key = (idx + 1).astype(np.uint64) << np.uint64(48) | offset
        uniq, inverse = np.unique(key, return_inverse=True)
        m = (uniq >> np.uint64(48)).astype(np.int64) - 1
        fid = self._frame_rows([paths[k] for k in m.tolist()], uniq & np.uint64((1 << 48) - 1))
        fid = fid[inverse.reshape(-1)][order]
        bounds = np.searchsorted(stack[order], ids, side="left")
        ends = np.searchsorted(stack[order], ids, side="right")
        return np.array(
            [self._stack_row(tuple(fid[a:b].tolist())) for a, b in zip(bounds, ends)],
            dtype=np.int64,
        )  # a loop over distinct stacks

    def by_caller(self, trace: Trace, callers: np.ndarray) -> np.ndarray:
        """The stack row of each distinct caller (one frame; 0: no frame)."""
        mods = trace.modules
        if mods is not None and len(mods):
            midx, off = mods.locate(callers)
        else:
            midx, off = np.full(len(callers), -1, np.int32), np.zeros(len(callers), np.uint64)
        off = np.where(midx >= 0, off, callers)  # no module: the raw address
        paths = [*(mods.path if mods is not None else ()), ""]
        fid = self._frame_rows([paths[m] for m in midx.tolist()], off)
        return np.array(
            [self._stack_row((f,) if c else ()) for f, c in zip(fid.tolist(), callers.tolist())],
            dtype=np.int64,
        )


def _stacks_of(interner: _Interner, trace: Trace, rows: _Rows, alloc: np.ndarray) -> np.ndarray:
    """The run's stack row of each allocation row: its stack's, else its caller's one frame."""
    out = np.empty(len(alloc), np.int64)
    has = rows.has_stack[alloc]
    ids, inverse = np.unique(rows.stack[alloc][has], return_inverse=True)
    out[has] = interner.by_id(ids, rows.frames)[inverse.reshape(-1)]
    callers, inverse = np.unique(rows.caller[alloc][~has], return_inverse=True)
    out[~has] = interner.by_caller(trace, callers)[inverse.reshape(-1)]
    return out


def stack_profile(traces: Sequence[Trace], sysroot: Path | None = None) -> StackProfile:
    """The StackProfile of a run's process traces (one per process image, in the run's file
    order). Stacks of different processes with the same frames ((module, offset) each) are
    one stack; frames are named once each (tasks.format.frames, under `sysroot` for a
    container's run).

    A trace without stacks (format version 1 or 2, or one recorded with `--frames 0`) gives
    one-frame stacks, malloc's caller, when it records callers, else empty stacks (one stack
    of no frame for all its calls); an allocation whose stack the converter could not give (a
    stack id with no node in its trace) gets its caller's one frame too.

    Counted per stack over the allocations that returned a block: `calls`, `bytes` (their
    sizes), `leaked` (bytes never freed in the trace), `temporaries` (blocks freed before the
    allocating thread's next allocation, heaptrack's rule; not the report's lifetime in calls),
    and `peak`: bytes live at the run's peak, the instant all processes' live bytes summed are
    largest (the report's peak; each process's heap released after its last call).
    """
    interner = _Interner()
    images: list[_Rows] = []
    allocs = []  # per image: (allocation rows, their stack rows)
    for trace in traces:  # a loop over process images
        rows = _rows(trace)
        alloc = np.flatnonzero(rows.defines)
        allocs.append((alloc, _stacks_of(interner, trace, rows, alloc)))
        # interned: what only named the stacks is let go (the peak needs the rest)
        rows.frames, rows.stack, rows.has_stack, rows.caller = (
            FRAMES_SCHEMA.empty_table(),
            *(np.zeros(0, a.dtype) for a in (rows.stack, rows.has_stack, rows.caller)),
        )
        images.append(rows)

    n = len(interner.stacks)
    calls, nbytes, peak, leaked, temps = (np.zeros(n, np.int64) for _ in range(5))
    for rows, (alloc, stack), at in zip(images, allocs, _peak_rows(images)):
        size, f = rows.size[alloc], rows.free_row[alloc]
        calls += np.bincount(stack, minlength=n)
        nbytes += np.bincount(stack, weights=size, minlength=n).astype(np.int64)
        leaked += np.bincount(stack, weights=np.where(f < 0, size, 0), minlength=n).astype(np.int64)
        temps += np.bincount(stack, weights=_temporaries(rows, alloc), minlength=n).astype(np.int64)
        live = (alloc <= at) & ((f < 0) | (f > at))
        peak += np.bincount(stack[live], weights=size[live], minlength=n).astype(np.int64)

    modules = tuple(m for m, _ in interner.frames)
    offsets = np.array([o for _, o in interner.frames], dtype=np.uint64)
    names = frame_names(modules, offsets, sysroot)
    stacks = tuple(np.array(s, dtype=np.int32) for s in interner.stacks)
    return StackProfile(
        frames=Frames(function=tuple(names), module=modules, offset=offsets),
        stacks=stacks,
        calls=calls,
        bytes=nbytes,
        peak=peak,
        leaked=leaked,
        temporaries=temps,
    )
