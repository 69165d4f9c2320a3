"""tasks.dataset.convert: one raw trace -> events rows, exactly (pairing, lifetimes, tokens, order)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.convert import convert_trace, events_from_trace, pair_frees
from tasks.dataset.events_schema import EVENTS_SCHEMA
from tasks.format.trace_reader import Op, parse_trace, read_trace
from tests.conftest import need_tool
from tests.tracegen import (
    Rec,
    calloc,
    free,
    malloc,
    memalign,
    module,
    realloc,
    synthetic_records,
    thread_start,
    trace_bytes,
)

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[3]
LIB = PROJECT / "native" / "build" / "libheapcast.so"


def convert(recs, **header) -> pa.Table:
    return events_from_trace(parse_trace(trace_bytes(recs, **header), "test.hct"))


def col(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def test_schema_is_the_contract():
    table = convert([thread_start(0, 7), malloc(1, 10, 0x10)])
    assert table.schema.equals(EVENTS_SCHEMA, check_metadata=True)
    empty = convert([])
    assert empty.num_rows == 0 and empty.schema.equals(EVENTS_SCHEMA)


def test_reused_address_pairs_with_latest_allocation():
    # GIVEN a block at 0x100 freed, then a new block at the same address, freed again
    table = convert(
        [
            thread_start(0, 50),
            malloc(10, 24, 0x100),
            malloc(15, 8, 0x200),
            free(20, 0x100),
            malloc(30, 1000, 0x100),
            free(45, 0x100),
            free(50, 0x200),
        ]
    )
    # THEN each free gets the size of the block it frees, and each block its lifetime
    assert col(table, "op") == [Op.MALLOC, Op.MALLOC, Op.FREE, Op.MALLOC, Op.FREE, Op.FREE]
    assert col(table, "freed_size") == [None, None, 24, None, 1000, 8]
    # a plain free's freed block is its addr: freed_addr is left null there
    assert col(table, "freed_addr") == [None] * 6
    assert col(table, "addr") == [0x100, 0x200, 0x100, 0x100, 0x100, 0x200]
    assert col(table, "lifetime_ns") == [10, 35, None, 15, None, None]
    assert col(table, "lifetime_calls") == [2, 4, None, 1, None, None]
    assert col(table, "token") == [5, 4, 32 + 5, 10, 32 + 10, 32 + 4]
    assert col(table, "tid") == [50] * 6
    assert col(table, "seq") == list(range(6))
    assert col(table, "time_ns") == [10, 15, 20, 30, 45, 50]


def test_double_free_and_unknown_free_are_unpaired_not_fatal():
    table, stats = convert_trace(
        parse_trace(
            trace_bytes([malloc(1, 64, 0x100), free(2, 0x100), free(3, 0x100), free(4, 0xDEAD0)]),
            "t.hct",
        )
    )
    assert col(table, "freed_size") == [None, 64, None, None]
    assert col(table, "token") == [7, 39, 32, 32]
    assert col(table, "lifetime_calls") == [1, None, None, None]
    assert stats.unpaired_frees == 2
    assert stats.never_freed == 0


def test_realloc_chain_in_place_and_moving():
    table, stats = convert_trace(
        parse_trace(
            trace_bytes(
                [
                    malloc(10, 100, 0xA0),
                    realloc(20, 0xA0, 200, 0xB0),  # moves: frees 100 at A0, new 200 at B0
                    realloc(30, 0xB0, 300, 0xB0),  # in place: frees 200 at B0, new 300 at B0
                    realloc(40, 0, 16, 0xC0),  # realloc(NULL, 16): an allocation only
                    realloc(50, 0xB0, 0, 0),  # realloc(p, 0) -> NULL: frees 300, free token
                    realloc(60, 0xC0, 1 << 20, 0),  # failed realloc: frees nothing, C0 stays live
                    free(70, 0xC0),
                ]
            ),
            "t.hct",
        )
    )
    # realloc's old block (null for realloc(NULL, n), a failed realloc, and a plain free)
    assert col(table, "freed_addr") == [None, 0xA0, 0xB0, None, 0xB0, None, None]
    assert col(table, "freed_size") == [None, 100, 200, None, 300, None, 16]
    assert col(table, "lifetime_ns") == [10, 10, 20, 30, None, None, None]
    assert col(table, "lifetime_calls") == [1, 1, 2, 3, None, None, None]
    assert col(table, "token") == [7, 8, 9, 5, 32 + 9, 21, 32 + 5]
    assert stats.unpaired_frees == 0 and stats.never_freed == 0
    assert stats.failed_allocations == 1
    assert stats.peak_live_bytes == 316


def test_failed_allocation_aligned_forms_and_calloc():
    table = convert(
        [
            malloc(1, 1 << 39, 0),
            memalign(2, 64, 1024, 0x1000),
            memalign(3, 4096, 10, 0x2000, op=Op.VALLOC),
            calloc(4, 300, 0x3000),
            free(5, 0x1000),
        ]
    )
    assert col(table, "alignment") == [None, 64, 4096, None, None]
    assert col(table, "lifetime_calls") == [None, 3, None, None, None]
    assert col(table, "token") == [31, 11, 4, 9, 43]
    assert col(table, "size") == [1 << 39, 1024, 10, 300, 0]


def test_threads_sorted_by_time_then_position_with_tids_and_seq():
    # GIVEN two threads whose buffers were appended in blocks (thread 1's block first)
    recs = [
        thread_start(5, 901, thread=1),
        malloc(6, 10, 0x500, thread=1),
        free(40, 0x100, thread=1),  # frees thread 0's block
        thread_start(1, 900),
        malloc(2, 16, 0x100),
        malloc(6, 20, 0x600),
        free(50, 0x500),
    ]
    table = convert(recs)
    # THEN rows are in time order (ties by file position), markers are not rows
    assert col(table, "time_ns") == [2, 6, 6, 40, 50]
    assert col(table, "thread") == [0, 1, 0, 1, 0]
    assert col(table, "tid") == [900, 901, 900, 901, 900]
    assert col(table, "seq") == [0, 0, 1, 1, 2]
    # and a free on another thread pairs across threads (pairing is per process)
    assert col(table, "freed_size") == [None, None, None, 16, 10]
    assert col(table, "lifetime_calls") == [3, 3, None, None, None]


def test_caller_recorded_and_tsc_clock():
    recs = [
        Rec(1000, Op.MALLOC, 8, 0x10, 0, 0, caller=0x401000),
        Rec(1500, Op.FREE, 0, 0x10, 0, 0, caller=0x401010),
    ]
    table = convert(
        recs, caller=True, clock=2, start_ticks=1000, ns_per_tick=0.5, start_monotonic_ns=7_000
    )
    assert col(table, "caller") == [0x401000, 0x401010]
    assert col(table, "time_ns") == [7_000, 7_250]
    assert col(table, "lifetime_ns") == [250, None]
    assert convert([malloc(1, 8, 0x10)]).column("caller").null_count == 1


def reference_pairing(def_addr, free_addr):
    """The article's way, a dict of live pointers, as the oracle for the vectorised pairing."""
    live: dict[int, int] = {}
    alloc_of_free = [-1] * len(def_addr)
    free_of_alloc = [-1] * len(def_addr)
    for i, (d, f) in enumerate(zip(def_addr.tolist(), free_addr.tolist())):
        if f and f in live:
            j = live.pop(f)
            alloc_of_free[i], free_of_alloc[j] = j, i
        if d:
            live[d] = i
    return alloc_of_free, free_of_alloc


