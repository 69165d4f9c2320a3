"""`heapcast layer --policy place -- PROGRAM`: the program under jemalloc with heapcast's
placement layer in front (native/layers/place.c, built on demand), output and exit code the
program's, then one sentence of what the layer did; a missing jemalloc named with its package."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAPCAST = Path(sys.executable).with_name("heapcast")
BURSTKV = Path(__file__).resolve().parents[2] / "benchmarks" / "programs" / "burstkv.c"


def heapcast(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(HEAPCAST), *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_help_runs_nothing_and_names_the_policy(tmp_path):
    r = heapcast("layer", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "place" in r.stdout and "--policy place" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_missing_jemalloc_is_named_with_its_package(tmp_path):
    import os

    env = dict(os.environ, HEAPCAST_JEMALLOC=str(tmp_path / "libjemalloc.so.2"))
    r = heapcast("layer", "--policy", "place", "--", "true", cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert f"{tmp_path / 'libjemalloc.so.2'} is missing" in r.stderr
    assert "install the Debian package libjemalloc2 (apt-get install libjemalloc2)" in r.stderr


def test_a_bad_option_is_refused_before_anything_runs(tmp_path):
    r = heapcast("layer", "--policy", "place", "-O", "stats=1", "--", "true", cwd=tmp_path)
    assert r.returncode == 2 and "stats is heapcast's" in r.stderr


@pytest.mark.slow
def test_place_keeps_output_and_exit_code_and_says_what_it_placed(tmp_path):
    # GIVEN burstkv: 8 bursts of 100 000 request buffers, a long-lived entry every 100 from
    # another call site
    prog = tmp_path / "burstkv"
    subprocess.run(["gcc", "-O2", "-o", str(prog), str(BURSTKV)], check=True, capture_output=True)
    argv = [str(prog), "8", "100000", "100"]
    plain = subprocess.run(argv, capture_output=True, text=True)
    # WHEN it runs under the placement layer (its stats lines asked for too)
    r = heapcast("layer", "--policy", "place", "--stats", "--", *argv, cwd=tmp_path)
    # THEN output and exit code are the program's, and one sentence says what the layer did
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout) == (0, plain.stdout)
    assert plain.stdout.startswith("entries=8000 ")
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("heapcast layer (place")]
    m = re.match(
        r"heapcast layer \(place, predict\): 1 process\(es\), mode predict: ([\d,]+) "
        r"allocations placed long .*; (\d+) of (\d+) call sites long",
        line,
    )
    assert m, line
    assert int(m[1].replace(",", "")) > 1000 and int(m[2]) >= 1
    assert re.search(r"heapcast layer: pid=\d+ mode=predict long=\d+ ", r.stderr)
    # the layer's own knobs pass through: by size alone, only the few blocks of >= 1024 bytes
    # (burstkv's arrays, stdio's buffers) go long, none of its requests or entries (< 300 B)
    r = heapcast("layer", "--policy", "place", "-O", "mode=size", "--", *argv, cwd=tmp_path)
    assert r.stdout == plain.stdout
    m = re.search(r"heapcast layer \(place, size\): 1 process\(es\), mode size: (\d+) ", r.stderr)
    assert m and int(m[1]) < 100, r.stderr
