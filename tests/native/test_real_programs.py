"""Real programs (Debian packages) run traced with unchanged output and exit code."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tasks.format.trace_reader import Op
from tasks.replay.inputs import generate_input
from tests.conftest import need_tool
from tests.localhost import free_port
from tests.native.tracer_harness import read_traces, tracer_env

PYTHON = Path("/usr/bin/python3.11")  # the real binary, not a shim that forks


def need(tool: str) -> str:
    return need_tool(tool)


def test_sqlite3_output_unchanged(libheapcast, trace_dir, tmp_path, assert_frees_paired):
    # GIVEN sqlite3 and the catalog's generated SQL (bulk inserts, indexes, mixed queries,
    # updates, deletes: the sqlite3 workload's input)
    sqlite3 = need("sqlite3")
    (name,) = generate_input("sql", 1, 8_000, tmp_path)
    script = (tmp_path / name).read_text()
    plain = subprocess.run(
        [sqlite3, ":memory:"],
        input=script,
        capture_output=True,
        text=True,
        env=tracer_env(libheapcast, None) | {"LD_PRELOAD": ""},
        timeout=300,
    )

    # WHEN it runs traced
    traced = subprocess.run(
        [sqlite3, ":memory:"],
        input=script,
        capture_output=True,
        text=True,
        env=tracer_env(libheapcast, trace_dir),
        timeout=300,
    )

    # THEN its output and exit code are unchanged, and its one trace is consistent
    assert plain.returncode == traced.returncode == 0
    assert traced.stdout == plain.stdout and plain.stdout.count("\n") >= 17
    assert traced.stderr == plain.stderr == ""
    (trace,) = read_traces(trace_dir)
    assert trace.header.cmdline == (sqlite3, ":memory:")
    counts = trace.counts_by_op()
    assert counts["malloc"] > 20_000 and counts["free"] > 20_000
    assert_frees_paired(trace)


CHURN = """
import json
d = {}
for i in range(20000):
    d[f"k{i}"] = [i, str(i) * (i % 7), {"v": i * 3}]
text = json.dumps(d, sort_keys=True)
back = json.loads(text)
lists = [list(range(i % 50)) for i in range(5000)]
print(len(text), sum(len(v[1]) for v in back.values()), sum(map(len, lists)))
"""


def test_cpython_output_unchanged(libheapcast, trace_dir, assert_frees_paired):
    # GIVEN Debian's CPython with PYTHONMALLOC=malloc (every object through malloc)
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is not installed (apt-get install python3.11)")
    argv = [str(PYTHON), "-c", CHURN]
    plain = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONMALLOC": "malloc"},
        timeout=300,
    )

    # WHEN it runs a dict/list/json churn traced
    traced = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env=tracer_env(libheapcast, trace_dir, PYTHONMALLOC="malloc"),
    )

    # THEN output and exit code are unchanged, and the trace holds its >10k heap calls
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout and traced.stderr == plain.stderr == ""
    (trace,) = read_traces(trace_dir)
    assert trace.header.cmdline == tuple(argv)
    assert len(trace) > 10_000
    assert (trace.op == Op.MALLOC).sum() > 10_000
    assert_frees_paired(trace)


def test_redis_server_runs_and_shuts_down_cleanly(
    libheapcast, trace_dir, tmp_path, assert_frees_paired
):
    # GIVEN Debian's redis-server (linked against jemalloc, calls malloc_usable_size)
    server, cli = need("redis-server"), need("redis-cli")
    port = free_port()
    plain_env = {"PATH": os.environ["PATH"]}
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(tmp_path),
        ],
        env=tracer_env(libheapcast, trace_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # WHEN it is pinged and used by an untraced redis-cli, then shut down
        def cli_run(*args: str) -> str:
            return subprocess.run(
                [cli, "-p", str(port), *args],
                capture_output=True,
                text=True,
                env=plain_env,
                timeout=30,
            ).stdout.strip()

        deadline = time.monotonic() + 30
        while cli_run("ping") != "PONG":
            assert proc.poll() is None, f"redis-server died: {proc.communicate()}"
            assert time.monotonic() < deadline, "redis-server did not answer PING in 30 s"
            time.sleep(0.1)
        for i in range(3):
            assert cli_run("set", f"key{i}", "v" * (i + 1)) == "OK"
        subprocess.run(
            [cli, "-p", str(port)],
            input="".join(f"SET k{i} {i}\n" for i in range(500)),
            capture_output=True,
            text=True,
            env=plain_env,
            timeout=30,
            check=True,
        )
        assert cli_run("dbsize") == "503"
        assert cli_run("get", "k499") == "499"
        cli_run("shutdown", "nosave")
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # THEN it exited cleanly and its trace is readable
    assert proc.returncode == 0, err
    assert "ready to exit" in out
    assert "heapcast" not in err
    traces = read_traces(trace_dir)
    assert len(traces) == 1
    (trace,) = traces
    assert trace.header.cmdline[0] == server or trace.header.cmdline[0].startswith("redis-server")
    assert (trace.op == Op.MALLOC).sum() > 1000
    assert (trace.op == Op.THREAD_START).sum() >= 1
    assert_frees_paired(trace)
