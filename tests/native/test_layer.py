"""heapcast's allocator layer (native/layers/layer.c, libheapcast_layer.so) under real programs.

Each policy (largest, pools, guided) keeps the output and exit code of real programs (python3
with numpy on seed 002's expression, sqlite3, a threaded C program, fork beside a working
thread) and reuses blocks (its counters at exit). The predictor equals the project's online
counter (tasks/learning/counters/online.py, orders (2, 1)) on a token sequence. A setting it cannot
parse, or a table file it cannot trust, is said in one line on stderr and never stops the
program. The layer keeps
nothing until reuse is proven (`proof`), and steps aside where it is not.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.learning.counters.online import online_features
from tasks.replay.inputs import generate_input
from tests.conftest import need_tool
from tests.native.tracer_harness import NATIVE

POLICIES = ("largest", "pools", "guided")
BIG = ["300000", "1000000", "2500000"]

# seed 002's expression on 40 MB arrays: above glibc's largest mmap threshold (32 MiB), so glibc
# maps and unmaps every temporary, and the layer keeps them (below it, once a free reaches
# glibc, glibc serves them from its heap and the layer leaves them to it: scope=mapped)
NUMPY_EXPRESSION = (
    "import numpy as np\n"
    "a = np.linspace(0.0, 1.0, 5_000_000)\n"
    "b = np.linspace(1.0, 2.0, 5_000_000)\n"
    "s = 0.0\n"
    "for i in range(20):\n"
    "    c = (a * b) ** 2 + 3\n"
    "    s += float(c[::997].sum())\n"
    "print(repr(s), c.shape, float(c[12345]))\n"
)


@pytest.fixture(scope="session")
def heapcast_layer() -> Path:
    subprocess.run(["make", "-s", "-C", str(NATIVE), "layer"], check=True)
    lib = NATIVE / "build" / "libheapcast_layer.so"
    assert lib.is_file()
    return lib


def _env(lib: Path | None, setting: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env.pop("LD_PRELOAD", None)
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    if setting is not None:
        # the layer keeps from the first free here (proof=0) unless a test sets its proof: these
        # small programs reuse a block a few times only, and the proof would keep nothing there
        # (test_the_layer_keeps_nothing_until_reuse_is_proven tests the proof itself)
        proof = "" if "proof=" in setting or "=" not in setting else ",proof=0"
        env["HEAPCAST_LAYER"] = setting + proof
    env.update(extra)
    return env


def _stats(path: Path) -> list[dict[str, int]]:
    """The layer's stats lines (one per process that exited through exit())."""
    if not path.exists():
        return []
    return [
        {k: int(v) for k, v in (f.split("=", 1) for f in line.split())}
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _plain_and_under(argv, lib, setting, stdin=None, **extra):
    """argv run plainly, then under the layer with HEAPCAST_LAYER=setting: both runs."""
    kw = dict(capture_output=True, text=True, input=stdin, timeout=600)
    plain = subprocess.run([str(a) for a in argv], env=_env(None, **extra), **kw)
    return plain, subprocess.run([str(a) for a in argv], env=_env(lib, setting, **extra), **kw)


def _same_under_layer(argv, lib, setting, tmp_path, stdin=None, **extra):
    """Run argv plainly and under the layer; assert identical stdout, stderr and exit code;
    return the layer's stats lines."""
    stats = tmp_path / "stats"
    stats.unlink(missing_ok=True)
    plain, under = _plain_and_under(argv, lib, f"{setting},stats={stats}", stdin, **extra)
    assert under.returncode == plain.returncode, (under.returncode, under.stderr[-2000:])
    assert under.stdout == plain.stdout
    assert under.stderr == plain.stderr
    return _stats(stats)


# --- the predictor --------------------------------------------------------------------------------


def test_predictor_equals_the_online_counter(program, tmp_path):
    # a phase-structured sequence with noise: repeated patterns, then another phase, random calls
    rng = np.random.default_rng(21)
    parts = []
    for _ in range(6):
        pattern = rng.integers(0, 64, size=rng.integers(2, 7))
        reps = np.tile(pattern, 150)
        noise = rng.random(len(reps)) < 0.15
        reps[noise] = rng.integers(0, 64, size=int(noise.sum()))
        parts.append(reps)
    tokens = np.concatenate(parts).astype(np.uint8)
    path = tmp_path / "tokens"
    path.write_bytes(tokens.tobytes())
    out = subprocess.run(
        [str(program("predict_tokens")), str(path)], capture_output=True, text=True, check=True
    ).stdout
    got = np.array([line.split() for line in out.splitlines()], dtype=np.int64)
    ref = online_features(tokens, np.array([0, len(tokens)]), orders=(2, 1))
    assert got.shape == (len(tokens), 4)
    for j, key in enumerate(("top1", "order", "count", "total")):
        np.testing.assert_array_equal(got[:, j], ref[key].astype(np.int64), err_msg=key)


# --- real programs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_numpy_expression_same_output(heapcast_layer, policy, tmp_path):
    python = Path(sys.executable)
    rows = _same_under_layer(
        [python, "-c", NUMPY_EXPRESSION], heapcast_layer, f"policy={policy}", tmp_path
    )
    main = max(rows, key=lambda r: r["hits"])  # numpy's import may run helper processes
    assert main["hits"] >= 15, main
    assert main["double_frees"] == 0 and main["untracked"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_sqlite3_same_output(heapcast_layer, policy, tmp_path):
    sqlite3 = need_tool("sqlite3")
    # min=4K, scope=all: sqlite's page cache and sorter blocks (glibc's heap) go through it too
    rows = _same_under_layer(
        [sqlite3, ":memory:"],
        heapcast_layer,
        f"policy={policy},min=4K,scope=all",
        tmp_path,
        stdin=(tmp_path / generate_input("sql", 1, 20_000, tmp_path)[0]).read_text(),
    )
    assert len(rows) == 1 and rows[0]["hits"] > 0, rows


@pytest.mark.parametrize("policy", POLICIES)
def test_threads_same_output(heapcast_layer, program, policy, tmp_path):
    exe = program("bigblocks")
    rows = _same_under_layer([exe, "20", "4", *BIG, "4000000"], heapcast_layer, f"policy={policy}",
                             tmp_path)  # fmt: skip
    assert len(rows) == 1 and rows[0]["hits"] > 0, rows


@pytest.mark.parametrize("policy", POLICIES)
def test_fork_beside_a_working_thread(heapcast_layer, program, policy, tmp_path):
    exe = program("forkbig")
    rows = _same_under_layer([exe, "40", "300000"], heapcast_layer, f"policy={policy}", tmp_path)
    # children leave with _exit (no stats line); the parent's thread reused blocks throughout
    assert len(rows) == 1 and rows[0]["hits"] > 100, rows


@pytest.mark.parametrize("policy", POLICIES)
def test_the_layer_keeps_nothing_until_reuse_is_proven(heapcast_layer, program, policy, tmp_path):
    """GIVEN bigblocks, 30 rounds of the same large blocks, every one mapped (glibc's threshold
    fixed), and sqlite3 on a generated input (6 large calls, one of them a request a block it
    freed could serve)
    WHEN each runs under the layer with proof=4 (2 is the default), and bigblocks with proof=0
    THEN bigblocks: the layer keeps once its 4th miss could have been served by a block it passed
    on; it then reuses, giving up fewer hits than rounds. sqlite3: nothing kept, ever (it
    stepped aside), and the output is the same."""
    argv = [str(program("bigblocks")), "30", "1", *BIG, "700000"]
    fixed = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    (proven,) = _same_under_layer(
        argv, heapcast_layer, f"policy={policy},proof=4", tmp_path, **fixed
    )
    (eager,) = _same_under_layer(
        argv, heapcast_layer, f"policy={policy},proof=0", tmp_path, **fixed
    )
    assert (proven["proven"], proven["proof_hits"], eager["proven"]) == (1, 4, 1), proven
    assert proven["unproven"] >= 4 and eager["unproven"] == eager["proof_hits"] == 0, proven
    assert 0 < proven["hits"] < eager["hits"] < proven["hits"] + 30, (proven, eager)
    sqlite3 = need_tool("sqlite3")
    (aside,) = _same_under_layer(
        [sqlite3, "-bail", ":memory:"],
        heapcast_layer,
        f"policy={policy},proof=4",
        tmp_path,
        stdin=(tmp_path / generate_input("sql", 2, 12_000, tmp_path)[0]).read_text(),
    )
    assert (aside["proven"], aside["kept"], aside["hits"], aside["bytes_kept_peak"]) == (0, 0, 0, 0)
    assert aside["unproven"] >= 1 and aside["proof_hits"] < 4, aside


# --- settings and the table file -------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        "policy=bogus",
        "cap=12Q",
        "frobnicate=1",
        "policy",
        "n=65",
        "predictor=table:",
        "min=0",
        "peak=-1",
        "regret=2",
    ],
)
def test_a_setting_it_cannot_parse_passes_through(heapcast_layer, program, setting, tmp_path):
    exe = program("bigblocks")
    stats = tmp_path / "stats"
    plain, r = _plain_and_under(
        [exe, "5", "1", *BIG], heapcast_layer, f"policy=guided,stats={stats},{setting}"
    )
    assert r.returncode == plain.returncode == 0
    assert r.stdout == plain.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("heapcast layer: cannot parse HEAPCAST_LAYER item") and (
        setting in lines[0]
    )
    assert lines[0].endswith("running as a pass-through")
    assert not stats.exists()  # a pass-through keeps nothing and counts nothing


