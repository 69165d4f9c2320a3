"""Integration: the real container engine builds the images and replays a real workload.

Needs an engine (`scripts/engine.sh up`; `.ci/run` starts one). With CI=true a missing engine
is a failure; elsewhere these tests skip, saying how to start one. The first image build is
slow (debootstrap, apt); the engine's data root persists, so later runs reuse the images.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from tasks.core.storage import Root
from tasks.format.trace_reader import read_trace
from tasks.replay.images import BASE_IMAGE, build_all
from tasks.replay.manifest import MANIFEST_NAME, RunManifest
from tasks.replay.replays import replay_input
from tasks.replay.runners.base import RUN_UID
from tasks.replay.workloads import load_catalog
from tests.tasks.replay.replay_checks import op_counts, tracer_path, unpaired_frees

pytestmark = pytest.mark.integration

# Start-up records that may differ between a container and the host sandbox: the same binary
# and libraries, but glibc's start-up (locale, nss) reads files of two different root file
# systems (the image's and the host's). Measured: 2 mallocs of ~540 bytes, at record 12.
STARTUP_RECORDS = 64


@pytest.fixture(scope="module")
def images(engine):
    builds = build_all(["sqlite3"], host=engine)
    assert [b.tag for b in builds] == [BASE_IMAGE, "heapcast/sqlite3:bookworm"]
    # building again is a no-op
    again = build_all(["sqlite3"], host=engine)
    assert not any(b.built for b in again)
    assert [b.image_id for b in again] == [b.image_id for b in builds]
    return builds


@pytest.fixture(scope="module")
def runs(images, tmp_path_factory):
    """sqlite3 `small` (deterministic) replayed through docker and through local."""
    tracer = tracer_path()
    w = load_catalog().get("sqlite3")
    out = {}
    for runner in ("docker", "local"):
        root = tmp_path_factory.mktemp(runner)
        m = replay_input(w, w.input("small"), tracer, root=Root.from_url(str(root)), runner=runner)
        run_dir = root / "raw" / "sqlite3" / "small"
        out[runner] = (m, [read_trace(run_dir / f) for f in m.files], run_dir)
    return out


def test_docker_replay_records_events_exit_code_and_image(runs, images):
    m, traces, run_dir = runs["docker"]
    assert RunManifest.from_json((run_dir / MANIFEST_NAME).read_bytes()) == m
    assert m.ok and m.runner == "docker" and m.sandbox == "docker"
    assert m.exit_code == 0 and m.expected_exit_code == 0 and not m.timed_out
    assert m.image == "heapcast/sqlite3:bookworm" and m.image_id == images[1].image_id
    assert m.events > 0 and m.processes == len(traces) == 1 and m.threads == 1
    assert m.events == sum(int((t.op != 64).sum()) for t in traces)
    # inside the container the program sees the /heapcast layout and runs as nobody
    assert traces[0].header.cmdline[-1] == ".read /heapcast/input/input.sql"
    assert m.env["LD_PRELOAD"] == "/heapcast/tracer/libheapcast.so"


def test_every_free_is_paired_with_an_earlier_allocation(runs):
    for runner in ("docker", "local"):
        for t in runs[runner][1]:
            assert unpaired_frees(t) == 0, runner


def test_docker_and_local_agree_on_a_deterministic_input(runs):
    (md, td, _), (ml, tl, _) = runs["docker"], runs["local"]
    assert md.command == ml.command
    cd, cl = op_counts(td), op_counts(tl)
    assert set(cd) == set(cl)
    # per operation the counts agree up to the start-up records (see STARTUP_RECORDS) ...
    for op in cd:
        assert abs(cd[op] - cl[op]) <= STARTUP_RECORDS, (op, cd[op], cl[op])
    # ... and after start-up the two sequences of (operation, size) are identical
    a, b = td[0], tl[0]
    n = min(len(a), len(b)) - STARTUP_RECORDS
    assert n > 0.99 * max(len(a), len(b))
    assert np.array_equal(a.op[-n:], b.op[-n:])
    assert np.array_equal(a.size[-n:], b.size[-n:])


def test_a_caller_that_is_not_root_shares_the_trace_folder_through_its_group(
    images, tmp_path, monkeypatch
):
    # GIVEN a caller that is not root: it cannot give its folders to the container's user
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    w = load_catalog().get("sqlite3")

    # WHEN it replays a workload in a container
    m = replay_input(
        w, w.input("small"), tracer_path(), root=Root.from_url(str(tmp_path)), runner="docker"
    )

    # THEN the container's user (nobody, given the caller's group) wrote the traces, which stay
    # in that group, and the folder is no one else's to write
    assert m.ok and m.events > 0 and m.files
    run_dir = tmp_path / "raw" / "sqlite3" / "small"
    assert not run_dir.stat().st_mode & stat.S_IWOTH
    for name in m.files:
        st = (run_dir / name).stat()
        assert (st.st_uid, st.st_gid) == (RUN_UID, os.getegid())
