"""The one reader of heapcast raw traces (spec: native/FORMAT.md).

A trace file is a header followed by fixed-size little-endian records. The records are viewed
with one structured numpy dtype (`numpy.frombuffer` over the file bytes): nothing is parsed per
record; the derived columns (op, size, thread, time in ns) are vectorised bit operations.
"""

from __future__ import annotations

import enum
import struct
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"HEAPCAST"
FORMAT_VERSION = 3  # written by this tracer; READ_VERSIONS are read
READ_VERSIONS = (1, 2, 3)  # 3 added stack records, 2 module records (caller traces only)
FLAG_CALLER = 1
FLAG_STACKS = 2  # version 3: allocating calls carry a stack id (HEAPCAST_FRAMES)
CLOCK_MONOTONIC = 1
CLOCK_TSC = 2
TRACE_SUFFIX = ".hct"

# Fixed part of the header, offsets as in FORMAT.md; the command line follows at byte 80.
_HEADER = struct.Struct("<8sIIIIIIQQQdIIQ")
assert _HEADER.size == 80

# packed field: bits 0-39 size, 40-47 op, 48-63 thread number
SIZE_BITS = 40
SIZE_MASK = (1 << SIZE_BITS) - 1
OP_SHIFT = 40
THREAD_SHIFT = 48

RECORD_DTYPE = np.dtype([("time", "<u8"), ("addr", "<u8"), ("arg", "<u8"), ("packed", "<u8")])
RECORD_DTYPE_CALLER = np.dtype(
    [("time", "<u8"), ("addr", "<u8"), ("arg", "<u8"), ("packed", "<u8"), ("caller", "<u8")]
)
RECORD_DTYPE_STACK = np.dtype(
    [
        ("time", "<u8"),
        ("addr", "<u8"),
        ("arg", "<u8"),
        ("packed", "<u8"),
        ("caller", "<u8"),
        ("stack", "<u8"),
    ]
)


class Op(enum.IntEnum):
    """Operation codes of the raw format."""

    MALLOC = 1
    CALLOC = 2
    REALLOC = 3
    REALLOCARRAY = 4
    FREE = 5
    POSIX_MEMALIGN = 6
    ALIGNED_ALLOC = 7
    MEMALIGN = 8
    VALLOC = 9
    PVALLOC = 10
    THREAD_START = 64
    MODULE = 65  # version 2: a mapped module; not a heap call, not in Trace.records
    MODULE_PATH = 66  # version 2: 24 bytes of the preceding MODULE's path
    STACK_NODE = 67  # version 3: a node of the process's stack trie; not in Trace.records


MODULE_OPS = (Op.MODULE, Op.MODULE_PATH)
MAP_OPS = (Op.MODULE, Op.MODULE_PATH, Op.STACK_NODE)  # records that are not heap calls
MODULE_PATH_CHUNK = 24

ALLOCATING_OPS = (
    Op.MALLOC,
    Op.CALLOC,
    Op.POSIX_MEMALIGN,
    Op.ALIGNED_ALLOC,
    Op.MEMALIGN,
    Op.VALLOC,
    Op.PVALLOC,
)
REALLOCATING_OPS = (Op.REALLOC, Op.REALLOCARRAY)
ALIGNED_OPS = (Op.POSIX_MEMALIGN, Op.ALIGNED_ALLOC, Op.MEMALIGN, Op.VALLOC, Op.PVALLOC)


class TraceFormatError(ValueError):
    """A file that cannot be read as a heapcast trace; the message names the file."""


