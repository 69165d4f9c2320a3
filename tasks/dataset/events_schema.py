"""The events dataset's schemas, written once (DESIGN.md: data contracts).

EVENTS_SCHEMA: one row per heap call (THREAD_START markers of the raw trace are not rows), in
call order per process. Stored as Parquet under `<root>/events/workload=<w>/run=<r>/part-*.parquet`;
the partition columns `workload` and `run` come from the path.

STACKS_SCHEMA: the run's call stacks, one row per (stack, depth), in
`<root>/events/workload=<w>/run=<r>/_stacks.parquet` (docs/dataset.md#call-stacks); an event's
`stack` joins its `stack` column.
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
        # the call's stack in the run's stacks table (STACKS_SCHEMA.stack): a hash of its
        # frames (module path and offset each, innermost first), so one id per distinct frame
        # sequence over the run's processes; null where the trace has no stacks (version 1/2,
        # or recorded without HEAPCAST_FRAMES) or the call took none (frees, a walk that found
        # no frame, a stack whose nodes the file lost)
        pa.field("stack", pa.uint64(), nullable=True),
    ],
    # 2: the stack column (a version 1 part reads it as nulls: tasks.dataset.events_reader)
    metadata={"heapcast.events.version": "2"},
)

STACKS_SCHEMA = pa.schema(
    [
        pa.field("stack", pa.uint64(), nullable=False),  # EVENTS_SCHEMA.stack
        pa.field("depth", pa.uint16(), nullable=False),  # 0: the innermost frame (malloc's caller)
        # the frame's module (its path; dictionary-encoded) and the frame's address in that
        # module's own ELF addresses (return address - load bias); where no module of the
        # process's map holds the address, module is null and offset is the raw address
        pa.field("module", CALLER_MODULE_TYPE, nullable=True),
        pa.field("offset", pa.uint64(), nullable=False),
        # the function holding the frame, demangled; "" where no symbol names it
        pa.field("function", pa.dictionary(pa.int32(), pa.string()), nullable=False),
    ],
    metadata={"heapcast.stacks.version": "1"},
)

PARTITION_COLUMNS = ("workload", "run")
