"""The placement layer (native/layers/place.c, issue 45) in front of jemalloc: output and exit code
as under jemalloc alone, on every interposed function, at start-up, across threads and fork, on
foreign and double frees, on blocks that change arena, and on real programs; the online counter
finds the long-lived call site of a bursty workload; it steps aside, with one line, where the next
allocator has no arenas API or an option is wrong.

Modes under test: predict (the online counter, the default), size with big=0 (every request to
the long arena through mallocx: the arenas path on every call), size (the realloc test: requests
of 1000 bytes and more in the long arena), sites (a first run's learned sites)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_tool
from tests.native.tracer_harness import NATIVE, STARTUP_DLSYM_SERVED

pytestmark = pytest.mark.slow

REPO = NATIVE.parent
PLACE = NATIVE / "build" / "libheapcast_place.so"
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
PYTHON = Path("/usr/bin/python3.11")  # the real binary, not a shim that forks
MODES = ["mode=predict", "mode=size,big=0"]
# what the layer sets through jemalloc's malloc_conf symbol (place.c says why): jemalloc alone with
# it is the allocator the layer stands in front of, where its undefined behaviour (a double free,
# a foreign pointer) is compared
LAYER_CONF = "lg_extent_max_active_fit:10"
# and the counter at its most eager: every allocation sampled, long after 100 more, no site ever
# kept short, no floor of resident memory (sites flip between the arenas all the time, samples
# freed by other threads, the tables under contention)
EAGER = "mode=predict,sample=1,horizon=100,falls=0,min_mb=0"


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if not JEMALLOC.is_file():
        pytest.fail("the placement tests need jemalloc: apt-get install libjemalloc2")
    subprocess.run(["make", "-s", "-C", str(NATIVE), "place"], check=True)
    assert PLACE.is_file()


def _same_output(name: str, under, alone) -> None:
    """The program printed under the layer what it printed under jemalloc alone."""
    if name in ("threads", "thread_churn", "fork"):  # thread ids, pids: the lines' shape only
        assert len(under.stdout.splitlines()) == len(alone.stdout.splitlines())
    else:
        assert under.stdout == alone.stdout
    assert under.stderr == alone.stderr


def _run(
    argv, *, place: str | None, jemalloc: bool = True, stdin: str | None = None, conf: str = ""
):
    """argv under jemalloc alone (place None) or the layer in front of it (HEAPCAST_PLACE=place),
    with MALLOC_CONF=conf if given."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    for k in ("LD_PRELOAD", "MALLOC_CONF"):
        e.pop(k, None)
    if conf:
        e["MALLOC_CONF"] = conf
    libs = ([str(PLACE)] if place is not None else []) + ([str(JEMALLOC)] if jemalloc else [])
    if libs:
        e["LD_PRELOAD"] = " ".join(libs)
    if place is not None:
        e["HEAPCAST_PLACE"] = place
    return subprocess.run(
        [str(a) for a in argv], env=e, input=stdin, capture_output=True, text=True, timeout=300
    )


def _stats(text: str) -> list[dict[str, str]]:
    return [
        dict(f.split("=", 1) for f in line.removeprefix("heapcast place: ").split())
        for line in text.splitlines()
        if line.startswith("heapcast place: pid=")
    ]


@pytest.fixture(scope="module")
def burstkv(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("burstkv") / "burstkv"
    src = REPO / "benchmarks" / "programs" / "burstkv.c"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(src)], check=True)
    return exe


@pytest.mark.parametrize("mode", [*MODES, EAGER])
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("allforms", ["12", "3000"]),  # every entry point, small blocks
        ("allforms", ["12", "300000"]),  # and large ones
        ("threads", []),
        ("thread_churn", []),  # threads that exit while others allocate
        ("handoff", ["100", "4194304"]),  # a reader thread's blocks freed by main
        ("fronts", ["relay", "2000", "8", "3000"]),  # blocks traded and freed across threads
        ("forkbig", ["40", "300000"]),  # fork beside a working thread
        ("fork", ["exit"]),
        ("place_realloc", ["200"]),
    ],
)
def test_same_output_as_jemalloc_alone(program, mode, name, args):
    exe = program(name)
    alone = _run([exe, *args], place=None)
    under = _run([exe, *args], place=mode)
    if name == "allforms":
        # jemalloc exports no pvalloc: alone, glibc's pvalloc block reaches jemalloc's free and
        # the program dies; the layer serves pvalloc by memalign, as glibc does
        plain = _run([exe, *args], place=None, jemalloc=False)
        assert alone.returncode != 0
        assert (under.returncode, under.stdout) == (0, plain.stdout), under.stderr[-2000:]
        return
    assert under.returncode == alone.returncode == 0, (under.returncode, under.stderr[-2000:])
    _same_output(name, under, alone)


