"""Integration: a catalog mount reaches the program inside its container, read-only.

Needs an engine (`scripts/engine.sh up`); see test_replay_docker.py for how a missing one is
handled."""

from __future__ import annotations

import pytest

from tasks.replay.images import build_all
from tasks.replay.runners.docker_runner import DockerRunner
from tasks.replay.workloads import parse_catalog
from tests.tasks.replay.replay_checks import run_request

pytestmark = pytest.mark.integration


def test_docker_runner_binds_a_mount_read_only(engine, tmp_path):
    # GIVEN a host folder with a file, and a workload that mounts it and tries to read and write
    build_all(["sqlite3"], host=engine)
    host = tmp_path / "shared"
    host.mkdir()
    (host / "marker.txt").write_text("heapcast mount marker\n")
    host.chmod(0o755)
    (host / "marker.txt").chmod(0o644)
    script = "cat /heapcast/extra/marker.txt; touch /heapcast/extra/new 2>/dev/null && echo WROTE"
    w = parse_catalog(
        {
            "workloads": [
                {
                    "name": "mounted",
                    "image": "sqlite3",
                    "command": ["/bin/sh", "-c", script],
                    "time_limit_s": 60,
                    "mounts": [{"source": str(host), "target": "/heapcast/extra"}],
                    "inputs": [{"name": "small", "seed": 1, "size": 1}],
                }
            ]
        },
        "test",
    ).get("mounted")
    # WHEN it runs through the docker runner, untraced
    result = DockerRunner(engine).run(run_request(w, tmp_path, tracer=None))
    # THEN it read the host's file and could not write beside it
    assert result.exit_code == 1, result.log_tail
    assert "heapcast mount marker" in result.log_tail and "WROTE" not in result.log_tail
    assert not (host / "new").exists()
