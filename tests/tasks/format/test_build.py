"""build_tracer: builds once, rebuilds only when a source changes, names missing tools."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tasks.format.build import NATIVE_DIR, SOURCES, TracerBuildError, build_tracer


@pytest.fixture
def native_copy(tmp_path) -> Path:
    """A private copy of native/ (sources only), so tests never race the real build/."""
    dst = tmp_path / "native"
    dst.mkdir()
    for name in SOURCES:  # the tracer's sources, as the build knows them
        shutil.copy2(NATIVE_DIR / name, dst / name)
    return dst


def test_builds_and_returns_the_absolute_library_path(native_copy):
    # GIVEN sources without a build
    # WHEN the task runs
    lib = build_tracer.fn(native_copy)

    # THEN it returns the absolute path of a shared library
    assert lib.is_absolute() and lib == native_copy / "build" / "libheapcast.so"
    assert lib.read_bytes()[:4] == b"\x7fELF"


def test_rebuilds_only_when_a_source_changes(native_copy):
    # GIVEN a built library
    lib = build_tracer.fn(native_copy)
    old = lib.stat().st_mtime_ns - 10_000_000_000  # 10 s in the past, to tell a rebuild apart
    os.utime(lib, ns=(old, old))
    for name in SOURCES:
        os.utime(native_copy / name, ns=(old - 10**9, old - 10**9))

    # WHEN the task runs again with nothing touched
    # THEN the library is left alone
    assert build_tracer.fn(native_copy) == lib
    assert lib.stat().st_mtime_ns == old

    # WHEN a source is touched
    os.utime(native_copy / "heapcast.c")
    # THEN the library is rebuilt
    assert build_tracer.fn(native_copy) == lib
    assert lib.stat().st_mtime_ns > old


def test_missing_make_is_named(native_copy, monkeypatch):
    # GIVEN a PATH without make or gcc, and no library yet
    monkeypatch.setenv("PATH", str(native_copy))

    # WHEN the task runs
    # THEN the error names the missing tool
    with pytest.raises(TracerBuildError, match="`make` is not on PATH"):
        build_tracer.fn(native_copy)


def test_a_folder_without_sources_is_refused(tmp_path):
    with pytest.raises(TracerBuildError, match="no heapcast.c"):
        build_tracer.fn(tmp_path)