def test_realloc_across_arenas(program, tmp_path):
    """GIVEN blocks grown past, shrunk below and grown again past 1000 bytes, and blocks one
    thread made and another grows and frees, WHEN requests of >= 1000 bytes go to the long arena
    (mode=size,big=1000), THEN every content check holds and the output is jemalloc's."""
    exe = program("place_realloc")
    stats = tmp_path / "stats"
    alone = _run([exe, "300"], place=None)
    under = _run([exe, "300"], place=f"mode=size,big=1000,stats={stats}")
    assert under.returncode == alone.returncode == 0, under.stderr
    assert under.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert row["mode"] == "size" and int(row["long"]) >= 3 * 300, row


def test_allocation_while_the_layer_resolves_is_served_or_refused(program):
    # the program's own dlsym allocates on the layer's first lookup (../real.h, bootstrap pool)
    exe = program("startup_dlsym", "-rdynamic")
    for mode in MODES:
        r = _run([exe], place=mode)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        assert r.stdout.splitlines() == STARTUP_DLSYM_SERVED


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "args", [["300000"], ["64"], ["300000", "realloc"], ["64", "realloc"]]
)  # fmt: skip
def test_double_free_reaches_jemalloc_as_without_the_layer(program, mode, args):
    """The second free reaches jemalloc as it is (the layer keeps nothing, dedupes nothing).
    Under the online counter the program sees what it sees under jemalloc alone; with every
    request in the long arena (mallocx without a thread cache) the blocks after it come from
    elsewhere than the thread cache the double free filled, so jemalloc's "same" can become
    "distinct", never the reverse."""
    exe = program("doublefree")
    alone = _run([exe, *args], place=None, conf=LAYER_CONF)
    under = _run([exe, *args], place=mode)
    if mode == "mode=predict":
        assert (under.returncode, under.stdout) == (alone.returncode, alone.stdout)
    else:
        # the program ends as it does alone (jemalloc's own crash on a large block's double
        # free included: the same signal), except that alone's "same" (exit 1) may become
        # "distinct" (exit 0); a crash of the layer's own is neither
        ends = {(under.returncode, under.stdout), (alone.returncode, alone.stdout)}
        allowed = {(alone.returncode, alone.stdout)}
        if alone.stdout == "same\n":
            allowed.add((0, "distinct\n"))
        assert (under.returncode, under.stdout) in allowed, (under, alone)
        assert len(ends) == 1 or alone.returncode == 1, (under, alone)


@pytest.mark.parametrize("mode", MODES)
def test_foreign_pointer_reaches_jemalloc(program, mode):
    exe = program("foreign")
    alone = _run([exe], place=None, conf=LAYER_CONF)
    under = _run([exe], place=mode)
    assert (under.returncode, under.stdout) == (alone.returncode, alone.stdout)


