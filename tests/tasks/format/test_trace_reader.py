"""The one reader: exact decoding of spec-built files, and clear refusals of bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tasks.format.trace_reader import Op, TraceFormatError, count_traces, op_name, read_trace


def spec_header(
    *,
    version=1,
    flags=0,
    cmdline=b"prog\0arg\0",
    pid=42,
    ppid=7,
    clock=2,
    start_ticks=1000,
    ns_per_tick=0.5,
    mono=10**12,
) -> bytes:
    """A header built from native/FORMAT.md's offsets, independently of the reader's code."""
    record_size = 40 if flags & 1 else 32
    header_size = (80 + len(cmdline) + 7) // 8 * 8
    h = bytearray(header_size)
    h[0:8] = b"HEAPCAST"
    struct.pack_into("<IIII", h, 8, version, header_size, record_size, flags)
    struct.pack_into("<II", h, 24, pid, ppid)
    struct.pack_into("<QQQd", h, 32, 1_700_000_000 * 10**9, mono, start_ticks, ns_per_tick)
    struct.pack_into("<II", h, 64, clock, len(cmdline))
    h[80 : 80 + len(cmdline)] = cmdline
    return bytes(h)


def record(time, addr, arg, size, op, thread, caller=None) -> bytes:
    packed = size | (op << 40) | (thread << 48)
    out = struct.pack("<QQQQ", time, addr, arg, packed)
    return out + (struct.pack("<Q", caller) if caller is not None else b"")


def test_reader_decodes_every_field_of_spec_built_records(tmp_path):
    # GIVEN a trace with a thread start, a malloc, an aligned alloc, a realloc and a free
    body = (
        record(1000, 0, 4321, 0, Op.THREAD_START, 0)
        + record(1002, 0x1000, 0, 24, Op.MALLOC, 0)
        + record(1004, 0x2000, 64, 256, Op.POSIX_MEMALIGN, 0)
        + record(1006, 0x3000, 0x1000, (1 << 40) - 1, Op.REALLOC, 3)
        + record(1010, 0x2000, 0, 0, Op.FREE, 3)
    )
    path = tmp_path / "42-1.hct"
    path.write_bytes(spec_header() + body)
    # WHEN it is read
    t = read_trace(path)
    # THEN header and records come back exactly
    assert (t.header.pid, t.header.ppid, t.header.cmdline) == (42, 7, ("prog", "arg"))
    assert list(t.op) == [Op.THREAD_START, Op.MALLOC, Op.POSIX_MEMALIGN, Op.REALLOC, Op.FREE]
    assert list(t.size) == [0, 24, 256, (1 << 40) - 1, 0]
    assert list(t.thread) == [0, 0, 0, 3, 3]
    assert list(t.addr) == [0, 0x1000, 0x2000, 0x3000, 0x2000]
    assert list(t.arg) == [4321, 0, 64, 0x1000, 0]
    # time: start_monotonic + (ticks - start_ticks) * ns_per_tick
    assert list(t.time_ns) == [10**12, 10**12 + 1, 10**12 + 2, 10**12 + 3, 10**12 + 5]
    assert t.caller is None
    assert t.counts_by_op()["malloc"] == 1


def test_reader_keeps_empty_arguments_of_the_command_line(tmp_path):
    path = tmp_path / "redis.hct"
    path.write_bytes(spec_header(cmdline=b"redis-server\0--save\0\0--port\0007\0"))
    assert read_trace(path).header.cmdline == ("redis-server", "--save", "", "--port", "7")


def test_reader_reads_caller_records(tmp_path):
    path = tmp_path / "c.hct"
    path.write_bytes(
        spec_header(flags=1) + record(1000, 0x10, 0, 8, Op.MALLOC, 0, caller=0xDEADBEEF)
    )
    t = read_trace(path)
    assert t.header.record_size == 40
    assert list(t.caller) == [0xDEADBEEF]


def module_records(time, start, end, bias, path: bytes) -> bytes:
    """MODULE + MODULE_PATH records as FORMAT.md lays them out (40-byte records)."""
    out = record(time, start, end, len(path), Op.MODULE, 0, caller=bias)
    for at in range(0, len(path), 24):
        chunk = path[at : at + 24]
        words = chunk.ljust(24, b"\0")
        out += words + struct.pack("<QQ", len(chunk) | (int(Op.MODULE_PATH) << 40), 0)
    return out


def test_reader_takes_the_module_map_out_of_a_version_2_caller_trace(tmp_path):
    # GIVEN a version 2 caller trace: two modules after the header, one more between records
    exe = b"/usr/bin/some-program-with-a-long-name"  # 38 bytes: two path records
    body = (
        module_records(990, 0x5000, 0x9000, 0x5000, exe)
        + module_records(991, 0x7F0000, 0x7F8000, 0x7F0000, b"/lib/libc.so.6")
        + record(1000, 0, 4321, 0, Op.THREAD_START, 0, caller=0)
        + record(1002, 0x1000, 0, 24, Op.MALLOC, 0, caller=0x5123)
        + module_records(1003, 0x900000, 0x901000, 0x900000, b"/opt/plugin.so")
        + record(1004, 0x1000, 0, 0, Op.FREE, 0, caller=0x900010)
        + record(1005, 0x2000, 0, 8, Op.MALLOC, 0, caller=0x1)
    )
    path = tmp_path / "m.hct"
    path.write_bytes(spec_header(version=2, flags=1) + body)
    # WHEN it is read
    t = read_trace(path)
    # THEN the records are the heap calls and THREAD_START only, in file order
    assert list(t.op) == [Op.THREAD_START, Op.MALLOC, Op.FREE, Op.MALLOC]
    assert list(t.caller) == [0, 0x5123, 0x900010, 0x1]
    # AND the module map is every module record, path included
    m = t.modules
    assert m.path == (exe.decode(), "/lib/libc.so.6", "/opt/plugin.so")
    assert list(m.start) == [0x5000, 0x7F0000, 0x900000]
    assert list(m.end) == [0x9000, 0x7F8000, 0x901000]
    # AND callers locate to (module, address - load bias); -1 outside every module
    idx, off = m.locate(t.caller)
    assert list(idx) == [-1, 0, 2, -1]
    assert list(off) == [0, 0x123, 0x10, 0]


def test_reader_keeps_records_a_view_when_modules_are_only_at_the_start(tmp_path):
    path = tmp_path / "m.hct"
    body = module_records(990, 0x5000, 0x9000, 0x4000, b"/bin/x") + record(
        1002, 0x1000, 0, 24, Op.MALLOC, 0, caller=0x5123
    )
    path.write_bytes(spec_header(version=2, flags=1) + body)
    t = read_trace(path)
    assert not t.records.flags.owndata  # a view of the file's bytes, no copy
    assert list(t.modules.locate(t.caller)[1]) == [0x1123]


def test_a_later_module_wins_where_ranges_overlap(tmp_path):
    # a module unloaded and another mapped over part of its range
    path = tmp_path / "m.hct"
    body = module_records(1, 0x1000, 0x5000, 0x1000, b"/a.so") + module_records(
        2, 0x2000, 0x3000, 0x2000, b"/b.so"
    )
    path.write_bytes(spec_header(version=2, flags=1) + body)
    idx, off = read_trace(path).modules.locate(np.array([0x1500, 0x2500, 0x3500], np.uint64))
    assert list(idx) == [0, 1, 0] and list(off) == [0x500, 0x500, 0x2500]


def test_reader_still_reads_version_1_files_which_have_no_modules(tmp_path):
    path = tmp_path / "old.hct"
    path.write_bytes(
        spec_header(version=1, flags=1) + record(1000, 0x10, 0, 8, Op.MALLOC, 0, caller=0xBEEF)
    )
    t = read_trace(path)
    assert t.header.version == 1 and t.modules is None
    assert list(t.caller) == [0xBEEF]


def test_reader_has_no_per_record_parsing_cost_on_a_large_file(tmp_path):
    # A million records are viewed, not parsed: the records array shares the file's buffer.
    n = 1_000_000
    rec = np.zeros(n, dtype=[("time", "<u8"), ("addr", "<u8"), ("arg", "<u8"), ("packed", "<u8")])
    rec["time"] = np.arange(n) + 1000
    rec["packed"] = 16 | (Op.MALLOC << 40)
    path = tmp_path / "big.hct"
    path.write_bytes(spec_header() + rec.tobytes())
    t = read_trace(path)
    assert len(t) == n and not t.records.flags.owndata
    assert int(t.size.sum()) == 16 * n


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty file"),
        (b"\x7fELF" + b"\0" * 200, "does not look like a heapcast trace"),
        (b"HEAPCA", "does not look like a heapcast trace"),
    ],
)
def test_reader_refuses_files_that_are_not_traces(tmp_path, content, message):
    path = tmp_path / "bad.hct"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_reader_refuses_an_unknown_version_naming_the_file(tmp_path):
    path = tmp_path / "v9.hct"
    path.write_bytes(spec_header(version=9) + record(1000, 1, 0, 1, Op.MALLOC, 0))
    with pytest.raises(TraceFormatError, match=r"version 9.*reads version 1 and 2") as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_reader_refuses_a_header_cut_short(tmp_path):
    path = tmp_path / "cut.hct"
    path.write_bytes(spec_header()[:85])
    with pytest.raises(TraceFormatError, match="header_size"):
        read_trace(path)


def test_reader_drops_a_truncated_last_record_with_a_warning(tmp_path):
    # GIVEN two whole records and 13 bytes of a third (a process killed mid-write)
    body = record(1000, 1, 0, 8, Op.MALLOC, 0) + record(1001, 1, 0, 0, Op.FREE, 0)
    path = tmp_path / "trunc.hct"
    path.write_bytes(spec_header() + body + b"\x01" * 13)
    # WHEN read, THEN the whole records are kept and the warning names the bytes dropped
    with pytest.warns(UserWarning, match=r"dropped a truncated last record \(13 bytes\)"):
        t = read_trace(path)
    assert len(t) == 2 and t.dropped_bytes == 13


def test_missing_file_is_named(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        read_trace(tmp_path / "nope.hct")


def test_count_traces_sums_a_folder_and_names_unreadable_files(tmp_path):
    # GIVEN two processes' traces and a file killed before its header
    (tmp_path / "1-1.hct").write_bytes(
        spec_header(pid=1)
        + record(1000, 0, 11, 0, Op.THREAD_START, 0)
        + record(1001, 0x10, 0, 8, Op.MALLOC, 0)
        + record(1002, 0x10, 0, 0, Op.FREE, 0)
    )
    (tmp_path / "2-1.hct").write_bytes(
        spec_header(pid=2)
        + record(1000, 0, 12, 0, Op.THREAD_START, 0)
        + record(1000, 0, 13, 0, Op.THREAD_START, 1)
        + record(1003, 0x20, 0, 16, Op.MALLOC, 1)
    )
    (tmp_path / "3-1.hct").write_bytes(b"")
    # WHEN counted, THEN processes, threads, events and ops add up, and the bad file says why
    c = count_traces(tmp_path)
    assert (c.processes, c.threads, c.events) == (2, 3, 3)
    assert c.events_by_op == {"thread_start": 3, "malloc": 2, "free": 1}
    assert c.files == ["1-1.hct", "2-1.hct", "3-1.hct"]
    assert list(c.unreadable) == ["3-1.hct"] and "empty file" in c.unreadable["3-1.hct"]


def test_op_name_knows_every_code_and_names_unknown_ones():
    assert [op_name(int(o)) for o in (Op.MALLOC, Op.THREAD_START)] == ["malloc", "thread_start"]
    assert op_name(200) == "op200"