@dataclass(frozen=True)
class Modules:
    """The ELF modules a process mapped (FORMAT.md, Modules), in the order they were recorded.

    start/end: the module's mapped address range [start, end); bias: its load bias (the
    run-time address of ELF virtual address 0), so `address - bias` is the address in the file's
    own symbol tables; path: as the loader named it ("" when unknown, e.g. the vDSO's name)."""

    start: np.ndarray  # uint64
    end: np.ndarray  # uint64
    bias: np.ndarray  # uint64
    time: np.ndarray  # uint64, raw record clock ticks
    path: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.path)

    @cached_property
    def _segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Disjoint address ranges (start, end, module index), sorted by start; where ranges
        overlap (a module unloaded and another loaded at its place) the later module wins."""
        segs: list[tuple[int, int, int]] = []
        for i in range(len(self.path)):  # a loop over modules (tens to thousands), not events
            s, e = int(self.start[i]), int(self.end[i])
            kept: list[tuple[int, int, int]] = []
            for a, b, k in segs:
                if b <= s or a >= e:
                    kept.append((a, b, k))
                    continue
                if a < s:
                    kept.append((a, s, k))
                if b > e:
                    kept.append((e, b, k))
            kept.append((s, e, i))
            segs = sorted(kept)
        arr = np.array(segs, dtype=np.uint64).reshape(-1, 3)
        return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].astype(np.int32)

    def locate(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(module index, offset) of each address: the index into this table (int32, -1 when
        no module holds the address) and `address - bias` (uint64, 0 where the index is -1)."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        starts, ends, mod = self._segments
        if len(starts) == 0:
            return np.full(len(addresses), -1, np.int32), np.zeros(len(addresses), np.uint64)
        j = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        jc = np.maximum(j, 0)
        hit = (j >= 0) & (addresses < ends[jc])
        idx = np.where(hit, mod[jc], np.int32(-1)).astype(np.int32)
        offset = np.where(hit, addresses - self.bias[np.maximum(idx, 0)], np.uint64(0))
        return idx, offset.astype(np.uint64)


def rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """int64: the row of each `wanted` id in `ids` (uint64, ascending, unique), -1 where it is
    not there (a stack table's lookup: the trie's nodes, a run's stacks)."""
    wanted = np.asarray(wanted, dtype=np.uint64)
    if len(ids) == 0:
        return np.full(len(wanted), -1, np.int64)
    j = np.searchsorted(ids, wanted).astype(np.int64)
    jc = np.minimum(j, len(ids) - 1)
    return np.where((j < len(ids)) & (ids[jc] == wanted), jc, -1)


@dataclass(frozen=True)
class StackNodes:
    """A process's stack trie (FORMAT.md, Stacks), sorted by node id: node `id[i]` is the frame
    `address[i]` called from node `parent[i]` (0: the root, so the frame is the outermost one
    recorded) at `depth[i]` (1 for the root's children). A stack id is its innermost node."""

    id: np.ndarray  # uint64, ascending, unique
    parent: np.ndarray  # uint64
    address: np.ndarray  # uint64, return address (the interrupted PC above a signal frame)
    depth: np.ndarray  # uint32

    def __len__(self) -> int:
        return len(self.id)

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Row of each node id in this table (int64), -1 for 0 and ids without a node."""
        return rows_of(self.id, ids)

    def frames(self, ids: np.ndarray, max_depth: int | None = None) -> np.ndarray:
        """uint64 [len(ids), D]: the frames of each stack, innermost first, 0 past its
        outermost frame; D is the deepest of them (or `max_depth`). One numpy step a depth."""
        rows = self.index(ids)
        depth = int(self.depth[rows[rows >= 0]].max(initial=0))
        if max_depth is not None:
            depth = min(depth, max_depth)
        out = np.zeros((len(rows), depth), np.uint64)
        parent_row = self.index(self.parent)
        cur = rows
        for d in range(depth):  # a loop over depth, not events
            ok = cur >= 0
            out[ok, d] = self.address[cur[ok]]
            cur = np.where(ok, parent_row[np.maximum(cur, 0)], -1)
        return out


@dataclass(frozen=True)
class TraceHeader:
    path: str
    version: int
    header_size: int
    record_size: int
    flags: int
    pid: int
    ppid: int
    start_realtime_ns: int
    start_monotonic_ns: int
    start_ticks: int
    ns_per_tick: float
    clock: int
    cmdline: tuple[str, ...]

    @property
    def has_caller(self) -> bool:
        return bool(self.flags & FLAG_CALLER)

    @property
    def has_stacks(self) -> bool:
        return bool(self.flags & FLAG_STACKS)

    @property
    def dtype(self) -> np.dtype:
        if self.has_stacks:
            return RECORD_DTYPE_STACK
        return RECORD_DTYPE_CALLER if self.has_caller else RECORD_DTYPE


def ticks_to_ns(ticks: np.ndarray, h: TraceHeader, out: np.ndarray | None = None) -> np.ndarray:
    """Monotonic ns (int64) of raw record times, from the header's clock calibration; into `out`
    when given (the converter fills its time column a cache-sized step at a time)."""
    if h.clock == CLOCK_MONOTONIC and h.ns_per_tick == 1.0:
        if out is None:
            return ticks.astype(np.int64)
        out[...] = ticks
        return out
    # float64 holds tick differences exactly up to 2^53 (weeks of TSC at 3 GHz)
    delta = ticks.astype(np.int64)
    delta -= np.int64(h.start_ticks)
    ns = delta.astype(np.float64)
    ns *= h.ns_per_tick
    np.rint(ns, out=ns)
    if out is None:
        out = np.empty(len(ticks), dtype=np.int64)
    out[...] = ns
    out += np.int64(h.start_monotonic_ns)
    return out


@dataclass(frozen=True)
class Trace:
    """One process image's trace: its header and its records, in file order."""

    header: TraceHeader
    records: np.ndarray  # heap calls and THREAD_START markers; never module records
    dropped_bytes: int = 0
    modules: Modules | None = None  # version 2 caller traces: the module map
    stacks: StackNodes | None = None  # version 3 stack traces: the stack trie
    unknown_stack_records: int = 0  # records whose stack had no node in the file: read as 0

    def __len__(self) -> int:
        return len(self.records)

    @cached_property
    def op(self) -> np.ndarray:
        return ((self.records["packed"] >> np.uint64(OP_SHIFT)) & np.uint64(0xFF)).astype(np.uint8)

    @cached_property
    def size(self) -> np.ndarray:
        return self.records["packed"] & np.uint64(SIZE_MASK)

    @cached_property
    def thread(self) -> np.ndarray:
        return (self.records["packed"] >> np.uint64(THREAD_SHIFT)).astype(np.uint16)

    @property
    def addr(self) -> np.ndarray:
        return self.records["addr"]

    @property
    def arg(self) -> np.ndarray:
        return self.records["arg"]

    @property
    def caller(self) -> np.ndarray | None:
        return self.records["caller"] if self.header.has_caller else None

    @property
    def stack(self) -> np.ndarray | None:
        """Each record's stack id (a node of `stacks`; 0: none), or None without stacks."""
        return self.records["stack"] if self.header.has_stacks else None

    @cached_property
    def time_ns(self) -> np.ndarray:
        """Monotonic time of each record in ns (int64), from the header's clock calibration."""
        return ticks_to_ns(self.records["time"], self.header)

    def counts_by_op(self) -> dict[str, int]:
        codes, counts = np.unique(self.op, return_counts=True)
        return {op_name(int(c)): int(n) for c, n in zip(codes, counts)}


def op_name(code: int) -> str:
    """`malloc`, `free`, `thread_start`, ...; `op<N>` for a code this version does not know."""
    try:
        return Op(code).name.lower()
    except ValueError:
        return f"op{code}"


def parse_header(data: bytes | memoryview, path: str) -> TraceHeader:
    """Parse and validate the header at the start of `data`; errors name `path`."""
    if len(data) == 0:
        raise TraceFormatError(
            f"{path}: empty file, not a heapcast trace (the traced process "
            "may have been killed before it wrote its header)"
        )
    if len(data) < _HEADER.size or bytes(data[:8]) != MAGIC:
        raise TraceFormatError(
            f"{path}: does not look like a heapcast trace (no {MAGIC.decode()} "
            "magic at its start); pass the .hct files the tracer wrote"
        )
    (
        magic,
        version,
        header_size,
        record_size,
        flags,
        pid,
        ppid,
        rt,
        mono,
        ticks,
        npt,
        clock,
        cmdline_len,
        _reserved,
    ) = _HEADER.unpack_from(data, 0)
    if version not in READ_VERSIONS:
        raise TraceFormatError(
            f"{path}: trace format version {version}, this heapcast reads version "
            f"{' and '.join(map(str, READ_VERSIONS))}; re-record it with the matching tracer "
            "or upgrade heapcast"
        )
    if flags & FLAG_STACKS and not flags & FLAG_CALLER:
        raise TraceFormatError(
            f"{path}: header flags {flags} say stacks without callers, which no tracer writes; "
            "the file is corrupt"
        )
    if flags & FLAG_STACKS:
        expected_record = RECORD_DTYPE_STACK.itemsize
    elif flags & FLAG_CALLER:
        expected_record = RECORD_DTYPE_CALLER.itemsize
    else:
        expected_record = RECORD_DTYPE.itemsize
    if record_size != expected_record:
        raise TraceFormatError(
            f"{path}: header says record_size {record_size}, expected "
            f"{expected_record} for flags {flags}; the file is corrupt"
        )
    if header_size < _HEADER.size + cmdline_len or header_size % 8 or header_size > len(data):
        raise TraceFormatError(
            f"{path}: header_size {header_size} is inconsistent with a file of "
            f"{len(data)} bytes; the file is corrupt or truncated in its header"
        )
    raw_cmd = bytes(data[_HEADER.size : _HEADER.size + cmdline_len])
    # Each argument ends with one NUL; empty arguments (redis's --save "") are kept.
    if raw_cmd.endswith(b"\0"):
        raw_cmd = raw_cmd[:-1]
    cmdline = tuple(a.decode("utf-8", "replace") for a in raw_cmd.split(b"\0")) if raw_cmd else ()
    return TraceHeader(
        path=path,
        version=version,
        header_size=header_size,
        record_size=record_size,
        flags=flags,
        pid=pid,
        ppid=ppid,
        start_realtime_ns=rt,
        start_monotonic_ns=mono,
        start_ticks=ticks,
        ns_per_tick=npt,
        clock=clock,
        cmdline=cmdline,
    )


def parse_trace(data: bytes | memoryview, path: str) -> Trace:
    """View `data` (a whole trace file's bytes) as a Trace without copying the records."""
    header = parse_header(data, path)
    dtype = header.dtype
    body = len(data) - header.header_size
    count, dropped = divmod(body, header.record_size)
    if dropped:
        warnings.warn(
            f"{path}: dropped a truncated last record ({dropped} bytes); the process "
            "was probably killed or its disk filled while writing",
            stacklevel=2,
        )
    records = np.frombuffer(data, dtype=dtype, count=count, offset=header.header_size)
    modules = stacks = None
    unknown = 0
    if header.version >= 2 and header.has_caller:
        records, modules, stacks, unknown = _split_maps(records, path, header.has_stacks)
    return Trace(
        header=header,
        records=records,
        dropped_bytes=dropped,
        modules=modules,
        stacks=stacks,
        unknown_stack_records=unknown,
    )


def _split_maps(
    records: np.ndarray, path: str, has_stacks: bool
) -> tuple[np.ndarray, Modules, StackNodes | None, int]:
    """The heap records, the module map, the stack trie of a version-2/3 caller trace and how
    many records named a stack without a node (`_drop_unknown_stacks`). The
    tracer writes the module records in whole blocks, first after the header and then where a
    scan found new modules, and stack nodes among the heap records: when they are all at the
    start (a program that loads nothing later, no stacks), the heap records stay a view of the
    file; else they are copied without them."""
    op = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)[:, 29]
    is_map = op >= np.uint8(Op.MODULE)
    is_map &= op <= np.uint8(Op.STACK_NODE if has_stacks else Op.MODULE_PATH)
    map_idx = np.flatnonzero(is_map)
    stacks = _stacks_of(records[:0], path) if has_stacks else None
    if len(map_idx) == 0:
        return records, _modules_of(records[:0], path), stacks, 0
    maps = records[map_idx]
    if map_idx[-1] == len(map_idx) - 1:
        heap = records[len(map_idx) :]
    else:
        heap = records[~is_map]
    if has_stacks:
        is_node = op[map_idx] == np.uint8(Op.STACK_NODE)
        stacks = _stacks_of(maps[is_node], path)
        maps = maps[~is_node]
        heap, unknown = _drop_unknown_stacks(heap, stacks, path)
        return heap, _modules_of(maps, path), stacks, unknown
    return heap, _modules_of(maps, path), stacks, 0


