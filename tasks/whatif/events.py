"""One run's events, read and laid out for the simulator (tasks/whatif/simulate.py).

`read_events(root, workload, run)` reads a run's partition through the dataset's one reader,
with an `image` column (the Parquet part, i.e. the process image). `prepare(table)` turns it into
numpy arrays in SIMULATION ORDER, vectorised: processes in call order, request and freed sizes
per row, block partners, time.

The rules: docs/whatif.md#reading-a-run
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from tasks.core.storage import Root
from tasks.dataset.events_reader import read_run
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op

PART = "image"  # the column that names the part (the image) each row comes from
COLUMNS = (
    "pid",
    "thread",
    "seq",
    "time_ns",
    "op",
    "size",
    "addr",
    "freed_size",
    "lifetime_calls",
    "alignment",
)
N_CLASSES = 32  # allocation tokens 0..31 (tasks.dataset.tokens)
NEVER = np.iinfo(np.int64).max

_DEFINES = np.zeros(256, dtype=bool)
_DEFINES[list(ALLOCATING_OPS) + list(REALLOCATING_OPS)] = True
_PAGE_ALIGNED = np.array([int(Op.VALLOC), int(Op.PVALLOC)])
PAGE_SIZE = 4096
_FREES = np.zeros(256, dtype=bool)
_FREES[[int(Op.FREE)] + list(REALLOCATING_OPS)] = True


def read_events(root: Root, workload: str, run: str, extra: tuple[str, ...] = ()) -> pa.Table:
    """The run's events (COLUMNS + `extra` + `image`, the part each row comes from) in call
    order, through the dataset's one reader (EventsNotFound when the run is not there)."""
    return read_run(root, workload, run, COLUMNS + extra, part_column=PART)


def _np(table: pa.Table, name: str, fill: int | None = None) -> np.ndarray:
    col = table.column(name)
    if fill is not None and col.null_count:
        col = col.fill_null(fill)
    return col.to_numpy()


@njit(cache=True)
def _last_rows(proc: np.ndarray, n_proc: int) -> np.ndarray:
    is_last = np.zeros(len(proc), dtype=np.bool_)
    seen = np.zeros(n_proc, dtype=np.bool_)
    for i in range(len(proc) - 1, -1, -1):
        p = proc[i]
        if not seen[p]:
            seen[p] = True
            is_last[i] = True
    return is_last


