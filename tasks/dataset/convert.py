"""One raw trace file -> Arrow tables of events (EVENTS_SCHEMA), vectorised.

No Python loop per event. `_plan` does what needs the whole file once (1. order by time,
2. threads and `seq`, 3. `pair_frees`); `_group_table` builds the columns a group of rows at a
time (4. freed_size, lifetimes, token), so `convert_groups` can write row groups and let them go;
`convert_trace` gives one table.

The steps and the row semantics (realloc, failed calls, unpaired frees):
docs/dataset.md#converting-one-trace-file
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.dataset.events_schema import CALLER_MODULE_TYPE, EVENTS_SCHEMA
from tasks.dataset.stacks_table import ProcessStacks
from tasks.dataset.tokens import FREE_OFFSET, N_TOKENS, size_class
from tasks.format.trace_reader import (
    ALIGNED_OPS,
    ALLOCATING_OPS,
    REALLOCATING_OPS,
    SIZE_MASK,
    Op,
    Trace,
    TraceHeader,
    op_name,
    ticks_to_ns,
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

# An entry group: (rows, source, half, rec). `rows`: row numbers (ascending); the address of row
# r is source[rec(r)], where rec is None (source indexed by row), an int offset (row r is record
# r + offset) or an index array (row r is record rec[r]). `source` may be a strided view of the
# raw records: it is gathered a chunk at a time, never copied whole.
Group = tuple[np.ndarray, np.ndarray, int, "int | np.ndarray | None"]


def _at(rec: int | np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """Record indices of row numbers `rows` (see Group)."""
    if rec is None:
        return rows
    if isinstance(rec, np.ndarray):
        return rec[rows]
    return rows + rec if rec else rows


def _gather(source: np.ndarray, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """source[idx]; np.take when source is contiguous (fast path), fancy indexing otherwise
    (np.take would first copy a strided source whole)."""
    if source.flags.c_contiguous:
        return np.take(source, idx, out=out)
    if out is None:
        return source[idx]
    out[...] = source[idx]
    return out


def _entry_keys(groups: list[Group], n: int) -> tuple[np.ndarray, int] | None:
    """Entries sorted by (addr, order) as packed uint64 keys, with the order key's bit count;
    None when (address, order) does not fit 64 bits.

    Each group (see Group) gives the entries of its rows with their addresses and order keys
    2*row + half, unique. np.sort of one uint64 array is
    SIMD-vectorised and several times faster than an argsort or a lexsort, so the address
    (compacted) and the order key are packed into one uint64 and sorted by value; the order key
    comes back from the low bits. Compaction: the high 32 address bits take few distinct values
    in a process (heap, mmap regions), mapped to small ids; the low 32 bits lose the trailing
    zeros every address shares (malloc alignment). The keys are built in place, a chunk at a
    time, in the one output array: no full-size temporaries.
    """
    pos_bits = max(2 * n - 1, 1).bit_length()
    m = sum(len(g[0]) for g in groups)
    key = np.empty(m, dtype=np.uint64)
    spans = []  # (key slice, rows chunk, half)
    common, a_min, a_max, o = 0, None, None, 0
    for rows, source, half, rec in groups:
        for s in range(0, len(rows), _CHUNK):
            r = rows[s : s + _CHUNK]
            out = key[o : o + len(r)]
            _gather(source, _at(rec, r), out=out)
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


def _nonzero_rows(mask: np.ndarray, row_t: type) -> np.ndarray:
    """np.flatnonzero(mask) as `row_t`, a chunk at a time: no full-size int64 temporary."""
    out = np.empty(int(np.count_nonzero(mask)), dtype=row_t)
    o = 0
    for s in range(0, len(mask), _CHUNK):
        idx = np.flatnonzero(mask[s : s + _CHUNK])
        idx += s
        out[o : o + len(idx)] = idx
        o += len(idx)
    return out


def _defines(kind: np.ndarray, addr_nz: np.ndarray) -> np.ndarray:
    """Rows that define a block: allocations and reallocs that returned an address."""
    out = kind == _KIND_ALLOC
    out |= kind == _KIND_REALLOC
    out &= addr_nz
    return out


def _frees_old_block(addr_nz: np.ndarray, size: np.ndarray, arg: np.ndarray) -> np.ndarray:
    """Of realloc rows: which free their old block. realloc frees it when it returned a new one,
    or when realloc(p, 0) freed p (recorded with addr 0); a failed realloc(p, n > 0) leaves p
    live."""
    return (addr_nz | (size == 0)) & (arg != 0)


def _row_type(n: int) -> type:
    """The narrowest signed integer type for row numbers of n rows (and -1)."""
    return np.int32 if n < 2**31 else np.int64


def _pairs(groups: list[Group], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (defining row, freeing row) of every paired block, in address order.

    `groups`: the entries as in `_entry_keys` (half 0: frees, 1: definitions), n: the row count.
    See `pair_frees` for the rule.
    """
    row_t = _row_type(n)
    empty = np.zeros(0, dtype=row_t)
    if not any(len(g[0]) for g in groups if g[2] == 0) or not any(
        len(g[0]) for g in groups if g[2] == 1
    ):
        return empty, empty
    packed = _entry_keys(groups, n)
    parts_a, parts_f = [], []

    def match(okey: np.ndarray, same: np.ndarray) -> None:
        # entry j+1 is a free paired with entry j: same address, j a definition, j+1 a free
        is_def = (okey & np.uint64(1)).astype(bool)
        same &= is_def[:-1]
        same &= ~is_def[1:]
        j = np.flatnonzero(same)
        parts_a.append((okey[j] >> np.uint64(1)).astype(row_t))
        parts_f.append((okey[j + 1] >> np.uint64(1)).astype(row_t))

    if packed is not None:
        key, pos_bits = packed
        low = np.uint64((1 << pos_bits) - 1)
        for s in range(0, max(len(key) - 1, 0), _CHUNK):  # overlapping by one entry
            x = key[s : s + _CHUNK + 1]
            # the same address: the keys differ only in the order bits
            match(x & low, (x[1:] ^ x[:-1]) <= low)
    else:  # addresses that do not pack (unaligned, spread over the 64-bit range): lexsort
        addr = np.concatenate([_gather(src, _at(rec, r)) for r, src, _, rec in groups])
        order = np.concatenate(
            [r.astype(np.uint64) * np.uint64(2) + np.uint64(h) for r, _, h, _ in groups]
        )
        perm = np.lexsort((order, addr))
        sorted_addr = addr[perm]
        match(order[perm], sorted_addr[1:] == sorted_addr[:-1])
    a, f = np.concatenate(parts_a), np.concatenate(parts_f)
    return a, f


