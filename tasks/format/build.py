"""Build the heapcast tracer (native/build/libheapcast.so) with make."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prefect import task

from tasks.format.native_sources import TRACER_SOURCES

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
LIB_RELPATH = Path("build") / "libheapcast.so"
SOURCES = TRACER_SOURCES  # what the library is built from


class TracerBuildError(RuntimeError):
    """The tracer cannot be built; the message names the missing tool or make's error."""


def _up_to_date(native: Path, lib: Path) -> bool:
    """True when the library is newer than every source (make would do nothing)."""
    try:
        built = lib.stat().st_mtime_ns
        return all((native / s).stat().st_mtime_ns <= built for s in SOURCES)
    except FileNotFoundError:
        return False


@task(name="build-tracer")
def build_tracer(native_dir: str | Path | None = None) -> Path:
    """Build libheapcast.so with `make -C native` (only when a source changed); return its path."""
    native = (Path(native_dir) if native_dir is not None else NATIVE_DIR).resolve()
    lib = native / LIB_RELPATH
    if not (native / "heapcast.c").is_file():
        raise TracerBuildError(
            f"{native}: no heapcast.c here; pass the repository's native/ folder"
        )
    if _up_to_date(native, lib):
        return lib
    for tool in ("make", "gcc"):
        if shutil.which(tool) is None:
            raise TracerBuildError(
                f"cannot build the tracer: `{tool}` is not on PATH "
                "(Debian: apt-get install build-essential)"
            )
    proc = subprocess.run(["make", "-C", str(native)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise TracerBuildError(
            f"`make -C {native}` failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    if not lib.is_file():
        raise TracerBuildError(f"`make -C {native}` succeeded but {lib} does not exist")
    return lib
