"""A real program traced with stacks (the tracer, HEAPCAST_FRAMES), profiled and exported: its
known call paths are stacks with their known numbers, named from its symbol table, and the
real tools read the same totals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.stacks.collect import stack_profile
from tasks.stacks.export import write
from tests.native.tracer_harness import NATIVE, read_traces, tracer_env
from tests.tasks.stacks.test_export import parse_raw, pprof_raw, speedscope

# builds the tracer and a program, runs it traced: seconds
pytestmark = pytest.mark.slow

SOURCE = Path(__file__).with_name("programs") / "two_paths.c"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The program's traces, recorded 32 frames deep."""
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    d = tmp_path_factory.mktemp("two_paths")
    exe = d / "two_paths"
    subprocess.run(
        [
            "gcc",
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-builtin",
            "-o",
            str(exe),
            str(SOURCE),
        ],
        check=True,
    )
    out = d / "traces"
    out.mkdir()
    env = tracer_env(NATIVE / "build" / "libheapcast.so", out, HEAPCAST_FRAMES="32")
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return out


def test_known_paths_are_stacks_with_their_numbers(traced):
    # GIVEN the program's trace; WHEN profiled
    profile = stack_profile(read_traces(traced))
    # THEN each path into the wrapper is one stack, named wrapper <- path <- main, outward on
    # (libc's start-up frames) and with the calls and bytes the program makes
    # (big_path is called from two lines of main: two stacks, summed here by function)
    fr = profile.frames
    found: dict[tuple[str, ...], list[int]] = {}
    for k, s in enumerate(profile.stacks):
        names = tuple(fr.function[f] for f in s[:3])
        if names[0] == "wrapper":
            assert fr.module[s[0]] == str(traced.parent / "two_paths")
            row = [int(getattr(profile, c)[k]) for c in ("calls", "bytes", "leaked", "temporaries")]
            found[names] = [a + b for a, b in zip(found.get(names, [0] * 4), row)]
    assert found == {
        ("wrapper", "small_path", "main"): [3, 300, 0, 3],
        ("wrapper", "big_path", "main"): [2, 10000, 10000, 0],
    }


def test_real_exports_read_by_go_tool_pprof_and_speedscope(traced, tmp_path):
    profile = stack_profile(read_traces(traced))
    pb, folded = tmp_path / "heap.pb.gz", tmp_path / "heap.folded"
    write(profile, "pprof", pb, "bytes")
    write(profile, "collapsed", folded, "bytes")
    # go tool pprof: every sample's values sum to the profile's, per weight
    types, samples = parse_raw(pprof_raw(pb, "-raw"))
    sums = [sum(v[i] for v in samples.values()) for i in range(len(types))]
    assert sums == [int(profile.weight(w).sum()) for w in ("bytes", "calls", "peak", "leaked")]
    assert any(names[:3] == ("wrapper", "big_path", "main") for names in samples)
    # speedscope: the same total, and the wrapper's frame carries both paths' bytes
    got = speedscope(folded)
    assert got["total"] == int(profile.bytes.sum())
    assert got["frames"]["wrapper"][1] == 300 + 10000


def test_pprof_locations_carry_the_source_lines_of_a_binary_built_with_debug_info(traced, tmp_path):
    # GIVEN the program built with -g: its DWARF line table says where each call is
    source = SOURCE.read_text().splitlines()
    malloc_line = next(i + 1 for i, text in enumerate(source) if "malloc(n)" in text)
    small_line = next(i + 1 for i, text in enumerate(source) if "wrapper(100)" in text)
    pb = tmp_path / "heap.pb.gz"
    write(stack_profile(read_traces(traced)), "pprof", pb, "bytes")
    # WHEN go tool pprof lists the stacks by line
    text = pprof_raw(pb, "-traces", "-lines")
    # THEN the wrapper's frame is its malloc call's line, small_path's its call of the wrapper
    assert f"wrapper two_paths.c:{malloc_line}" in text.replace(str(SOURCE.parent) + "/", "")
    assert f"small_path two_paths.c:{small_line}" in text.replace(str(SOURCE.parent) + "/", "")
