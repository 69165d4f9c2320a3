"""The log the seed article's tracer itself writes: build libtracemalloc.c, run a program under it.

benchmarks/bench_convert.py compares heapcast's raw trace -> Parquet conversion with the article's
approach, a gzip'ed text log parsed line by line in Python. A log synthesised from heapcast's own
trace (bench_convert.write_text_log) carries heapcast's timestamps: calls ~60 ns apart, many
sharing a microsecond, which compresses better than what the article's tracer produces. This
module gives the real thing: libtracemalloc.c (here, re-implemented from the article's
description: gettimeofday + sprintf + one write() per call under one global mutex) is preloaded
into the same workload, and its log, with the tracer's own timestamps and overhead, is gzip'ed
at level 6 (as gzip.open does) for the benchmark to parse.

    lib = build(Path("/tmp/x"))
    lines = trace_to_gzip_log(["sqlite3", "/tmp/x/bench.db"], Path("bench.sql"),
                              Path("/tmp/x/article.log.gz"), Path("/tmp/x/work"))
"""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("libtracemalloc.c")
LIB_NAME = "libtracemalloc.so"
CHUNK = 1 << 20


def build(out_dir: Path) -> Path:
    """out_dir/libtracemalloc.so, compiled when missing or older than libtracemalloc.c."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIB_NAME
    if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
        return lib
    tmp = out_dir / f".{LIB_NAME}.{os.getpid()}.tmp"
    cc = os.environ.get("CC", "cc")
    # -fno-builtin-*: the compiler must not turn the tracer's own code into calls to the hooks.
    subprocess.run(
        [
            cc,
            "-O2",
            "-shared",
            "-fPIC",
            "-Wall",
            "-fno-builtin-malloc",
            "-fno-builtin-calloc",
            "-fno-builtin-realloc",
            "-fno-builtin-free",
            "-o",
            str(tmp),
            str(SOURCE),
            "-ldl",
            "-lpthread",
        ],
        check=True,
    )
    os.replace(tmp, lib)
    return lib


def trace_to_gzip_log(
    argv: list[str], stdin_path: Path | None, log_gz: Path, work: Path, *, lib: Path | None = None
) -> int:
    """Run argv under the tracer (stdin from stdin_path or /dev/null, stdout to /dev/null) and
    gzip its log into log_gz; returns the number of lines (= logged calls).

    The plain log is written to work/tracemalloc.log (removed first: the tracer opens it with
    O_EXCL) and deleted once compressed; it is streamed through gzip, never read whole (22 M calls
    make ~1 GB). lib: a built library; default: build(work).
    """
    work.mkdir(parents=True, exist_ok=True)
    lib = lib or build(work)
    log = work / "tracemalloc.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(lib), TRACEMALLOC_LOG=str(log))
    stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL, env=env)
    finally:
        if stdin_path is not None:
            stdin.close()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    if not log.exists():
        raise RuntimeError(f"{argv[0]} ran but the tracer wrote no log at {log}")
    lines = 0
    try:
        with open(log, "rb") as fin, gzip.open(log_gz, "wb", compresslevel=6) as fout:
            while chunk := fin.read(CHUNK):
                lines += chunk.count(b"\n")
                fout.write(chunk)
    finally:
        log.unlink(missing_ok=True)
    return lines


__all__ = ["build", "trace_to_gzip_log", "SOURCE", "LIB_NAME"]
