"""A run's events reduced to the report's numbers (`HeapReport`), with numpy and Arrow only: no
Python loop per event (loops run over batches, process images, time windows and callers).

Each batch is reduced to histograms, counts and per-caller groups; live bytes are a cumulative
sum per process image, merged by time across images (each image's heap released after its last
call); the peak and the plots' time bins come from that.

The rules: docs/report.md
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from tasks.dataset.tokens import FREE_OFFSET, size_class
from tasks.dataset.worker_heap import heap_kept
from tasks.format.symbols import caller_label, resolve
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, op_name
from tasks.report.sources import Part, ReportInputError, RunInput, iter_parts
from tasks.stacks.profile import StackProfile

N_CLASSES = 32  # size classes 0..31: a block of n bytes is min(n.bit_length(), 31)
N_LOG2 = 64  # bins of the lifetime histogram in ns: bit length of the lifetime
# Lifetime in calls: one bin per value below CALLS_EXACT (temporaries are counted there), then
# one per bit length: [16, 32), [32, 64), ...
CALLS_EXACT = 16
N_CALL_BINS = CALLS_EXACT + 64 - CALLS_EXACT.bit_length() + 1
DEFAULT_BINS = 1000
DEFAULT_TEMPORARY_CALLS = 4
DEFAULT_TOP_PROCESSES = 8

WINDOW_ROWS = 1 << 21  # rows merged at a time for the total (whole time bins)

# lookup tables indexed by the op byte
_IS_DEF = np.zeros(256, dtype=bool)  # may define a block (when it returns an address)
_IS_DEF[list(ALLOCATING_OPS) + list(REALLOCATING_OPS)] = True
_IS_REALLOC = np.zeros(256, dtype=bool)
_IS_REALLOC[list(REALLOCATING_OPS)] = True
NONE = 255  # "no block" in the per-row size-class arrays

CALLER_COLUMNS = ("calls", "allocs", "bytes", "leaks", "leak_bytes", "temps")


@dataclass
class Process:
    """One process image (one trace file; an `exec` starts a new one with the same pid)."""

    image: int
    pid: int
    ppid: int
    part: str  # the file it came from
    cmdline: tuple[str, ...] = ()
    start_ns: int | None = None  # realtime start from the trace header or file name
    events: int = 0
    threads: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    allocations: int = 0
    peak_bytes: int = 0
    peak_ns: int | None = None
    final_bytes: int = 0  # live at its last event: its never-freed blocks
    leaks: int = 0
    leak_bytes: int = 0
    parent: int = -1  # image of the parent (fork) or of the image it replaced (exec)
    relation: str = ""  # "fork", "exec", or "" (a root of the tree)

    @property
    def name(self) -> str:
        if self.cmdline:
            return self.cmdline[0].rsplit("/", 1)[-1]
        return self.part

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else "(command line not recorded)"


@dataclass
class Series:
    """A curve over the report's time bins."""

    label: str
    live_max: np.ndarray  # float: largest live bytes in each bin (NaN: the image not alive)
    alloc_calls: np.ndarray  # allocations (blocks defined) in each bin
    alloc_bytes: np.ndarray  # bytes of those blocks
    image: int | None = None