def assert_pairs_as_the_reference(rng, pool: np.ndarray, n: int) -> None:
    """n rows, each allocating at a random address of `pool` half the time and freeing one half
    the time: pair_frees pairs them as reference_pairing does."""
    def_addr = np.where(rng.random(n) < 0.5, rng.choice(pool, n), 0).astype(np.uint64)
    free_addr = np.where(rng.random(n) < 0.5, rng.choice(pool, n), 0).astype(np.uint64)
    p = pair_frees(def_addr, free_addr)
    a, f = reference_pairing(def_addr, free_addr)
    assert p.alloc_of_free.tolist() == a and p.free_of_alloc.tolist() == f


@pytest.mark.parametrize("seed", range(5))
def test_pairing_matches_a_dict_of_live_pointers(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    # few distinct addresses, including high ones (other mmap regions), so reuse, double frees,
    # and frees of never-allocated addresses all happen
    pool = np.array(
        [0x5555_0000_1000 + 16 * k for k in range(20)]
        + [0x7FFF_F000_0000 + 4096 * k for k in range(5)],
        dtype=np.uint64,
    )
    assert_pairs_as_the_reference(rng, pool, n)


def test_pairing_with_unaligned_addresses_takes_the_general_path():
    # odd addresses spread over the whole 64-bit range do not fit the packed sort key
    rng = np.random.default_rng(3)
    pool = rng.integers(1, 2**63, 40, dtype=np.uint64) | np.uint64(1)
    assert_pairs_as_the_reference(rng, pool, 500)


def test_synthetic_multithreaded_trace_has_every_free_paired():
    trace = parse_trace(trace_bytes(synthetic_records(20_000, threads=3)), "s.hct")
    table, stats = convert_trace(trace)
    assert table.num_rows == len(trace) - 3
    assert stats.unpaired_frees == 0 and stats.never_freed == 0
    t = np.asarray(table.column("time_ns"))
    assert np.all(np.diff(t) >= 0)
    assert sum(stats.token_hist) == table.num_rows


@pytest.mark.parametrize("threads", [1, 3])
def test_results_do_not_depend_on_the_chunk_size(monkeypatch, threads):
    # GIVEN a trace converted with the usual chunk size (one chunk for this small trace)
    trace = parse_trace(trace_bytes(synthetic_records(20_000, threads=threads)), "s.hct")
    table, stats = convert_trace(trace)
    # WHEN it is converted again in chunks of 7 rows/entries (keys, pairs, tokens, live bytes,
    # constant columns all cross chunk boundaries), groups of 5 rows (lifetimes, freed sizes,
    # call numbers and live bytes cross groups) and unpack steps of 3 records
    import tasks.dataset.convert as convert_module

    monkeypatch.setattr(convert_module, "_CHUNK", 7)
    monkeypatch.setattr(convert_module, "GROUP_ROWS", 5)
    monkeypatch.setattr(convert_module, "_UNPACK_STEP", 3)
    table7, stats7 = convert_trace(trace)
    # THEN rows and facts are the same
    assert table7.equals(table) and stats7 == stats
    # reallocs, failed and aligned allocations across chunk boundaries too
    recs = [thread_start(0, 5)]
    for k in range(40):
        t, b = 100 * k, 0x1000 * (k % 7 + 1)
        recs += [
            malloc(t + 1, 100 + k, b),
            realloc(t + 2, b, 200, b + 0x10),
            realloc(t + 3, b + 0x10, 0, 0),
            realloc(t + 4, 0, 16, b + 0x20),
            realloc(t + 5, b + 0x20, 1 << 20, 0),
            memalign(t + 6, 64, 1024, b + 0x40),
            free(t + 7, b + 0x20),
            free(t + 8, b + 0x40),
            free(t + 9, 0xDEAD0),
        ]
    trace = parse_trace(trace_bytes(recs), "r.hct")
    table7, stats7 = convert_trace(trace)
    monkeypatch.setattr(convert_module, "_CHUNK", 1 << 20)
    monkeypatch.setattr(convert_module, "GROUP_ROWS", 1 << 22)
    monkeypatch.setattr(convert_module, "_UNPACK_STEP", 1 << 15)
    assert table7.equals(convert_trace(trace)[0]) and stats7 == convert_trace(trace)[1]
    rng = np.random.default_rng(9)
    pool = np.array([0x5555_0000_1000 + 16 * k for k in range(20)], dtype=np.uint64)
    def_addr = np.where(rng.random(500) < 0.5, rng.choice(pool, 500), 0).astype(np.uint64)
    free_addr = np.where(rng.random(500) < 0.5, rng.choice(pool, 500), 0).astype(np.uint64)
    p = pair_frees(def_addr, free_addr)
    assert (p.alloc_of_free.tolist(), p.free_of_alloc.tolist()) == reference_pairing(
        def_addr, free_addr
    )


# ------------------------------------------------------------------ a real trace from a C program


@pytest.fixture(scope="module")
def pairs_trace(tmp_path_factory) -> Path:
    need_tool("gcc")
    if not LIB.exists():
        subprocess.run(["make", "-C", str(PROJECT / "native")], check=True, capture_output=True)
    tmp = tmp_path_factory.mktemp("pairs")
    exe = tmp / "pairs"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-fno-builtin",
            "-pthread",
            "-o",
            str(exe),
            str(Path(__file__).parent / "programs" / "pairs.c"),
        ],
        check=True,
    )
    out = tmp / "out"
    out.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(LIB), HEAPCAST_OUT=str(out))
    done = subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == "done\n"
    (path,) = out.glob("*.hct")
    return path