def test_the_online_counter_finds_the_long_lived_site(burstkv, tmp_path):
    """GIVEN 6 bursts of 100 k short-lived requests with one long-lived entry per 100 from
    another call site, WHEN the counter learns (default: 1 in 64 sampled, horizon 262144), THEN
    the entry site is long and most entries go to the long arena (the first burst's are placed
    before the site's blocks outlive the horizon); the learned sites file names that one site,
    and a run placing by it (mode=sites) places every entry; output unchanged throughout."""
    argv = [burstkv, "6", "100000", "100"]
    alone = _run(argv, place=None)
    stats, sites = tmp_path / "stats", tmp_path / "sites"
    under = _run(argv, place=f"stats={stats},learn={sites}")
    assert under.returncode == alone.returncode == 0 and under.stdout == alone.stdout
    assert alone.stdout == "entries=6000 sum=76674660\n"
    (row,) = _stats(stats.read_text())
    assert row["mode"] == "predict" and int(row["sites_long"]) == 1, row
    assert 2000 < int(row["long"]) <= 6000, row
    # the layer judges its own long placements, the entries' (those freed at exit within the
    # horizon count young): every one it judged was placed long, so it judged no more than that
    judged = int(row["long_old"]) + int(row["long_young"])
    assert 0 < judged <= int(row["long"]), row
    # at the default depth (1) the one site is a call site, "module offset" (native/TABLE.md)
    head, line = sites.read_text().splitlines()
    assert head == "# heapcast place sites 2 depth=1" and len(line.split()) == 2, (head, line)
    stats.unlink()
    bound = _run(argv, place=f"mode=sites,sites={sites},stats={stats}")
    assert bound.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert (row["mode"], row["long"], row["sampled"]) == ("sites", "6000", "0"), row


@pytest.mark.parametrize(("size", "placed_long"), [(1000, True), (16384, False), (300000, False)])
def test_a_large_block_is_never_placed_long_by_a_prediction(program, tmp_path, size, placed_long):
    """GIVEN one call site whose every block lives to the end, WHEN the counter learns it at its
    most eager, THEN its small blocks go to the long arena and its large ones (jemalloc's large
    classes, from 16 KiB: an extent of their own, which pins no neighbour) never do; placement by
    size alone keeps its own rule; the output is jemalloc's."""
    exe = program("place_large")
    argv = [exe, "3000", str(size)]
    alone = _run(argv, place=None)
    stats = tmp_path / "stats"
    under = _run(argv, place=f"{EAGER},stats={stats}")
    assert under.returncode == alone.returncode == 0 and under.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert int(row["sites_long"]) >= 1, row  # the site is long either way
    if placed_long:
        assert int(row["long"]) > 2000, row
    else:
        assert int(row["long"]) == 0, row
    stats.unlink()
    by_size = _run(argv, place=f"mode=size,big=0,stats={stats}")
    assert by_size.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert int(row["long"]) >= 3000, row  # and the few of start-up and printf


@pytest.mark.parametrize(
    ("place", "size", "second_arena"),
    [
        ("mode=predict", 1000, False),  # 3000 allocations: nothing outlives the horizon
        (EAGER, 16384, False),  # long, but of a large class: never placed long
        (EAGER, 1000, True),
        (EAGER.replace(",min_mb=0", ""), 1000, False),  # long, but a 3 MB process: the floor
        ("mode=size,big=0", 16384, True),
    ],
)
def test_the_long_arena_is_made_only_when_something_goes_long(program, place, size, second_arena):
    """GIVEN one call site keeping every block, WHEN nothing it asks is placed long, THEN
    jemalloc has the arenas it has alone (the long arena, and jemalloc's control tables with it,
    cost about 240 KiB resident a process); when something is, one more; the output is the
    same."""
    argv = [program("place_large"), "3000", str(size), "arenas"]
    alone = _run(argv, place=None)
    automatic = int(re.search(r"arenas=(\d+)", alone.stdout).group(1))
    assert automatic >= 1, alone.stdout
    under = _run(argv, place=place)
    assert under.returncode == 0, under.stderr
    assert under.stdout == alone.stdout.replace(
        f"arenas={automatic}\n", f"arenas={automatic + second_arena}\n"
    )


