"""The events dataset's schema, written once (DESIGN.md: data contracts).

One row per heap call (THREAD_START markers of the raw trace are not rows), in call order per
process. Stored as Parquet under `<root>/events/workload=<w>/run=<r>/part-*.parquet`; the
partition columns `workload` and `run` come from the path.
"""

from __future__ import annotations

import pyarrow as pa

CALLER_MODULE_TYPE = pa.dictionary(pa.int32(), pa.string())

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("pid", pa.uint32(), nullable=False),
        pa.field("ppid", pa.uint32(), nullable=False),
        pa.field("thread", pa.uint16(), nullable=False),  # per-process thread number
        pa.field("tid", pa.uint32(), nullable=False),  # OS thread id
        pa.field("seq", pa.uint64(), nullable=False),  # call number within (pid, thread)
        pa.field("time_ns", pa.int64(), nullable=False),  # CLOCK_MONOTONIC
        pa.field("op", pa.uint8(), nullable=False),  # tasks.format.trace_reader.Op
        pa.field("size", pa.uint64(), nullable=False),  # requested bytes; 0 for free
        pa.field("alignment", pa.uint64(), nullable=True),  # aligned forms only
        pa.field("addr", pa.uint64(), nullable=False),  # returned address (free: freed address)
        pa.field("freed_addr", pa.uint64(), nullable=True),  # realloc's old block; null on
        # a plain free, whose freed block is its addr (stored once: the column costs nothing)
        pa.field("freed_size", pa.uint64(), nullable=True),  # size of the block freed, if paired
        pa.field("caller", pa.uint64(), nullable=True),  # where HEAPCAST_CALLER was set
        pa.field("lifetime_ns", pa.int64(), nullable=True),  # allocations: until freed
        pa.field("lifetime_calls", pa.int64(), nullable=True),  # calls in the process until freed
        pa.field("token", pa.uint8(), nullable=False),  # tasks.dataset.tokens
        # the caller's module (its path; a dictionary column: an int32 id per row into the
        # file's list of module paths) and the caller's address in that module's own ELF
        # addresses (caller - load bias: what its symbol tables give); null where the trace has
        # no module map (no caller, or a version 1 trace) or no module holds the address
        pa.field("caller_module", CALLER_MODULE_TYPE, nullable=True),
        pa.field("caller_offset", pa.uint64(), nullable=True),
    ],
    metadata={"heapcast.events.version": "1"},
)

PARTITION_COLUMNS = ("workload", "run")
