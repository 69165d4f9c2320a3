"""Write valid heapcast trace files (native/FORMAT.md, version 3) from given records.

For tests that need exact control over what a trace holds (reused addresses, double frees,
unpaired frees, realloc chains, several threads), without running the tracer. Other test
modules may use it too:

    from tests.tracegen import Rec, write_trace, malloc, free, realloc, thread_start
    write_trace(path, [thread_start(0, tid=100), malloc(10, 24, 0x1000), free(20, 0x1000)])

Stack traces (version 3): give `stacks=True`, a `stack` (a node id) on each allocating Rec, and
the trie's nodes as `stack_node` records (or build both from frame lists with `StackTrie`):

    trie = StackTrie()
    recs = [thread_start(0, tid=100), malloc(10, 24, 0x1000, caller=0x401234,
            stack=trie.id((0x401234, 0x401500, 0x401600)))]
    write_trace(path, module(0, 0x400000, 0x500000, 0, "/bin/prog") + trie.records() + recs,
                stacks=True)

Times are record clock ticks; with the default clock (CLOCK_MONOTONIC, 1 ns per tick) they are
the events' `time_ns`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.format.trace_reader import (
    CLOCK_MONOTONIC,
    FLAG_CALLER,
    FLAG_STACKS,
    FORMAT_VERSION,
    MAGIC,
    OP_SHIFT,
    RECORD_DTYPE,
    RECORD_DTYPE_CALLER,
    RECORD_DTYPE_STACK,
    SIZE_MASK,
    THREAD_SHIFT,
    Op,
)

_HEADER = struct.Struct("<8sIIIIIIQQQdIIQ")


@dataclass(frozen=True)
class Rec:
    """One raw record, in the tracer's terms (size already nmemb*size for calloc)."""

    time: int
    op: int
    size: int = 0
    addr: int = 0
    arg: int = 0
    thread: int = 0
    caller: int = 0
    stack: int = 0


def thread_start(time: int, tid: int, thread: int = 0) -> Rec:
    return Rec(time, Op.THREAD_START, 0, 0, tid, thread)


def malloc(
    time: int, size: int, addr: int, thread: int = 0, caller: int = 0, stack: int = 0
) -> Rec:
    return Rec(time, Op.MALLOC, size, addr, 0, thread, caller, stack)


def calloc(time: int, size: int, addr: int, thread: int = 0) -> Rec:
    return Rec(time, Op.CALLOC, size, addr, 0, thread)


def free(time: int, addr: int, thread: int = 0, caller: int = 0) -> Rec:
    return Rec(time, Op.FREE, 0, addr, 0, thread, caller)


def realloc(time: int, old: int, size: int, new: int, thread: int = 0) -> Rec:
    return Rec(time, Op.REALLOC, size, new, old, thread)


def memalign(
    time: int, alignment: int, size: int, addr: int, op: int = Op.POSIX_MEMALIGN, thread: int = 0
) -> Rec:
    return Rec(time, op, size, addr, alignment, thread)


def module(time: int, start: int, end: int, bias: int, path: str) -> list[Rec]:
    """A MODULE record and its MODULE_PATH records (FORMAT.md, Modules; caller traces only)."""
    raw = path.encode()
    out = [Rec(time, Op.MODULE, len(raw), start, end, 0, bias)]
    for at in range(0, len(raw), 24):
        chunk = raw[at : at + 24]
        word = [int.from_bytes(chunk[i : i + 8].ljust(8, b"\0"), "little") for i in (0, 8, 16)]
        out.append(Rec(word[0], Op.MODULE_PATH, len(chunk), word[1], word[2]))
    return out


def stack_node(time: int, node: int, parent: int, address: int, depth: int) -> Rec:
    """A STACK_NODE record (FORMAT.md, Stacks; stack traces only)."""
    return Rec(time, Op.STACK_NODE, depth, node, parent, 0, address)


