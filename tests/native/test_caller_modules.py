"""Callers that survive ASLR: a real program traced with HEAPCAST_CALLER=1 records its module
map (FORMAT.md, Modules), and the report names its top caller from the modules' ELF symbols."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.dataset.convert import convert_groups, events_from_trace
from tasks.dataset.partitions import write_events
from tasks.report.analysis import analyze
from tasks.report.page import top_callers
from tasks.report.sources import resolve
from tests.native.tracer_harness import PROGRAMS


def _top(trace_dir: Path, by: str) -> tuple[str, dict[str, int]]:
    rep = analyze(resolve(str(trace_dir)))
    assert rep.has_callers
    return top_callers(rep, by, 1)[0]


def test_top_caller_of_a_pie_program_resolves_to_its_function(program, run_traced, trace_dir):
    # GIVEN a PIE program whose allocations come mostly from hot_allocator, traced with callers
    exe = program("hot_caller")
    run = run_traced([exe], HEAPCAST_CALLER="1")
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    # THEN the trace holds its module map: the program itself and libc at least
    paths = trace.modules.path
    assert str(exe) in paths and any("libc.so" in p for p in paths)
    # AND the events carry the caller's module and offset next to the raw address
    ev = events_from_trace(trace).to_pydict()
    mallocs = [i for i, op in enumerate(ev["op"]) if op == 1]
    assert {ev["caller_module"][i] for i in mallocs} == {str(exe)}
    assert all(ev["caller_offset"][i] < ev["caller"][i] for i in mallocs)
    # AND the report's top caller by calls, bytes and leaks is hot_allocator in the program
    for by in ("calls", "bytes", "leaks"):
        name, figures = _top(trace_dir, by)
        assert name.startswith("hot_allocator+0x") and name.endswith(f"({exe.name})"), name
    assert _top(trace_dir, "leaks")[1]["leaks"] == 1000


def test_a_non_pie_program_and_a_fork_child_resolve_too(tmp_path, run_traced, trace_dir):
    # GIVEN the program built without PIE (load bias 0), forking a child that does the work
    exe = tmp_path / "hot_nopie"
    src = PROGRAMS / "hot_caller.c"
    subprocess.run(["gcc", "-O1", "-g", "-fno-builtin", "-no-pie", "-o", exe, src], check=True)
    run = run_traced([exe, "fork"], HEAPCAST_CALLER="1")
    assert run.proc.returncode == 0, run.proc.stderr
    # THEN parent and child each hold the module map (the child's inherited from the parent)
    assert len(run.traces) == 2 and all(str(exe) in t.modules.path for t in run.traces)
    # AND the child's calls are named after hot_allocator
    name, figures = _top(trace_dir, "calls")
    assert name.startswith("hot_allocator+0x") and figures["calls"] == 3000


@pytest.fixture
def plugin(tmp_path) -> Path:
    so = tmp_path / "libplugin.so"
    subprocess.run(
        ["gcc", "-O1", "-g", "-fno-builtin", "-shared", "-fPIC", "-o", so, PROGRAMS / "plugin.c"],
        check=True,
    )
    return so


def test_a_library_loaded_with_dlopen_is_recorded_and_resolves(
    program, run_traced, trace_dir, plugin
):
    # GIVEN a program that dlopens a library after start and allocates through it
    run = run_traced([program("hot_caller"), "dlopen", plugin], HEAPCAST_CALLER="1")
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    # THEN the library is in the module map, recorded at a buffer flush (before later calls),
    # not only at exit
    m = trace.modules
    k = m.path.index(str(plugin))
    assert m.time[k] < trace.records["time"].max()
    # AND the top caller by bytes is the library's function, named from its symbols
    name, figures = _top(trace_dir, "bytes")
    assert name.startswith("plugin_allocate+0x") and name.endswith("(libplugin.so)"), name
    assert figures["calls"] == 20000


def test_a_module_that_cannot_be_read_falls_back_to_module_and_offset(
    program, run_traced, trace_dir, tmp_path
):
    # GIVEN a traced program that is removed before the report
    exe = tmp_path / "gone"
    exe.write_bytes(program("hot_caller").read_bytes())
    exe.chmod(0o755)
    run = run_traced([exe], HEAPCAST_CALLER="1")
    assert run.proc.returncode == 0, run.proc.stderr
    exe.unlink()
    # THEN its callers are named by module and offset
    name, _ = _top(trace_dir, "calls")
    assert name.startswith("gone+0x"), name


def test_the_events_dataset_keeps_the_module_and_the_report_names_from_it(
    program, run_traced, trace_dir, tmp_path
):
    # GIVEN the traced program's events written as the dataset writes them (Parquet)
    (trace,) = run_traced([program("hot_caller")], HEAPCAST_CALLER="1").traces
    tables, _ = convert_groups(trace)
    part = tmp_path / "events" / f"part-{trace.header.pid}-1.parquet"
    part.parent.mkdir()
    write_events(tables, str(part))
    # THEN the report of the Parquet part names the same top caller
    name, _ = _top(part.parent, "calls")
    assert name.startswith("hot_allocator+0x"), name