def pair_frees(def_addr: np.ndarray, free_addr: np.ndarray) -> Pairing:
    """Pair each freed block with the definition that made it, per process, vectorised.

    def_addr[i]: the address of the block row i defines (0: none); free_addr[i]: the address row
    i frees (0: none). A row may do both (realloc): its free half comes first.

    Each free half and each definition is an entry keyed (address, 2*row + half: 0 the free, 1 the
    definition); sorted, the entries of one address are its history in call order. A free pairs
    with the entry just before it when that is a definition of the same address (the latest earlier
    allocation, not yet freed); after a free (double free) or with none before it (never allocated
    in the trace) it is unpaired. A definition is freed by the entry just after it
    when that frees the same address; followed by another definition (a free the trace missed) or
    by nothing, it is never freed.
    """
    n = len(def_addr)
    a, f = _pairs(
        [
            (np.flatnonzero(free_addr), free_addr, 0, None),
            (np.flatnonzero(def_addr), def_addr, 1, None),
        ],
        n,
    )
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
    return pa.Array.from_buffers(
        type_, len(values), [bitmap, pa.py_buffer(values)], null_count=null_count
    )


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
    chunk = (
        pa.nulls(m, type_)
        if value is None
        else pa.array(np.full(m, value, dtype=type_.to_pandas_dtype()), type=type_)
    )
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
        c = np.bincount(values[s : s + step], minlength=minlength)
        if len(c) > len(counts):
            c[: len(counts)] += counts
            counts = c
        else:
            counts += c
    return counts


