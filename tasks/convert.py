"""One raw trace file -> one Arrow table of events (EVENTS_SCHEMA), vectorised.

The whole conversion of a file is numpy/Arrow work over arrays; nothing loops over events in
Python. Steps (the invariants each relies on are at the code that relies on them):

1. Order. The tracer appends whole per-thread buffers, so a file is ordered per thread, not
   globally (FORMAT.md, Durability). Rows are sorted by time, then by file position (a stable
   sort; a file that is already in time order is detected and not sorted at all).
2. Threads. THREAD_START records are not rows; each gives its thread number's OS tid, carried
   forward to the rows of that thread number (thread 65535 is shared by late threads: each row
   gets the tid of the latest THREAD_START of its number before it). `seq` numbers the rows of
   each thread number in call order.
3. Pairing (`pair_frees`). Each row may free a block (free; realloc's old block) and/or define
   one (allocations; realloc's new block). Addresses are reused, so a free pairs with the latest
   earlier definition at its address, and only if no free came in between (a double free or a
   free of an address never allocated is unpaired: counted, never fatal).
4. Derived columns: freed_size from the paired definition, lifetime (ns and calls) of each
   defined block up to the row that frees it, token (tasks.tokens).

Row semantics (decisions recorded in DESIGN/issue):
- realloc is one row: `addr` = new block, `freed_addr`/`freed_size` = its free half, token =
  size class of the new size. realloc(p, 0) recorded with addr 0 frees p only: token = free
  token. A failed realloc(p, n > 0) (addr 0) frees nothing: the old block stays live.
- A failed allocation (addr 0) is a row with no lifetime.
- An unpaired free: freed_size null, token 32.
- lifetime_calls = (row number of the freeing call) - (row number of the allocation) within the
  process: 1 when the very next call of the process frees the block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.events_schema import EVENTS_SCHEMA
from tasks.tokens import FREE_OFFSET, N_TOKENS, size_class
from tasks.trace_reader import (
    ALIGNED_OPS, ALLOCATING_OPS, REALLOCATING_OPS, SIZE_MASK, Op, Trace, op_name, ticks_to_ns,
)

# Kind of each op code, as a lookup table indexed by the op byte.
_KIND_NONE, _KIND_ALLOC, _KIND_REALLOC, _KIND_FREE = 0, 1, 2, 3
_KIND = np.zeros(256, dtype=np.uint8)
_KIND[list(ALLOCATING_OPS)] = _KIND_ALLOC
_KIND[list(REALLOCATING_OPS)] = _KIND_REALLOC
_KIND[Op.FREE] = _KIND_FREE
_ALIGNED = np.zeros(256, dtype=bool)
_ALIGNED[list(ALIGNED_OPS)] = True


@dataclass(frozen=True)
class Pairing:
    """Result of `pair_frees`, indexed by row (call order in the process).

    alloc_of_free[i]: the row whose block row i frees, or -1 (row i frees nothing, or its free is
    unpaired). free_of_alloc[i]: the row that frees the block row i defines, or -1 (row i defines
    no block, or the block is never freed in the trace).
    """

    alloc_of_free: np.ndarray
    free_of_alloc: np.ndarray


_CHUNK = 1 << 20  # entries per step when building keys: a step's temporaries stay in cache


def _entry_keys(groups: list[tuple[np.ndarray, np.ndarray, int]], n: int
                ) -> tuple[np.ndarray, int] | None:
    """Entries sorted by (addr, order) as packed uint64 keys, with the order key's bit count;
    None when (address, order) does not fit 64 bits.

    Each group is (rows, source, half): the entries of rows `rows` (ascending) with addresses
    `source[rows]` and order keys 2*row + half, unique. np.sort of one uint64 array is
    SIMD-vectorised and several times faster than an argsort or a lexsort, so the address
    (compacted) and the order key are packed into one uint64 and sorted by value; the order key
    comes back from the low bits. Compaction: the high 32 address bits take few distinct values
    in a process (heap, mmap regions), mapped to small ids; the low 32 bits lose the trailing
    zeros every address shares (malloc alignment). The keys are built in place, a chunk at a
    time, in the one output array: no full-size temporaries.
    """
    pos_bits = max(2 * n - 1, 1).bit_length()
    m = sum(len(rows) for rows, _, _ in groups)
    key = np.empty(m, dtype=np.uint64)
    spans = []  # (key slice, rows chunk, half)
    common, a_min, a_max, o = 0, None, None, 0
    for rows, source, half in groups:
        for s in range(0, len(rows), _CHUNK):
            r = rows[s:s + _CHUNK]
            out = key[o:o + len(r)]
            np.take(source, r, out=out)
            common |= int(np.bitwise_or.reduce(out))
            lo, hi = int(out.min()), int(out.max())
            a_min = lo if a_min is None else min(a_min, lo)
            a_max = hi if a_max is None else max(a_max, hi)
            spans.append((out, r, half))
            o += len(r)
    if m == 0:
        return key, pos_bits
    shift = min((common & -common).bit_length() - 1, 32) if common else 0
    h0, h1 = a_min >> 32, a_max >> 32
    if h1 - h0 < (1 << 22):
        present = np.zeros(h1 - h0 + 1, dtype=np.uint64)
        for out, _, _ in spans:  # (int64 indices: numpy's fast path; the values are < 2^32)
            hi = out >> np.uint64(32)
            hi -= np.uint64(h0)
            present[hi.view(np.int64)] = 1
        n_hi = int(present.sum())
        ids, uniq = np.cumsum(present, dtype=np.uint64) - np.uint64(1), None
    else:
        uniq = np.unique(np.concatenate([np.unique(out >> np.uint64(32)) for out, _, _ in spans]))
        n_hi, ids = len(uniq), None
    hid_bits = max(n_hi - 1, 0).bit_length()
    lo_bits = 32 - shift
    if hid_bits + lo_bits + pos_bits > 64:
        return None
    hid_shift, lo_mask = np.uint64(lo_bits + pos_bits), np.uint64(0xFFFF_FFFF)
    for out, r, half in spans:
        hi = out >> np.uint64(32)
        if ids is not None:
            hi -= np.uint64(h0)
            hid = np.take(ids, hi.view(np.int64))
        else:
            hid = np.searchsorted(uniq, hi).astype(np.uint64)
        hid <<= hid_shift
        out &= lo_mask
        out >>= np.uint64(shift)
        out <<= np.uint64(pos_bits)
        out |= hid
        pos = r.astype(np.uint64)
        pos <<= np.uint64(1)
        if half:
            pos |= np.uint64(1)
        out |= pos
    key.sort()
    return key, pos_bits


def _pairs(groups: list[tuple[np.ndarray, np.ndarray, int]], n: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """The (defining row, freeing row) of every paired block, in address order.

    `groups`: the entries as in `_entry_keys` (half 0: frees, 1: definitions), n: the row count.
    See `pair_frees` for the rule.
    """
    empty = np.zeros(0, dtype=np.int64)
    if not any(len(r) for r, _, h in groups if h == 0) or \
            not any(len(r) for r, _, h in groups if h == 1):
        return empty, empty
    packed = _entry_keys(groups, n)
    parts_a, parts_f = [], []

    def match(okey: np.ndarray, same: np.ndarray) -> None:
        # entry j+1 is a free paired with entry j: same address, j a definition, j+1 a free
        is_def = (okey & np.uint64(1)).astype(bool)
        same &= is_def[:-1]
        same &= ~is_def[1:]
        j = np.flatnonzero(same)
        parts_a.append((okey[j] >> np.uint64(1)).view(np.int64))
        parts_f.append((okey[j + 1] >> np.uint64(1)).view(np.int64))

    if packed is not None:
        key, pos_bits = packed
        low = np.uint64((1 << pos_bits) - 1)
        for s in range(0, max(len(key) - 1, 0), _CHUNK):  # overlapping by one entry
            x = key[s:s + _CHUNK + 1]
            # the same address: the keys differ only in the order bits
            match(x & low, (x[1:] ^ x[:-1]) <= low)
    else:  # addresses that do not pack (unaligned, spread over the 64-bit range): lexsort
        addr = np.concatenate([src[r] for r, src, _ in groups])
        order = np.concatenate([r.astype(np.uint64) * np.uint64(2) + np.uint64(h)
                                for r, _, h in groups])
        perm = np.lexsort((order, addr))
        sorted_addr = addr[perm]
        match(order[perm], sorted_addr[1:] == sorted_addr[:-1])
    a, f = np.concatenate(parts_a), np.concatenate(parts_f)
    return a, f


def pair_frees(def_addr: np.ndarray, free_addr: np.ndarray) -> Pairing:
    """Pair each freed block with the definition that made it, per process, vectorised.

    def_addr[i]: the address of the block row i defines (0: none); free_addr[i]: the address row
    i frees (0: none). A row may do both (realloc): its free half comes first.

    Every free half and every definition becomes an entry keyed (address, 2*row + half), half 0
    for the free, 1 for the definition. Sorted by that key, the entries of one address are its
    history in call order. A free pairs with the entry just before it when that entry is a
    definition of the same address: the latest earlier allocation, not yet freed. If the entry
    before is a free, the block was already freed (double free), and if there is none, the
    address was never allocated in the trace: both are unpaired. Symmetrically a definition is
    freed by the entry just after it when that is a free of the same address; a definition
    followed by another definition (a free the trace missed) or by nothing is never freed.
    """
    n = len(def_addr)
    a, f = _pairs([(np.flatnonzero(free_addr), free_addr, 0),
                   (np.flatnonzero(def_addr), def_addr, 1)], n)
    alloc_of_free = np.full(n, -1, dtype=np.int64)
    free_of_alloc = np.full(n, -1, dtype=np.int64)
    alloc_of_free[f] = a
    free_of_alloc[a] = f
    return Pairing(alloc_of_free, free_of_alloc)


def _time_order(time_ns: np.ndarray) -> np.ndarray | None:
    """Row order by time then file position; None when the file is already in that order."""
    if len(time_ns) < 2 or bool(np.all(time_ns[1:] >= time_ns[:-1])):
        return None
    return np.argsort(time_ns, kind="stable")


def _group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    start = np.ones(len(sorted_keys), dtype=bool)
    start[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return start


def _tid_per_record(thread: np.ndarray, is_ts: np.ndarray, arg: np.ndarray) -> np.ndarray:
    """OS tid of each record: the arg of its thread number's latest THREAD_START (file order).

    Within one thread number the file is in call order (each thread appends its own buffers in
    order), so "latest before" is taken in file order. 0 where none precedes (a file whose
    THREAD_START was lost).
    """
    n = len(thread)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    single = bool(np.all(thread == thread[0]))
    perm = None if single else np.argsort(thread, kind="stable")
    ts = is_ts if perm is None else is_ts[perm]
    a = arg if perm is None else arg[perm]
    idx = np.arange(n)
    start = np.zeros(n, dtype=bool) if perm is None else _group_starts(thread[perm])
    start[0] = True
    last = np.maximum.accumulate(np.where(ts | start, idx, 0))
    tid_sorted = np.where(ts[last], a[last], 0).astype(np.uint32)
    if perm is None:
        return tid_sorted
    tid = np.empty(n, dtype=np.uint32)
    tid[perm] = tid_sorted
    return tid


def _tids(trace: Trace, thread_all: np.ndarray, is_ts: np.ndarray, ts_idx: np.ndarray,
          thread_rows: np.ndarray, take) -> np.ndarray:
    """OS tid of each row. Usually each thread number has one THREAD_START: a lookup table by
    thread number. Otherwise (thread 65535 shared by late threads) `_tid_per_record`."""
    ts_threads = np.asarray(thread_all[ts_idx])
    if len(np.unique(ts_threads)) == len(ts_threads):
        lut = np.zeros(1 << 16, dtype=np.uint32)
        lut[ts_threads] = trace.arg[ts_idx]
        if len(ts_threads) == 1 and len(thread_rows) and \
                not bool(np.any(thread_rows != ts_threads[0])):
            return np.full(len(thread_rows), lut[ts_threads[0]], dtype=np.uint32)
        return lut[thread_rows]
    return take(_tid_per_record(np.ascontiguousarray(thread_all), is_ts, trace.arg))


def _seq_per_row(thread: np.ndarray) -> np.ndarray:
    """Call number of each row within its thread number (rows in call order)."""
    n = len(thread)
    if n == 0 or bool(np.all(thread == thread[0])):
        return np.arange(n, dtype=np.uint64)
    perm = np.argsort(thread, kind="stable")
    start = _group_starts(thread[perm])
    idx = np.arange(n)
    first = np.maximum.accumulate(np.where(start, idx, 0))
    seq = np.empty(n, dtype=np.uint64)
    seq[perm] = (idx - first).astype(np.uint64)
    return seq


def _nullable(values: np.ndarray, valid: np.ndarray | None, type_: pa.DataType) -> pa.Array:
    """An Arrow array over `values` with a validity bitmap built from `valid`, without copies."""
    values = np.ascontiguousarray(values, dtype=type_.to_pandas_dtype())
    if valid is None or bool(valid.all()):
        return pa.array(values, type=type_)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    null_count = int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(type_, len(values), [bitmap, pa.py_buffer(values)],
                                 null_count=null_count)


_SMALL = 1 << 16
_SMALL_CLASS = size_class(np.arange(_SMALL, dtype=np.uint64))  # the token rule, tabulated


def _size_classes(size: np.ndarray, out: np.ndarray) -> None:
    """size_class of each size into `out`: a lookup in the rule's table for sizes below 64 KiB
    (nearly all), the rule itself for the others."""
    # sizes are below 2^40 (FORMAT.md), so an int64 view is the same values; mode="clip" maps
    # larger ones to the table's end (fixed below) without a temporary
    np.take(_SMALL_CLASS, size.view(np.int64), out=out, mode="clip")
    big = np.flatnonzero(size >= np.uint64(_SMALL))
    if len(big):
        out[big] = size_class(size[big])


def _constant(value: int | None, type_: pa.DataType, n: int) -> pa.ChunkedArray:
    """A column of n copies of one value (None: all null) that holds one chunk of memory: a
    chunk of up to _CHUNK rows, referenced as often as needed. Full-size constant arrays cost
    their allocation, page faults and fill, and the Parquet writer reads them all."""
    m = min(n, _CHUNK)
    chunk = pa.nulls(m, type_) if value is None else \
        pa.array(np.full(m, value, dtype=type_.to_pandas_dtype()), type=type_)
    k, rem = divmod(n, _CHUNK)
    return pa.chunked_array([chunk] * k + ([chunk.slice(0, rem)] if rem else []), type=type_)


@dataclass
class FileStats:
    """Small per-file facts for the run summary (all computed vectorised)."""

    rows: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    threads: int = 0
    token_hist: list[int] = field(default_factory=lambda: [0] * N_TOKENS)
    unpaired_frees: int = 0
    never_freed: int = 0
    failed_allocations: int = 0
    peak_live_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _counts(values: np.ndarray, minlength: int) -> np.ndarray:
    """np.bincount of small unsigned ints, in chunks: bincount widens its input to intp, and a
    chunk's widened copy stays in cache instead of making a full-size temporary."""
    counts = np.zeros(minlength, dtype=np.int64)
    step = 1 << 20
    for s in range(0, len(values), step):
        c = np.bincount(values[s:s + step], minlength=minlength)
        if len(c) > len(counts):
            c[:len(counts)] += counts
            counts = c
        else:
            counts += c
    return counts