def write_table(path: Path, *, magic=b"HCLTAB\x00\x01", version=2, model=3, payload=None,
                checksum=None) -> None:  # fmt: skip
    """A layer table file written by hand (format: native/TABLE.md)."""
    if payload is None:
        payload = bytes(
            255 if (t >= 32 and c == t - 32) else 0 for t in range(64) for c in range(64)
        )
    h = 0xCBF29CE484222325
    for b in payload:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    path.write_bytes(
        magic
        + struct.pack(
            "<IIIIQ", version, model, 64, len(payload), h if checksum is None else checksum
        )
        + payload
    )


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("magic", "is not a heapcast layer table (magic)"),
        ("version", "has another format version (this layer reads 2, 3 and 4)"),
        ("truncated", "has a payload of the wrong length (truncated or extended)"),
        ("checksum", "is corrupt (payload checksum)"),
        ("disorder", "is corrupt (site entries out of order)"),
        (
            "shape",
            "has another shape (64 tokens, 4096 payload bytes and 4 per site entry expected)",
        ),
        ("model", "comes from another model version"),
        ("missing", "cannot be opened"),
        ("short", "is shorter than its 32-byte header"),
    ],
)
def test_a_table_it_cannot_trust_is_refused(heapcast_layer, program, kind, reason, tmp_path):
    table = tmp_path / "table.bin"
    write_table(table)
    raw = table.read_bytes()
    if kind == "magic":
        table.write_bytes(b"PK\x03\x04xxxx" + raw[8:])
    elif kind == "version":
        write_table(table, version=1)  # 1: "soon" was 16 calls (TABLE.md)
    elif kind == "truncated":
        table.write_bytes(raw[:-100])
    elif kind == "checksum":
        table.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif kind in ("disorder", "shape"):
        # format 3: the class scores, then (site * 32 + class) << 8 | score words, keys rising;
        # here falling (site 9 before site 3, class 20), or a word cut short
        words = struct.pack("<II", (9 * 32 + 20) << 8 | 255, (3 * 32 + 20) << 8 | 255)
        write_table(
            table, version=3, payload=raw[32:] + (words if kind == "disorder" else words[:6])
        )
    elif kind == "missing":
        table.unlink()
    elif kind == "short":
        table.write_bytes(raw[:20])
    model = "5" if kind == "model" else "3"
    exe = program("bigblocks")
    stats = tmp_path / "stats"
    plain, r = _plain_and_under(
        [exe, "5", "1", *BIG],
        heapcast_layer,
        f"policy=guided,predictor=table:{table},model={model},stats={stats}",
    )
    assert r.returncode == 0 and r.stdout == plain.stdout
    assert r.stderr.splitlines() == [
        f"heapcast layer: table file {table} refused: it {reason}; "
        "the guided policy uses the online counter"
    ]
    (row,) = _stats(stats)
    assert row["table"] == 0 and row["table_refused"] == 1
    assert row["hits"] > 0  # the online counter guides the cache instead


