"""The placement layer keyed on the calling context (native/context_key.h, `depth`): the keys it
computes inside a program are the dataset's context keys of the same calls
(tasks/dataset/contexts.py); a first run's context sites tell apart the blocks one wrapper
makes for different callers, where one frame cannot; depth 1 is the call site as before; the
program's output is unchanged across threads, fork and signal frames."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tasks.dataset.contexts import stack_contexts
from tasks.dataset.convert import convert_groups
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.stacks_table import ProcessStacks, run_stacks
from tests.native.test_place import (  # noqa: F401 (built: the module's fixture)
    EAGER,
    JEMALLOC,
    PYTHON,
    REPO,
    _run,
    _same_output,
    _stats,
    built,
)
from tests.native.tracer_harness import NATIVE

pytestmark = pytest.mark.slow

PROMPT = "dirty_decay_ms:0,muzzy_decay_ms:0"
# the counter at its most eager (every allocation sampled, long past 100 more): every context
# with two blocks that outlive 100 allocations is written long, the requests' and the entries'
EVERY_LONG = "sample=1,horizon=100,falls=0,min_mb=0"
# a burst's requests live 50,000 allocations, the entries the whole run: only the entries go long
ENTRIES_LONG = "horizon=80000,min_mb=0"
AS_IS = ["6", "50000", "100"]  # burstkv: 6 bursts, 500 entries each
WRAP = [*AS_IS, "wrap"]  # every block through xmalloc


@pytest.fixture(scope="module")
def burstkv(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("burstkv") / "burstkv"
    src = REPO / "benchmarks" / "programs" / "burstkv.c"
    subprocess.run(["gcc", "-O2", "-g", "-Wall", "-o", str(exe), str(src)], check=True)
    return exe


def _learned(exe: Path, argv: list[str], sites: Path, setting: str) -> list[str]:
    """The sites file a run under `setting` with learn=`sites` wrote (its lines)."""
    r = _run([exe, *argv], place=f"{setting},learn={sites}")
    assert r.returncode == 0, r.stderr
    return sites.read_text().splitlines()


def _dataset_contexts(run_traced, exe: Path, argv: list[str], depths) -> dict[str, dict]:
    """Per depth, the dataset's context key of the wrapper's calls from each of its callers
    (frame 1's function: new_request, new_entry), from a traced run with call stacks."""
    run = run_traced([exe, *argv], HEAPCAST_CALLER="1", HEAPCAST_FRAMES="32")
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    ps = ProcessStacks.of_trace(trace)
    list(convert_groups(trace, ps)[0])  # names every stack the records use
    frames = StackFrames.of_table(run_stacks([ps.table()]).table)
    keys = stack_contexts(frames, tuple(depths))
    names = frames.frames.function
    out: dict[int, dict[str, set[int]]] = {d: {} for d in depths}
    for k in range(len(frames)):  # a loop over distinct stacks
        rows = frames.frame_rows[frames.start[k] : frames.start[k + 1]]
        if len(rows) < 2 or "xmalloc" not in names[rows[0]]:
            continue
        caller = names[rows[1]].split("(")[0]
        for d in depths:
            out[d].setdefault(caller, set()).add(int(keys[d][k]))
    return out


@pytest.mark.parametrize("depth", [2, 3, 8])
def test_the_layer_computes_the_contexts_the_dataset_names(burstkv, run_traced, tmp_path, depth):
    # GIVEN burstkv's wrapper calls, traced with their stacks, and their context keys as the
    # dataset computes them (module + offset of each frame, folded: contexts.py)
    named = _dataset_contexts(run_traced, burstkv, ["2", "3000", "100", "wrap"], [depth])[depth]
    assert set(named) == {"main", "new_request", "new_entry"}, named  # main: the two arrays
    assert len(named["new_request"]) == len(named["new_entry"]) == 1, named
    # WHEN the layer learns at that depth, every context with two long blocks written (not
    # main's: one array each)
    lines = _learned(
        burstkv, ["2", "3000", "100", "wrap"], tmp_path / "s", f"{EVERY_LONG},depth={depth}"
    )
    # THEN its file says its depth, and its keys are the dataset's keys of the two callers
    assert lines[0] == f"# heapcast place sites 2 depth={depth}"
    assert {int(x, 16) for x in lines[1:]} == named["new_request"] | named["new_entry"]


def _end_rss(exe: Path, argv: list[str], place: str | None) -> tuple[int, dict]:
    r = _run([exe, *argv], place=None if place is None else f"{place},stats=1", conf=PROMPT)
    assert r.returncode == 0, r.stderr
    (end,) = [int(x.split()[-1]) for x in r.stderr.splitlines() if x.startswith("rss_kb end")]
    stats = _stats(r.stderr) if place is not None else [{}]
    return end, stats[0]


def test_context_sites_separate_a_wrapper_s_blocks_where_one_frame_cannot(burstkv, tmp_path):
    # GIVEN burstkv with every block through one wrapper, learned once at depth 1 and at depth 2
    one = _learned(burstkv, WRAP, tmp_path / "one", f"{ENTRIES_LONG},depth=1")
    two = _learned(burstkv, WRAP, tmp_path / "two", f"{ENTRIES_LONG},depth=2")
    # THEN one frame finds no long site (the wrapper's blocks are mostly short), the context one
    assert one == ["# heapcast place sites 2 depth=1"]
    assert len(two) == 2 and two[0] == "# heapcast place sites 2 depth=2"
    # WHEN a second run places by each file, jemalloc returning freed pages at once
    alone, _ = _end_rss(burstkv, WRAP, None)
    by_one, s1 = _end_rss(burstkv, WRAP, f"mode=sites,sites={tmp_path / 'one'}")
    by_two, s2 = _end_rss(burstkv, WRAP, f"mode=sites,sites={tmp_path / 'two'}")
    # THEN the context places exactly the entries long (6 bursts of 500), one frame nothing,
    # and only the context's run gives the bursts' pages back
    assert (s1["depth"], s1["long"]) == ("1", "0") and (s2["depth"], s2["long"]) == ("2", "3000")
    assert by_two < 0.6 * alone and by_one > 0.9 * alone, (by_two, by_one, alone)


def test_depth_1_keys_on_the_call_site_as_before(burstkv, tmp_path):
    # GIVEN burstkv as is (the requests and the entries from two call sites), learned at depth 1
    lines = _learned(burstkv, AS_IS, tmp_path / "s", f"{ENTRIES_LONG},depth=1")
    # THEN the file is "module offset" lines, the program's one long site (new_entry's malloc)
    assert lines[0] == "# heapcast place sites 2 depth=1" and len(lines) == 2
    module, offset = lines[1].rsplit(" ", 1)
    assert module == "-" and int(offset, 16) > 0
    # AND a format 1 file (no first line) is read as depth 1, placing the same blocks
    old = tmp_path / "old"
    old.write_text(lines[1] + "\n")
    _, by_old = _end_rss(burstkv, AS_IS, f"mode=sites,sites={old}")
    _, by_new = _end_rss(burstkv, AS_IS, f"mode=sites,sites={tmp_path / 's'}")
    assert by_old["long"] == by_new["long"] == "3000" and by_old["depth"] == "1"


def test_a_sites_file_of_an_unknown_format_is_one_line_and_nothing_long(burstkv, tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("# heapcast place sites 3 depth=2\n1234\n")
    r = _run([burstkv, "2", "3000", "100", "wrap"], place=f"mode=sites,sites={bad},stats=1")
    assert r.returncode == 0
    said = [x for x in r.stderr.splitlines() if x.startswith("heapcast place: sites file")]
    assert said == [
        f"heapcast place: sites file {bad} is not one this layer reads (formats 1 and 2, "
        "depth 1..16); every site is short"
    ]
    assert _stats(r.stderr)[0]["long"] == "0"


@pytest.mark.parametrize("depth", [2, 16])
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("threads", []),
        ("thread_churn", []),
        ("fronts", ["relay", "2000", "8", "3000"]),
        ("forkbig", ["40", "300000"]),
        ("fork", ["exit"]),
        ("calltree", []),  # a signal handler's allocations: walks through the signal frame
    ],
)
def test_same_output_keyed_on_the_context(program, name, args, depth):
    exe = program(name)
    alone = _run([exe, *args], place=None)
    under = _run([exe, *args], place=f"{EAGER},depth={depth}")
    assert under.returncode == alone.returncode, (under.returncode, under.stderr[-2000:])
    assert alone.returncode == (3 if name == "calltree" else 0)  # calltree's own exit code
    _same_output(name, under, alone)


