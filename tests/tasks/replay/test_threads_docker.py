"""Integration: the threads image builds its programs from docker/workloads/threads/src and a
replay of one traces every thread's calls and prints what the same source prints on the host.

Needs an engine (`scripts/engine.sh up`); see test_replay_docker.py for how a missing one is
handled."""

from __future__ import annotations

import subprocess

import pytest

from tasks.core.storage import Root
from tasks.replay.images import build_all
from tasks.replay.replays import replay_input
from tasks.replay.workloads import IMAGES_DIR, load_catalog
from tests.conftest import need_tool
from tests.tasks.replay.replay_checks import tracer_path

pytestmark = pytest.mark.integration

# hc-larson: 4 threads x 1000 slots filled and freed at the ends, 2 calls a replacement
SLOTS, ROUNDS, THREADS = 1000, 12, 4


def test_larson_replays_in_its_image_with_every_call_and_the_hosts_checksum(engine, tmp_path):
    # GIVEN the threads image, and larson's small input
    build_all(["threads"], host=engine)
    w = load_catalog().get("larson")
    inp = w.input("small")
    # WHEN it is replayed through the docker runner
    m = replay_input(w, inp, tracer_path(), root=Root.from_url(str(tmp_path)), runner="docker")
    # THEN it exits 0 with the main thread and 4 workers traced, every replacement recorded
    assert m.ok and m.exit_code == 0 and m.image == "heapcast/threads:bookworm"
    assert m.processes == 1 and m.threads == THREADS + 1
    calls = 2 * SLOTS * THREADS + 2 * inp.size * THREADS * ROUNDS
    assert calls <= m.events < calls + 100
    # AND it printed the checksum the same source built on the host prints
    gcc = need_tool("gcc")
    exe = tmp_path / "hc-larson"
    src = IMAGES_DIR / "threads" / "src" / "larson.c"
    subprocess.run([gcc, "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    host = subprocess.run(
        [str(exe), str(inp.seed), str(inp.size), str(THREADS)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert host.stdout.strip() in m.log_tail.splitlines()