def test_a_good_table_is_used(heapcast_layer, program, tmp_path):
    table = tmp_path / "table.bin"
    write_table(table)
    exe = program("bigblocks")
    stats = tmp_path / "stats"
    r = subprocess.run(
        [exe, "5", "1", *BIG],
        capture_output=True,
        text=True,
        env=_env(heapcast_layer, f"policy=guided,predictor=table:{table},model=3,stats={stats}"),
    )
    assert r.returncode == 0 and r.stderr == ""
    (row,) = _stats(stats)
    assert row["table"] == 1 and row["table_refused"] == 0
    # the table says "a free of class c is followed by an allocation of class c": all kept
    assert row["hits"] > 0 and row["kept"] > 0


def test_stats_on_stderr_on_request(heapcast_layer, program):
    exe = program("bigblocks")
    r = subprocess.run(
        [exe, "5", "1", *BIG],
        capture_output=True,
        text=True,
        env=_env(heapcast_layer, "policy=pools,stats=1"),
    )
    assert r.returncode == 0
    (line,) = r.stderr.splitlines()
    assert line.startswith("heapcast layer: pid=")
    fields = dict(f.split("=") for f in line.removeprefix("heapcast layer: ").split())
    assert int(fields["hits"]) > 0 and int(fields["policy"]) == 2


