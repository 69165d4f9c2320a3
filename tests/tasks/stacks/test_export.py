"""The exports, read by the real tools: pprof files by Go's `go tool pprof` (Debian's golang-go),
folded stacks by speedscope's own importer (npm's speedscope, run in node); both installed by
scripts/setup.sh."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tasks.format.trace_reader import read_trace
from tasks.stacks.collect import stack_profile
from tasks.stacks.export import NO_STACK, SAMPLE_TYPES, write
from tasks.stacks.profile import WEIGHTS
from tests.tasks.stacks import known_stacks as known
from tests.tracegen import malloc, thread_start, write_trace

REPO = Path(__file__).resolve().parents[3]
SPEEDSCOPE = REPO / ".cache" / "npm" / "node_modules" / "speedscope"  # scripts/setup.sh
SPEEDSCOPE_READER = Path(__file__).with_name("speedscope_folded.mjs")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/setup.sh (it installs it for this test)")
    return path


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """The known run's profile, with a call recorded without a stack (a version-1 trace)."""
    folder = tmp_path_factory.mktemp("run")
    paths = known.write_run(folder)
    bare = write_trace(folder / "12-2.hct", [thread_start(0, tid=12), malloc(1, 7, 0x10)], pid=12)
    return stack_profile([read_trace(p) for p in [*paths, bare]])


def names_of(profile, k: int) -> tuple[str, ...]:
    """Stack k's frame names, innermost first, as the exports name them."""
    return tuple(profile.frames.label(int(f)) for f in profile.stacks[k]) or (NO_STACK,)


def pprof_raw(path: Path, *args: str) -> str:
    r = subprocess.run(
        [tool("go"), "tool", "pprof", "-symbolize=none", *args, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def parse_raw(text: str) -> tuple[list[str], dict[tuple[str, ...], list[int]]]:
    """`go tool pprof -raw`: the sample types (the default marked [dflt]) and the samples'
    values by their stack's location names, leaf first."""
    lines = text.splitlines()
    at = lines.index("Samples:")
    types = lines[at + 1].split()
    samples, j = [], at + 2
    while lines[j].strip() and ":" in lines[j] and not lines[j].startswith("Locations"):
        values, ids = lines[j].split(":", 1)
        samples.append(([int(v) for v in values.split()], ids.split()))
        j += 1
    names = {}
    for line in lines[lines.index("Locations") + 1 :]:
        m = re.match(r"\s+(\d+): 0x[0-9a-f]+ (?:M=\d+ )?(.+?) \S*:\d+ s=0$", line)
        if m:
            names[m[1]] = m[2]
    out: dict[tuple[str, ...], list[int]] = {}
    for values, ids in samples:  # stacks through different lines of one function: summed
        key = tuple(names[i] for i in ids)
        out[key] = [a + b for a, b in zip(out.get(key, [0] * len(values)), values)]
    return types, out


def test_pprof_is_read_by_go_tool_pprof(profile, tmp_path):
    # GIVEN the known run exported as pprof, weighted by peak
    path = tmp_path / "heap.pb.gz"
    write(profile, "pprof", path, "peak", "the known run")
    # WHEN Go's pprof reads it raw
    types, samples = parse_raw(pprof_raw(path, "-raw"))
    # THEN every weight is a sample type, the chosen one the default
    assert types == [
        f"{t}/{u}" + ("[dflt]" if w == "peak" else "") for w, (t, u) in SAMPLE_TYPES.items()
    ]
    # and each stack is one sample with the profile's values, its frames leaf first
    want = {
        names_of(profile, k): [int(profile.weight(w)[k]) for w in WEIGHTS]
        for k in range(len(profile))
    }
    assert samples == want
    assert sum(v[WEIGHTS.index("bytes")] for v in samples.values()) == 2658 + 7


@pytest.mark.parametrize("weight", WEIGHTS)
def test_pprof_totals_per_weight_in_go_tool_pprof_top(profile, tmp_path, weight):
    # GIVEN the export weighted by each weight in turn
    path = tmp_path / "heap.pb.gz"
    write(profile, "pprof", path, weight)
    # WHEN `go tool pprof -top` shows its default sample
    out = pprof_raw(
        path, "-top", "-unit=B" if SAMPLE_TYPES[weight][1] == "bytes" else "-unit=count"
    )
    # THEN it is the weight's and its total is the profile's
    assert f"Type: {SAMPLE_TYPES[weight][0]}" in out
    total = re.search(r"of ([\d.]+)\S* total", out)
    assert total and int(float(total[1])) == int(profile.weight(weight).sum()), out


def speedscope(path: Path) -> dict:
    if not (SPEEDSCOPE / "package.json").is_file():
        pytest.fail(f"{SPEEDSCOPE}: npm's speedscope is not installed: run scripts/setup.sh")
    r = subprocess.run(
        [tool("node"), str(SPEEDSCOPE_READER), str(SPEEDSCOPE), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("weight", WEIGHTS)
def test_collapsed_is_read_by_speedscope(profile, tmp_path, weight):
    # GIVEN the known run as folded stacks, for each weight
    path = tmp_path / "heap.folded"
    write(profile, "collapsed", path, weight)
    # WHEN speedscope's importer reads it
    got = speedscope(path)
    # THEN its total and each frame's total and self weight are the profile's
    w = profile.weight(weight)
    assert got["total"] == int(w.sum())
    want: dict[str, list[int]] = {}
    for k in np.flatnonzero(w > 0).tolist():
        names = names_of(profile, k)
        for n in set(names):
            want.setdefault(n, [0, 0])[0] += int(w[k])
        want[names[0]][1] += int(w[k])
    assert got["frames"] == want


def test_collapsed_lines_are_outer_first_heaviest_first(profile, tmp_path):
    path = tmp_path / "heap.folded"
    write(profile, "collapsed", path, "bytes")
    assert path.read_text().splitlines() == [
        "prog+0x1200;prog+0x1100;prog+0x1020 1000",
        "prog+0x1300;prog+0x1010 1000",
        "prog+0x1200;prog+0x1100;prog+0x1010 650",
        "prog+0x1030 8",
        f"{NO_STACK} 7",
    ]
