"""tasks.dataset.stacks_table: events carry their stack's id, the run's stacks table its frames.

GIVEN stack traces written by tests/tracegen (StackTrie) with known frames WHEN converted THEN
every event's `stack` joins to the frames that were written (module + offset, innermost first,
named where the module has a symbol), the same frames in two processes are one stack, and a
truncated trie or a frame in no module is one warning naming the file, never a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from distributed import Client

from tasks.core.storage import Root
from tasks.dataset.convert import convert_groups, convert_trace, events_from_trace
from tasks.dataset.events_reader import (
    StackFrames,
    read_run,
    read_stack_frames,
    read_stacks,
)
from tasks.dataset.events_schema import EVENTS_SCHEMA, STACKS_SCHEMA
from tasks.dataset.partitions import RunRef, convert_run, summary_markdown
from tasks.dataset.stacks_table import ProcessStacks, run_stacks
from tasks.dataset.token_runs import read_scored_run
from tasks.format.symbols import symbol_table
from tasks.format.trace_reader import Op, parse_trace, read_trace
from tests.conftest import need_tool
from tests.tracegen import (
    StackTrie,
    free,
    malloc,
    module,
    records_array,
    thread_start,
    trace_bytes,
)

PROG = "/opt/app/bin/prog"  # a module path no host has: named only through a sysroot
LIBC = next(
    (
        p
        for p in ("/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6")
        if Path(p).is_file()
    ),
    None,
)


def _named_frames(path: str, n: int) -> list[tuple[str, int]]:
    """n functions of the ELF file at `path` with a return address inside each (offset + 1)."""
    table = symbol_table(path)
    sized = [k for k in range(len(table.names)) if table.size[k] > 1]
    pick = [sized[len(sized) * (i + 1) // (n + 1)] for i in range(n)]
    return [(table.names[k], int(table.start[k]) + 1) for k in pick]


# The frames of each call, innermost first, as (module, offset); None: an address in no module.
# Two processes map the modules at different bases: the same frames are the same stacks.
def _calls() -> list[tuple[tuple[str | None, int], ...]]:
    return [
        ((PROG, 0x1100), (PROG, 0x1200), (PROG, 0x1300)),
        ((PROG, 0x1100), (PROG, 0x1250), (PROG, 0x1300)),  # another path to the same caller
        ((PROG, 0x1300),),
        ((None, 0xDEAD0000), (PROG, 0x1300)),  # a JIT frame: in no module
    ]


PROG_BASES = {100: 0x555500000000, 200: 0x565600000000}


def _address(pid: int, frame: tuple[str | None, int]) -> int:
    mod, off = frame
    return off if mod is None else PROG_BASES[pid] + off


def stack_trace(pid: int, calls=None, drop_nodes=()) -> bytes:
    """A process that makes each call of `calls` twice, then frees the first block; its trie's
    nodes written first (less `drop_nodes`, by id: a truncated trie)."""
    calls = calls if calls is not None else _calls()
    trie = StackTrie()
    base = PROG_BASES[pid]
    recs = [thread_start(0, tid=pid)]
    t, addr = 10, 0x10000
    for frames in calls * 2:
        addresses = [_address(pid, f) for f in frames]
        recs.append(malloc(t, 24, addr, caller=addresses[0], stack=trie.id(addresses)))
        t, addr = t + 1, addr + 0x100
    recs.append(free(t, 0x10000))
    nodes = [r for r in trie.records() if r.addr not in drop_nodes]
    maps = module(0, base, base + 0x4000000, base, PROG)
    return trace_bytes(maps + nodes + recs, stacks=True, pid=pid)


def _frames_of(sf: StackFrames, stacks: pa.ChunkedArray) -> list[list[tuple[str, int]]]:
    """Each event's frames as (module, offset), through the join events.stack -> stacks."""
    m = sf.matrix(stacks)
    return [[(sf.frames.module[i], int(sf.frames.offset[i])) for i in row if i >= 0] for row in m]


def _written(calls) -> list[list[tuple[str, int]]]:
    return [[(mod or "", off) for mod, off in frames] for frames in calls]