@pytest.mark.parametrize("old, new", [("seed002", "largest"), ("seed001", "pools")])
def test_the_policies_former_names_are_the_policies_now(heapcast_layer, program, old, new):
    """HEAPCAST_LAYER=policy=seed002 (issue 46: the names before) is policy=largest: the same
    policy in the stats line, the same hits and blocks kept, nothing said on stderr."""
    exe = program("bigblocks")
    rows = {}
    for name in (old, new):
        r = subprocess.run(
            [exe, "5", "1", *BIG],
            capture_output=True,
            text=True,
            env=_env(heapcast_layer, f"policy={name},madv=off,stats=1"),
        )
        assert r.returncode == 0
        (line,) = r.stderr.splitlines()
        rows[name] = dict(f.split("=") for f in line.removeprefix("heapcast layer: ").split())
    assert int(rows[new]["policy"]) == POLICIES.index(new) + 1
    for k in ("policy", "hits", "misses", "kept", "given_back"):
        assert rows[old][k] == rows[new][k], (k, rows)
    assert int(rows[new]["hits"]) > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_every_entry_point_same_output(heapcast_layer, program, policy, tmp_path):
    # malloc, calloc, realloc, reallocarray, the aligned forms, malloc_usable_size, free
    exe = program("allforms")
    rows = _same_under_layer([exe, "12", "300000"], heapcast_layer, f"policy={policy}", tmp_path)
    (row,) = rows
    assert row["hits"] > 0 and row["untracked"] == 0, row


def test_many_live_blocks(heapcast_layer, tmp_path):
    """Thousands of live blocks the layer tracks at once (its live set grows by mmap) and then
    frees and reuses, with min=4K: the output is the program's."""
    code = (
        "import numpy as np\n"
        "arrs = [np.full(700, i, dtype=np.float64) for i in range(20000)]\n"
        "t = sum(float(a[3]) for a in arrs[::7])\n"
        "del arrs[::2]\n"
        "arrs += [np.full(650, i) for i in range(5000)]\n"
        "print(t, sum(float(a[0]) for a in arrs), len(arrs))\n"
    )
    rows = _same_under_layer(
        [sys.executable, "-c", code], heapcast_layer, "policy=pools,min=4K,scope=all", tmp_path
    )
    main = max(rows, key=lambda r: r["kept"])
    # the 10000 frees are kept up to the cache's 512 entries (layer.c HL_MAX_KEPT), the oldest
    # going back; the 5000 new arrays then hit what is kept
    assert main["kept"] >= 10000 and main["given_back"] >= 9000 and main["hits"] >= 500, main
    assert main["untracked"] == 0 and main["double_frees"] == 0