def _packed_fields(records: np.ndarray) -> np.ndarray:
    """A view of the op byte and the thread number inside each record's packed field
    (FORMAT.md: bits 40-47 and 48-63 of the little-endian u64 at offset 24): no shifts."""
    dt = np.dtype(
        {
            "names": ["op", "thread"],
            "formats": ["u1", "<u2"],
            "offsets": [29, 30],
            "itemsize": records.dtype.itemsize,
        }
    )
    return records.view(dt)


_UNPACK_STEP = 1 << 15  # records per step: a step's records stay in cache for all fields
# Rows converted (and written) at a time: one Parquet row group, small enough that the group's
# columns are reused from group to group (docs/dataset.md#converting-one-trace-file).
GROUP_ROWS = 1 << 20


def _unpack(records: np.ndarray, h: TraceHeader, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each named field of `records` as its own contiguous array: time (ns, int64), op,
    thread, size, addr, arg, caller. The records are interleaved in memory, so extracting one
    field over all of them reads every byte; here each cache-sized step of records is read once
    for all fields."""
    n = len(records)
    packed = _packed_fields(records)
    dtypes = {
        "time": np.int64,
        "op": np.uint8,
        "thread": np.uint16,
        "size": np.uint64,
        "addr": np.uint64,
        "arg": np.uint64,
        "caller": np.uint64,
        "stack": np.uint64,
    }
    out = {f: np.empty(n, dtype=dtypes[f]) for f in fields}
    for s in range(0, n, _UNPACK_STEP):
        e = min(s + _UNPACK_STEP, n)
        r, fr = records[s:e], packed[s:e]
        for f, a in out.items():
            if f == "time":
                ticks_to_ns(r["time"], h, out=a[s:e])
            elif f in ("op", "thread"):
                a[s:e] = fr[f]
            elif f == "size":
                np.bitwise_and(r["packed"], np.uint64(SIZE_MASK), out=a[s:e])
            else:
                a[s:e] = r[f]
    return out


@dataclass
class _Plan:
    """What a file's conversion needs of the whole file, computed once: which record each row
    is, the pairing of frees with definitions, the threads and their OS tids. Rows are then
    converted a group at a time (`_group_table`), so the full-size arrays held at once are these
    few small ones, not every column of the file."""

    n: int
    rec: int | np.ndarray  # row r is record r + rec (int) or record rec[r] (array)
    free_of_alloc: np.ndarray  # per row: the row freeing the block it defines, or -1
    alloc_of_free: np.ndarray  # per row: the row defining the block it frees, or -1
    single_thread: bool
    thread0: int
    tid_lut: np.ndarray | None  # OS tid by thread number, or None: `tid` per row
    tid: np.ndarray | None
    stats: FileStats
    kind: np.ndarray  # per row: _KIND of its op
    any_aligned: bool  # some row is an aligned allocation
    stacks: ProcessStacks | None = None  # a stack trace's trie, keyed for the run


def _scan_records(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """op and thread of every record, whether its address is not null, and whether the records'
    times never decrease, in one cache-sized pass."""
    records = trace.records
    n = len(records)
    packed = _packed_fields(records)
    op, thread = np.empty(n, dtype=np.uint8), np.empty(n, dtype=np.uint16)
    addr_nz = np.empty(n, dtype=bool)
    ordered, last = True, None
    for s in range(0, n, _UNPACK_STEP):
        e = min(s + _UNPACK_STEP, n)
        op[s:e] = packed["op"][s:e]
        thread[s:e] = packed["thread"][s:e]
        np.not_equal(records["addr"][s:e], 0, out=addr_nz[s:e])
        if ordered:
            # raw times: ns are a non-decreasing function of them (FORMAT.md)
            t = records["time"][s:e]
            ordered = bool(np.all(t[1:] >= t[:-1])) and (last is None or t[0] >= last)
            last = t[-1]
    return op, thread, addr_nz, ordered


def _thread_count(thread: np.ndarray) -> int:
    """How many threads the rows' thread numbers name."""
    if len(thread) == 0:
        return 0
    if thread.min() == thread.max():
        return 1
    return int(np.count_nonzero(_counts(thread, 1 << 16)))


def _records_of_rows(
    trace: Trace, is_ts_all: np.ndarray, ts_idx: np.ndarray, ordered: bool
) -> int | np.ndarray:
    """Which record each row (event) is: an offset where the rows are the records past the
    THREAD_START markers in file order, else an index per row (time order, markers left out)."""
    if not ordered:
        order = _time_order(ticks_to_ns(trace.records["time"], trace.header))
        if order is not None:
            return order[~is_ts_all[order]]
    # Usual case (one thread, or threads that never interleave out of time order): when
    # the THREAD_START markers are a prefix, row r is record r + their count.
    if len(ts_idx) == 0 or ts_idx[-1] == len(ts_idx) - 1:
        return len(ts_idx)
    return np.flatnonzero(~is_ts_all)


def _plan(trace: Trace) -> _Plan:
    records = trace.records
    op_all, thread_all, addr_nz_all, ordered = _scan_records(trace)
    is_ts_all = op_all == Op.THREAD_START
    ts_idx = np.flatnonzero(is_ts_all)

    rec = _records_of_rows(trace, is_ts_all, ts_idx, ordered)
    n = len(records) - len(ts_idx)

    def rows_of(a: np.ndarray) -> np.ndarray:
        return a[rec:] if isinstance(rec, int) else a[rec]

    op = rows_of(op_all)
    thread = rows_of(thread_all)
    threads = _thread_count(thread)
    single_thread = threads == 1 and len(ts_idx) <= 1
    thread0 = int(thread[0]) if n else 0

    # OS tids: a lookup table by thread number when each number has one THREAD_START (usual);
    # else per row (thread 65535 shared by late threads: `_tid_per_record`)
    ts_threads = thread_all[ts_idx]
    tid_lut = tid = None
    if len(np.unique(ts_threads)) == len(ts_threads):
        tid_lut = np.zeros(1 << 16, dtype=np.uint32)
        tid_lut[ts_threads] = trace.arg[ts_idx]
    else:
        tid = rows_of(_tid_per_record(thread_all, is_ts_all, np.ascontiguousarray(trace.arg)))

    # Pairing entries by row number, their addresses gathered from the records a chunk at a
    # time (a contiguous copy of every address is faster to gather from, but on a VM the fresh
    # memory it takes costs more than it saves on a worker's first file)
    addr_v, arg_v = records["addr"], records["arg"]
    kind = np.take(_KIND, op)
    addr_nz = rows_of(addr_nz_all)
    defines = _defines(kind, addr_nz)
    row_t = _row_type(n)
    def_rows = _nonzero_rows(defines, row_t)
    is_free = kind == _KIND_FREE
    is_free &= addr_nz
    free_rows = _nonzero_rows(is_free, row_t)
    del is_free
    groups: list[Group] = [(free_rows, addr_v, 0, rec)]
    realloc_rows = np.flatnonzero(kind == _KIND_REALLOC)
    failed = int(np.count_nonzero((kind == _KIND_ALLOC) & ~addr_nz))
    if len(realloc_rows):
        size = _gather(records["packed"], _at(rec, realloc_rows)) & np.uint64(SIZE_MASK)
        nz = addr_nz[realloc_rows]
        frees_old = _frees_old_block(nz, size, _gather(arg_v, _at(rec, realloc_rows)))
        groups.append((realloc_rows[frees_old], arg_v, 0, rec))
        failed += int(np.count_nonzero(~nz & (size != 0)))
    n_frees = sum(len(g[0]) for g in groups)
    a, f = _pairs(groups + [(def_rows, addr_v, 1, rec)], n)
    free_of_alloc = np.full(n, -1, dtype=row_t)
    alloc_of_free = np.full(n, -1, dtype=row_t)
    free_of_alloc[a] = f
    alloc_of_free[f] = a

    op_counts = _counts(op, 256)
    stats = FileStats(
        rows=n,
        ops={op_name(int(c)): int(op_counts[c]) for c in np.flatnonzero(op_counts)},
        threads=threads,
        unpaired_frees=n_frees - len(a),
        never_freed=len(def_rows) - len(a),
        failed_allocations=failed,
    )
    return _Plan(
        n,
        rec,
        free_of_alloc,
        alloc_of_free,
        single_thread,
        thread0,
        tid_lut,
        tid,
        stats,
        kind,
        bool(op_counts[list(ALIGNED_OPS)].any()),
    )


def _partner_field(trace: Trace, plan: _Plan, rows: np.ndarray, field: str) -> np.ndarray:
    """A raw record field of other rows (the partner of a pair, possibly in another group)."""
    return _gather(trace.records[field], _at(plan.rec, rows))


class _GroupState:
    """What carries from one group of rows to the next: live bytes, per-thread call numbers."""

    def __init__(self) -> None:
        self.live_base = np.int64(0)
        self.peak_live = 0
        self.seq_base = np.zeros(1 << 16, dtype=np.uint64)
        self.token_hist = np.zeros(N_TOKENS, dtype=np.int64)


def _lifetimes(
    trace: Trace, plan: _Plan, s: int, e: int, time_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows s..e that define a block freed in the trace, and its lifetime to the row that frees
    it, in ns and in calls of the process (0 elsewhere)."""
    g = e - s
    fa = plan.free_of_alloc[s:e]
    freed = fa >= 0
    fi = np.flatnonzero(freed)
    partner = fa[fi].astype(np.int64)
    partner -= s  # as a row of this group
    lifetime_calls = np.zeros(g, dtype=np.int64)
    lifetime_calls[fi] = partner - fi
    later = partner >= g
    t_free = np.take(time_ns, partner, mode="clip")
    if later.any():
        t_free[later] = ticks_to_ns(
            _partner_field(trace, plan, partner[later] + s, "time"), trace.header
        )
    t_free -= time_ns[fi]
    lifetime_ns = np.zeros(g, dtype=np.int64)
    lifetime_ns[fi] = t_free
    return freed, lifetime_ns, lifetime_calls


def _freed_sizes(
    trace: Trace, plan: _Plan, s: int, e: int, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows s..e that free a block defined in the trace, and its size, from the row that
    defined it (0 elsewhere)."""
    af = plan.alloc_of_free[s:e]
    paired = af >= 0
    pi = np.flatnonzero(paired)
    partner = af[pi].astype(np.int64)
    partner -= s
    earlier = partner < 0
    sizes = np.take(size, partner, mode="clip")
    if earlier.any():
        sizes[earlier] = _partner_field(trace, plan, partner[earlier] + s, "packed")
        sizes[earlier] &= np.uint64(SIZE_MASK)
    freed_size = np.zeros(e - s, dtype=np.uint64)
    freed_size[pi] = sizes
    return paired, freed_size


def _tokens(
    free_only: np.ndarray,
    freed_size: np.ndarray,
    size: np.ndarray,
    defines: np.ndarray,
    state: _GroupState,
) -> np.ndarray:
    """The rows' tokens (the size class; a free's, of the freed block, plus FREE_OFFSET), with
    the live bytes' peak and the token counts carried in `state`."""
    g = len(size)
    token = np.empty(g, dtype=np.uint8)
    for c in range(0, g, _CHUNK):  # a chunk's temporaries stay in cache
        d = min(c + _CHUNK, g)
        fo = free_only[c:d]
        tk = token[c:d]
        _size_classes(np.where(fo, freed_size[c:d], size[c:d]), out=tk)
        tk += fo.view(np.uint8) * np.uint8(FREE_OFFSET)
        # live bytes in call order: + the size of each block defined, - each paired free's size
        delta = np.where(defines[c:d], size[c:d], np.uint64(0)).view(np.int64)
        delta -= freed_size[c:d].view(np.int64)
        live = np.cumsum(delta)
        live += state.live_base
        state.peak_live = max(state.peak_live, int(live.max()))
        state.live_base = live[-1]
    state.token_hist += _counts(token, N_TOKENS)[:N_TOKENS]
    return token


def _thread_columns(
    plan: _Plan, thread: np.ndarray | None, s: int, e: int, state: _GroupState
) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """The thread, tid and per-thread sequence columns of rows s..e (the sequence carried in
    `state`); constants where the trace has one thread."""
    g = e - s
    if plan.single_thread:
        # at most one THREAD_START (single_thread): the tid is a lookup table's entry
        return (
            _constant(plan.thread0, pa.uint16(), g),
            _constant(int(plan.tid_lut[plan.thread0]), pa.uint32(), g),
            np.arange(s, e, dtype=np.uint64),
        )
    tid = plan.tid_lut[thread] if plan.tid_lut is not None else plan.tid[s:e]
    seq = _seq_per_row(thread)
    seq += state.seq_base[thread]
    state.seq_base += _counts(thread, 1 << 16).astype(np.uint64)
    return pa.array(thread), pa.array(tid), seq


def _group_table(trace: Trace, plan: _Plan, s: int, e: int, state: _GroupState) -> pa.Table:
    """The events table of rows s..e (EVENTS_SCHEMA)."""
    h = trace.header
    g = e - s
    rec = plan.rec
    records = trace.records[rec + s : rec + e] if isinstance(rec, int) else trace.records[rec[s:e]]
    fields = ("time", "op", "size", "addr", "arg") + (() if plan.single_thread else ("thread",))
    fields += ("caller",) if trace.caller is not None else ()
    fields += ("stack",) if plan.stacks is not None else ()
    cols_g = _unpack(records, h, fields)
    time_ns, op, size, addr, arg = (cols_g[k] for k in ("time", "op", "size", "addr", "arg"))

    kind = plan.kind[s:e]
    is_free = kind == _KIND_FREE
    is_realloc = kind == _KIND_REALLOC
    any_realloc = bool(is_realloc.any())
    addr_nz = addr != 0
    defines = _defines(kind, addr_nz)
    free_only = is_free
    realloc_frees = None
    if any_realloc:
        realloc_frees = is_realloc & _frees_old_block(addr_nz, size, arg)
        # realloc(p, 0) that only frees, and free itself, carry the free token
        free_only = is_free | (realloc_frees & ~addr_nz)

    # Blocks mostly die young: the row that frees a block defined here (or defined one freed
    # here) is usually in this group, its columns at hand; else it is read from the records.
    freed, lifetime_ns, lifetime_calls = _lifetimes(trace, plan, s, e, time_ns)
    paired, freed_size = _freed_sizes(trace, plan, s, e, size)
    token = _tokens(free_only, freed_size, size, defines, state)

    aligned = np.take(_ALIGNED, op) if plan.any_aligned else None
    if aligned is not None and aligned.any():
        alignment = _nullable(np.where(aligned, arg, np.uint64(0)), aligned, pa.uint64())
    else:
        alignment = _constant(None, pa.uint64(), g)
    # freed_addr: realloc's old block only; a plain free's freed block is its `addr`
    if realloc_frees is not None and realloc_frees.any():
        # arg is this group's own copy (_unpack), not read after this: it becomes the column
        np.copyto(arg, np.uint64(0), where=~realloc_frees)
        freed_addr = _nullable(arg, realloc_frees, pa.uint64())
    else:
        freed_addr = _constant(None, pa.uint64(), g)

    thread_col, tid_col, seq = _thread_columns(plan, cols_g.get("thread"), s, e, state)
    cols = {
        "pid": _constant(h.pid, pa.uint32(), g),
        "ppid": _constant(h.ppid, pa.uint32(), g),
        "thread": thread_col,
        "tid": tid_col,
        "seq": pa.array(seq),
        "time_ns": pa.array(time_ns),
        "op": pa.array(op),
        "size": pa.array(size),
        "alignment": alignment,
        "addr": pa.array(addr),
        "freed_addr": freed_addr,
        "freed_size": _nullable(freed_size, paired, pa.uint64()),
        "caller": (
            pa.array(cols_g["caller"]) if "caller" in cols_g else _constant(None, pa.uint64(), g)
        ),
        **_caller_modules(trace, cols_g.get("caller"), g),
        "lifetime_ns": _nullable(lifetime_ns, freed, pa.int64()),
        "lifetime_calls": _nullable(lifetime_calls, freed, pa.int64()),
        "token": pa.array(token),
        "stack": (
            plan.stacks.column(cols_g["stack"])
            if plan.stacks is not None
            else _constant(None, pa.uint64(), g)
        ),
    }
    return pa.Table.from_arrays([cols[f.name] for f in EVENTS_SCHEMA], schema=EVENTS_SCHEMA)


def _caller_modules(trace: Trace, caller: np.ndarray | None, g: int) -> dict[str, Any]:
    """caller_module and caller_offset of a group: the module holding each caller and the
    caller's address in it (FORMAT.md, Modules); null without a module map."""
    m = trace.modules
    if caller is None or m is None or len(m) == 0:
        return {
            "caller_module": _constant(None, CALLER_MODULE_TYPE, g),
            "caller_offset": _constant(None, pa.uint64(), g),
        }
    idx, offset = m.locate(caller)
    missing = idx < 0
    valid = None if not missing.any() else ~missing
    return {
        "caller_module": pa.DictionaryArray.from_arrays(
            pa.array(idx, mask=missing if valid is not None else None, type=pa.int32()),
            pa.array(list(m.path), type=pa.string()),
        ),
        "caller_offset": _nullable(offset, valid, pa.uint64()),
    }


def convert_groups(
    trace: Trace, stacks: ProcessStacks | None = None
) -> tuple[Iterator[pa.Table], FileStats]:
    """The events of one trace as consecutive tables of up to GROUP_ROWS rows (EVENTS_SCHEMA),
    and its summary facts, complete once the tables are all consumed. Only one group's columns
    are in memory at a time: a writer writes each as a row group and lets it go.

    A stack trace's `stack` column comes through `stacks` (ProcessStacks.of_trace(trace), made
    here when not given): once the tables are consumed, its `table()` holds the frames of the
    stacks the events name (tasks.dataset.stacks_table)."""
    plan = _plan(trace)
    plan.stacks = stacks if stacks is not None else ProcessStacks.of_trace(trace)
    state = _GroupState()
    stats = plan.stats

    def tables() -> Iterator[pa.Table]:
        if plan.n == 0:
            yield EVENTS_SCHEMA.empty_table()
        for s in range(0, plan.n, GROUP_ROWS):
            yield _group_table(trace, plan, s, min(s + GROUP_ROWS, plan.n), state)
        stats.token_hist = state.token_hist.astype(int).tolist()
        stats.peak_live_bytes = state.peak_live

    return tables(), stats


def convert_trace(trace: Trace) -> tuple[pa.Table, FileStats]:
    """The events table of one trace (EVENTS_SCHEMA) and its summary facts."""
    tables, stats = convert_groups(trace)
    return pa.concat_tables(list(tables)), stats


def events_from_trace(trace: Trace) -> pa.Table:
    """The events table (EVENTS_SCHEMA) of one trace file: one row per heap call."""
    return convert_trace(trace)[0]


assert FREE_OFFSET == 32  # the unpaired-free token (32) relies on it
