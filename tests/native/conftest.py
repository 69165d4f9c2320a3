"""Fixtures for the tracer tests: build libheapcast.so once, run a command under LD_PRELOAD and
read back its traces (tracer_harness.py); the small C programs in programs/ are compiled by
tests/conftest.py's `program`, which the probe's and the CLI's tests use too."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.format.trace_reader import Trace
from tests.native.tracer_harness import (
    NATIVE,
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