def test_events_join_the_frames_that_were_written():
    # GIVEN two processes making the same calls with their modules at different bases
    traces = [parse_trace(stack_trace(pid), f"{pid}.hct") for pid in PROG_BASES]
    tables, frames = [], []
    for tr in traces:
        ps = ProcessStacks.of_trace(tr)
        table, _ = convert_trace_with(tr, ps)
        tables.append(table)
        frames.append(ps.table())
    # WHEN the run's stacks table is made from both files
    found = run_stacks(frames)
    sf = StackFrames.of_table(found.table)
    # THEN each allocation's stack joins to exactly the frames written, in both processes
    for table in tables:
        assert table.schema.equals(EVENTS_SCHEMA, check_metadata=True)
        got = _frames_of(sf, table.column("stack"))
        assert got[:-1] == _written(_calls()) * 2
        # AND the free took no stack
        assert table.column("op").to_pylist()[-1] == Op.FREE and got[-1] == []
        assert table.column("stack").null_count == 1
    # AND the same frames are the same id across processes: 4 distinct stacks, not 8
    assert tables[0].column("stack").to_pylist() == tables[1].column("stack").to_pylist()
    assert found.stacks == len(sf) == 4
    assert found.table.schema.equals(STACKS_SCHEMA, check_metadata=True)
    # AND rows are one per (stack, depth), sorted so, depth 0 the innermost frame
    st, dp = found.table.column("stack").to_numpy(), found.table.column("depth").to_numpy()
    assert np.all((st[1:] > st[:-1]) | ((st[1:] == st[:-1]) & (dp[1:] == dp[:-1] + 1)))
    # AND a frame in no module keeps its raw address, with a null module
    nomod = found.table.filter(pa.compute.is_null(found.table.column("module")))
    assert nomod.column("offset").to_pylist() == [0xDEAD0000]


def convert_trace_with(tr, ps):
    """The events table of `tr` converted through `ps` (whose table() then holds its stacks)."""
    groups, stats = convert_groups(tr, ps)
    return pa.concat_tables(list(groups)), stats


def test_a_stack_and_its_reverse_or_another_module_are_different_stacks():
    calls = [
        ((PROG, 0x10), (PROG, 0x20)),
        ((PROG, 0x20), (PROG, 0x10)),
        ((PROG, 0x10),),
        ((None, PROG_BASES[100] + 0x10),),  # the same address, but read as in no module
    ]
    tr = parse_trace(stack_trace(100, calls), "a.hct")
    stacks = events_from_trace(tr).column("stack").to_pylist()[:4]
    assert len(set(stacks)) == 3  # the last is the third's address: it is inside PROG
    calls[3] = ((None, 0x10),)
    tr = parse_trace(stack_trace(100, calls), "a.hct")
    assert len(set(events_from_trace(tr).column("stack").to_pylist()[:4])) == 4


def test_traces_without_stacks_convert_as_before():
    # GIVEN the same calls as a version-3 caller trace without stacks and as a stack trace
    tr = parse_trace(stack_trace(100), "s.hct")
    plain = tr.records[["time", "addr", "arg", "packed", "caller"]]
    recs = np.zeros(len(plain), dtype=[(n, "<u8") for n in plain.dtype.names])
    for n in plain.dtype.names:
        recs[n] = plain[n]
    maps = module(0, PROG_BASES[100], PROG_BASES[100] + 0x4000000, PROG_BASES[100], PROG)
    no_stacks = parse_trace(
        trace_bytes(np.concatenate([records_array(maps, caller=True), recs]), caller=True, pid=100),
        "c.hct",
    )
    assert ProcessStacks.of_trace(no_stacks) is None
    with_stacks, s1 = convert_trace(tr)
    without, s2 = convert_trace(no_stacks)
    # THEN every column but the stack is the same, and the stack is null throughout
    assert without.column("stack").null_count == without.num_rows
    assert with_stacks.drop_columns(["stack"]).equals(without.drop_columns(["stack"]))
    assert s1.to_dict() == s2.to_dict()
    # AND a version 1 trace (no caller, no module map) has a null stack too
    v1 = parse_trace(trace_bytes([thread_start(0, 5), malloc(1, 8, 0x10)], version=1), "v1.hct")
    assert events_from_trace(v1).column("stack").to_pylist() == [None]