# --- glibc's dynamic mmap threshold ----------------------------------------------------------------


def _placed(exe, lib, setting=None, *args, **extra) -> str:
    r = subprocess.run(
        [str(exe), *args], env=_env(lib, setting, **extra), capture_output=True, text=True
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    return r.stdout.strip()


@pytest.mark.parametrize("policy", POLICIES)
def test_the_layer_raises_glibcs_mmap_threshold_as_glibc_would(heapcast_layer, program, policy):
    """A 600000-byte block freed (the layer keeps it), then one of 200000 that it cannot serve:
    glibc alone serves that from its heap, having raised its threshold at the free; so must
    glibc under the layer, which kept the free from it (follow=0 shows the frozen threshold)."""
    exe = program("threshold")
    assert _placed(exe, None) == "heap"
    assert _placed(exe, heapcast_layer, f"policy={policy}") == "heap"
    assert _placed(exe, heapcast_layer, f"policy={policy},follow=0") == "mmap"
    # raised in two steps (a free of 300000 first): whether the layer passes a free to glibc,
    # which then raises the threshold itself, or keeps it and raises it by mallopt
    assert _placed(exe, None, None, "twice") == "heap"
    assert _placed(exe, heapcast_layer, f"policy={policy}", "twice") == "heap"


@pytest.mark.parametrize(
    "how",
    [
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
        {"MALLOC_TRIM_THRESHOLD_": "1048576"},
        "mallopt",
    ],
)
def test_a_threshold_fixed_by_the_user_or_the_program_stays_fixed(heapcast_layer, program, how):
    exe = program("threshold")
    args, extra = (["mallopt"], {}) if how == "mallopt" else ([], how)
    # glibc stops following once any of them is fixed: the block of 200000 is mmapped
    assert _placed(exe, None, None, *args, **extra) == "mmap"
    assert _placed(exe, heapcast_layer, "policy=pools", *args, **extra) == "mmap"


# --- what the layer keeps: glibc's mapped blocks, not an outgrown one ------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_blocks_from_glibcs_heap_are_left_to_glibc(heapcast_layer, program, policy, tmp_path):
    """With glibc's mmap threshold above the blocks (1 MiB) and its trim threshold far above
    (64 MiB), glibc serves them from its heap and keeps the memory there: the layer keeps none
    of them by default (scope=mapped), and says so (`heap`); scope=all keeps and reuses them.
    Output unchanged either way."""
    exe = program("bigblocks")
    argv = [exe, "12", "1", "200000", "300000", "400000"]
    fixed = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "67108864"}
    rows = _same_under_layer(argv, heapcast_layer, f"policy={policy}", tmp_path, **fixed)
    assert len(rows) == 1, rows
    # 3 blocks a round, 12 rounds; block 0 is grown by realloc (its free is of the grown one)
    assert rows[0]["kept"] == 0 and rows[0]["hits"] == 0 and rows[0]["heap"] >= 30, rows
    every = _same_under_layer(argv, heapcast_layer, f"policy={policy},scope=all", tmp_path, **fixed)
    assert every[0]["heap"] == 0 and every[0]["kept"] > 0 and every[0]["hits"] > 0, every


@pytest.mark.parametrize("policy", POLICIES)
def test_heap_blocks_are_kept_once_glibc_trims_its_heap(heapcast_layer, program, policy, tmp_path):
    """The same blocks with glibc's trim threshold at its 128 KiB default: freeing a round's
    blocks grows the heap's top past it and glibc gives the memory back to the kernel (lowers
    its break), to fault it in again next round. From the first such free on, the layer keeps
    heap blocks too: few are left to glibc, and the rounds after reuse the kept ones."""
    exe = program("bigblocks")
    argv = [exe, "12", "1", "200000", "300000", "400000"]
    fixed = {"MALLOC_MMAP_THRESHOLD_": "1048576"}
    rows = _same_under_layer(argv, heapcast_layer, f"policy={policy}", tmp_path, **fixed)
    assert len(rows) == 1, rows
    assert rows[0]["heap"] <= 6 and rows[0]["hits"] >= 20, rows