def _stacks_of(nodes: np.ndarray, path: str) -> StackNodes:
    """The stack trie from STACK_NODE records (any order; a node written twice counts once)."""
    ids, first = np.unique(nodes["addr"], return_index=True)
    packed = nodes["packed"][first]
    return StackNodes(
        id=ids.astype(np.uint64),
        parent=nodes["arg"][first].copy(),
        address=nodes["caller"][first].copy(),
        depth=(packed & np.uint64(SIZE_MASK)).astype(np.uint32),
    )


def _drop_unknown_stacks(heap: np.ndarray, stacks: StackNodes, path: str) -> tuple[np.ndarray, int]:
    """Heap records whose stack id has no node in the file read as stack 0 (FORMAT.md, Stacks:
    a thread killed before its buffer was written), with a warning that counts them; and the
    count."""
    sid = heap["stack"]
    used = sid != 0
    if not used.any():
        return heap, 0
    if len(stacks) and int(stacks.id[-1]) == len(stacks):
        # ids 1..N, each with its node (the tracer counts them from 1): one compare a record,
        # not a search
        unknown = sid > np.uint64(len(stacks))
    else:
        unknown = used & (stacks.index(sid) < 0)
    n = int(unknown.sum())
    if n:
        warnings.warn(
            f"{path}: {n} records name a stack whose nodes are not in the file (a thread's "
            "buffer was lost, e.g. killed); they read as without a stack",
            stacklevel=3,
        )
        heap = heap.copy()
        heap["stack"][unknown] = 0
    return heap, n