@njit(cache=True)
def _next_requests(
    proc: np.ndarray, n_proc: int, req: np.ndarray, cls_req: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """next_same[i]: the next row of row i's process requesting row i's class (NEVER if none);
    first[p, c]: the first row of process p requesting class c."""
    n = len(proc)
    nxt = np.full((n_proc, N_CLASSES), NEVER, np.int64)
    out = np.full(n, NEVER, np.int64)
    for i in range(n - 1, -1, -1):
        if req[i] >= 0:
            p = proc[i]
            c = cls_req[i]
            out[i] = nxt[p, c]
            nxt[p, c] = i
    return out, nxt


@dataclass
class SimInput:
    """One run's events in simulation order (see docs/whatif.md#reading-a-run)."""

    proc: np.ndarray  # int32 process index, 0..n_proc-1
    n_proc: int
    req: np.ndarray  # int64 bytes requested, -1 = row defines no block
    freed: np.ndarray  # int64 bytes of the block freed, -1 = row frees none (or unpaired)
    cls_req: np.ndarray  # uint8 size class of req
    cls_free: np.ndarray  # uint8 size class of freed
    partner: np.ndarray  # int64 row defining the freed block, -1 unknown
    time: np.ndarray  # int64 ns (or row numbers, see time_basis)
    is_last: np.ndarray  # bool: last row of its process (the process exits after it)
    row: np.ndarray  # int64 row of the input table
    # int64 alignment the row's request asks for (aligned ops; valloc/pvalloc: a page), else 0
    align_req: np.ndarray | None = None
    # int64 alignment of the address the row's request got in the traced run (its lowest set
    # bit; 0: no address): what the system allocator hands out for it
    addr_align: np.ndarray | None = None
    # int32 the row's thread, 0..n_threads-1 over (process, thread) pairs: the layer's outgrown
    # rule is the freeing thread's (None: one thread per process)
    thread: np.ndarray | None = None
    n_threads: int = 0
    time_basis: str = "ns"
    workload: str = ""
    run: str = ""
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def one_thread(
        cls,
        req: np.ndarray,
        freed: np.ndarray,
        partner: np.ndarray,
        time: np.ndarray,
        align_req: np.ndarray,
        addr_align: np.ndarray,
        time_basis: str = "ns",
    ) -> SimInput:
        """A stream made by hand or generated, as one process of one thread, its sizes all of
        class 0 (what the policy core's tests and benchmark replay)."""
        n = len(req)
        zero = np.zeros(n, np.int32)
        return cls(
            proc=zero,
            n_proc=1,
            req=req,
            freed=freed,
            cls_req=np.zeros(n, np.uint8),
            cls_free=np.zeros(n, np.uint8),
            partner=partner,
            time=time,
            is_last=np.arange(n) == n - 1,
            row=np.arange(n),
            align_req=align_req,
            addr_align=addr_align,
            thread=zero,
            n_threads=1,
            time_basis=time_basis,
        )

    @property
    def n(self) -> int:
        return len(self.req)

    @property
    def span(self) -> int:
        return int(self.time[-1] - self.time[0]) if self.n else 0

    def next_requests(self) -> tuple[np.ndarray, np.ndarray]:
        if "next" not in self.cache:
            self.cache["next"] = _next_requests(self.proc, self.n_proc, self.req, self.cls_req)
        return self.cache["next"]

    def align(self, per_row: np.ndarray) -> np.ndarray:
        """An array given per row of the input table, in simulation order."""
        per_row = np.asarray(per_row)
        if len(per_row) != self.n:
            raise ValueError(f"{len(per_row)} values given for a run of {self.n} events")
        return per_row[self.row]


def _grouped_in_time(key: np.ndarray, time: np.ndarray) -> bool:
    """Every key's rows contiguous, each group in time order."""
    if len(key) < 2:
        return True
    change = key[1:] != key[:-1]
    if not np.all((time[1:] >= time[:-1]) | change):
        return False
    return int(change.sum()) + 1 == len(np.unique(key[np.concatenate([[True], change])]))


@njit(cache=True)
def _bit_length(x):
    n = 0
    if x >= 1 << 32:
        x >>= 32
        n += 32
    if x >= 1 << 16:
        x >>= 16
        n += 16
    if x >= 1 << 8:
        x >>= 8
        n += 8
    while x:
        x >>= 1
        n += 1
    return n


@njit(cache=True)
def _layout(key, op, size, addr, freed_size, has_freed, life, defines, frees):
    """One pass over rows grouped by process in call order: (proc, req, freed, cls_req,
    cls_free, partner, n_proc); see docs/whatif.md#reading-a-run."""
    n = len(key)
    proc = np.empty(n, np.int32)
    req = np.empty(n, np.int64)
    freed = np.empty(n, np.int64)
    cls_req = np.zeros(n, np.uint8)
    cls_free = np.zeros(n, np.uint8)
    partner = np.full(n, -1, np.int64)
    p = -1
    for i in range(n):
        if i == 0 or key[i] != key[i - 1]:
            p += 1
        proc[i] = p
        o = op[i]
        r = -1
        if defines[o] and addr[i] != 0:
            r = np.int64(size[i])
            cls_req[i] = min(_bit_length(r), 31)
        req[i] = r
        f = -1
        if frees[o] and has_freed[i]:
            f = np.int64(freed_size[i])
            cls_free[i] = min(_bit_length(f), 31)
        freed[i] = f
    n_proc = p + 1
    end = np.empty(n_proc, np.int64)
    for i in range(n):
        end[proc[i]] = i + 1
    for i in range(n):
        if req[i] >= 0 and life[i] > 0:
            j = i + life[i]
            if j < end[proc[i]] and freed[j] == req[i]:
                partner[j] = i
    return proc, req, freed, cls_req, cls_free, partner, n_proc


def prepare(table: pa.Table, workload: str = "", run: str = "") -> SimInput:
    """Lay one run's events out for the simulator (see docs/whatif.md#reading-a-run)."""
    n = table.num_rows
    key_name = "image" if "image" in table.column_names else "pid"
    key = _np(table, key_name)
    time = _np(table, "time_ns").astype(np.int64, copy=False)
    order = None
    if not _grouped_in_time(key, time):
        order = np.lexsort((_np(table, "seq"), _np(table, "thread"), time, key))
        key, time = key[order], time[order]

    def col(name: str, fill: int | None = None) -> np.ndarray:
        a = _np(table, name, fill)
        return a if order is None else a[order]

    has_freed = ~np.asarray(table.column("freed_size").is_null().to_numpy(zero_copy_only=False))
    if order is not None:
        has_freed = has_freed[order]
    proc, req, freed, cls_req, cls_free, partner, n_proc = _layout(
        key,
        col("op"),
        col("size"),
        col("addr"),
        col("freed_size", 0),
        has_freed,
        col("lifetime_calls", -1).astype(np.int64, copy=False),
        _DEFINES,
        _FREES,
    )
    row = np.arange(n, dtype=np.int64) if order is None else order.astype(np.int64)
    # (process, thread) as one key: thread numbers are 16 bits in the raw format (FORMAT.md)
    pair = (proc.astype(np.int64) << 32) | col("thread").astype(np.int64, copy=False)
    _, thread = np.unique(pair, return_inverse=True)
    thread = np.asarray(thread, np.int32).reshape(-1)
    n_threads = int(thread.max()) + 1 if n else 0
    a = col("addr").astype(np.uint64, copy=False)
    addr_align = (a & (~a + np.uint64(1))).astype(np.int64)  # lowest set bit (0 for 0)
    addr_align[addr_align < 0] = 1 << 62
    ops = col("op")
    if "alignment" in table.column_names:
        align_req = col("alignment", 0).astype(np.int64, copy=False)
    else:
        align_req = np.zeros(n, np.int64)
    align_req = np.where(np.isin(ops, _PAGE_ALIGNED), np.int64(PAGE_SIZE), align_req)
    if n_proc > 1 and not np.all(time[1:] >= time[:-1]):
        # merge the processes by time; stable, so each keeps its call order (timsort: runs)
        merge = np.argsort(time, kind="stable")
        inv = np.empty(n, np.int64)
        inv[merge] = np.arange(n)
        proc, req, freed, time, row = proc[merge], req[merge], freed[merge], time[merge], row[merge]
        cls_req, cls_free = cls_req[merge], cls_free[merge]
        partner = partner[merge]
        align_req, addr_align = align_req[merge], addr_align[merge]
        thread = thread[merge]
        partner = np.where(partner >= 0, inv[np.maximum(partner, 0)], -1)
    time_basis = "ns"
    if n and time[-1] == time[0]:
        time = np.arange(n, dtype=np.int64)
        time_basis = "calls"
    return SimInput(
        proc=np.ascontiguousarray(proc, np.int32),
        n_proc=int(n_proc),
        req=np.ascontiguousarray(req),
        freed=np.ascontiguousarray(freed),
        cls_req=np.ascontiguousarray(cls_req),
        cls_free=np.ascontiguousarray(cls_free),
        partner=np.ascontiguousarray(partner),
        time=np.ascontiguousarray(time),
        is_last=_last_rows(proc, n_proc),
        row=row,
        align_req=np.ascontiguousarray(align_req, np.int64),
        addr_align=np.ascontiguousarray(addr_align, np.int64),
        thread=np.ascontiguousarray(thread, np.int32),
        n_threads=n_threads,
        time_basis=time_basis,
        workload=workload,
        run=run,
    )
