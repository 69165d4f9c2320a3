"""The cache layer keyed on the freed block's allocation context (table format 4, native/TABLE.md
"Context entries"): the keys it computes when it hands a block out are the dataset's context keys
of the same calls (tasks/dataset/contexts.py), so a table written from them tells apart the
blocks one wrapper makes for two callers, where the free's call site (one free wrapper) cannot;
a format 4 file it cannot trust is refused in one line; programs with threads, fork and
signal frames print what they print alone while every large request walks its context."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.table.distill import ClassTable, ContextCounts
from tasks.learning.table.layer_file import (
    CLASS_BYTES,
    CONTEXT_ENTRY,
    HEADER,
    MAGIC,
    fnv1a64,
    write_layer_table,
)
from tests.native.test_layer import _env, _stats, heapcast_layer  # noqa: F401 (fixture)
from tests.native.test_place_context import _dataset_contexts

ARGS = ["20", "1", "3", "300000"]  # 20 rounds: 1 scratch block, 3 records, 300 kB (class 19)
CLASS = 19
MAJORITY = np.full(REUSE_CLASSES, 1.0 / REUSE_CLASSES)
DEPTH = 4


def _table(soon: dict[int, bool]) -> ClassTable:
    """Every class never reused (not asked: entries send unknown keys to the counter); each
    context given at CLASS: all its frees reused within 1 call (soon) or never."""
    counts = np.zeros((32, REUSE_CLASSES))
    counts[:, REUSE_CLASSES - 1] = 100.0
    keys = sorted(soon)
    per = np.zeros((len(keys), REUSE_CLASSES))
    for i, k in enumerate(keys):
        per[i, 0 if soon[k] else REUSE_CLASSES - 1] = 100.0
    ctx = ContextCounts(DEPTH, np.array(keys, np.int64), np.full(len(keys), CLASS), per)
    return ClassTable(counts, MAJORITY, None, ctx)


def _run(layer: Path, exe: Path, table: Path, stats: Path):
    setting = f"policy=guided,predictor=table:{table},model=7,proof=0,stats={stats}"
    return subprocess.run([exe, *ARGS], capture_output=True, text=True, env=_env(layer, setting))


def test_two_contexts_through_one_wrapper_get_their_own_answers(
    heapcast_layer,  # noqa: F811
    program,
    run_traced,
    tmp_path,
):
    # GIVEN the wrapper's calls from its two callers, named as the dataset names them (a traced
    # run with stacks, their context keys at depth 4)
    exe = program("ctxwrap")
    named = _dataset_contexts(run_traced, exe, ARGS, (DEPTH,))[DEPTH]
    (scratch,), (record,) = named["make_scratch"], named["make_record"]
    assert scratch != record
    plain = subprocess.run([exe, *ARGS], capture_output=True, text=True, check=True).stdout
    rows = {}
    for keep in ("scratch", "record"):
        # WHEN a format 4 table says one caller's blocks come back soon and the other's never
        table = write_layer_table(
            tmp_path / f"{keep}.hcltab",
            _table({scratch: keep == "scratch", record: keep == "record"}),
            7,
        )
        assert struct.unpack_from("<I", table.read_bytes(), 8)[0] == 4
        stats = tmp_path / f"stats-{keep}"
        r = _run(heapcast_layer, exe, table, stats)
        assert r.returncode == 0 and r.stderr == "" and r.stdout == plain
        (rows[keep],) = _stats(stats)
    # THEN every large free the layer tracked (all but those glibc served from its heap before
    # its mmap threshold settled: `heap`) was answered by its allocation's context entry ...
    frees = 20 * (1 + 3)
    for row in rows.values():
        assert row["table"] == 1 and row["table_sites"] == 0
        assert row["table_contexts"] + row["heap"] == frees and row["heap"] <= 4
    # ... and the layer kept the blocks of the caller the table named, none of the other's
    s, r = rows["scratch"], rows["record"]
    assert 20 * 1 - s["heap"] <= s["kept"] <= 20 * 1
    assert 20 * 3 - r["heap"] <= r["kept"] <= 20 * 3


def _v4(tail: bytes, depth: int = DEPTH, sites: int = 0) -> bytes:
    payload = bytes(CLASS_BYTES) + struct.pack("<II", depth, sites) + tail
    return HEADER.pack(MAGIC, 4, 7, 64, len(payload), fnv1a64(payload)) + payload


def _entries(*keys: tuple[int, int]) -> bytes:
    e = np.zeros(len(keys), CONTEXT_ENTRY)
    for i, (ctx, cls) in enumerate(keys):
        e[i] = (ctx, cls << 8 | 200)
    return e.tobytes()


@pytest.mark.parametrize(
    "data, reason",
    [
        (
            _v4(_entries((5, CLASS), (3, CLASS))),
            "is corrupt (context entries out of order or out of range)",
        ),
        (
            _v4(_entries((5, CLASS), (5, CLASS))),
            "is corrupt (context entries out of order or out of range)",
        ),
        (
            _v4(_entries((1 << 63, CLASS))),
            "is corrupt (context entries out of order or out of range)",
        ),
        (_v4(_entries((5, 40))), "is corrupt (context entries out of order or out of range)"),
        (
            _v4(_entries((5, CLASS)) + b"\0"),
            "has another shape (site entries of 4 bytes, then context entries of 12 expected)",
        ),
        (
            _v4(_entries((5, CLASS)), sites=9),
            "has another shape (site entries of 4 bytes, then context entries of 12 expected)",
        ),
        (_v4(_entries((5, CLASS)), depth=1), "has a context depth outside 2..16"),
        (_v4(_entries((5, CLASS)), depth=17), "has a context depth outside 2..16"),
        (
            _v4(b"")[: HEADER.size + CLASS_BYTES + 4],
            "has a payload of the wrong length (truncated or extended)",
        ),
    ],
    ids=[
        "falling",
        "twice",
        "key-63-bits",
        "class",
        "partial",
        "sites",
        "depth-1",
        "depth-17",
        "cut",
    ],
)
def test_a_format_4_table_it_cannot_trust_is_refused_in_one_line(
    heapcast_layer,  # noqa: F811
    program,
    data,
    reason,
    tmp_path,
):
    # GIVEN a format 4 file the layer must not trust
    table = tmp_path / "bad.hcltab"
    table.write_bytes(data)
    stats = tmp_path / "stats"
    exe = program("ctxwrap")
    plain = subprocess.run([exe, *ARGS], capture_output=True, text=True, check=True).stdout
    r = _run(heapcast_layer, exe, table, stats)
    # THEN one line says why, and the program runs with the online counter, output unchanged
    assert r.returncode == 0 and r.stdout == plain
    assert r.stderr.splitlines() == [
        f"heapcast layer: table file {table} refused: it {reason}; "
        "the guided policy uses the online counter"
    ]
    (row,) = _stats(stats)
    assert row["table"] == 0 and row["table_refused"] == 1 and row["table_contexts"] == 0


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("fronts", ["relay", "200000", "8", "3000"]),  # 8 threads trading large blocks
        ("forkbig", ["40", "300000"]),  # fork beside a thread working on large blocks
        ("bigblocks", ["5", "4", "300000", "1000000", "2500000"]),  # every allocating form
        ("calltree", []),  # signal frames, an alternate stack, longjmp, threads
    ],
)
def test_same_output_with_a_table_of_contexts(heapcast_layer, program, name, args, tmp_path):  # noqa: F811
    # GIVEN a format 4 table (entries at keys these programs never compute: every in-scope
    # large request walks its context, every free finds no entry and asks the counter)
    per = np.zeros((2, REUSE_CLASSES))
    per[:, 0] = 10
    ctx = ContextCounts(DEPTH, np.array([1, 2]), np.array([CLASS, CLASS]), per)
    table = write_layer_table(
        tmp_path / "t.hcltab", ClassTable(np.ones((32, REUSE_CLASSES)), MAJORITY, None, ctx), 7
    )
    exe = program(name)
    alone = subprocess.run([exe, *args], capture_output=True, text=True, env=_env(None))
    stats = tmp_path / "stats"
    under = subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        env=_env(heapcast_layer, f"policy=guided,predictor=table:{table},model=7,stats={stats}"),
    )
    # THEN the program prints and exits as alone, and the layer used the table
    assert under.returncode == alone.returncode, (under.returncode, under.stderr[-2000:])
    assert under.stdout == alone.stdout and under.stderr == alone.stderr
    rows = _stats(stats)
    assert rows and all(r["table"] == 1 and r["table_contexts"] == 0 for r in rows)
