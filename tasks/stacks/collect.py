"""A run's process traces reduced to a StackProfile: per distinct call stack, what its
allocations did (vectorised per event; Python loops run over traces, distinct stacks and
distinct frames only).

The rows and their pairing are the converter's (`tasks.dataset.convert.convert_groups`, what
`heapcast report` reads): a row defines a block when an allocating call returned an address (a
failed call and `realloc(p, 0)` that only frees define none), and the row that frees it is the
row `lifetime_calls` later. The run's peak is the report's (tasks.report.analysis): the largest
total of live bytes over all processes merged by time, a process's heap released after its last
call; `peak` is each stack's bytes live at that instant (summed, it equals the report's peak).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.dataset.convert import convert_groups
from tasks.format.frames import Frames, frame_names
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, Trace
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
    record: np.ndarray  # int64: the record it is (an index into trace.records)


def _row_records(trace: Trace) -> np.ndarray:
    """The record of each of the converter's rows: heap calls (THREAD_START markers left out)
    by time, then file order."""
    keep = trace.op != Op.THREAD_START
    t = trace.time_ns
    if len(t) < 2 or bool(np.all(t[1:] >= t[:-1])):
        return np.flatnonzero(keep)
    order = np.argsort(t, kind="stable")
    return order[keep[order]]


def _rows(trace: Trace) -> _Rows:
    """The rows of one trace, paired by the converter."""
    tables, _ = convert_groups(trace)
    time, op, size, addr, freed, lt = [], [], [], [], [], []
    for t in tables:  # a loop over row groups of up to 1 M rows
        time.append(t["time_ns"].to_numpy())
        op.append(t["op"].to_numpy())
        size.append(t["size"].to_numpy())
        addr.append(t["addr"].to_numpy())
        freed.append(t["freed_size"].fill_null(0).to_numpy())
        lt.append(t["lifetime_calls"].fill_null(-1).to_numpy())
    time_a, op_a = np.concatenate(time), np.concatenate(op)
    record = _row_records(trace)
    if len(record) != len(time_a):  # the converter's row rule changed: said, not guessed
        raise RuntimeError(
            f"{trace.header.path}: {len(time_a)} converted rows but {len(record)} heap calls"
        )
    defines = np.take(_IS_DEF, op_a) & (np.concatenate(addr) != 0)
    lt_a = np.concatenate(lt).astype(np.int64)
    rows = np.arange(len(lt_a), dtype=np.int64)
    free_row = np.where(defines & (lt_a >= 0), rows + lt_a, -1)
    return _Rows(
        time=time_a.astype(np.int64),
        defines=defines,
        size=np.where(defines, np.concatenate(size), 0).astype(np.int64),
        freed=np.concatenate(freed).astype(np.int64),
        free_row=free_row,
        thread=trace.thread[record],
        record=record,
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


def _distinct(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, ascending; each key's index among them): a lookup table where the
    keys are small (stack ids count nodes), else a sort."""
    top = int(key.max()) if len(key) else 0
    if top < 1 << 24:
        seen = np.zeros(top + 1, bool)
        seen[key] = True
        index = np.cumsum(seen) - 1
        return np.flatnonzero(seen).astype(np.uint64), index[key]
    uniq, inverse = np.unique(key, return_inverse=True)
    return uniq, inverse.reshape(-1)


def _stack_keys(trace: Trace, record: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For allocation records: each one's index among its trace's distinct stacks, and each
    distinct stack's frame addresses, innermost first, 0 past the outermost. With stacks, the
    trie's frames of its stack id; without (or where a stack id has no node), its caller as one
    frame; without either, no frame."""
    caller = trace.caller
    if trace.stack is not None and trace.stacks is not None:
        ids = trace.stack[record]
        # ids have no top bit (node counts); a caller-only key sets it
        key = np.where(ids != 0, ids, caller[record] | np.uint64(1 << 63))
        uniq, local = _distinct(key)
        stacked = (uniq >> np.uint64(63)) == 0
        frames = trace.stacks.frames(np.where(stacked, uniq, 0))
        if frames.shape[1] == 0:
            frames = np.zeros((len(uniq), 1), np.uint64)
        lone = ~stacked
        frames[lone] = 0
        frames[lone, 0] = uniq[lone] & np.uint64((1 << 63) - 1)
        return local, frames
    key = caller[record] if caller is not None else np.zeros(len(record), np.uint64)
    uniq, local = _distinct(key)
    return local, uniq.reshape(-1, 1)


class _Interner:
    """Distinct frames (module path, offset) and stacks (tuples of frame rows) over a run."""

    def __init__(self) -> None:
        self.frames: dict[tuple[str, int], int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}

    def stack_rows(self, trace: Trace, frames: np.ndarray) -> np.ndarray:
        """The run-wide stack row of each process-local stack (rows of frame addresses,
        innermost first, 0 past the outermost)."""
        mods = trace.modules
        present = frames != 0
        addr, inverse = np.unique(frames[present], return_inverse=True)  # distinct addresses
        if mods is not None and len(mods):
            midx, off = mods.locate(addr)
        else:
            midx, off = np.full(len(addr), -1, np.int32), np.zeros(len(addr), np.uint64)
        off = np.where(midx >= 0, off, addr)  # no module: the raw address
        paths = mods.path if mods is not None else ()
        fid = np.empty(len(addr), np.int64)
        for j, (m, o) in enumerate(zip(midx.tolist(), off.tolist())):  # distinct frames
            fkey = (paths[m] if m >= 0 else "", o)
            fid[j] = self.frames.setdefault(fkey, len(self.frames))
        fid_of = np.full(frames.shape, -1, np.int64)
        fid_of[present] = fid[inverse.reshape(-1)]
        out = np.empty(len(frames), np.int64)
        depth = np.count_nonzero(present, axis=1)  # frames end at the first 0
        for s in range(len(frames)):  # a loop over distinct stacks
            key = tuple(fid_of[s, : depth[s]].tolist())
            out[s] = self.stacks.setdefault(key, len(self.stacks))
        return out


def stack_profile(traces: Sequence[Trace], sysroot: Path | None = None) -> StackProfile:
    """The StackProfile of a run's process traces (one per process image, in the run's file
    order). Stacks of different processes with the same frames ((module, offset) each) are
    one stack; frames are named once each (tasks.stacks.names, under `sysroot` for a
    container's run).

    A trace without stacks (format version 1 or 2, or one recorded with `--frames 0`) gives
    one-frame stacks, malloc's caller, when it records callers, else empty stacks (one stack
    of no frame for all its calls); an allocation whose stack id has no node in its trace gets
    its caller's one frame too.

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
        local, frames = _stack_keys(trace, rows.record[alloc])
        allocs.append((alloc, interner.stack_rows(trace, frames)[local]))
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
