"""Fixtures for the tracer tests: build libheapcast.so once, compile the small C programs in
programs/, run a command under LD_PRELOAD and read back its traces (tracer_harness.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.format.trace_reader import Trace
from tests.native.tracer_harness import (
    NATIVE,
    PROGRAMS,
    TracedRun,
    read_traces,
    tracer_env,
    unpaired_frees,
)


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
def program(tmp_path_factory) -> Callable[..., Path]:
    """Compiles tests/native/programs/<name>.c once (per set of extra gcc flags, e.g.
    "-rdynamic") and returns the executable's path.

    -fno-builtin: gcc otherwise deletes malloc/free pairs whose block is unused, and the tests
    count exactly those calls."""
    bin_dir = tmp_path_factory.mktemp("programs")
    built: dict[tuple[str, ...], Path] = {}

    def build(name: str, *flags: str) -> Path:
        key = (name, *flags)
        if key not in built:
            exe = bin_dir / (name + "".join(f.replace("/", "_") for f in flags))
            subprocess.run(
                [
                    "gcc",
                    "-O1",
                    "-g",
                    "-fno-builtin",
                    "-Wall",
                    "-pthread",
                    f"-I{NATIVE}",
                    "-o",
                    str(exe),
                    str(PROGRAMS / f"{name}.c"),
                    *flags,
                ],
                check=True,
            )
            built[key] = exe
        return built[key]

    return build


@pytest.fixture
def trace_dir(tmp_path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    return d


@pytest.fixture
def run_traced(libheapcast, trace_dir) -> Callable[..., TracedRun]:
    """Runs argv under the tracer (HEAPCAST_OUT=trace_dir) and reads back all its traces."""

    def run(
        argv: list[str], *, timeout: float = 120, out_dir: Path | None = None, **env_extra: str
    ) -> TracedRun:
        out = trace_dir if out_dir is None else out_dir
        proc = subprocess.run(
            [str(a) for a in argv],
            env=tracer_env(libheapcast, out, **env_extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return TracedRun(proc=proc, traces=read_traces(out) if out.is_dir() else [])

    return run


@pytest.fixture
def assert_frees_paired() -> Callable[[Trace], None]:
    def check(trace: Trace) -> None:
        bad = unpaired_frees(trace)
        assert not bad, (
            f"{trace.header.path}: {len(bad)} frees without an earlier allocation "
            f"at that address, first {bad[:5]}"
        )

    return check
