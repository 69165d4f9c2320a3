"""benchmarks/reference: the article's tracer re-implemented writes the article's log, exactly in
the formats bench_convert.reference_line_loop parses, without changing the traced program."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_convert import reference_line_loop, sqlite_sql
from benchmarks.reference.article_log import build, trace_to_gzip_log
from tests.conftest import need_tool

T = rb"(\d+)\.(\d{6})\t(-?\d+)\t"
P = rb"(0x[0-9a-f]+|\(nil\))"
ALLOC = re.compile(T + rb"(\d+)\t" + P + rb"\n")
FREE = re.compile(T + rb"-1\t" + P + rb"\n")
REALLOC = re.compile(T + rb"(\d+)\t" + P + rb"\t" + P + rb"\n")


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    need_tool("cc", "gcc")
    return build(tmp_path_factory.mktemp("libtracemalloc"))


def read_log(log_gz: Path) -> list[bytes]:
    with gzip.open(log_gz) as f:
        return f.readlines()


def test_sqlite3_log_is_the_articles_format_and_parses(lib, tmp_path):
    sqlite3 = need_tool("sqlite3")
    sql = tmp_path / "bench.sql"
    sqlite_sql(2000, sql)

    def argv(tag: str) -> list[str]:  # the queries' output goes to a file: stdout is /dev/null
        out = tmp_path / f"{tag}.out"
        return [sqlite3, "-cmd", f".output {out}", str(tmp_path / f"{tag}.db")]

    with open(sql, "rb") as stdin:
        subprocess.run(argv("plain"), stdin=stdin, stdout=subprocess.DEVNULL, check=True)
    log_gz = tmp_path / "article.log.gz"
    n = trace_to_gzip_log(argv("traced"), sql, log_gz, tmp_path / "work", lib=lib)

    plain, traced = (tmp_path / "plain.out").read_bytes(), (tmp_path / "traced.out").read_bytes()
    assert plain and traced == plain
    assert not (tmp_path / "work" / "tracemalloc.log").exists()  # the plain log is removed

    lines = read_log(log_gz)
    assert len(lines) == n > 50_000
    allocs = frees = nil_frees = realloc_new_blocks = 0
    times, threads = [], set()
    for line in lines:
        if m := FREE.fullmatch(line):
            if m[4] == b"(nil)":
                nil_frees += 1
            else:
                frees += 1
        elif m := ALLOC.fullmatch(line):
            allocs += 1
        elif m := REALLOC.fullmatch(line):
            realloc_new_blocks += m[6] == b"(nil)" and m[5] != b"(nil)"
        else:
            pytest.fail(f"not one of the article's formats: {line!r}")
        times.append(int(m[1]) * 1_000_000 + int(m[2]))
        threads.add(m[3])
    assert times[0] == 0  # relative to the first logged call, as in the article's example
    assert all(a <= b for a, b in zip(times, times[1:]))  # one thread: time order = log order
    assert len(threads) == 1 and int(threads.pop()) > 0  # pthread_self() as %ld
    # sqlite3 frees (nearly) every block it allocates, and frees only blocks it allocated
    blocks = allocs + realloc_new_blocks
    assert 0.99 * blocks <= frees <= blocks

    parsed = reference_line_loop(log_gz, None)
    assert parsed["lines"] == n
    assert parsed["checksum"]["unpaired_frees"] == nil_frees  # only free(NULL) pairs with nothing


def test_threads_get_their_own_pthread_self(lib, tmp_path):
    code = (
        "import threading\n"
        "def work():\n"
        "    for i in range(2000): bytearray(100 + i)\n"
        "ts = [threading.Thread(target=work) for _ in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
    )
    log_gz = tmp_path / "py.log.gz"
    n = trace_to_gzip_log([sys.executable, "-c", code], None, log_gz, tmp_path / "work", lib=lib)
    lines = read_log(log_gz)
    assert len(lines) == n
    for line in lines:  # the mutex keeps every line whole
        assert FREE.fullmatch(line) or ALLOC.fullmatch(line) or REALLOC.fullmatch(line), line
    assert len({line.split(b"\t")[1] for line in lines}) >= 2


def test_untraced_when_the_log_exists_or_is_not_set(lib, tmp_path):
    """O_EXCL as in the article: an existing log is left alone and the program runs untraced."""
    sqlite3 = need_tool("sqlite3")
    log = tmp_path / "taken.log"
    log.write_bytes(b"someone else's\n")
    for env in ({"TRACEMALLOC_LOG": str(log)}, {}):
        out = subprocess.run(
            [sqlite3, ":memory:", "SELECT 6*7;"],
            capture_output=True,
            check=True,
            env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(lib), **env},
        )
        assert out.stdout == b"42\n"
    assert log.read_bytes() == b"someone else's\n"
