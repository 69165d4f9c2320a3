"""Helpers of the tracer tests: run a command under LD_PRELOAD, read back every trace it wrote
(only through tasks.format.trace_reader.read_trace), check that frees pair with allocations.

A module of its own (not conftest.py) so that test modules can import it by a unique name."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, Trace, read_trace

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
PROGRAMS = Path(__file__).resolve().parent / "programs"
# what programs/startup_dlsym.c prints when a layer serves the calls its dlsym makes during the
# layer's first lookup; the realloc of a block the layer did not make, before it knows the real
# realloc, is refused and the block kept intact
STARTUP_DLSYM_SERVED = [
    "posix_memalign rc=0 aligned=1",
    "aligned_alloc aligned=1",
    "memalign aligned=1",
    "valloc aligned=1",
    "realloc refused errno=ENOMEM",
]


@dataclass
class TracedRun:
    """A finished command and the traces it left, ordered by start time."""

    proc: subprocess.CompletedProcess
    traces: list[Trace]

    def by_cmd(self, *argv_tail: str) -> Trace:
        """The one trace whose command line ends with `argv_tail`."""
        hits = [t for t in self.traces if t.header.cmdline[-len(argv_tail) :] == argv_tail]
        assert len(hits) == 1, f"{len(hits)} traces end with {argv_tail}: " + str(
            [t.header.cmdline for t in self.traces]
        )
        return hits[0]


def read_traces(out_dir: Path) -> list[Trace]:
    traces = [read_trace(p) for p in sorted(out_dir.glob("*.hct"))]
    return sorted(traces, key=lambda t: (t.header.start_monotonic_ns, t.header.pid))


def tracer_env(lib: Path, out_dir: Path | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("HEAPCAST_OUT", "HEAPCAST_CALLER", "HEAPCAST_FRAMES", "HEAPCAST_CLOCK", "LD_PRELOAD"):
        env.pop(k, None)
    env["LD_PRELOAD"] = str(lib)
    if out_dir is not None:
        env["HEAPCAST_OUT"] = str(out_dir)
    env.update(extra)
    return env


def unpaired_frees(trace: Trace) -> list[tuple[int, int]]:
    """(record index, address) of every free (and realloc of an old block) that has no earlier
    live allocation at that address in the same trace. Records are taken in time order (file
    position breaks ties), as the converter does."""
    order = np.lexsort((np.arange(len(trace)), trace.records["time"]))
    ops = trace.op[order].tolist()
    addrs = trace.addr[order].tolist()
    args = trace.arg[order].tolist()
    sizes = trace.size[order].tolist()
    alloc_ops = {int(o) for o in ALLOCATING_OPS}
    realloc_ops = {int(o) for o in REALLOCATING_OPS}
    live: set[int] = set()
    bad: list[tuple[int, int]] = []
    for i, (op, addr, arg, size) in enumerate(zip(ops, addrs, args, sizes)):
        if op in alloc_ops:
            if addr:
                live.add(addr)
        elif op in realloc_ops:
            released = arg != 0 and (addr != 0 or size == 0)  # failed realloc keeps the old block
            if released:
                if arg in live:
                    live.remove(arg)
                else:
                    bad.append((int(order[i]), arg))
            if addr:
                live.add(addr)
        elif op == Op.FREE:
            if addr in live:
                live.remove(addr)
            else:
                bad.append((int(order[i]), addr))
    return bad
