"""benchmarks/bench_place_servers.py: the real redis-server (Debian's, installed by setup.sh) under
every arm, on a small input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from benchmarks.harness import REPO

# runs redis-server seven times and builds the layer: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

BENCH = REPO / "benchmarks" / "bench_place_servers.py"
NAME = "place_servers"


def test_help_runs_nothing():
    p = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--requests" in p.stdout


def test_every_arm_keeps_the_same_state_and_reports_each_burst(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is missing: scripts/setup.sh installs Debian's redis-server")
    out = tmp_path / "r.json"
    argv = [sys.executable, str(BENCH), "--reps", "1", "--bursts", "2", "--requests", "500"]
    argv += ["--every", "100", "--sessions", "1", "--out", str(out)]
    subprocess.run(argv, check=True, timeout=300)
    doc = json.loads(out.read_text())  # the harness's one shape, the figures under `results`
    assert doc["benchmark"] == NAME and doc["reference"]
    r = doc["results"]
    assert r["keys_identical_across_arms"]
    assert set(r["arms"]) >= {"jemalloc (redis's own)", "jemalloc+place", "jemalloc+place-bound"}
    for arm in r["arms"].values():
        assert arm["keys"] == [2 * 5]  # every 100th of 500 kept, two bursts: the rest deleted
        assert len(arm["rss_after_bursts_kb"]) == len(arm["used_memory_after_bursts_kb"]) == 2
        assert arm["peak_rss_kb"] >= arm["rss_end_kb"] > 0
    # the layer was in the server: its stats line, from the process redis-server is
    assert r["counter_stats"] and r["counter_stats"][0].startswith("heapcast place: pid=")
    # kv_service: the same state at the end under every arm, glibc's among them
    kv = r["kv_service"]
    assert kv["output_identical_across_arms"]
    assert set(kv["arms"]) >= {"glibc", "jemalloc", "jemalloc+place", "jemalloc+place-bound"}
    assert kv["counter_stats"][0].startswith("heapcast place: pid=")
    assert all(a["peak_rss_kb"] > 0 and a["runs"] == 1 for a in kv["arms"].values())
