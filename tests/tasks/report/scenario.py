"""A hand-made run whose report is known exactly: three process images, written as raw traces
(tests.tracegen) and, converted by the dataset's converter, as an events run folder.

pid 100 (`prog run`, callers recorded, one thread) allocates, frees, reallocs, frees an address
never allocated and fails a malloc; pid 101 (its fork, two threads) overlaps it in time, then
execs `/bin/true`. The peak of live bytes is 6724 at 50 ns. Every call with the live bytes after
it, each freed block's lifetime and the blocks never freed:
docs/testing.md#the-reports-hand-made-scenario.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.core.storage import Root
from tasks.dataset.partitions import convert_file
from tests.tracegen import free, malloc, realloc, thread_start, write_trace

PARENT = [
    thread_start(0, tid=100),
    malloc(10, 100, 0x1000, caller=0xA),
    malloc(20, 1000, 0x2000, caller=0xB),
    free(30, 0x1000, caller=0xC),
    malloc(40, 5000, 0x3000, caller=0xA),
    malloc(50, 24, 0x4000, caller=0xB),
    free(60, 0x3000, caller=0xC),
    realloc(70, 0x2000, 2000, 0x5000),
    free(80, 0x9999),
    malloc(90, 64, 0),
]
CHILD = [
    thread_start(44, tid=101),
    malloc(45, 300, 0x10000),
    thread_start(47, tid=202, thread=1),
    malloc(48, 400, 0x20000, thread=1),
    free(55, 0x10000),
]
EXECED = [thread_start(199, tid=101), malloc(200, 16, 0x7000)]

PEAK = 6724
PEAK_NS = 50
PEAK_CLASSES = {5: (24, 1), 9: (700, 2), 10: (1000, 1), 13: (5000, 1)}  # class: (bytes, blocks)
LEAKS = {5: (40, 2), 9: (400, 1), 11: (2000, 1)}  # class: (bytes, blocks)
TEMPORARIES = {7: (100, 1), 9: (300, 1), 13: (5000, 1)}  # within 4 calls
# caller: calls, allocations, bytes, leaks, leaked bytes, temporaries (pid 100 only)
CALLERS = {
    0xA: (2, 2, 5100, 0, 0, 2),
    0xB: (2, 2, 1024, 1, 24, 0),
    0xC: (2, 0, 0, 0, 0, 0),
    0x0: (3, 1, 2000, 1, 2000, 0),  # realloc, the unpaired free and the failed malloc
}


def write_raw(folder: Path) -> Path:
    """The three traces in `folder` (a run folder as `heapcast trace` writes it)."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = 1_700_000_000_000_000_000
    write_trace(
        folder / f"100-{t0}.hct",
        PARENT,
        caller=True,
        pid=100,
        ppid=1,
        cmdline=("prog", "run"),
        start_realtime_ns=t0,
    )
    write_trace(
        folder / f"101-{t0 + 40}.hct",
        CHILD,
        pid=101,
        ppid=100,
        cmdline=("prog", "child"),
        start_realtime_ns=t0 + 40,
    )
    write_trace(
        folder / f"101-{t0 + 150}.hct",
        EXECED,
        pid=101,
        ppid=100,
        cmdline=("/bin/true",),
        start_realtime_ns=t0 + 150,
    )
    return folder


def write_events(raw: Path, root: Path, workload: str = "hand", run: str = "r1") -> Path:
    """The raw run converted (the dataset's own per-file conversion) into
    <root>/events/workload=<w>/run=<r>/ with a _summary.json, as the dataset flow leaves it."""
    out = root / "events" / f"workload={workload}" / f"run={run}"
    out.mkdir(parents=True, exist_ok=True)
    files = [
        convert_file(str(p), Root.from_url(str(root)), str(out)) for p in sorted(raw.glob("*.hct"))
    ]
    (out / "_summary.json").write_text(
        json.dumps({"workload": workload, "run": run, "files": files})
    )
    return out