@pytest.mark.parametrize("policy", POLICIES)
def test_mapped_blocks_are_kept(heapcast_layer, program, policy, tmp_path):
    """With glibc's threshold fixed below them (128 KiB), every block is mapped: kept, reused.
    (Without the bound on live + kept, peak=off: the rounds' sizes drift, and a block kept
    that misfits is given back at the next miss; that rule has its own test below.)"""
    exe = program("bigblocks")
    argv = [exe, "12", "1", "200000", "300000", "400000"]
    rows = _same_under_layer(
        argv, heapcast_layer, f"policy={policy},peak=off", tmp_path, MALLOC_MMAP_THRESHOLD_="131072"
    )
    assert rows[0]["heap"] == 0 and rows[0]["hits"] >= 20, rows


@pytest.mark.parametrize("policy", POLICIES)
def test_a_block_the_program_outgrew_is_not_kept(heapcast_layer, program, policy, tmp_path):
    """A buffer grown by malloc, copy and free (perl's strings, C++ vectors): a freed block a
    little too small for the request just made is given back (`outgrown`), never held: kept,
    a chain of them was perl's 1.4 MB beside its 10 MB. A block that still fits what comes
    next is kept: a round's last block serves the next round, and then every other step (the
    block in hand is larger than the next request, so it is kept, and the step after takes it)."""
    exe = program("grow")
    rounds, steps = 6, 10
    rows = _same_under_layer(
        [exe, str(rounds), str(steps), "300000"],
        heapcast_layer,
        f"policy={policy}",
        tmp_path,
        MALLOC_MMAP_THRESHOLD_="131072",  # every block mapped: kept but for the rule
    )
    assert len(rows) == 1, rows
    s = rows[0]
    assert s["outgrown"] >= steps and s["heap"] == 0, s  # the first round: every step
    final = int(300000 * (17 / 16) ** steps) + 4096
    assert s["bytes_kept_peak"] <= final, s  # one block at most: never a chain
    if policy != "guided":  # guided also declines what its counter does not predict
        assert s["kept"] + s["outgrown"] == rounds * (steps + 1), s  # each large free
        assert s["hits"] >= rounds - 1, s


# --- the bound: kept blocks never lift the program's footprint over its own peak ------------------

MiB = 1 << 20
# phase A holds 8 blocks of 2 MiB, phase B 8 of 5 MiB, in turns; glibc's threshold fixed at
# 128 KiB, as TensorFlow's generator dataset fixes it (keras_video): every block is mapped, so
# under glibc the program takes what it has live, at most B's 40 MiB
PHASES = ["4", "8", str(2 * MiB), "8", str(5 * MiB)]
LIVE_PEAK = 8 * 5 * MiB