def test_a_small_process_places_nothing_long_by_the_counter_and_says_so(program, tmp_path):
    """GIVEN one call site keeping every block, which the counter calls long, WHEN the process
    stays under min_mb resident (16 MB by default), THEN nothing goes long (the long arena would
    cost more than it can save there): by default the counter does not even learn (it waits for
    learn_mb, 16 MB: nothing sampled, `waiting=1`); made to learn at once (learn_mb=0) it finds
    the site long and the stats line counts what was held short; with a floor it passes (1 MB),
    or none (min_mb=0), the site's blocks go long."""
    argv = [program("place_large"), "3000", "1000"]
    alone = _run(argv, place=None)
    rows = {}
    eager = EAGER.replace(",min_mb=0", "")
    for i, floor in enumerate(("", ",learn_mb=0", ",min_mb=1", ",min_mb=0")):
        stats = tmp_path / f"stats{i}"
        under = _run(argv, place=f"{eager}{floor},stats={stats}")
        assert under.returncode == 0 and under.stdout == alone.stdout, under.stderr
        (rows[floor],) = _stats(stats.read_text())
    waited = rows[""]
    assert (waited["waiting"], waited["sampled"], waited["sites_seen"], waited["long"]) == (
        "1",
        "0",
        "0",
        "0",
    ), waited
    held = rows[",learn_mb=0"]
    assert (held["sites_long"], held["long"], held["waiting"]) == ("1", "0", "0"), held
    assert int(held["held_small"]) > 2500, held
    for floor in (",min_mb=1", ",min_mb=0"):
        row = rows[floor]
        assert int(row["long"]) > 2500 and row["held_small"] == "0", row
        assert row["waiting"] == "0", row


@pytest.fixture(scope="module")
def place_wait(tmp_path_factory) -> Path:
    gxx = need_tool("g++", "g++")
    exe = tmp_path_factory.mktemp("wait") / "place_wait"
    src = NATIVE.parent / "tests" / "native" / "programs" / "place_wait.cpp"
    subprocess.run([gxx, "-O1", "-g", "-Wall", "-pthread", "-o", str(exe), str(src)], check=True)
    return exe


def test_the_counter_learns_from_learn_mb_while_threads_free_and_delete(place_wait, tmp_path):
    """GIVEN four threads allocating and freeing by malloc/free and every kind of delete, WHEN the
    process passes learn_mb (16 MB by default) halfway (the main thread touches 24 MB), THEN the
    counter samples from then on only: fewer samples than learning from the start (learn_mb=0),
    none at all under a learn_mb it never reaches; free and every delete change their path under
    the running threads, the output is jemalloc's, and the sampled blocks' frees are seen (nearly
    all of them die young: freed_short)."""
    argv = [place_wait, "4", "200000", "24"]
    alone = _run(argv, place=None)
    assert alone.returncode == 0 and alone.stdout.startswith("entries=12500 "), alone.stdout
    rows = {}
    for i, learn in enumerate(("learn_mb=0", "", "learn_mb=64,min_mb=64")):
        stats = tmp_path / f"stats{i}"
        under = _run(argv, place=f"{learn},stats={stats}".lstrip(","))
        assert under.returncode == 0 and under.stdout == alone.stdout, under.stderr[-2000:]
        (rows[learn],) = _stats(stats.read_text())
    at_once, waited, never = rows["learn_mb=0"], rows[""], rows["learn_mb=64,min_mb=64"]
    for row in (at_once, waited):
        assert row["waiting"] == "0", row
        recorded = int(row["sampled"]) - int(row["dropped"])  # dropped: its slot was busy
        assert int(row["freed_short"]) > 0.9 * recorded > 0, row
    # learnt over the second halves only
    assert int(waited["sampled"]) < 0.6 * int(at_once["sampled"]), (waited, at_once)
    assert (never["waiting"], never["sampled"], never["freed_short"]) == ("1", "0", "0"), never


def test_a_site_whose_verdict_falls_back_to_short_stays_short(program, tmp_path):
    """GIVEN one call site whose blocks live long, then die young, then live long again, WHEN the
    counter learns it, THEN by default the site steps aside once its verdict falls back to short
    (none of the last phase's blocks placed long; the stats line counts it), while with falls=0
    it goes long again; the output is jemalloc's either way. Keyed on the call site (depth=1):
    the phases call `make` from two lines of main, which the calling context tells apart.

    Where the sampled blocks land in the layer's table follows their addresses: the counts move
    by a few dozen with the address layout, so the program runs with it fixed (`setarch -R`)."""
    argv = ["setarch", platform.machine(), "-R", program("place_falls"), "3000", "3000"]
    alone = _run(argv, place=None)
    assert alone.stdout == "kept=6000 brief=3000 sum=1132812\n"
    rows = {}
    for falls in ("", ",falls=0"):
        stats = tmp_path / f"stats{len(falls)}"
        under = _run(argv, place=f"{EAGER.replace(',falls=0', falls)},depth=1,stats={stats}")
        assert under.returncode == 0 and under.stdout == alone.stdout, under.stderr
        (rows[falls],) = _stats(stats.read_text())
    aside, again = rows[""], rows[",falls=0"]
    assert (aside["sites_aside"], aside["sites_long"]) == ("1", "0"), aside
    assert (again["sites_aside"], again["sites_long"]) == ("0", "1"), again
    # the first phase's blocks go long in both; only falls=0 places the last phase's too
    assert 2500 < int(aside["long"]) <= 3100, aside
    assert int(again["long"]) > int(aside["long"]) + 2000, again


