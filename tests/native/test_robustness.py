"""The traced program's behaviour never changes; failures leave one stderr line; SIGKILL leaves
a readable file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings

import numpy as np

from tasks.format.trace_reader import Op, read_trace
from tests.native.tracer_harness import tracer_env


def test_missing_output_directory_leaves_the_program_unchanged(program, libheapcast, tmp_path):
    # GIVEN HEAPCAST_OUT naming a directory that does not exist
    exe = program("hello")
    missing = tmp_path / "no" / "such" / "dir"
    plain = subprocess.run([exe], capture_output=True, text=True)

    # WHEN the program runs under the tracer
    traced = subprocess.run(
        [exe], capture_output=True, text=True, env=tracer_env(libheapcast, missing)
    )

    # THEN stdout and the exit code are unchanged, and stderr has one line saying why
    assert plain.returncode == traced.returncode == 3
    assert traced.stdout == plain.stdout == "hello 42\nsecond line\n"
    lines = traced.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("heapcast: ") and str(missing) in lines[0]
    assert "No such file or directory" in lines[0]
    assert not missing.exists()


def test_unset_output_directory_leaves_the_program_unchanged(program, libheapcast):
    # GIVEN LD_PRELOAD without HEAPCAST_OUT
    exe = program("hello")

    # WHEN the program runs
    traced = subprocess.run(
        [exe], capture_output=True, text=True, env=tracer_env(libheapcast, None)
    )

    # THEN it runs as usual and stderr has one line naming the variable
    assert traced.returncode == 3
    assert traced.stdout == "hello 42\nsecond line\n"
    (line,) = traced.stderr.splitlines()
    assert line.startswith("heapcast: ") and "HEAPCAST_OUT" in line


def test_sigkill_leaves_flushed_records_readable(program, libheapcast, trace_dir):
    # GIVEN a program that allocates forever (several buffers' worth before it says "ready")
    exe = program("spin")
    proc = subprocess.Popen(
        [exe, "200000"], stdout=subprocess.PIPE, text=True, env=tracer_env(libheapcast, trace_dir)
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.05)
    finally:
        # WHEN it is killed with SIGKILL (no exit handler runs)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # THEN its file is readable: at least the 400k calls before "ready" minus one unflushed
    # buffer, a valid THREAD_START first. SIGKILL can cut the write() in flight, leaving a torn
    # last record, which the reader drops with a warning (FORMAT.md, Durability).
    (path,) = trace_dir.glob("*.hct")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = read_trace(path)
    assert trace.dropped_bytes < trace.header.record_size
    assert len(trace) > 400_000 - 8192
    assert trace.op[0] == Op.THREAD_START and trace.arg[0] == proc.pid
    body = trace.op[1:]
    assert np.all((body == Op.MALLOC) | (body == Op.FREE))
    mallocs = trace.size[1:][body == Op.MALLOC]
    assert np.array_equal(mallocs[:4096], np.arange(1, 4097))


def test_monotonic_clock_on_request(program, run_traced):
    # GIVEN HEAPCAST_CLOCK=monotonic
    exe = program("allocs")

    # WHEN the program runs traced
    run = run_traced([exe], HEAPCAST_CLOCK="monotonic")

    # THEN the header says clock 1 with 1 ns per tick, and times are CLOCK_MONOTONIC ns
    (trace,) = run.traces
    h = trace.header
    assert h.clock == 1 and h.ns_per_tick == 1.0 and h.start_ticks == h.start_monotonic_ns
    assert np.all(trace.time_ns >= h.start_monotonic_ns)
    assert np.all(trace.time_ns - h.start_monotonic_ns < 10_000_000_000)
    assert np.all(np.diff(trace.time_ns) >= 0)


def test_tsc_clock_is_calibrated(program, run_traced):
    # GIVEN the default clock on x86-64 (TSC)
    exe = program("allocs")

    # WHEN a program runs traced
    run = run_traced([exe])

    # THEN the header says clock 2, a plausible rate, and record times land right after start
    (trace,) = run.traces
    h = trace.header
    if os.uname().machine != "x86_64":
        assert h.clock == 1
        return
    assert h.clock == 2
    assert 0.05 < h.ns_per_tick < 5.0  # 0.2 - 20 GHz
    assert h.start_monotonic_ns <= trace.time_ns[0] < h.start_monotonic_ns + 1_000_000_000
    assert np.all(np.diff(trace.time_ns) >= 0)