@pytest.fixture(scope="module")
def place_check() -> Path:
    """The placement layer built with -DHC_CTX_CHECK: each key computed again from scratch."""
    subprocess.run(["make", "-s", "-C", str(NATIVE), "placecheck"], check=True)
    return NATIVE / "build" / "libheapcast_place_check.so"


PYTHON_THREADS = """
import json, threading
def work(n):
    json.dumps([{"k": i, "v": str(i) * 3} for i in range(n)])
ts = [threading.Thread(target=work, args=(5000 + t,)) for t in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("ok")
"""


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("burstkv", ["2", "20000", "100", "wrap"]),  # two callers of one wrapper, alternating
        (
            "calltree",
            [],
        ),  # signal frames, an alternate stack, longjmp, threads, a frame without CFI
        ("fronts", ["relay", "2000", "8", "3000"]),  # threads
        ("python", ["-c", PYTHON_THREADS]),  # an interpreter's deep stacks, on four threads
    ],
)
def test_the_thread_s_last_walk_gives_the_key_a_fresh_walk_gives(
    place_check, program, burstkv, name, args
):
    # GIVEN a program, and the layer built to compute every key again without the last walk
    exe = {"burstkv": burstkv, "python": PYTHON}.get(name) or program(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env |= {"LD_PRELOAD": f"{place_check} {JEMALLOC}", "HEAPCAST_PLACE": "depth=8"}
    env["PYTHONMALLOC"] = "malloc"  # CPython's objects through malloc, not its own pools
    # WHEN it runs keyed on 8 frames
    r = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=300)
    # THEN every key the reused walks gave is the one a walk from scratch gives
    said = re.findall(r"heapcast context check: (\d+) keys, (\d+) differed", r.stderr)
    assert said and all(int(n) > 0 for n, _ in said), r.stderr[-2000:]
    assert all(d == "0" for _, d in said), said


