"""benchmarks/bench_place.py: burstkv (as is and through one wrapper), the unseen CPython program
and the allocation path under every arm, on a small input; the arms and rounds both placement
benches share."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.harness import REPO

BENCH = REPO / "benchmarks" / "bench_place.py"
NAME = "place"
sys.path.insert(0, str(BENCH.parent))
import bench_place  # noqa: E402


def test_help_runs_nothing():
    p = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--train-shorts" in p.stdout


def test_rounds_rotate_so_every_arm_runs_first_once():
    calls: list[str] = []
    out = bench_place.alternating(["a", "b", "c"], 3, lambda n: calls.append(n) or len(calls))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}


def test_the_bound_and_the_table_are_arms_only_where_their_files_are_given(tmp_path):
    sites, table = tmp_path / "sites.txt", tmp_path / "t.bin"
    plain = bench_place.layer_arms()
    assert set(plain) == {"jemalloc+place-off", "jemalloc+place", "jemalloc+place-size"}
    full = bench_place.layer_arms(sites, table)
    assert full["jemalloc+place-bound"]["HEAPCAST_PLACE"] == f"mode=sites,sites={sites}"
    assert full["jemalloc+place-table"]["HEAPCAST_PLACE"] == f"table={table}"
    for env in full.values():  # the layer in front of jemalloc, in that order
        assert env["LD_PRELOAD"] == f"{bench_place.PLACE} {bench_place.JEMALLOC}"
    both = bench_place.arms(sites, table)
    assert both["jemalloc+place (prompt)"]["MALLOC_CONF"] == bench_place.PROMPT
    assert "glibc (prompt)" not in both and "MALLOC_CONF" not in both["jemalloc+place"]


@pytest.mark.slow
def test_every_arm_gives_the_same_output_and_the_table_knows_burstkv(tmp_path):
    out = tmp_path / "p.json"
    argv = [sys.executable, str(BENCH), "--reps", "1", "--bursts", "2", "--shorts", "3000"]
    argv += ["--pairs", "20000", "--train-bursts", "2", "--train-shorts", "3000"]
    argv += ["--unseen-shorts", "2000", "--out", str(out)]
    subprocess.run(argv, check=True, timeout=600)
    doc = json.loads(out.read_text())  # the harness's one shape, the figures under `results`
    assert doc["benchmark"] == NAME and doc["reference"]
    r = doc["results"]
    assert r["table"]["entries"] > 0
    for part in ("workload", "unseen"):
        assert r[part]["output_identical_across_arms"], part
        assert {"jemalloc+place", "jemalloc+place-bound", "jemalloc+place-table"} <= set(
            r[part]["arms"]
        )
    assert "glibc" in r["workload"]["arms"] and "glibc" not in r["unseen"]["arms"]
    for threads in ("threads=0", "threads=2"):
        assert set(r["cost"][threads]["ns_per_pair_min"]) == {
            "jemalloc",
            "jemalloc+place-off",
            "jemalloc+place",
            "jemalloc+place-table",
            "jemalloc+place-waiting",
            "jemalloc+place-depth2",
            "jemalloc+place-depth4",
            "jemalloc+place-depth8",
        }
    assert r["wrapper"]["output_identical_across_arms"]
    assert r["wrapper"]["sites"]["wrap-1"][0] == "# heapcast place sites 2 depth=1"
    assert r["wrapper"]["rss_end_vs_jemalloc"]["wrapper: jemalloc"] == 1.0