def test_placement_lowers_rss_after_bursts_when_jemalloc_returns_pages(burstkv, tmp_path):
    """With jemalloc returning freed pages at once (dirty_decay_ms:0), the pages a burst's short
    blocks emptied go back; without placement the long entries pin them. The bound (sites known
    from the start) ends far below jemalloc alone; the online counter below it too."""

    def end_rss(place: str | None) -> int:
        argv = [burstkv, "8", "200000", "100"]
        r = _run(argv, place=place, conf="dirty_decay_ms:0,muzzy_decay_ms:0")
        assert r.returncode == 0, r.stderr
        (end,) = [int(x.split()[-1]) for x in r.stderr.splitlines() if x.startswith("rss_kb end")]
        return end

    sites = tmp_path / "sites"
    alone = end_rss(None)
    predict = end_rss(f"mode=predict,learn={sites}")
    bound = end_rss(f"mode=sites,sites={sites}")
    assert bound < 0.4 * alone and predict < 0.8 * alone, (bound, predict, alone)


def test_mode_off_passes_every_call_and_its_stats_line_says_so(program, tmp_path):
    """mode=off (the layer loaded, placement off: the allocators stage's reference arm) routes
    nothing and makes no arena, and its stats line names the mode, every count 0, so that a run
    can be verified as the one it claims to be."""
    argv = [program("place_large"), "3000", "1000", "arenas"]
    alone = _run(argv, place=None)
    stats = tmp_path / "stats"
    under = _run(argv, place=f"mode=off,stats={stats}")
    assert (under.returncode, under.stdout) == (0, alone.stdout)
    (row,) = _stats(stats.read_text())
    assert row["mode"] == "off" and row["long"] == row["sampled"] == row["sites_seen"] == "0"


def test_steps_aside_without_an_arenas_api(program):
    """glibc behind it (no mallctl): one line on stderr, every call passed through."""
    exe = program("allforms")
    plain = _run([exe, "4", "3000"], place=None, jemalloc=False)
    under = _run([exe, "4", "3000"], place="stats=1", jemalloc=False)
    assert (under.returncode, under.stdout) == (0, plain.stdout)
    assert under.stderr.splitlines() == [
        "heapcast place: the next allocator has no arenas API (mallctl, mallocx: jemalloc's); "
        "passing every call through"
    ]


@pytest.mark.parametrize("bad", ["mode=fast", "pct=101"])
def test_a_bad_option_is_one_line_and_a_pass_through(program, bad):
    exe = program("allforms")
    alone = _run([exe, "4", "3000"], place=None, jemalloc=False)
    under = _run([exe, "4", "3000"], place=f"{bad},stats=1")
    assert (under.returncode, under.stdout) == (0, alone.stdout)
    (line,) = [x for x in under.stderr.splitlines() if "heapcast" in x]
    assert line.startswith(f"heapcast place: cannot parse HEAPCAST_PLACE item '{bad}'")


def test_sqlite3_output_unchanged(tmp_path):
    from tasks.replay.inputs import generate_input

    sqlite3 = need_tool("sqlite3")
    (name,) = generate_input("sql", 1, 8_000, tmp_path)
    script = (tmp_path / name).read_text()
    alone = _run([sqlite3, ":memory:"], place=None, stdin=script)
    for mode in MODES:
        under = _run([sqlite3, ":memory:"], place=mode, stdin=script)
        assert under.returncode == alone.returncode == 0, under.stderr[-2000:]
        assert under.stdout == alone.stdout and alone.stdout.count("\n") >= 17
        assert under.stderr == alone.stderr == ""