def test_real_trace_of_a_c_program_exactly(pairs_trace):
    table = events_from_trace(read_trace(pairs_trace)).to_pandas()
    start = table.index[(table["op"] == Op.MALLOC) & (table["size"] == 777777)][0]
    main = table[table["thread"] == 0].loc[start + 2 :].head(10)  # after the marker's free
    assert main["op"].tolist() == [
        Op.MALLOC,
        Op.CALLOC,
        Op.FREE,
        Op.REALLOC,
        Op.POSIX_MEMALIGN,
        Op.MALLOC,
        Op.FREE,
        Op.FREE,
        Op.REALLOC,
        Op.MALLOC,
    ]
    assert main["size"].tolist() == [100, 300, 0, 5000, 1024, 24, 0, 0, 0, 24]
    assert main["freed_size"].fillna(-1).tolist() == [-1, -1, 100, 300, -1, -1, 5000, 1024, 24, -1]
    assert main["token"].tolist() == [7, 9, 39, 13, 11, 5, 45, 43, 37, 5]
    assert main["lifetime_calls"].fillna(-1).tolist() == [2, 2, -1, 3, 3, 3, -1, -1, -1, -1]
    assert main["alignment"].fillna(0).tolist() == [0, 0, 0, 0, 64, 0, 0, 0, 0, 0]
    lt = main["lifetime_ns"].dropna()
    assert (lt > 0).all()
    # the worker thread: its own tid, its block freed with its size
    worker = table[(table["thread"] != 0) & (table["size"] == 40) & (table["op"] == Op.MALLOC)]
    assert len(worker) == 1
    w = worker.iloc[0]
    freeing = table.loc[worker.index[0] + int(w["lifetime_calls"])]
    assert freeing["op"] == Op.FREE and freeing["freed_size"] == 40 and freeing["token"] == 38
    assert w["tid"] != table.loc[start, "tid"]