class StackTrie:
    """Builds a process's stack trie as the tracer does: `id(frames)` (innermost first) gives a
    stack's id, making the nodes it lacks; `records()` are their STACK_NODE records."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], int] = {}  # (parent, address) -> id
        self.made: list[Rec] = []

    def id(self, frames: Sequence[int], time: int = 0) -> int:
        parent = 0
        for depth, address in enumerate(reversed(frames), start=1):
            key = (parent, address)
            if key not in self.nodes:
                self.nodes[key] = len(self.nodes) + 1
                self.made.append(stack_node(time, self.nodes[key], parent, address, depth))
            parent = self.nodes[key]
        return parent

    def records(self) -> list[Rec]:
        return list(self.made)


def _dtype(caller: bool, stacks: bool) -> np.dtype:
    if stacks:
        return RECORD_DTYPE_STACK
    return RECORD_DTYPE_CALLER if caller else RECORD_DTYPE


def records_array(recs: Sequence[Rec], caller: bool = False, stacks: bool = False) -> np.ndarray:
    """The structured record array (RECORD_DTYPE, _CALLER or _STACK) for `recs`."""
    dtype = _dtype(caller, stacks)
    out = np.zeros(len(recs), dtype=dtype)
    if not len(recs):
        return out
    cols = np.array(
        [(r.time, r.addr, r.arg, r.size, r.op, r.thread, r.caller, r.stack) for r in recs],
        dtype=np.uint64,
    )
    out["time"], out["addr"], out["arg"] = cols[:, 0], cols[:, 1], cols[:, 2]
    out["packed"] = (
        (cols[:, 3] & np.uint64(SIZE_MASK))
        | (cols[:, 4] << np.uint64(OP_SHIFT))
        | (cols[:, 5] << np.uint64(THREAD_SHIFT))
    )
    if caller or stacks:
        out["caller"] = cols[:, 6]
    if stacks:
        out["stack"] = cols[:, 7]
    return out


def header_bytes(
    *,
    pid: int = 4242,
    ppid: int = 1,
    caller: bool = False,
    stacks: bool = False,
    cmdline: Iterable[str] = ("prog", "arg"),
    version: int = FORMAT_VERSION,
    start_realtime_ns: int = 1_700_000_000_000_000_000,
    start_monotonic_ns: int = 0,
    start_ticks: int = 0,
    ns_per_tick: float = 1.0,
    clock: int = CLOCK_MONOTONIC,
) -> bytes:
    cmd = b"".join(a.encode() + b"\0" for a in cmdline)
    header_size = (80 + len(cmd) + 7) // 8 * 8
    record_size = _dtype(caller, stacks).itemsize
    fixed = _HEADER.pack(
        MAGIC,
        version,
        header_size,
        record_size,
        (FLAG_CALLER if caller or stacks else 0) | (FLAG_STACKS if stacks else 0),
        pid,
        ppid,
        start_realtime_ns,
        start_monotonic_ns,
        start_ticks,
        ns_per_tick,
        clock,
        len(cmd),
        0,
    )
    return (fixed + cmd).ljust(header_size, b"\0")


def trace_bytes(
    recs: Sequence[Rec] | np.ndarray, *, caller: bool = False, stacks: bool = False, **header
) -> bytes:
    arr = recs if isinstance(recs, np.ndarray) else records_array(recs, caller, stacks)
    return header_bytes(caller=caller, stacks=stacks, **header) + arr.tobytes()


def write_trace(
    path: str | Path,
    recs: Sequence[Rec] | np.ndarray,
    *,
    caller: bool = False,
    stacks: bool = False,
    **header,
) -> Path:
    """Write a trace file at `path` (header keywords as in `header_bytes`; `stacks` implies
    the caller)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(trace_bytes(recs, caller=caller, stacks=stacks, **header))
    return path


def synthetic_records(
    n: int, *, seed: int = 0, threads: int = 1, live: int = 4096, caller: bool = False
) -> np.ndarray:
    """About `n` records of a plausible malloc/free mix, built vectorised (for larger tests).

    Each thread starts with THREAD_START; then allocations at addresses drawn from `live` slots
    per thread (so addresses are reused) and a free of a slot's block when it is reused.
    """
    rng = np.random.default_rng(seed)
    per = max(n // threads, 2)
    parts = []
    for t in range(threads):
        # Alternate: allocate into slot s, later free slot s: pairs (malloc, free) shuffled in
        # time by interleaving the frees one "generation" later.
        k = per // 2
        slots = rng.integers(0, live, k)
        addr = np.uint64(0x5555_0000_0000 + t * 0x1_0000_0000) + slots.astype(
            np.uint64
        ) * np.uint64(64)
        size = rng.choice(np.array([8, 16, 24, 32, 48, 64, 100, 256, 1000, 4096], np.uint64), k)
        recs = np.zeros(2 * k + 1, dtype=RECORD_DTYPE_CALLER if caller else RECORD_DTYPE)
        recs["arg"][0] = 1000 + t
        recs["packed"][0] = (np.uint64(Op.THREAD_START) << np.uint64(OP_SHIFT)) | (
            np.uint64(t) << np.uint64(THREAD_SHIFT)
        )
        body = recs[1:]
        body["addr"][0::2] = addr
        body["addr"][1::2] = addr
        ops = np.empty(2 * k, np.uint64)
        ops[0::2] = Op.MALLOC
        ops[1::2] = Op.FREE
        sizes = np.zeros(2 * k, np.uint64)
        sizes[0::2] = size
        body["packed"] = (
            sizes | (ops << np.uint64(OP_SHIFT)) | (np.uint64(t) << np.uint64(THREAD_SHIFT))
        )
        recs["time"] = np.cumsum(rng.integers(20, 400, 2 * k + 1)).astype(np.uint64)
        parts.append(recs)
    out = np.concatenate(parts)
    return out[np.argsort(out["time"], kind="stable")] if threads > 1 else out