def _packed_fields(records: np.ndarray) -> np.ndarray:
    """A view of the op byte and the thread number inside each record's packed field
    (FORMAT.md: bits 40-47 and 48-63 of the little-endian u64 at offset 24): no shifts."""
    dt = np.dtype({"names": ["op", "thread"], "formats": ["u1", "<u2"], "offsets": [29, 30],
                   "itemsize": records.dtype.itemsize})
    return records.view(dt)


_UNPACK_STEP = 1 << 15  # records per step: a step's records stay in cache for all fields


def _unpack(trace: Trace) -> dict[str, np.ndarray]:
    """Each field of every record as its own contiguous array: time (ns, int64), op, thread,
    size, addr, arg (and caller). The records are interleaved in memory, so extracting one field
    over the whole file reads every byte of it; here each cache-sized step of records is read
    once for all fields."""
    records = trace.records
    n = len(records)
    fields = _packed_fields(records)
    h = trace.header
    out = {"time": np.empty(n, dtype=np.int64),
           "op": np.empty(n, dtype=np.uint8), "thread": np.empty(n, dtype=np.uint16),
           "size": np.empty(n, dtype=np.uint64), "addr": np.empty(n, dtype=np.uint64),
           "arg": np.empty(n, dtype=np.uint64)}
    if trace.caller is not None:
        out["caller"] = np.empty(n, dtype=np.uint64)
    for s in range(0, n, _UNPACK_STEP):
        e = min(s + _UNPACK_STEP, n)
        r, fr = records[s:e], fields[s:e]
        ticks_to_ns(r["time"], h, out=out["time"][s:e])
        out["op"][s:e] = fr["op"]
        out["thread"][s:e] = fr["thread"]
        np.bitwise_and(r["packed"], np.uint64(SIZE_MASK), out=out["size"][s:e])
        out["addr"][s:e] = r["addr"]
        out["arg"][s:e] = r["arg"]
        if "caller" in out:
            out["caller"][s:e] = r["caller"]
    return out