def test_pairing_with_far_apart_address_regions_takes_the_unique_path():
    # aligned addresses whose high 32 bits span more than the id table covers (> 2^22 apart)
    rng = np.random.default_rng(4)
    pool = np.array(
        [0x0000_0100_0000_1000 + 16 * k for k in range(10)]
        + [0x7F00_0000_0000_2000 + 16 * k for k in range(10)],
        dtype=np.uint64,
    )
    assert_pairs_as_the_reference(rng, pool, 800)


def test_callers_get_their_module_and_offset_from_the_module_map():
    # GIVEN a caller trace with two modules (FORMAT.md, Modules), one loaded between records
    recs = (
        module(0, 0x5000, 0x9000, 0x4000, "/bin/prog")
        + [thread_start(1, 7), malloc(2, 10, 0x10, caller=0x5010)]
        + module(3, 0x70000, 0x78000, 0x70000, "/lib/libx.so")
        + [free(4, 0x10, caller=0x70020), malloc(5, 8, 0x20, caller=0x99)]
    )
    table = convert(recs, caller=True)
    # THEN each row keeps its raw caller and gets (module, caller - load bias), null outside
    assert col(table, "caller") == [0x5010, 0x70020, 0x99]
    assert col(table, "caller_module") == ["/bin/prog", "/lib/libx.so", None]
    assert col(table, "caller_offset") == [0x1010, 0x20, None]
    assert table.schema.equals(EVENTS_SCHEMA, check_metadata=True)


def test_traces_without_a_module_map_have_null_module_columns():
    # version 1 files (no module records) and traces without callers
    for table in (
        convert([thread_start(0, 7), malloc(1, 10, 0x10, caller=0x5)], caller=True, version=1),
        convert([thread_start(0, 7), malloc(1, 10, 0x10)]),
    ):
        assert col(table, "caller_module") == [None] and col(table, "caller_offset") == [None]
