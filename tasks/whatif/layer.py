"""The real seed-002 layer (native/cache002.c): build it, and measure a command with and without.

`measure_layer(argv, env)` runs the command twice, once plainly and once with
native/build/libcache002.so preloaded, and returns the page faults, peak RSS and times of each
(os.wait4: the command and the descendants it waited for) and whether the two runs printed the
same and exited the same (`max_rss_kb` is ru_maxrss, which Linux carries over from the forked
caller into the exec'd command: it means something only when the caller is smaller than the
command). Minor faults x the page size is the measured counterpart of the
simulator's `fault_bytes_avoided` (tasks/whatif/simulate.py) for the `seed002` policy with the
same N and min_size.

`static_threshold=True` (default) sets MALLOC_MMAP_THRESHOLD_=131072 in both runs: a fixed
threshold, as the simulator's fault model assumes. Without it, glibc raises its mmap threshold
(up to 32 MiB) each time it unmaps a freed block, after which blocks of that size come from the
heap and stop faulting even without the layer, so the plain run faults less than the model says.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tasks.whatif.policies import MMAP_THRESHOLD

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
LAYER_RELPATH = Path("build") / "libcache002.so"
SOURCES = ("cache002.c", "Makefile")


class LayerBuildError(RuntimeError):
    """The layer cannot be built; the message names the missing tool or make's error."""


def build_layer(native_dir: str | Path | None = None) -> Path:
    """`make -C native cache002` when a source is newer than the library; its path."""
    native = Path(native_dir or NATIVE_DIR).resolve()
    lib = native / LAYER_RELPATH
    try:
        built = lib.stat().st_mtime_ns
        if all((native / s).stat().st_mtime_ns <= built for s in SOURCES):
            return lib
    except FileNotFoundError:
        pass
    for tool in ("make", "gcc"):
        if shutil.which(tool) is None:
            raise LayerBuildError(f"cannot build the layer: `{tool}` is not on PATH")
    proc = subprocess.run(["make", "-C", str(native), "cache002"], capture_output=True, text=True)
    if proc.returncode != 0 or not lib.is_file():
        raise LayerBuildError(
            f"`make -C {native} cache002` failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return lib


def run_measured(
    argv: list[str], env: dict[str, str], timeout: float = 600, cwd: str | Path | None = None
) -> dict[str, Any]:
    """Run argv; its exit code, output digests and resource usage from os.wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(a) for a in argv],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "returncode": proc.returncode,
        "minor_faults": ru.ru_minflt,
        "major_faults": ru.ru_majflt,
        "max_rss_kb": ru.ru_maxrss,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "wall_s": wall,
        "stdout_sha256": hashlib.sha256(stdout).hexdigest(),
        "stderr_sha256": hashlib.sha256(stderr).hexdigest(),
        "stdout_tail": stdout[-2000:].decode(errors="replace"),
        "stderr_tail": stderr[-2000:].decode(errors="replace"),
    }


def parse_stats(text: str) -> list[dict[str, int]]:
    """The layer's HEAPCAST_CACHE_STATS lines (`key=value ...`, one per process)."""
    rows = []
    for line in text.splitlines():
        if line.strip():
            rows.append({k: int(v) for k, v in (f.split("=", 1) for f in line.split())})
    return rows


def measure_layer(
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    n: int = 4,
    min_size: int = MMAP_THRESHOLD,
    madv_free: bool = False,
    static_threshold: bool = True,
    layer: str | Path | None = None,
    timeout: float = 600,
    cwd: str | Path | None = None,
) -> dict[str, Any]:
    """The command without and with the layer (N = n, blocks >= min_size): faults, RSS, times.

    `env`: added to os.environ for both runs (an LD_PRELOAD there stays, after the layer).
    Returns {"without": {...}, "with": {... "stats": [per process]}, "minor_faults_without",
    "minor_faults_with", "minor_faults_avoided", "fault_bytes_avoided" (avoided x page size),
    "same_output" (stdout, stderr and exit code identical), ...}."""
    lib = Path(layer) if layer is not None else build_layer()
    base = dict(os.environ)
    base.update(env or {})
    if static_threshold:
        base["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    without = run_measured(argv, base, timeout, cwd)
    with tempfile.TemporaryDirectory(prefix="cache002-") as tmp:
        stats_path = Path(tmp) / "stats"
        with_env = dict(base)
        with_env["LD_PRELOAD"] = " ".join(p for p in (str(lib), base.get("LD_PRELOAD", "")) if p)
        with_env["HEAPCAST_CACHE_N"] = str(n)
        with_env["HEAPCAST_CACHE_MIN"] = str(min_size)
        with_env["HEAPCAST_CACHE_MADV_FREE"] = "1" if madv_free else "0"
        with_env["HEAPCAST_CACHE_STATS"] = str(stats_path)
        with_layer = run_measured(argv, with_env, timeout, cwd)
        with_layer["stats"] = parse_stats(stats_path.read_text()) if stats_path.exists() else []
    page = os.sysconf("SC_PAGE_SIZE")
    avoided = without["minor_faults"] - with_layer["minor_faults"]
    same = all(
        without[k] == with_layer[k] for k in ("returncode", "stdout_sha256", "stderr_sha256")
    )
    return {
        "argv": [str(a) for a in argv],
        "n": n,
        "min_size": min_size,
        "madv_free": madv_free,
        "static_threshold": static_threshold,
        "without": without,
        "with": with_layer,
        "minor_faults": with_layer["minor_faults"],
        "minor_faults_without": without["minor_faults"],
        "minor_faults_with": with_layer["minor_faults"],
        "minor_faults_avoided": avoided,
        "fault_bytes_avoided": avoided * page,
        "page_size": page,
        "same_output": same,
        "hits": sum(s.get("hits", 0) for s in with_layer["stats"]),
        "misses": sum(s.get("misses", 0) for s in with_layer["stats"]),
    }