def test_a_truncated_trie_is_one_warning_naming_the_file_and_keeps_the_rest():
    # GIVEN a trie whose node 2 (the middle frame of the first stack) is missing
    tr = parse_trace(stack_trace(100, drop_nodes=(2,)), "cut.hct")
    ps = ProcessStacks.of_trace(tr)
    table, _ = convert_trace_with(tr, ps)
    sf = StackFrames.of_table(run_stacks([ps.table()]).table)
    got = _frames_of(sf, table.column("stack"))
    # THEN the first stack ends at the missing node; the others are whole
    want = _written(_calls())
    assert got[0] == want[0][:1]
    assert got[1:4] == want[1:4]
    assert ps.warnings()[0].startswith("cut.hct: 1 stack node(s) name a parent node")


def test_records_naming_lost_nodes_have_no_stack_and_a_warning():
    # GIVEN the node of the JIT call's stack lost (node 6: the id its two records name)
    with pytest.warns(UserWarning, match="lost.hct: 2 records name a stack"):
        tr = parse_trace(stack_trace(100, drop_nodes=(6,)), "lost.hct")
    assert tr.unknown_stack_records == 2
    ps = ProcessStacks.of_trace(tr)
    table, _ = convert_trace_with(tr, ps)
    # THEN they have no stack (with the free), the others keep theirs, and the file says why
    assert table.column("stack").null_count == 3
    assert table.column("stack").to_pylist()[3] is None
    assert any(w.startswith("lost.hct: 2 record(s) name a stack") for w in ps.warnings())


def test_frames_in_no_module_are_one_warning():
    tr = parse_trace(stack_trace(100), "jit.hct")
    ps = ProcessStacks.of_trace(tr)
    events_from_trace(tr)
    (line,) = [w for w in ps.warnings() if "no module" in w]
    assert line.startswith("jit.hct: 1 of ") and "0xdead0000" in line


@pytest.mark.skipif(LIBC is None, reason="glibc's libc.so.6 is where Debian keeps it")
def test_frames_are_named_from_the_run_sysroot_once_per_frame(tmp_path):
    # GIVEN a run whose program is only in the run's sysroot (a container replay's copy)
    raw = tmp_path / "raw" / "w" / "r"
    raw.mkdir(parents=True)
    calls, want = _named_calls()
    for pid in PROG_BASES:
        (raw / f"{pid}-1.hct").write_bytes(stack_trace(pid, calls))
    copy = raw / "sysroot" / PROG.lstrip("/")
    copy.parent.mkdir(parents=True)
    shutil.copy(LIBC, copy)
    root = Root.from_url(str(tmp_path))
    # WHEN the run is converted
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        summary = convert_run(root, RunRef("w", "r"), client=c)
    # THEN the events join frames named from the copy, and the summary says so
    ev = read_run(root, "w", "r", ["pid", "op", "stack"])
    sf = read_stack_frames(root, "w", "r")
    names = [[sf.frames.function[i] for i in row if i >= 0] for row in sf.matrix(ev["stack"])]
    assert names[:2] == want and all(n for row in want for n in row)
    assert summary["stacks"]["named"] == 3 and summary["stacks"]["frames"] == 3
    assert summary["stacks"]["sysroot"].endswith("raw/w/r/sysroot")
    assert "call stacks: 2 distinct" in summary_markdown(summary)
    # AND the stacks table is read with the same commit as the events
    assert read_stacks(root, "w", "r").num_rows == 5
    assert not list((tmp_path / "events" / "workload=w" / "run=r").glob("_frames*"))
    # AND a run read as the evaluation scores it (whatif) carries its stacks where asked
    scored = read_scored_run(root, "w", "r", ["op", "stack"], stacks=True)
    got = scored.frames.matrix(scored.table["stack"])
    assert [[sf.frames.function[i] for i in row if i >= 0] for row in got][:2] == want
    assert read_scored_run(root, "w", "r", ["op", "stack"]).frames is None


def _named_calls():
    (a, fa), (b, fb), (c, fc) = _named_frames(LIBC, 3)
    calls = [((PROG, fa), (PROG, fb), (PROG, fc)), ((PROG, fb), (PROG, fc))]
    return calls, [[a, b, c], [b, c]]