def test_python_numpy_threads_output_unchanged():
    """python3 with numpy and a thread pool, under the online counter and all-long placement."""
    code = (
        "import numpy as np\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "def work(i):\n"
        "    a = [np.full(100 + i, i, dtype=np.float64) for _ in range(2000)]\n"
        "    d = {j: str(j) * (j % 7) for j in range(20000)}\n"
        "    return float(sum(x.sum() for x in a[::3])) + len(d)\n"
        "with ThreadPoolExecutor(4) as ex:\n"
        "    print(sum(ex.map(work, range(16))))\n"
    )
    alone = _run([PYTHON, "-c", code], place=None)
    assert alone.returncode == 0, alone.stderr[-2000:]
    for mode in MODES:
        under = _run([PYTHON, "-c", code], place=mode)
        assert under.returncode == 0, under.stderr[-2000:]
        assert under.stdout == alone.stdout and under.stderr == ""


@pytest.fixture(scope="module")
def place_cxx(tmp_path_factory) -> Path:
    gxx = need_tool("g++", "g++")
    exe = tmp_path_factory.mktemp("cxx") / "place_cxx"
    src = NATIVE.parent / "tests" / "native" / "programs" / "place_cxx.cpp"
    subprocess.run([gxx, "-O1", "-g", "-Wall", "-o", str(exe), str(src)], check=True)
    return exe


@pytest.mark.parametrize("mode", [*MODES, EAGER])
def test_cxx_new_and_delete_same_output(place_cxx, mode):
    """operator new and delete in every form (array, aligned, nothrow, sized), a bad_alloc
    thrown through the layer's frames and caught: the output is jemalloc's own."""
    argv = [place_cxx, "4", "20000", "50"]
    alone = _run(argv, place=None)
    under = _run(argv, place=mode)
    assert under.returncode == alone.returncode == 0, under.stderr[-2000:]
    assert under.stdout == alone.stdout == "bad_alloc\nentries=1600 sum=12689288\n"
    assert under.stderr == ""


def test_cxx_long_lived_site_is_placed(place_cxx, tmp_path):
    """GIVEN requests that die within 64 allocations and entries kept to the end, both by new
    (which jemalloc serves itself, past malloc), WHEN the horizon is 20000 allocations, THEN the
    entries' site is long and most entries go to the long arena."""
    stats = tmp_path / "stats"
    r = _run([place_cxx, "6", "50000", "50"], place=f"horizon=20000,min_mb=0,stats={stats}")
    assert r.returncode == 0 and r.stdout == "bad_alloc\nentries=6000 sum=60941164\n"
    (row,) = _stats(stats.read_text())
    assert int(row["sites_long"]) >= 1 and 4500 < int(row["long"]) < 12000, row


# ---- the lifetime table (table=FILE; native/TABLE.md, "The placement's lifetime table") ----


def _table(path: Path, keys, score: int) -> Path:
    from tasks.registry.table_files import write_lifetime_table

    keys = sorted(set(keys))
    return write_lifetime_table(path, keys, [score] * len(keys), 0)


@pytest.fixture(scope="module")
def burstkv_keys(burstkv, tmp_path_factory) -> list[int]:
    """Every (call site, size class) key of burstkv's own two call sites (request buffers and
    entries), as the training data names them: the sites a run learning every call site
    (horizon=1, depth=1) wrote as "- OFFSET", hashed by tasks/dataset/sites.py call_sites from
    the program's path (as the tracer records it) and the offset."""
    import pyarrow as pa

    from tasks.dataset.sites import call_sites

    sites = tmp_path_factory.mktemp("learn") / "sites"
    r = _run([burstkv, "1", "2000", "10"], place=f"sample=1,horizon=1,depth=1,learn={sites}")
    assert r.returncode == 0, r.stderr
    offsets = [int(x.split()[1], 16) for x in sites.read_text().splitlines() if x[:2] == "- "]
    assert len(offsets) == 2, sites.read_text()
    exe = os.path.realpath(burstkv)
    rows = pa.table({"caller_module": [exe] * 2, "caller_offset": pa.array(offsets, pa.uint64())})
    return sorted(int(s) * 32 + c for s in call_sites(rows) for c in range(32))


