"""heapcast's placement layer as a candidate of the allocators stage (issue 45): jemalloc with
native/layers/place.c in front of it, declared `kind: place` as `jemalloc-place`; its settings
checked, its library built on demand, its stats line read from each run's measure folder and its
being in force verified, measured for real on benchmarks/programs/burstkv.c."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.measure import NOT_APPLIED, Case, measure_cases, place_error
from tasks.allocators.place import (
    JEMALLOC,
    PLACE_LIBRARY,
    PLACE_OPTIONS,
    describe,
    read_place_stats,
)
from tasks.core.config import ConfigError, load_config
from tasks.core.storage import Root
from tasks.replay.workloads import parse_catalog

CFG = load_allocators_config()
REPO = Path(__file__).resolve().parents[3]
PLACE_C = REPO / "native" / "layers" / "place.c"
BURSTKV = REPO / "benchmarks" / "programs" / "burstkv.c"
LINE = (
    "heapcast place: pid={pid} mode=predict long={long} sampled=100 dropped=2 freed_short=90 "
    "freed_long=5 evicted_long=1 sites_seen={seen} sites_long=1\n"
)


def test_the_candidate_is_jemalloc_behind_the_placement_layer_in_predict_mode():
    a = CFG.get("jemalloc-place")
    assert (a.kind, a.library, a.package) == ("place", JEMALLOC, "libjemalloc2")
    assert a.place_mode == "predict" and a.malloc_family == "jemalloc"
    # the probe must see the layer define malloc; jemalloc and the layer's settings come apart
    assert a.spec.host_library == PLACE_LIBRARY and a.spec.library is None and a.spec.env == ()
    assert a.place_env("/m") == {"HEAPCAST_PLACE": "mode=predict,stats=/m/place-stats"}
    assert a.line() == f"LD_PRELOAD={PLACE_LIBRARY}:{JEMALLOC} HEAPCAST_PLACE=mode=predict"
    # in the full night's list beside jemalloc, not in the quick one (make run's minutes)
    assert "jemalloc-place" in CFG.seeds.allocators
    assert "jemalloc-place" not in CFG.seeds.quick_allocators


def test_a_candidate_may_give_every_placement_option_but_stats():
    text = PLACE_C.read_text()
    start = text.index("#define HP_OPTIONS(X)")
    table = text[start : text.index("\n\n", start)]
    assert PLACE_OPTIONS == set(re.findall(r"X\((\w+),", table)) - {"stats"}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"env": {}}, "gives its settings in env.HEAPCAST_PLACE"),
        ({"env": {"HEAPCAST_PLACE": "mode=guess"}}, "mode: 'guess' is not one of"),
        ({"env": {"HEAPCAST_PLACE": "mode=predict,horizn=9"}}, "'horizn=9' is not NAME=VALUE"),
        ({"env": {"HEAPCAST_PLACE": "mode=predict,stats=1"}}, "`stats` is set by the stage"),
        ({"env": {"HEAPCAST_PLACE": "mode=sites"}}, "mode=sites needs sites=FILE"),
        ({"env": {"HEAPCAST_PLACE": "horizon=lots"}}, "horizon: 'lots' is not a whole number"),
        (
            {"library": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"},
            "the jemalloc behind the layer",
        ),
        ({"library": "libjemalloc.so.2"}, "the jemalloc behind the layer, an absolute path"),
        ({"package": None}, "`package`"),
        (
            {"env": {"HEAPCAST_PLACE": "mode=predict", "TCMALLOC_RELEASE_RATE": "2"}},
            "tunes tcmalloc's malloc, but this candidate runs jemalloc's",
        ),
    ],
)
def test_a_bad_place_candidate_is_refused_naming_the_field(fields, message):
    spec = {
        "name": "mine",
        "kind": "place",
        "library": JEMALLOC,
        "package": "libjemalloc2",
        "env": {"HEAPCAST_PLACE": "mode=predict"},
        **fields,
    }
    with pytest.raises(ValidationError, match=re.escape(message)):
        Allocator(**spec)


def test_jemallocs_own_knobs_may_tune_the_jemalloc_behind_the_layer():
    a = Allocator(
        name="p",
        kind="place",
        library=JEMALLOC,
        package="libjemalloc2",
        env={"HEAPCAST_PLACE": "mode=size,big=512", "MALLOC_CONF": "dirty_decay_ms:0"},
    )
    # MALLOC_CONF goes to the probe's check (jemalloc answering), HEAPCAST_PLACE apart
    assert a.spec.env == (("MALLOC_CONF", "dirty_decay_ms:0"),)
    assert a.place_mode == "size"


def test_a_bad_candidate_in_the_file_names_the_file_and_the_field(tmp_path):
    text = (REPO / "configs" / "allocators.yaml").read_text()
    bad = tmp_path / "allocators.yaml"
    bad.write_text(text.replace('{HEAPCAST_PLACE: "mode=predict"}', '{HEAPCAST_PLACE: "mode=x"}'))
    with pytest.raises(ConfigError, match=r"(?s)allocators\.yaml.*allocators\.\d+.*mode: 'x'"):
        load_config(type(CFG), bad)


def test_the_stats_lines_are_summed_over_processes_and_said_in_a_sentence(tmp_path):
    stats = tmp_path / "place-stats"
    assert read_place_stats(stats) == {}
    stats.write_text(
        LINE.format(pid=7, long=40, seen=3) + "noise\n" + LINE.format(pid=9, long=2, seen=5)
    )
    got = read_place_stats(stats)
    assert got["place_processes"] == 2 and got["place_long"] == 42
    assert got["place_sites_seen"] == 5  # a process's own table: the largest, not the sum
    assert got["place_mode"] == "predict" and got["place_freed_short"] == 180
    text = describe(got)
    assert text.startswith("2 process(es), mode predict: 42 allocations placed long")
    assert "180 died young, 12 outlived the horizon" in text
    assert "of the sampled blocks" not in text  # a line from before the layer judged them
    # the layer's own long placements, judged: right ones (long_old) of all judged, summed
    stats.write_text(
        LINE.format(pid=7, long=40, seen=3).replace("\n", " long_young=3 long_old=9\n")
        + LINE.format(pid=9, long=2, seen=5).replace("\n", " long_young=70 long_old=1\n")
    )
    text = describe(read_place_stats(stats))
    assert "of the sampled blocks placed long, 10 of 83 outlived the horizon" in text
    assert "stepped aside" not in text
    # sites whose verdict fell back to short: a process's own table, the largest, and said so
    stats.write_text(
        LINE.format(pid=7, long=40, seen=3).replace("\n", " sites_aside=2\n")
        + LINE.format(pid=9, long=2, seen=5).replace("\n", " sites_aside=1\n")
    )
    got_aside = read_place_stats(stats)
    assert got_aside["place_sites_aside"] == 2
    assert "; 2 call site(s) stepped aside (their verdict fell from long" in describe(got_aside)
    assert "stayed short" not in describe(got_aside)
    # the counter's verdicts held short in processes under the floor of resident memory: summed
    stats.write_text(
        LINE.format(pid=7, long=0, seen=3).replace("\n", " held_small=300\n")
        + LINE.format(pid=9, long=0, seen=5).replace("\n", " held_small=45\n")
    )
    got_small = read_place_stats(stats)
    assert got_small["place_held_small"] == 345
    assert (
        "; 345 allocations the counter called long stayed short: the process was under min_mb"
        in describe(got_small)
    )
    assert "never learned" not in describe(got_small)
    # processes whose counter never learned (under learn_mb to the end): counted and said so
    stats.write_text(
        LINE.format(pid=7, long=0, seen=0).replace("\n", " waiting=1\n")
        + LINE.format(pid=9, long=0, seen=5).replace("\n", " waiting=0\n")
    )
    got_waiting = read_place_stats(stats)
    assert got_waiting["place_waiting"] == 1
    assert "; in 1 process(es) the counter never learned: they stayed under learn_mb" in describe(
        got_waiting
    )
    a = CFG.get("jemalloc-place")
    assert place_error(a, got) is None
    # no line: the layer passed every call through (no jemalloc behind it, an option refused)
    assert place_error(a, {}).startswith(f"{NOT_APPLIED}: placement not in force")
    assert place_error(CFG.get("jemalloc"), {}) is None


# ------------------------------------------------------------------ a real run, on this host


@pytest.fixture(scope="module")
def burstkv(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build benchmarks/programs/burstkv.c")
    out = tmp_path_factory.mktemp("burstkv") / "burstkv"
    subprocess.run(["gcc", "-O2", "-o", str(out), str(BURSTKV)], check=True, capture_output=True)
    return out


@pytest.mark.slow
def test_the_stage_measures_jemalloc_place_verified_in_force_with_its_stats(burstkv, tmp_path):
    """burstkv (8 bursts of 100 000 request buffers, a long-lived entry every 100, from another
    call site) under glibc, jemalloc and jemalloc-place through the local runner: the layer built
    on demand, the probe seeing it define malloc, its stats line read from the measure folder."""
    from tasks.replay.inputs import GENERATORS

    if not Path(JEMALLOC).is_file():
        pytest.fail(f"{JEMALLOC} is missing: apt-get install libjemalloc2 (scripts/setup.sh)")

    def generate(seed: int, size: int, dest: Path) -> list[str]:
        shutil.copy(burstkv, dest / "burstkv")
        return ["burstkv"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(GENERATORS, "burstkv_program", generate)
        catalog = parse_catalog(
            {
                "workloads": [
                    {
                        "name": "burstkv",
                        "image": "sqlite3",
                        "generator": "burstkv_program",
                        "command": ["/usr/bin/env", "{input}/burstkv", "8", "{size}", "100"],
                        "expected_exit_code": 0,
                        "time_limit_s": 120,
                        "inputs": [{"name": "small", "seed": 1, "size": 100000, "quick": True}],
                    }
                ]
            },
            "tests (burstkv)",
        )
        cfg = CFG.model_copy(
            update={
                "allocators": [CFG.get(n) for n in ("glibc", "jemalloc", "jemalloc-place")],
                "warmup": 0,
                "max_repetitions": None,
            }
        )
        w = catalog.get("burstkv")
        m = measure_cases(
            [Case(w, w.inputs[0], "burstkv")],
            cfg,
            Root.from_url(str(tmp_path)),
            "local",
            repetitions=1,
        )
    by = {s.allocator: s for s in m.samples}
    assert set(by) == {"glibc", "jemalloc", "jemalloc-place"} and not m.unavailable
    assert all(s.ok and s.applied for s in m.samples), [s.error for s in m.samples]
    assert len({s.stdout_sha256 for s in m.samples}) == 1  # output unchanged
    p = by["jemalloc-place"]
    assert p.place_processes == 1 and p.place_mode == "predict"
    # the counter found the entries' site long and placed them in the long arena
    assert p.place_sites_long >= 1 and p.place_long > 1000
    assert by["jemalloc"].place_processes is None and PLACE_LIBRARY.is_file()