def test_a_run_with_a_truncated_trie_converts_with_its_warning_in_the_summary(tmp_path):
    raw = tmp_path / "raw" / "w" / "r"
    raw.mkdir(parents=True)
    (raw / "100-1.hct").write_bytes(stack_trace(100, drop_nodes=(2,)))
    (raw / "200-1.hct").write_bytes(stack_trace(200))
    root = Root.from_url(str(tmp_path))
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        summary = convert_run(root, RunRef("w", "r"), client=c)
    assert summary["processes"] == 2 and summary["rows"] == 18
    cut = [w for w in summary["warnings"] if "stack node(s) name a parent" in w]
    assert len(cut) == 1 and cut[0].startswith(str(raw / "100-1.hct"))
    assert "## Warnings" in summary_markdown(summary)
    # the whole stacks of the other process are kept
    assert read_stacks(root, "w", "r").num_rows > 0
    assert (
        json.loads((tmp_path / "events" / "workload=w" / "run=r" / "_summary.json").read_text())[
            "stacks"
        ]["file"]
        == "_stacks.parquet"
    )


def test_stack_frames_matrix_is_cut_at_a_depth_and_of_gives_one_stack():
    tr = parse_trace(stack_trace(100), "m.hct")
    ps = ProcessStacks.of_trace(tr)
    table, _ = convert_trace_with(tr, ps)
    sf = StackFrames.of_table(run_stacks([ps.table()]).table)
    m = sf.matrix(table.column("stack"), depth=2)
    assert m.shape == (table.num_rows, 2)
    first = sf.of(table.column("stack")[0].as_py())
    assert m[0].tolist() == first[:2].tolist() and len(first) == 3
    assert len(sf.of(12345)) == 0


PROJECT = Path(__file__).resolve().parents[3]
LIB = PROJECT / "native" / "build" / "libheapcast.so"


@pytest.mark.slow
def test_a_real_stack_trace_joins_the_frames_the_tracer_wrote(tmp_path):
    # GIVEN tests/tasks/dataset/programs/pairs.c traced with 16 frames a call
    need_tool("gcc")
    if not LIB.exists():
        subprocess.run(["make", "-C", str(PROJECT / "native")], check=True, capture_output=True)
    exe = tmp_path / "pairs"
    src = Path(__file__).parent / "programs" / "pairs.c"
    subprocess.run(["gcc", "-O1", "-fno-builtin", "-pthread", "-o", str(exe), str(src)], check=True)
    raw = tmp_path / "raw" / "w" / "r"
    raw.mkdir(parents=True)
    env = dict(os.environ, LD_PRELOAD=str(LIB), HEAPCAST_OUT=str(raw), HEAPCAST_FRAMES="16")
    done = subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == "done\n"
    (path,) = raw.glob("*.hct")
    # WHEN its run is converted
    root = Root.from_url(str(tmp_path))
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        summary = convert_run(root, RunRef("w", "r"), client=c)
    assert summary["warnings"] == []
    ev = read_run(root, "w", "r", ["op", "size", "stack", "caller_offset"])
    sf = read_stack_frames(root, "w", "r")
    # THEN each event's frames are the trie's, located in their modules, in call order
    tr = read_trace(path)
    heap = tr.op != Op.THREAD_START
    order = np.argsort(tr.time_ns[heap], kind="stable")
    raw_frames = tr.stacks.frames(tr.stack[heap][order])
    idx, off = tr.modules.locate(raw_frames.reshape(-1))
    want = np.where(idx >= 0, off, raw_frames.reshape(-1)).reshape(raw_frames.shape)
    m = sf.matrix(ev["stack"], depth=raw_frames.shape[1])
    got = np.where(m >= 0, sf.frames.offset[np.maximum(m, 0)], 0)
    assert (got == want).all()
    # AND every allocation has a stack whose innermost frame is its caller
    alloc = np.isin(ev["op"].to_numpy(), [Op.MALLOC, Op.CALLOC, Op.REALLOC, Op.POSIX_MEMALIGN])
    assert (m[alloc, 0] >= 0).all()
    caller = ev["caller_offset"].to_numpy(zero_copy_only=False)
    assert (sf.frames.offset[m[alloc, 0]] == caller[alloc]).all()
    # AND the marker's allocation (777777 bytes; marker() is inlined) is named from main out to
    # _start, the worker thread's from worker
    size = ev["size"].to_numpy()

    def names(k: int) -> list[str]:
        return [sf.frames.function[j] for j in m[k] if j >= 0]

    at_marker = names(int(np.flatnonzero(size == 777777)[0]))
    assert at_marker[0] == "main" and at_marker[-1] == "_start"
    assert names(int(np.flatnonzero(size == 40)[0]))[0] == "worker"
