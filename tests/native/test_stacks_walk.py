"""The unwinder's shortcut never changes a stack: each thread's next walk reuses the frames of
its last one above the first frame found unchanged (native/README.md, Call stacks). The
walk-check build steps every reused walk again in full and counts the walks that differ; on
real programs with deep, varied stacks (CPython's evaluator, perl's interpreter, gcc's cc1)
none may differ, and most walks must be reused (else the shortcut saves nothing)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.native.tracer_harness import NATIVE, read_traces, tracer_env

PYTHON = (
    "import json\nd=[{'k': i, 'v': [str(j) * (i % 7) for j in range(i % 13)]} for i in range(3000)]\n"
    "print(len(json.loads(json.dumps(d))))\n"
)
PERL = 'my %h; for my $i (1..30000) { $h{$i} = "x" x ($i % 50); } print scalar(keys %h), "\\n"'
C_SOURCE = "int f(int x) { return x * 3; }\nint main(void) { return f(2) - 6; }\n"

CHECK = re.compile(r"heapcast walk check: (\d+) walks, (\d+) reused, (\d+) differed")


@pytest.fixture(scope="module")
def walkcheck_lib():
    subprocess.run(["make", "-s", "-C", str(NATIVE), "walkcheck"], check=True)
    return NATIVE / "build" / "libheapcast_walkcheck.so"


def programs(tmp_path):
    src = tmp_path / "f.c"
    src.write_text(C_SOURCE)
    return {
        "python3": (["python3", "-c", PYTHON], {"PYTHONMALLOC": "malloc"}),
        "perl": (["perl", "-e", PERL], {}),
        "gcc": (["gcc", "-O2", "-c", str(src), "-o", str(tmp_path / "f.o")], {}),
    }


@pytest.mark.parametrize("name", ["python3", "perl", "gcc"])
def test_reused_walks_equal_full_walks_on_real_programs(name, walkcheck_lib, tmp_path):
    argv, extra = programs(tmp_path)[name]
    if shutil.which(argv[0]) is None:
        pytest.fail(f"{argv[0]} is not installed (scripts/setup.sh installs it)")
    out = tmp_path / "traces"
    out.mkdir()
    untraced = {k: v for k, v in tracer_env(walkcheck_lib, None).items() if k != "LD_PRELOAD"}
    plain = subprocess.run(argv, capture_output=True, text=True, env={**untraced, **extra})
    traced = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**tracer_env(walkcheck_lib, out), "HEAPCAST_FRAMES": "32", **extra},
    )
    # THEN the program did what it does untraced
    assert traced.returncode == plain.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    # AND every process's check found no reused walk that differs from a full one
    counts = [tuple(map(int, m)) for m in CHECK.findall(traced.stderr)]
    assert counts, f"no walk check line on stderr: {traced.stderr[-500:]}"
    walks = sum(c[0] for c in counts)
    reused = sum(c[1] for c in counts)
    assert sum(c[2] for c in counts) == 0, counts
    assert reused > 0.5 * walks, f"only {reused} of {walks} walks reused"
    # AND the traces carry stacks deeper than the caller, in one trie per process
    traces = read_traces(out)
    assert traces and all(t.header.has_stacks for t in traces)
    main = max(traces, key=len)
    allocating = main.stack != 0
    assert allocating.sum() > 1000
    depth = main.stacks.depth[main.stacks.index(main.stack[allocating])]
    assert np.median(depth) >= 5
    # frame 0 of every stack is the record's caller
    frames = main.stacks.frames(main.stack[allocating], max_depth=1)[:, 0]
    assert np.array_equal(frames, main.caller[allocating])