def _maxrss_kib(argv, env) -> tuple[int, str]:
    """The peak resident set of one run of `phases` (its own VmHWM, in KiB), and its stdout."""
    r = subprocess.run(
        [str(a) for a in argv], env=env | {"PHASES_VMHWM": "1"}, capture_output=True, text=True
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    (kib,) = [int(ln.split()[1]) for ln in r.stderr.splitlines() if ln.startswith("VmHWM:")]
    return kib, r.stdout


@pytest.mark.parametrize("policy", POLICIES)
def test_kept_blocks_stay_within_the_programs_own_peak(heapcast_layer, program, policy, tmp_path):
    """Without the bound (peak=off), pools keeps A's blocks through B (16 MiB on B's 40) and
    largest its 4 largest (8 MiB): the program's peak memory grows by them. With it (the
    default, 4%), a miss gives the oldest kept blocks back until live + kept is within the live
    blocks' peak: the peak stays glibc's, within 4% of 40 MiB and the library's own pages, and
    the cache still serves each round (B's blocks kept through A as far as the bound allows)."""
    exe = program("phases")
    fixed = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    glibc, expected = _maxrss_kib([exe, *PHASES], _env(None, **fixed))
    stats = tmp_path / "stats"
    rss, out = _maxrss_kib(
        [exe, *PHASES], _env(heapcast_layer, f"policy={policy},stats={stats}", **fixed)
    )
    assert out == expected
    (s,) = _stats(stats)
    assert LIVE_PEAK <= s["live_peak"] <= LIVE_PEAK + 8 * 4096, s  # usable sizes: page-rounded
    assert rss <= glibc + (LIVE_PEAK * 4 // 100 + MiB) // 1024, (rss, glibc, s)
    if policy != "guided":  # guided keeps only what its counter predicts
        assert s["bounded"] > 0 and s["hits"] >= 3, s
    if policy == "guided":
        return
    stats.unlink()
    unbound, _ = _maxrss_kib(
        [exe, *PHASES], _env(heapcast_layer, f"policy={policy},peak=off,stats={stats}", **fixed)
    )
    (s,) = _stats(stats)
    assert s["bounded"] == 0, s
    held = 16 * MiB if policy == "pools" else 8 * MiB
    assert unbound >= glibc + (held - MiB) // 1024, (unbound, glibc, s)


@pytest.mark.parametrize("predictor", ["online", "table"])
def test_blocks_one_thread_frees_and_another_asks_for_are_kept_on_the_processs_regret(
    heapcast_layer, program, predictor, tmp_path
):
    """A reader thread's blocks freed by the main thread (handoff.c): the freeing thread never
    asks for a block, so its counter says "not soon" at every free and guided passes every one
    on, as does a table whose classes say "not soon" (learnt from other programs). With
    regret=1, the first misses a passed-on block would have served make the process keep that
    class's frees (after the proof, two such misses), and the reader takes them back: every
    chunk but the first few is a hit. The output stays the program's."""
    exe = program("handoff")
    setting = "policy=guided,proof=2"
    if predictor == "table":
        table = tmp_path / "t.hcltab"
        write_table(table, payload=bytes(4096))  # every class scored 0: never soon
        setting += f",predictor=table:{table}"
    fixed = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # every 1 MiB block mapped: in the layer's scope
    chunks = 200
    (without,) = _same_under_layer([exe, chunks, MiB], heapcast_layer, setting, tmp_path, **fixed)
    (with_,) = _same_under_layer(
        [exe, chunks, MiB], heapcast_layer, setting + ",regret=1", tmp_path, **fixed
    )
    assert without["regret"] == 0 and without["hits"] == 0, without
    assert without["kept"] == 0 and without["regret_keeps"] == 0, without
    assert with_["regret"] == 1 and with_["regret_hits"] >= 1, with_
    assert with_["hits"] >= chunks - 10, with_
    assert with_["regret_keeps"] >= with_["hits"], with_  # kept against the counter's answer
    assert with_["hits"] + with_["misses"] == chunks, with_


# --- its counters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["policy=largest,n=0", "policy=pools", "policy=guided"])
def test_every_large_call_is_counted_once_across_many_threads(
    heapcast_layer, program, setting, tmp_path
):
    """100 threads alive at once (more than the layer's 64 per-thread counters: the other 36
    share one, counted atomically), then 150 started one after another (each gives its counter
    back at exit and the next takes it, keeping its counts): every large request is a hit or a
    miss, and every large free is kept or passed on, each counted once in the stats. Counts lost
    by two threads owning one counter, or by a counter handed over, make the sums fall short;
    a policy whose threads cannot give theirs back (no destructor: largest had none) shares it
    with all, atomically, at every call (8 threads: 47 -> 130 ns a pair)."""
    exe = program("passcount")
    rows = _same_under_layer(
        [exe, "100", "150", "1000", "262144"], heapcast_layer, setting, tmp_path
    )
    pairs = 250 * 1000
    assert len(rows) == 1, rows
    s = rows[0]
    assert s["hits"] + s["misses"] == pairs, s
    assert s["kept"] + s["passed"] - s["misses"] == pairs, s
    if "n=0" in setting:  # keeps nothing: every call passed on, each thread's first counted
        assert s["hits"] == 0 and s["passed"] == 2 * pairs, s
        assert s["threads_sharing_counters"] == 100 - 64, s
    else:  # a thread whose first calls were kept or hits counts later, maybe on a freed one
        assert s["threads_sharing_counters"] <= 100 - 64, s
