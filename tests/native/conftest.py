"""Fixtures for the tracer tests: build libheapcast.so once, compile the small C programs in
programs/, run a command under LD_PRELOAD and read back every trace it wrote (only through
tasks.trace_reader.read_trace)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tasks.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, Trace, read_trace

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
PROGRAMS = Path(__file__).resolve().parent / "programs"


@dataclass
class TracedRun:
    """A finished command and the traces it left, ordered by start time."""

    proc: subprocess.CompletedProcess
    traces: list[Trace]

    def by_cmd(self, *argv_tail: str) -> Trace:
        """The one trace whose command line ends with `argv_tail`."""
        hits = [t for t in self.traces if t.header.cmdline[-len(argv_tail):] == argv_tail]
        assert len(hits) == 1, f"{len(hits)} traces end with {argv_tail}: " + \
            str([t.header.cmdline for t in self.traces])
        return hits[0]


def read_traces(out_dir: Path) -> list[Trace]:
    traces = [read_trace(p) for p in sorted(out_dir.glob("*.hct"))]
    return sorted(traces, key=lambda t: (t.header.start_monotonic_ns, t.header.pid))


def tracer_env(lib: Path, out_dir: Path | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("HEAPCAST_OUT", "HEAPCAST_CALLER", "HEAPCAST_CLOCK", "LD_PRELOAD"):
        env.pop(k, None)
    env["LD_PRELOAD"] = str(lib)
    if out_dir is not None:
        env["HEAPCAST_OUT"] = str(out_dir)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def libheapcast() -> Path:
    """native/build/libheapcast.so, built once per session with `make -C native`."""
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.fail("the tracer tests need gcc and make (apt-get install build-essential)")
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    lib = NATIVE / "build" / "libheapcast.so"
    assert lib.is_file()
    return lib


@pytest.fixture(scope="session")
def program(tmp_path_factory) -> Callable[[str], Path]:
    """Compiles tests/native/programs/<name>.c once and returns the executable's path.

    -fno-builtin: gcc otherwise deletes malloc/free pairs whose block is unused, and the tests
    count exactly those calls."""
    bin_dir = tmp_path_factory.mktemp("programs")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            exe = bin_dir / name
            subprocess.run(
                ["gcc", "-O1", "-g", "-fno-builtin", "-Wall", "-pthread", f"-I{NATIVE}",
                 "-o", str(exe), str(PROGRAMS / f"{name}.c")],
                check=True,
            )
            built[name] = exe
        return built[name]

    return build


@pytest.fixture
def trace_dir(tmp_path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    return d


@pytest.fixture
def run_traced(libheapcast, trace_dir) -> Callable[..., TracedRun]:
    """Runs argv under the tracer (HEAPCAST_OUT=trace_dir) and reads back all its traces."""

    def run(argv: list[str], *, timeout: float = 120, out_dir: Path | None = None,
            **env_extra: str) -> TracedRun:
        out = trace_dir if out_dir is None else out_dir
        proc = subprocess.run([str(a) for a in argv], env=tracer_env(libheapcast, out, **env_extra),
                              capture_output=True, text=True, timeout=timeout)
        return TracedRun(proc=proc, traces=read_traces(out) if out.is_dir() else [])

    return run


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


@pytest.fixture
def assert_frees_paired() -> Callable[[Trace], None]:
    def check(trace: Trace) -> None:
        bad = unpaired_frees(trace)
        assert not bad, (f"{trace.header.path}: {len(bad)} frees without an earlier allocation "
                         f"at that address, first {bad[:5]}")

    return check