def test_libraries_unloaded_and_reloaded_keyed_on_the_context(program, place_check, tmp_path):
    # GIVEN two libraries, each dlopen'ed, allocated through and dlclose'd in turn, 3 rounds
    libs = []
    for name in ("a", "b"):
        so = tmp_path / f"libplugin_{name}.so"
        src = REPO / "tests" / "native" / "programs" / "plugin.c"
        subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-o", so, src], check=True)
        libs.append(so)
    argv = [program("place_reload", "-ldl"), "3", *libs]
    alone = _run(argv, place=None)
    assert alone.returncode == 0 and alone.stdout.startswith("rounds=3 kept=300 "), alone.stderr
    # WHEN the layer keys on the context (every block sampled, long after 100 more)
    under = _run(argv, place=f"{EAGER},depth=4")
    # THEN the output is jemalloc's
    assert under.returncode == 0 and under.stdout == alone.stdout, under.stderr[-2000:]
    # AND the checked build's reused walks agree with fresh ones across the unloads
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env |= {"LD_PRELOAD": f"{place_check} {JEMALLOC}", "HEAPCAST_PLACE": f"{EAGER},depth=4"}
    r = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True)
    assert r.stdout == alone.stdout
    (said,) = re.findall(r"heapcast context check: (\d+) keys, (\d+) differed", r.stderr)
    assert int(said[0]) >= 30000 and said[1] == "0", said