def test_the_table_places_where_it_knows_the_site_the_counter_elsewhere(
    burstkv, burstkv_keys, tmp_path
):
    """GIVEN burstkv (6 bursts of 100 k short requests, an entry kept per 100 from another site),
    WHEN a table keyed as the training data keys them marks both of its sites long, THEN every
    one of its 606,000 allocations goes to the long arena, the request site's too, which the
    online counter calls short (alone it places 2,000-6,000), each answered by the table, and
    the few allocations of other modules (libc's stdio buffer) by the counter; WHEN the table
    marks them short, THEN none goes long, the entries neither, which the counter calls long
    (it still learns: sites_long 1). Output unchanged throughout."""
    argv = [burstkv, "6", "100000", "100"]
    alone = _run(argv, place=None)
    stats = tmp_path / "stats"
    long_table = _table(tmp_path / "long.hclife", burstkv_keys, 255)
    under = _run(argv, place=f"table={long_table},learn_mb=0,stats={stats}")
    assert under.returncode == alone.returncode == 0 and under.stdout == alone.stdout
    assert "heapcast" not in under.stderr  # its stderr: the resident sets it prints
    (row,) = _stats(stats.read_text())
    assert (row["table"], row["table_refused"]) == ("1", "0"), row
    assert row["long"] == row["table_answers"] == "606000", row
    assert 0 < int(row["counter_answers"]) < 100, row
    stats.unlink()
    short_table = _table(tmp_path / "short.hclife", burstkv_keys, 0)
    under = _run(argv, place=f"table={short_table},learn_mb=0,stats={stats}")
    assert under.returncode == 0 and under.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert (row["long"], row["table_answers"], row["sites_long"]) == ("0", "606000", "1"), row


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (None, "cannot be opened"),
        (lambda b: b[:-1], "has a payload of the wrong length"),
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "is corrupt \\(payload checksum\\)"),
        (lambda b: b"HCLTAB\x00\x01" + b[8:], "is not a heapcast lifetime table"),
        (lambda b: b[:12], "is shorter than its 32-byte header"),
    ],
)
def test_a_bad_table_is_one_line_naming_it_and_the_counter_places(
    burstkv, burstkv_keys, tmp_path, damage, why
):
    """A missing, cut, changed or foreign table file: one line on stderr naming the file and
    why, the program's output and exit code as without the layer, and placement by the online
    counter (it finds the entry site: sites_long 1), table_refused=1. The counter learns from the
    start (learn_mb=0): by default it waits for 16 MB, which burstkv passes in its first burst."""
    path = tmp_path / "t.hclife"
    if damage is not None:
        raw = _table(path, burstkv_keys, 255).read_bytes()
        path.write_bytes(damage(raw))
    argv = [burstkv, "6", "100000", "100"]
    alone = _run(argv, place=None)
    stats = tmp_path / "stats"
    under = _run(argv, place=f"table={path},learn_mb=0,stats={stats}")
    assert under.returncode == alone.returncode == 0 and under.stdout == alone.stdout
    (line,) = [x for x in under.stderr.splitlines() if "heapcast" in x]
    assert re.fullmatch(
        rf"heapcast place: table file {re.escape(str(path))} refused: it {why}.*; placement "
        "uses the online counter",
        line,
    ), line
    (row,) = _stats(stats.read_text())
    assert (row["table"], row["table_refused"], row["table_answers"]) == ("0", "1", "0"), row
    assert row["sites_long"] == "1" and int(row["long"]) > 0, row


def test_a_table_for_another_model_version_is_refused(burstkv, burstkv_keys, tmp_path):
    from tasks.registry.table_files import write_lifetime_table

    path = write_lifetime_table(tmp_path / "v3.hclife", burstkv_keys, [255] * 64, 3)
    r = _run([burstkv, "1", "1000", "10"], place=f"table={path},model=4,stats=1")
    assert r.returncode == 0
    assert "refused: it comes from another model version" in r.stderr
    r = _run([burstkv, "1", "1000", "10"], place=f"table={path},model=3,stats=1")
    assert "table=1 table_refused=0" in r.stderr and "refused:" not in r.stderr


