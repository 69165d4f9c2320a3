"""The C mirror of FORMAT.md (native/heapcast_format.h) and the Python reader agree."""

from __future__ import annotations

import json
import struct
import subprocess

from tasks.format import trace_reader
from tasks.format.trace_reader import RECORD_DTYPE, RECORD_DTYPE_CALLER, RECORD_DTYPE_STACK, Op

HEADER_FIELDS = [
    "magic",
    "version",
    "header_size",
    "record_size",
    "flags",
    "pid",
    "ppid",
    "start_realtime_ns",
    "start_monotonic_ns",
    "start_ticks",
    "ns_per_tick",
    "clock",
    "cmdline_len",
    "reserved",
]


def struct_offsets(fmt: str) -> list[int]:
    """Offsets of each field of a standard-size struct format like '<8sIIQ'."""
    order, codes = fmt[0], fmt[1:]
    offsets, i, fields = [], 0, []
    while i < len(codes):  # split '8s' style repeat counts from single codes
        j = i
        while codes[j].isdigit():
            j += 1
        fields.append(codes[i : j + 1])
        i = j + 1
    pos = 0
    for f in fields:
        offsets.append(pos)
        pos += struct.calcsize(order + f)
    return offsets


def test_c_struct_layout_matches_the_reader(program):
    # GIVEN the C header compiled into a program printing its sizes and offsets
    layout = json.loads(
        subprocess.run([program("layout")], capture_output=True, text=True, check=True).stdout
    )

    # THEN the record layout is the reader's dtype, field by field
    assert layout["record_size"] == RECORD_DTYPE.itemsize == 32
    assert layout["record_caller_size"] == RECORD_DTYPE_CALLER.itemsize == 40
    assert layout["record"] == {name: RECORD_DTYPE.fields[name][1] for name in RECORD_DTYPE.names}
    assert layout["caller"] == RECORD_DTYPE_CALLER.fields["caller"][1]
    assert layout["record_stack_size"] == RECORD_DTYPE_STACK.itemsize == 48
    assert layout["stack"] == RECORD_DTYPE_STACK.fields["stack"][1]
    assert layout["stack_caller"] == RECORD_DTYPE_STACK.fields["caller"][1]
    assert layout["flag_stacks"] == trace_reader.FLAG_STACKS

    # AND the header layout is the reader's header struct, field by field
    fmt = trace_reader._HEADER.format
    assert layout["header_size"] == struct.calcsize(fmt) == 80
    assert layout["header"] == dict(zip(HEADER_FIELDS, struct_offsets(fmt)))

    # AND the packed field and op codes are the same
    assert layout["size_bits"] == trace_reader.SIZE_BITS
    assert layout["op_shift"] == trace_reader.OP_SHIFT
    assert layout["thread_shift"] == trace_reader.THREAD_SHIFT
    assert layout["ops"] == {op.name: int(op) for op in Op}

    # AND the version the tracer writes, and the module records' path chunk (FORMAT.md, Modules)
    assert layout["version"] == trace_reader.FORMAT_VERSION == 3
    assert layout["module_path_chunk"] == trace_reader.MODULE_PATH_CHUNK