def convert_trace(trace: Trace) -> tuple[pa.Table, FileStats]:
    """The events table of one trace (EVENTS_SCHEMA) and its summary facts."""
    h = trace.header
    cols_all = _unpack(trace)
    op_all, time_all, thread_all = cols_all["op"], cols_all["time"], cols_all["thread"]
    is_ts_all = op_all == Op.THREAD_START

    order = _time_order(time_all)
    ts_idx = np.flatnonzero(is_ts_all)
    if order is None:
        # Usual case (one thread, or threads that never interleave out of time order): when
        # the THREAD_START markers are a prefix, the rows are a view, not a copy.
        if len(ts_idx) == 0:
            rows = None
        elif ts_idx[-1] == len(ts_idx) - 1:
            rows = slice(len(ts_idx), None)
        else:
            rows = np.flatnonzero(~is_ts_all)
    else:
        rows = order[~is_ts_all[order]]

    def take(a: np.ndarray) -> np.ndarray:
        return a if rows is None else a[rows]

    op = take(op_all)
    size = take(cols_all["size"])
    addr = take(cols_all["addr"])
    arg = take(cols_all["arg"])
    time_ns = take(time_all)
    thread = take(thread_all)
    single_thread = len(thread) > 0 and len(ts_idx) <= 1 \
        and bool(thread[0] == thread[-1]) and not bool(np.any(thread != thread[0]))
    # one thread: thread and tid are constant columns (the tid from a one-row lookup)
    tid = _tids(trace, thread_all, is_ts_all, ts_idx, thread[:1] if single_thread else thread,
                take)
    n = len(op)

    kind = np.take(_KIND, op)
    is_free = kind == _KIND_FREE
    is_realloc = kind == _KIND_REALLOC
    any_realloc = bool(is_realloc.any())
    addr_nz = addr != 0
    defines = kind == _KIND_ALLOC
    if any_realloc:
        defines |= is_realloc
    defines &= addr_nz
    def_rows = np.flatnonzero(defines)
    frees = [(np.flatnonzero(is_free & addr_nz), addr, 0)]
    free_only = is_free
    realloc_frees = None
    if any_realloc:
        # realloc frees its old block when it returned a new one, or when realloc(p, 0) freed p
        # (recorded with addr 0); a failed realloc(p, n > 0) leaves p live.
        realloc_frees = is_realloc & (addr_nz | (size == 0)) & (arg != 0)
        frees.append((np.flatnonzero(realloc_frees), arg, 0))
        # realloc(p, 0) that only frees, and free itself, carry the free token
        free_only = is_free | (realloc_frees & ~addr_nz)
    a, f = _pairs(frees + [(def_rows, addr, 1)], n)

    # The pairs come in address order (random rows): two scatters put them in defining-row order
    # (a free comes after its definition, f > a), so that what is derived from them reads and
    # writes the row arrays nearly sequentially: blocks mostly die young, so the freeing row is
    # close to the defining row.
    freed = np.zeros(n, dtype=bool)
    freed[a] = True
    lifetime_calls = np.zeros(n, dtype=np.int64)
    lifetime_calls[a] = f - a
    a = np.flatnonzero(freed)
    f = lifetime_calls[a]
    f += a
    paired = np.zeros(n, dtype=bool)
    paired[f] = True
    freed_size = np.zeros(n, dtype=np.uint64)
    freed_size[f] = size[a]
    lifetime_ns = np.zeros(n, dtype=np.int64)
    lifetime_ns[a] = time_ns[f] - time_ns[a]

    token = np.empty(n, dtype=np.uint8)
    peak_live = 0
    live_base = np.int64(0)
    for s in range(0, n, _CHUNK):  # a chunk's temporaries stay in cache
        e = min(s + _CHUNK, n)
        fo = free_only[s:e]
        tk = token[s:e]
        _size_classes(np.where(fo, freed_size[s:e], size[s:e]), out=tk)
        tk += fo.view(np.uint8) * np.uint8(FREE_OFFSET)
        # live bytes in call order: + the size of each block defined, - each paired free's size
        delta = np.where(defines[s:e], size[s:e], np.uint64(0)).view(np.int64)
        delta -= freed_size[s:e].view(np.int64)
        live = np.cumsum(delta)
        live += live_base
        peak_live = max(peak_live, int(live.max()))
        live_base = live[-1]

    aligned = np.take(_ALIGNED, op)
    n_aligned = int(np.count_nonzero(aligned))
    if n_aligned:
        alignment = _nullable(np.where(aligned, arg, np.uint64(0)), aligned, pa.uint64())
    else:
        alignment = _constant(None, pa.uint64(), n)
    # freed_addr: realloc's old block only; a plain free's freed block is its `addr`
    if realloc_frees is not None and realloc_frees.any():
        # arg is this conversion's own copy (_unpack) and not read after this: its buffer
        # becomes the column's values
        np.copyto(arg, np.uint64(0), where=~realloc_frees)
        freed_addr = _nullable(arg, realloc_frees, pa.uint64())
    else:
        freed_addr = _constant(None, pa.uint64(), n)
    caller = trace.caller
    cols = {
        "pid": _constant(h.pid, pa.uint32(), n),
        "ppid": _constant(h.ppid, pa.uint32(), n),
        "thread": _constant(int(thread[0]), pa.uint16(), n) if single_thread
        else pa.array(thread),
        "tid": _constant(int(tid[0]), pa.uint32(), n) if single_thread else pa.array(tid),
        "seq": pa.array(np.arange(n, dtype=np.uint64) if single_thread
                        else _seq_per_row(thread)),
        "time_ns": pa.array(time_ns),
        "op": pa.array(op),
        "size": pa.array(size),
        "alignment": alignment,
        "addr": pa.array(addr),
        "freed_addr": freed_addr,
        "freed_size": _nullable(freed_size, paired, pa.uint64()),
        "caller": (pa.array(take(cols_all["caller"])) if caller is not None
                   else _constant(None, pa.uint64(), n)),
        "lifetime_ns": _nullable(lifetime_ns, freed, pa.int64()),
        "lifetime_calls": _nullable(lifetime_calls, freed, pa.int64()),
        "token": pa.array(token),
    }
    table = pa.Table.from_arrays([cols[f.name] for f in EVENTS_SCHEMA], schema=EVENTS_SCHEMA)

    op_counts = _counts(op, 256)
    codes = np.flatnonzero(op_counts)
    n_paired, n_freed = len(f), len(a)
    stats = FileStats(
        rows=n,
        ops={op_name(int(c)): int(op_counts[c]) for c in codes},
        threads=1 if single_thread else int(np.count_nonzero(_counts(thread, 1))) if n else 0,
        token_hist=_counts(token, N_TOKENS)[:N_TOKENS].astype(int).tolist(),
        unpaired_frees=sum(len(rows) for rows, _, _ in frees) - n_paired,
        never_freed=len(def_rows) - n_freed,
        failed_allocations=int(np.count_nonzero((kind == _KIND_ALLOC) & ~addr_nz)
                               + (np.count_nonzero(is_realloc & ~addr_nz & (size != 0))
                                  if any_realloc else 0)),
        peak_live_bytes=peak_live,
    )
    return table, stats


def events_from_trace(trace: Trace) -> pa.Table:
    """The events table (EVENTS_SCHEMA) of one trace file: one row per heap call."""
    return convert_trace(trace)[0]


assert FREE_OFFSET == 32  # the unpaired-free token (32) relies on it