def _modules_of(mods: np.ndarray, path: str) -> Modules:
    """Modules from the module records (MODULE then its MODULE_PATH records), in file order."""
    packed = mods["packed"]
    op = ((packed >> np.uint64(OP_SHIFT)) & np.uint64(0xFF)).astype(np.uint8)
    size = packed & np.uint64(SIZE_MASK)
    heads = np.flatnonzero(op == Op.MODULE)
    raw = mods.view(np.uint8).reshape(len(mods), mods.dtype.itemsize)
    paths = []
    for h in heads:  # a loop over modules, not events
        n = int(size[h])
        k = -(-n // MODULE_PATH_CHUNK)
        chunks = raw[h + 1 : h + 1 + k, :MODULE_PATH_CHUNK]
        ok = len(chunks) == k and bool(np.all(op[h + 1 : h + 1 + k] == Op.MODULE_PATH))
        if not ok:
            warnings.warn(f"{path}: a module record's path is cut short", stacklevel=3)
        paths.append(chunks.tobytes()[:n].decode("utf-8", "replace"))
    return Modules(
        start=mods["addr"][heads].copy(),
        end=mods["arg"][heads].copy(),
        bias=mods["caller"][heads].copy(),
        time=mods["time"][heads].copy(),
        path=tuple(paths),
    )


@dataclass(frozen=True)
class TraceCounts:
    """What the traces of one folder (one run) hold, counted with numpy per file."""

    processes: int  # readable trace files: one per process image
    threads: int  # THREAD_START records over all processes
    events: int  # heap calls: every record but THREAD_START
    events_by_op: dict[str, int]
    files: list[str]  # every trace file name, readable or not
    unreadable: dict[str, str]  # file name -> why it could not be read

    @property
    def unreadable_files(self) -> list[str]:
        return list(self.unreadable)


def count_traces(folder: str | Path) -> TraceCounts:
    """Processes, threads and events of every trace file in `folder`."""
    folder = Path(folder)
    files = sorted(p.name for p in folder.glob(f"*{TRACE_SUFFIX}"))
    by_op: dict[str, int] = {}
    processes = 0
    unreadable: dict[str, str] = {}
    for name in files:
        try:
            t = read_trace(folder / name)
        except TraceFormatError as err:  # e.g. killed before its header was written
            unreadable[name] = str(err)
            continue
        processes += 1
        for op, n in t.counts_by_op().items():
            by_op[op] = by_op.get(op, 0) + n
    threads = by_op.get(op_name(Op.THREAD_START), 0)
    return TraceCounts(
        processes=processes,
        threads=threads,
        events=sum(by_op.values()) - threads,
        events_by_op=by_op,
        files=files,
        unreadable=unreadable,
    )


def read_trace(path: str | Path, *, fs: Any = None) -> Trace:
    """Read one trace file, local or through an fsspec filesystem `fs`."""
    path_s = str(path)
    try:
        if fs is None:
            data = Path(path_s).read_bytes()
        else:
            with fs.open(path_s, "rb") as f:
                data = f.read()
    except FileNotFoundError:
        raise TraceFormatError(f"{path_s}: no such trace file") from None
    return parse_trace(data, path_s)