@pytest.mark.parametrize("score", [255, 0])
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("threads", []),
        ("thread_churn", []),
        ("handoff", ["100", "4194304"]),
        ("fronts", ["relay", "2000", "8", "3000"]),
        ("forkbig", ["40", "300000"]),
        ("fork", ["exit"]),
        ("place_realloc", ["200"]),
    ],
)
def test_threads_and_fork_with_a_table(program, tmp_path, name, args, score):
    """With a table that knows every key (all long: every allocation from any module through
    mallocx to the long arena; all short), threads and fork children print what they print
    under jemalloc alone."""
    exe = program(name)
    path = _table(tmp_path / "t.hclife", range(4096 * 32), score)
    alone = _run([exe, *args], place=None)
    under = _run([exe, *args], place=f"table={path}")
    assert under.returncode == alone.returncode == 0, (under.returncode, under.stderr[-2000:])
    _same_output(name, under, alone)


def test_a_table_needs_mode_predict(program):
    r = _run([program("hello")], place="mode=size,table=/nonexistent")
    assert (r.returncode, r.stdout) == (3, "hello 42\nsecond line\n")
    assert r.stderr.splitlines() == [
        "heapcast place: table=FILE needs mode=predict (the counter answers where the table "
        "does not); passing every call through"
    ]


def test_the_cli_passes_a_table_through(burstkv, burstkv_keys, tmp_path):
    """`heapcast layer --policy place --predictor table:FILE`: the layer reads it (every
    allocation of burstkv's sites placed by it), the program's output and exit code are its
    own; a file that is not there, or a table with another mode, is refused before running."""
    import sys

    cli = Path(sys.executable).with_name("heapcast")
    table = _table(tmp_path / "t.hclife", burstkv_keys, 255)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    argv = [burstkv, "2", "10000", "10"]

    def heapcast(*args):
        return subprocess.run(
            [str(cli), "layer", "--policy", "place", *args, "--", *map(str, argv)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    alone = _run(argv, place=None)
    r = heapcast("--predictor", f"table:{table}", "--stats")
    assert (r.returncode, r.stdout) == (0, alone.stdout), r.stderr
    assert "the lifetime table placed 22,000 allocations" in r.stderr, r.stderr
    r = heapcast("--predictor", f"table:{tmp_path / 'none'}")
    assert r.returncode == 2 and "no such file" in r.stderr and r.stdout == ""
    r = heapcast("--predictor", f"table:{table}", "-O", "mode=size")
    assert r.returncode == 2 and "needs mode predict" in r.stderr and r.stdout == ""
    r = heapcast("--predictor", "bogus")
    assert r.returncode == 2 and "online, model[:VERSION] or table:FILE" in r.stderr


def test_a_short_site_sharing_a_long_sites_gate_key_stays_short(program, tmp_path):
    """GIVEN two call sites whose return addresses share their low 16 bits (the short path's
    gate key: twin functions 64 KiB apart), the first keeping every block, WHEN the counter has
    called the first long and the second makes short-lived blocks, THEN the second's blocks are
    not placed long (the site table tells the twins apart) and are sampled as any others (1 in
    8); the output is jemalloc's."""
    exe = program("place_twins")
    argv = [exe, "3000", "20000"]
    alone = _run(argv, place=None)
    assert alone.returncode == 0 and alone.stdout.startswith("twins=1 "), alone.stdout
    stats = tmp_path / "stats"
    under = _run(argv, place=f"{EAGER.replace('sample=1', 'sample=8')},stats={stats}")
    assert under.returncode == 0 and under.stdout == alone.stdout
    (row,) = _stats(stats.read_text())
    assert int(row["sites_long"]) >= 1, row
    # the kept site's blocks go long once it is learnt; none of the 20000 short ones do
    assert 1000 < int(row["long"]) <= 3000, row
    # every 8th allocation of the thread sampled, the gated ones too (and start-up's few)
    assert 23000 // 8 <= int(row["sampled"]) <= 23000 // 8 + 100, row