@dataclass
class HeapReport:
    """Everything the page and the summary show about one run (small arrays, no events)."""

    label: str
    kind: str  # "raw" or "events"
    command: list[str] | None
    temporary_calls: int
    events: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)
    threads: list[tuple[int, int, int]] = field(default_factory=list)  # (image, tid, events)
    t0_ns: int = 0
    t1_ns: int = 0
    bin_edges_ns: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))
    total: Series | None = None
    per_process: list[Series] = field(default_factory=list)  # top processes by peak
    peak_bytes: int = 0
    peak_ns: int = 0
    peak_by_class_bytes: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    peak_by_class_blocks: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    peak_by_process: dict[int, int] = field(default_factory=dict)  # image -> live bytes
    alloc_count: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    alloc_bytes: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    free_count: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    freed_bytes: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    lifetime_ns_hist: np.ndarray = field(default_factory=lambda: np.zeros(N_LOG2, np.int64))
    lifetime_calls_hist: np.ndarray = field(
        default_factory=lambda: np.zeros(N_CALL_BINS, np.int64)
    )  # bins of calls_bin
    temp_by_class_count: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    temp_by_class_bytes: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    leak_by_class_count: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    leak_by_class_bytes: np.ndarray = field(default_factory=lambda: np.zeros(N_CLASSES, np.int64))
    unpaired_frees: int = 0
    failed_allocations: int = 0
    # caller + CALLER_COLUMNS + image (the first process image it was seen in), by calls desc;
    # with a module map (FORMAT.md, Modules) also module (path, "" when unknown), offset (in the
    # module's ELF addresses), function ("" when unnamed) and label (how the report names it).
    # Callers with a module are one entry per (module, offset) over all processes; `caller` is
    # then the lowest of their raw addresses. Without one, per raw address.
    callers: dict[str, np.ndarray] | None = None
    # what each distinct call stack allocated (the page's flame graphs and stack tables); None
    # when not read (summary.make_report reads it from the run's traces)
    stacks: StackProfile | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def allocations(self) -> int:
        return int(self.alloc_count.sum())

    @property
    def allocated_bytes(self) -> int:
        return int(self.alloc_bytes.sum())

    @property
    def frees(self) -> int:
        return int(self.free_count.sum())

    @property
    def temporaries(self) -> int:
        return int(self.temp_by_class_count.sum())

    @property
    def temporary_bytes(self) -> int:
        return int(self.temp_by_class_bytes.sum())

    @property
    def leaks(self) -> int:
        return int(self.leak_by_class_count.sum())

    @property
    def leak_bytes(self) -> int:
        return int(self.leak_by_class_bytes.sum())

    @property
    def thread_count(self) -> int:
        return len(self.threads)

    @property
    def span_s(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9

    @property
    def has_callers(self) -> bool:
        return self.callers is not None and len(self.callers["caller"]) > 0

    def process(self, image: int) -> Process:
        return self.processes[image]

    @property
    def peak_process(self) -> Process | None:
        if not self.peak_by_process:
            return None
        image = max(self.peak_by_process, key=lambda i: self.peak_by_process[i])
        return self.processes[image]


# ------------------------------------------------------------------------------ batch helpers


def _column(col: Any) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _values(col: Any) -> np.ndarray:
    """A column without nulls as numpy (zero-copy for one chunk)."""
    return _column(col).to_numpy(zero_copy_only=False)


def _nullable(col: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(values, validity or None when all valid); (None, None) when all null. The values under
    nulls are whatever the buffer holds: callers use them only where valid (no fill pass)."""
    if col.null_count == len(col):
        return None, None
    arr = _column(col)
    if arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False), None
    n, off = len(arr), arr.offset
    bitmap, data = arr.buffers()[:2]
    values = np.frombuffer(data, dtype=arr.type.to_pandas_dtype(), count=off + n)[off:]
    valid = np.unpackbits(np.frombuffer(bitmap, np.uint8), count=off + n, bitorder="little")
    return values, valid[off:].view(bool)


def bit_length(x: np.ndarray) -> np.ndarray:
    """int.bit_length of integers (exact below 2^53; 0 for x <= 0), vectorised: the exponent
    field of x as a float64, which is bit_length + 1022 for x >= 1."""
    e = x.astype(np.float64).view(np.int64)
    e >>= 52
    e -= 1022
    np.maximum(e, 0, out=e)  # 0 (and negatives: sign bit set) -> 0
    return e


def calls_bin(calls: np.ndarray) -> np.ndarray:
    """The lifetime-in-calls histogram's bin of each value (see CALLS_EXACT)."""
    out = bit_length(calls)
    out += CALLS_EXACT - CALLS_EXACT.bit_length()
    small = calls < CALLS_EXACT
    out[small] = np.maximum(calls[small], 0)
    return out


def calls_bin_range(k: int) -> tuple[int, int]:
    """The lifetimes in calls [lo, hi) of bin k of calls_bin."""
    if k < CALLS_EXACT:
        return k, k + 1
    lo = 1 << (k - CALLS_EXACT + CALLS_EXACT.bit_length() - 1)
    return lo, 2 * lo


def _bincount(x: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(x, weights=weights, minlength=n)[:n]


def _by_class(cls: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sums by size class of rows whose class is 0..31 (NONE and the like are dropped)."""
    return np.bincount(cls, weights=weights, minlength=256)[:N_CLASSES]


# ------------------------------------------------------------------------- one process image


class _Image:
    """The rows of one process image that live bytes need, in call order: time, live bytes
    after the row, the size class of the block the row defines and of the block it frees (NONE:
    none); rows that do both (realloc) also keep the bytes they free in `side`. Class sums are
    checkpointed at each batch, so the classes live at any row cost at most one batch's rows."""

    def __init__(self, proc: Process, rows: int | None) -> None:
        self.proc = proc
        self.expected = rows
        self.n = 0
        self.time = self.live = self.acls = self.fcls = None
        self.side_parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.side_rows = np.zeros(0, np.int64)
        self.side_freed = np.zeros(0, np.int64)
        self.ckpt_rows: list[int] = []
        self.ckpt: list[tuple[np.ndarray, np.ndarray]] = []
        self.cls_bytes = np.zeros(N_CLASSES, np.float64)  # exact: integer sums below 2^53
        self.cls_blocks = np.zeros(N_CLASSES, np.float64)
        self.base = 0
        self.last_time: int | None = None
        self.ordered = True

    def _reserve(self, m: int) -> None:
        need = self.n + m
        if self.time is not None and need <= len(self.time):
            return
        cap = max(need, self.expected or 0) if self.time is None else max(need, 2 * len(self.time))
        for name, dt in (
            ("time", np.int64),
            ("live", np.int64),
            ("acls", np.uint8),
            ("fcls", np.uint8),
        ):
            new = np.empty(cap, dt)
            old = getattr(self, name)
            if old is not None:
                new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def append(
        self,
        time: np.ndarray,
        delta: np.ndarray,
        acls: np.ndarray,
        fcls: np.ndarray,
        side: tuple[np.ndarray, np.ndarray] | None,
        d_bytes: np.ndarray,
        d_blocks: np.ndarray,
    ) -> None:
        m = len(time)
        self._reserve(m)
        s, e = self.n, self.n + m
        self.ckpt_rows.append(s)
        self.ckpt.append((self.cls_bytes.copy(), self.cls_blocks.copy()))
        if self.ordered and (
            (self.last_time is not None and time[0] < self.last_time)
            or not bool(np.all(time[1:] >= time[:-1]))
        ):
            self.ordered = False
        live = self.live[s:e]
        np.cumsum(delta, out=live)
        live += self.base
        self.base = int(live[-1])
        self.time[s:e] = time
        self.acls[s:e] = acls
        self.fcls[s:e] = fcls
        if side is not None:
            self.side_parts.append((side[0] + s, side[1]))
        self.cls_bytes += d_bytes
        self.cls_blocks += d_blocks
        last = int(time[-1]) if self.ordered else int(time.max())
        self.last_time = last if self.last_time is None else max(self.last_time, last)
        self.n = e

    def finish(self) -> None:
        """Trim, put the rows in time order if they were not, and fill the Process's facts."""
        n = self.n
        self.time, self.live = self.time[:n], self.live[:n]
        self.acls, self.fcls = self.acls[:n], self.fcls[:n]
        if self.side_parts:
            self.side_rows = np.concatenate([r for r, _ in self.side_parts])
            self.side_freed = np.concatenate([f for _, f in self.side_parts]).astype(np.int64)
        self.side_parts = []
        if not self.ordered:  # rows written out of call order (hand-made data): sort them
            delta = np.diff(self.live, prepend=0)
            perm = np.argsort(self.time, kind="stable")
            self.time, self.acls, self.fcls = self.time[perm], self.acls[perm], self.fcls[perm]
            self.live = np.cumsum(delta[perm])
            inv = np.empty(n, np.int64)
            inv[perm] = np.arange(n)
            rows = inv[self.side_rows]
            o = np.argsort(rows, kind="stable")
            self.side_rows, self.side_freed = rows[o], self.side_freed[o]
            self.ckpt_rows = [0]
            self.ckpt = [(np.zeros(N_CLASSES), np.zeros(N_CLASSES))]
        p = self.proc
        j = int(np.argmax(self.live))
        p.peak_bytes, p.peak_ns = int(self.live[j]), int(self.time[j])
        p.final_bytes = int(self.live[-1])
        p.first_ns, p.last_ns = int(self.time[0]), int(self.time[-1])

    def row_delta(self, s: int, e: int) -> np.ndarray:
        """Live-bytes change of rows s..e-1."""
        return np.diff(self.live[s:e], prepend=self.live[s - 1] if s > 0 else 0)

    def alloc_bytes(self, s: int, e: int, delta: np.ndarray) -> np.ndarray:
        """Bytes of the block each row s..e-1 defines (0: none), from its live-bytes change."""
        out = np.where(self.acls[s:e] != NONE, delta, 0)
        lo, hi = np.searchsorted(self.side_rows, [s, e])
        if hi > lo:  # realloc rows: change = new size - freed size
            out[self.side_rows[lo:hi] - s] += self.side_freed[lo:hi]
        return out

    def classes_at(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Live bytes and blocks by size class after row r."""
        k = int(np.searchsorted(self.ckpt_rows, r, side="right")) - 1
        c = self.ckpt_rows[k]
        nbytes, blocks = (a.copy() for a in self.ckpt[k])
        delta = self.row_delta(c, r + 1)
        acls, fcls = self.acls[c : r + 1], self.fcls[c : r + 1]
        a_bytes = self.alloc_bytes(c, r + 1, delta)
        f_bytes = a_bytes - delta  # what each row freed
        nbytes += _by_class(acls, a_bytes) - _by_class(fcls, f_bytes)
        blocks += _by_class(acls) - _by_class(fcls)
        return nbytes, blocks


# ----------------------------------------------------------------------------- accumulation


class _Accumulator:
    """The per-batch reductions of one run, and its images' rows for live bytes."""

    def __init__(self, temporary_calls: int) -> None:
        self.temporary_calls = temporary_calls
        self.index: dict[tuple[int, int], int] = {}
        self.procs: list[Process] = []
        self.images: list[_Image] = []
        self.ops = np.zeros(256, np.int64)
        z = lambda: np.zeros(N_CLASSES, np.float64)  # noqa: E731 (bincount sums are floats)
        self.alloc_count, self.alloc_bytes, self.free_count, self.freed_bytes = z(), z(), z(), z()
        self.temp_count, self.temp_bytes, self.leak_count, self.leak_bytes = z(), z(), z(), z()
        self.lt_ns = np.zeros(N_LOG2, np.int64)
        self.lt_calls = np.zeros(N_CALL_BINS, np.int64)
        self.unpaired_frees = 0
        self.failed = 0
        self.caller_parts: list[pa.Table] = []
        self.thread_parts: list[tuple[np.ndarray, np.ndarray]] = []

    def image(self, part_idx: int, part: Part, pid: int, ppid: int, rows: int | None) -> _Image:
        key = (part_idx, pid)
        k = self.index.get(key)
        if k is None:
            k = self.index[key] = len(self.procs)
            own = part.pid is None or part.pid == pid
            proc = Process(
                image=k,
                pid=pid,
                ppid=part.ppid if own and part.ppid is not None else ppid,
                part=part.name,
                cmdline=part.cmdline if own else (),
                start_ns=part.start_ns if own else None,
            )
            self.procs.append(proc)
            self.images.append(_Image(proc, rows))
        return self.images[k]

    def add_part(self, part_idx: int, part: Part) -> None:
        for batch in part.batches:
            self.add(part_idx, part, batch)
        if part.pid is not None:  # an image with no heap call is still a process of the tree
            self.image(part_idx, part, part.pid, part.ppid or 0, 0)

    def add(self, part_idx: int, part: Part, b: Any) -> None:
        n = b.num_rows
        if n == 0:
            return
        if part.one_pid:
            self._rows(self.image(part_idx, part, part.pid, part.ppid or 0, part.rows), b)
            return
        pid = _values(b.column("pid"))
        ppid = _values(b.column("ppid"))
        if pid[0] == pid[-1] and pid.min() == pid.max():
            self._rows(self.image(part_idx, part, int(pid[0]), int(ppid[0]), None), b)
            return
        # several processes in one batch (hand-made datasets): each pid's rows, in file order
        perm = np.argsort(pid, kind="stable")
        b = b.take(pa.array(perm))
        pid, ppid = pid[perm], ppid[perm]
        starts = np.flatnonzero(np.diff(pid)) + 1
        for s, e in zip(np.concatenate([[0], starts]), np.append(starts, n)):
            img = self.image(part_idx, part, int(pid[s]), int(ppid[s]), None)
            self._rows(img, b.slice(int(s), int(e - s)))

    def _rows(self, img: _Image, b: Any) -> None:
        """One image's rows (in file order)."""
        n = b.num_rows
        c = b.column
        time = _values(c("time_ns")).astype(np.int64, copy=False)
        op = _values(c("op"))
        size = _values(c("size")).astype(np.uint64, copy=False)
        token = _values(c("token"))
        # a row defines a block when its op can and it returned an address; without failed
        # allocations in the file (its summary says so), when its token is an allocation's
        # (realloc(p, 0) that frees p carries the free token): the addr column is not read
        addr_nz = _values(c("addr")) != 0 if "addr" in b.schema.names else token < FREE_OFFSET
        blk = _row_blocks(op, size, token, addr_nz, *_nullable(c("freed_size")))

        # size classes of the blocks defined and freed (rows of class NONE land past 31)
        ca, fc = _by_class(blk.acls), _by_class(blk.fcls)
        ab, fb = _by_class(blk.acls, size), _by_class(blk.fcls, blk.freed)
        self.alloc_count += ca
        self.alloc_bytes += ab
        self.free_count += fc
        self.freed_bytes += fb
        self.ops += _bincount(op, 256)
        is_free = op == Op.FREE
        self.unpaired_frees += int(np.count_nonzero(is_free)) - int(
            np.count_nonzero(is_free & blk.fflag)
        )
        nd = np.take(_IS_DEF, op) & ~addr_nz
        if nd.any():  # failed allocations; realloc(p, 0) that freed p is not one
            self.failed += int(np.count_nonzero(nd & ~(np.take(_IS_REALLOC, op) & (size == 0))))

        freed_block, temp, leak = self._lifetimes(b, blk, size)
        p = img.proc
        p.events += n
        p.allocations += int(ca.sum())
        p.leaks += int(np.count_nonzero(leak))
        p.leak_bytes += int(blk.alloc[leak].sum())
        tids, counts = _thread_counts(_values(c("tid")))
        key = (np.uint64(p.image) << np.uint64(32)) | tids.astype(np.uint64)
        self.thread_parts.append((key, counts.astype(np.int64)))
        caller, cvalid = _nullable(c("caller"))
        if caller is not None:
            sel = cvalid if cvalid is not None else slice(None)
            t = pa.table(
                {
                    "caller": caller[sel],
                    "allocs": blk.dflag[sel].view(np.uint8),
                    "bytes": blk.alloc[sel],
                    "leaks": leak[sel].view(np.uint8),
                    "leak_bytes": np.where(freed_block, np.uint64(0), blk.alloc)[sel],
                    "temps": temp[sel].view(np.uint8),
                }
            )
            self.caller_parts.append(_sum_by_caller(t, _caller_modules(b, sel), p.image))

        img.append(time, blk.delta, blk.acls, blk.fcls, blk.side, ab - fb, ca - fc)

    def _lifetimes(
        self, b: Any, blk: _RowBlocks, size: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lifetimes of the blocks freed in the trace, temporaries and leaks (never freed),
        counted; (the rows whose block was freed, the temporaries, the leaks)."""
        n = b.num_rows
        lt_ns, lt_valid = _nullable(b.column("lifetime_ns"))
        lt_calls, _ = _nullable(b.column("lifetime_calls"))
        if lt_ns is None:
            freed_block = np.zeros(n, bool)
        else:
            freed_block = np.ones(n, bool) if lt_valid is None else lt_valid
            self.lt_ns += _bincount(bit_length(lt_ns[freed_block]), N_LOG2)
        if lt_calls is not None:
            self.lt_calls += _bincount(calls_bin(lt_calls[freed_block]), N_CALL_BINS)
            temp = freed_block & (lt_calls <= self.temporary_calls)
        else:
            temp = np.zeros(n, bool)
        leak = blk.dflag & ~freed_block
        tt, lt = blk.acls[temp], blk.acls[leak]
        self.temp_count += _by_class(tt)
        self.temp_bytes += _by_class(tt, size[temp])
        self.leak_count += _by_class(lt)
        self.leak_bytes += _by_class(lt, blk.alloc[leak])
        return freed_block, temp, leak


class _RowBlocks(NamedTuple):
    """The block each row defines (allocations and reallocs that returned an address) and the
    paired block it frees: flags, size classes (NONE: none), sizes, the live-bytes change, and
    the realloc rows that do both with the bytes they free (`side`: None when there are none)."""

    dflag: np.ndarray
    acls: np.ndarray
    alloc: np.ndarray
    fflag: np.ndarray
    fcls: np.ndarray
    freed: np.ndarray
    delta: np.ndarray
    side: tuple[np.ndarray, np.ndarray] | None


def _row_blocks(
    op: np.ndarray,
    size: np.ndarray,
    token: np.ndarray,
    addr_nz: np.ndarray,
    freed: np.ndarray | None,
    fvalid: np.ndarray | None,
) -> _RowBlocks:
    """The blocks rows define and free (see _RowBlocks), from their op, size, token, whether
    they returned an address, and the freed size where the trace pairs frees."""
    n = len(op)
    dflag = np.take(_IS_DEF, op)
    dflag &= addr_nz
    acls = np.where(dflag, token, np.uint8(NONE))
    alloc = np.where(dflag, size, np.uint64(0))
    delta = alloc.view(np.int64)  # sizes < 2^40 (FORMAT.md); a copy below if freed
    side = None
    if freed is None:
        fflag = np.zeros(n, bool)
        fcls = np.full(n, NONE, np.uint8)
        freed = np.zeros(n, np.uint64)
    else:
        fflag = np.ones(n, bool) if fvalid is None else fvalid
        # a free's token is 32 + the freed block's class; a realloc's is its new block's
        fcls = np.where(fflag, token - np.uint8(FREE_OFFSET), np.uint8(NONE))
        re = np.flatnonzero(fflag & (token < FREE_OFFSET))
        if len(re):
            fcls[re] = size_class(freed[re].astype(np.uint64))
        delta = delta - np.where(fflag, freed, np.uint64(0)).view(np.int64)
        both = np.flatnonzero(dflag[re]) if len(re) else re
        if len(both):
            side = (re[both].astype(np.int64), freed[re[both]].astype(np.int64))
    return _RowBlocks(dflag, acls, alloc, fflag, fcls, freed, delta, side)


def _thread_counts(tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls per OS tid: (tids, counts); a bincount over a narrow range, else Arrow's group-by."""
    t_lo, t_hi = int(tid.min()), int(tid.max())
    if t_lo == t_hi:
        return np.array([t_lo]), np.array([len(tid)])
    if t_hi - t_lo < 1 << 20:
        counts = np.bincount(tid - np.uint32(t_lo))
        tids = np.flatnonzero(counts)
        return tids + t_lo, counts[tids]
    g = pa.table({"t": tid}).group_by("t").aggregate([("t", "count")])
    return _values(g["t"]), _values(g["t_count"])


def _sum_by_caller(t: pa.Table, mods: Any, image: int) -> pa.Table:
    """One image's rows (caller and CALLER_COLUMNS' flags and bytes) summed per caller with
    Arrow's hash group-by; with the module and offset of each where the trace mapped them."""
    if mods is not None:
        t = t.append_column("midx", pa.array(mods[0])).append_column("offset", pa.array(mods[1]))
    g = t.group_by("caller").aggregate(
        [("caller", "count")]
        + [(c, "sum") for c in CALLER_COLUMNS[1:]]
        + ([("midx", "max"), ("offset", "max")] if mods is not None else [])
    )
    names = {"caller_count": "calls", **{f"{c}_sum": c for c in CALLER_COLUMNS[1:]}}
    names |= {"midx_max": "midx", "offset_max": "offset"}
    g = g.rename_columns([names.get(c, c) for c in g.column_names])
    if mods is not None:  # a raw address is one (module, offset) within one image
        midx = _values(g["midx"])
        paths = np.array([None, *mods[2]], dtype=object)[midx + 1]
        g = g.drop_columns(["midx"]).append_column("module", pa.array(paths, type=pa.string()))
    else:
        g = g.append_column("offset", pa.nulls(len(g), pa.uint64()))
        g = g.append_column("module", pa.nulls(len(g), pa.string()))
    return g.append_column("image", pa.array(np.full(len(g), image)))


# ---------------------------------------------------------------------------------- analysis


def _ints(x: np.ndarray) -> np.ndarray:
    return np.rint(x).astype(np.int64)


def _bins(t0: int, t1: int, bins: int) -> np.ndarray:
    """Edges of ~`bins` equal time bins of whole ns covering [t0, t1]."""
    span = t1 - t0 + 1
    width = max(-(-span // bins), 1)
    nb = -(-span // width)
    return t0 + width * np.arange(nb + 1, dtype=np.int64)


def _tree(procs: list[Process]) -> None:
    """Parents: an image replaces (exec) the previous image of its pid, else is forked by the
    image of its parent pid current at its start (images ordered by start)."""
    order = sorted(
        procs,
        key=lambda p: (p.start_ns if p.start_ns is not None else (p.first_ns or 0), p.image),
    )
    current: dict[int, int] = {}
    for p in order:
        if p.pid in current:
            p.parent, p.relation = current[p.pid], "exec"
        elif p.ppid in current:
            p.parent, p.relation = current[p.ppid], "fork"
        current[p.pid] = p.image


def analyze(
    run: RunInput,
    *,
    bins: int = DEFAULT_BINS,
    temporary_calls: int = DEFAULT_TEMPORARY_CALLS,
    top_processes: int = DEFAULT_TOP_PROCESSES,
    parts: Iterable[Part] | None = None,
) -> HeapReport:
    """Read `run` (or the given `parts`) and reduce it to a HeapReport. Files that cannot be
    read are skipped, with a warning naming them (`HeapReport.warnings`); a run with no
    readable file raises sources.ReportInputError."""
    # numpy's temporaries reuse freed heap memory instead of faulting fresh pages in each time
    # (tasks.dataset.worker_heap; docs/report.md#memory)
    with heap_kept():
        return _analyze(run, bins, temporary_calls, top_processes, parts)


def _analyze(
    run: RunInput,
    bins: int,
    temporary_calls: int,
    top_processes: int,
    parts: Iterable[Part] | None,
) -> HeapReport:

    acc = _Accumulator(temporary_calls)
    n_parts = 0
    for i, part in enumerate(iter_parts(run) if parts is None else parts):
        acc.add_part(i, part)
        n_parts += 1
    rep = HeapReport(
        label=run.label,
        kind=run.kind,
        command=run.command,
        temporary_calls=temporary_calls,
        warnings=list(run.warnings),
    )
    if n_parts == 0:
        why = "; ".join(run.warnings) if run.warnings else "no files"
        raise ReportInputError(f"{run.label}: nothing readable to report ({why})")

    rep.processes = acc.procs
    rep.ops = {op_name(int(c)): int(acc.ops[c]) for c in np.flatnonzero(acc.ops)}
    rep.alloc_count, rep.alloc_bytes = _ints(acc.alloc_count), _ints(acc.alloc_bytes)
    rep.free_count, rep.freed_bytes = _ints(acc.free_count), _ints(acc.freed_bytes)
    rep.temp_by_class_count, rep.temp_by_class_bytes = _ints(acc.temp_count), _ints(acc.temp_bytes)
    rep.leak_by_class_count, rep.leak_by_class_bytes = _ints(acc.leak_count), _ints(acc.leak_bytes)
    rep.lifetime_ns_hist, rep.lifetime_calls_hist = acc.lt_ns, acc.lt_calls
    rep.unpaired_frees, rep.failed_allocations = acc.unpaired_frees, acc.failed
    _threads(rep, acc)
    _callers(rep, acc)
    images = [im for im in acc.images if im.n]
    for im in images:
        im.finish()
    rep.events = sum(im.n for im in images)
    if images:
        _live(rep, images, bins, top_processes)
    else:
        z = np.zeros(1)
        rep.total = Series("all processes", z, z, z)
    _tree(acc.procs)
    return rep


def _threads(rep: HeapReport, acc: _Accumulator) -> None:
    if not acc.thread_parts:
        return
    keys = np.concatenate([k for k, _ in acc.thread_parts])
    counts = np.concatenate([c for _, c in acc.thread_parts])
    uniq, inv = np.unique(keys, return_inverse=True)
    total = np.bincount(inv, weights=counts).astype(np.int64)
    order = np.argsort(-total, kind="stable")
    image = (uniq >> np.uint64(32)).astype(np.int64)
    tid = (uniq & np.uint64(0xFFFF_FFFF)).astype(np.int64)
    rep.threads = [(int(image[i]), int(tid[i]), int(total[i])) for i in order]
    per_image = np.bincount(image, minlength=len(rep.processes))
    for p in rep.processes:
        p.threads = int(per_image[p.image])


def _caller_modules(b: Any, sel: Any) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """(module index, offset, module paths) of the rows' callers where the events carry them
    (caller_module, caller_offset: traces with a module map); index -1: no module."""
    names = b.schema.names
    if "caller_module" not in names or "caller_offset" not in names:
        return None
    col = _column(b.column("caller_module"))
    if col.null_count == len(col):
        return None
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    idx = col.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    off = _column(b.column("caller_offset")).fill_null(0).to_numpy(zero_copy_only=False)
    return idx[sel], off.astype(np.uint64)[sel], col.dictionary.to_pylist()


def _callers(rep: HeapReport, acc: _Accumulator) -> None:
    if not acc.caller_parts:
        return

    t = pa.concat_tables(acc.caller_parts)
    known = t["module"].is_valid()
    # the key within a module is the offset (the same code in every process, ASLR or not);
    # without a module, the raw address
    key = pa.array(
        np.where(_values(known), _values(t["offset"].fill_null(0)), _values(t["caller"]))
    )
    t = t.append_column("key", key)
    g = t.group_by(["module", "key"]).aggregate(
        [(k, "sum") for k in CALLER_COLUMNS] + [("image", "min"), ("caller", "min")]
    )
    rename = {f"{k}_sum": k for k in CALLER_COLUMNS} | {
        "image_min": "image",
        "caller_min": "caller",
    }
    g = g.rename_columns([rename.get(c, c) for c in g.column_names])
    out = {k: _values(g[k]).astype(np.int64) for k in (*CALLER_COLUMNS, "image")}
    out["caller"] = _values(g["caller"]).astype(np.uint64)
    order = np.lexsort((out["caller"], -out["calls"]))
    rep.callers = {k: v[order] for k, v in out.items()}
    modules = [m or "" for m in g["module"].to_pylist()]
    if any(modules):
        has = _values(g["module"].is_valid())
        offset = np.where(has, _values(g["key"]), 0).astype(np.uint64)
        functions = resolve(modules, offset)
        labels = [
            caller_label(m, int(o), f, int(c))
            for m, o, f, c in zip(modules, offset, functions, out["caller"])
        ]
        for k, v in (
            ("module", np.array(modules, dtype=object)),
            ("offset", offset),
            ("function", np.array(functions, dtype=object)),
            ("label", np.array(labels, dtype=object)),
        ):
            rep.callers[k] = v[order]


def _windows(counts: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive runs of bins [a, b) holding at most `limit` rows (or one bin)."""
    out = []
    a, total = 0, 0
    for k, c in enumerate(counts.tolist()):  # a loop over bins (~1000), not events
        if total and total + c > limit:
            out.append((a, k))
            a, total = k, 0
        total += c
    out.append((a, len(counts)))
    return out


class _Window:
    """The rows of every image in bins [a, b) (and the releases there), merged by time."""

    def __init__(
        self,
        images: list[_Image],
        bounds: list[np.ndarray],
        rel: list[tuple[int, int, int]],
        a: int,
        b: int,
    ) -> None:
        self.src: list[tuple[int, int, int]] = []  # (image index, first row, end row)
        times, deltas = [], []
        for i, (im, sj) in enumerate(zip(images, bounds)):
            s, e = int(sj[a]), int(sj[b])
            if e > s:
                self.src.append((i, s, e))
                times.append(im.time[s:e])
                deltas.append(im.row_delta(s, e))
        self.rel = rel  # (image index, time, -final) of the releases in these bins
        for _i, t, d in rel:
            times.append(np.array([t], np.int64))
            deltas.append(np.array([d], np.int64))
        self.perm = None
        if len(times) == 1:
            self.time, self.delta = times[0], deltas[0]
        else:  # stable: at the same ns, images in order, releases after every call
            t = np.concatenate(times)
            self.perm = np.argsort(t, kind="stable")
            self.time, self.delta = t[self.perm], np.concatenate(deltas)[self.perm]
        self.sizes = [e - s for _, s, e in self.src] + [1] * len(rel)

    def sources_upto(self, k: int) -> np.ndarray:
        """How many of the merged rows 0..k came from each source (images, then releases)."""
        if self.perm is None:
            return np.array([k + 1])
        src = np.repeat(np.arange(len(self.sizes)), self.sizes)
        return np.bincount(src[self.perm[: k + 1]], minlength=len(self.sizes))


def _live(rep: HeapReport, images: list[_Image], bins: int, top: int) -> None:
    rep.t0_ns = min(im.proc.first_ns for im in images)
    rep.t1_ns = max(im.proc.last_ns for im in images)
    edges = _bins(rep.t0_ns, rep.t1_ns, bins)
    rep.bin_edges_ns = edges
    nb = len(edges) - 1
    bounds = [np.searchsorted(im.time, edges, "left") for im in images]
    # each image's heap is released right after its last call (if anything is left)
    rel_all = [
        (i, im.proc.last_ns, -im.proc.final_bytes)
        for i, im in enumerate(images)
        if im.proc.final_bytes
    ]
    rel_bin = np.searchsorted(edges, [t for _, t, _ in rel_all], "right") - 1
    counts = (
        np.sum([np.diff(sj) for sj in bounds], axis=0) + np.bincount(rel_bin, minlength=nb)[:nb]
    )

    ranked = sorted(images, key=lambda im: (-im.proc.peak_bytes, im.proc.image))[:top]
    per = {id(im): (np.zeros(nb), np.zeros(nb)) for im in ranked} if len(images) > 1 else {}
    live_max = np.empty(nb)
    alloc_calls, alloc_bytes = np.zeros(nb), np.zeros(nb)
    carry = 0
    best, best_at = None, None
    for a, b in _windows(counts, WINDOW_ROWS):
        rel = [r for r, k in zip(rel_all, rel_bin) if a <= k < b]
        w = _Window(images, bounds, rel, a, b)
        # allocations per bin, per image and in total
        for i, s, e in w.src:
            im = images[i]
            local = bounds[i][a : b + 1] - s
            full = np.flatnonzero(local[1:] > local[:-1])
            is_a = (im.acls[s:e] != NONE).view(np.uint8)
            calls = np.add.reduceat(is_a, local[full], dtype=np.int64)
            nbytes = np.add.reduceat(im.alloc_bytes(s, e, im.row_delta(s, e)), local[full])
            alloc_calls[a + full] += calls
            alloc_bytes[a + full] += nbytes
            if id(im) in per:
                per[id(im)][0][a + full] += calls
                per[id(im)][1][a + full] += nbytes
        total = np.cumsum(w.delta)
        total += carry
        _bin_max(total, np.searchsorted(w.time, edges[a:b], "left"), carry, live_max[a:b])
        k = int(np.argmax(total))
        if best is None or total[k] > best:
            best, best_at = int(total[k]), (a, b, rel, k)
        carry = int(total[-1])

    rep.peak_bytes = best
    _peak(rep, images, bounds, edges, rel_all, best_at)
    rep.total = Series("all processes", live_max, alloc_calls, alloc_bytes)
    for im in ranked if per else []:
        curve = _process_curve(im, bounds[images.index(im)], edges)
        calls, nbytes = per[id(im)]
        p = im.proc
        rep.per_process.append(
            Series(f"{p.name} (pid {p.pid})", curve, calls, nbytes, image=p.image)
        )


def _bin_max(total: np.ndarray, starts: np.ndarray, before: int, out: np.ndarray) -> None:
    """Into `out`, the largest running total in each bin (bins starting at rows `starts`); an
    empty bin keeps the value before it (`before`: the one before the first row)."""
    ends = np.append(starts[1:], len(total))
    full = starts < ends
    if full.any():
        out[full] = np.maximum.reduceat(total, starts[full])
    prev = starts[~full] - 1
    out[~full] = np.where(prev >= 0, total[np.maximum(prev, 0)], before)


def _peak(
    rep: HeapReport,
    images: list[_Image],
    bounds: list[np.ndarray],
    edges: np.ndarray,
    rel_all: list[tuple[int, int, int]],
    best_at: tuple[int, int, list, int],
) -> None:
    """The peak's time and what was live there: which rows of which images were the last
    before it, their live bytes by process and their classes; an invariant checked."""
    a, b, rel, k = best_at
    w = _Window(images, bounds, rel, a, b)
    rep.peak_ns = int(w.time[k])
    upto = w.sources_upto(k)
    rows = {i: int(bounds[i][a]) - 1 for i in range(len(images))}  # last row before the window
    for (i, s, _e), c in zip(w.src, upto):
        rows[i] = s + int(c) - 1
    released = {i for i, t, _ in rel_all if t < edges[a]}
    released |= {r[0] for r, c in zip(rel, upto[len(w.src) :]) if c}
    cls_bytes, cls_blocks = np.zeros(N_CLASSES), np.zeros(N_CLASSES)
    for i, im in enumerate(images):
        r = rows[i]
        if r < 0 or i in released:
            continue
        live = int(im.live[r])
        if live:
            rep.peak_by_process[im.proc.image] = live
        nbytes, blocks = im.classes_at(r)
        cls_bytes += nbytes
        cls_blocks += blocks
    rep.peak_by_class_bytes, rep.peak_by_class_blocks = _ints(cls_bytes), _ints(cls_blocks)
    if not sum(rep.peak_by_process.values()) == rep.peak_bytes == int(cls_bytes.sum()):
        rep.warnings.append(  # an invariant: never seen; said rather than hidden
            f"internal: live bytes at the peak by process ({sum(rep.peak_by_process.values())}) "
            f"or by size class ({int(cls_bytes.sum())}) differ from the peak ({rep.peak_bytes})"
        )


def _process_curve(im: _Image, sj: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """One image's largest live bytes in each bin (rows sj[j]..sj[j+1]-1 in bin j), the value
    before an empty bin, NaN outside its life."""
    p = im.proc
    starts, ends = sj[:-1], sj[1:]
    full = starts < ends
    curve = np.full(len(edges) - 1, np.nan)
    if full.any():
        curve[full] = np.maximum.reduceat(im.live, starts[full])
    empty = ~full & (starts > 0)
    curve[empty] = im.live[starts[empty] - 1]
    alive = (edges[1:] > p.first_ns) & (edges[:-1] <= p.last_ns)
    curve[~alive] = np.nan
    return curve
