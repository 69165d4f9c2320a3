"""Integration: a real replay in a container brings home the image's modules its traces name,
and its callers and stack frames are named from those copies.

Needs an engine (`scripts/engine.sh up`), as test_replay_docker.py."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import docker
from tasks.core.storage import Root
from tasks.format.frames import frame_names
from tasks.format.trace_reader import read_trace
from tasks.replay.images import build_all
from tasks.replay.replays import replay_input
from tasks.replay.runners.sysroot import SYSROOT_DIR, archive, image_module
from tasks.replay.workloads import load_catalog
from tests.tasks.replay.replay_checks import tracer_path

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(engine, tmp_path_factory):
    """sqlite3 `small` replayed in its container, with callers and stacks 32 deep."""
    build_all(["sqlite3"], host=engine)
    root = tmp_path_factory.mktemp("root")
    w = load_catalog().get("sqlite3")
    m = replay_input(
        w, w.input("small"), tracer_path(), root=Root.from_url(str(root)), runner="docker",
        caller=True, frames=32,
    )  # fmt: skip
    return m, root / "raw" / "sqlite3" / "small"


def _image_file_sha256(engine: str, image: str, path: str) -> str:
    """The SHA-256 of a file of the image, links followed, read through the engine."""
    import io
    import tarfile

    client = docker.DockerClient(base_url=engine)
    container = client.containers.create(image, command=["/bin/true"])
    try:
        stream, _ = archive(container, path, docker.errors.NotFound)
        tar = tarfile.open(fileobj=io.BytesIO(b"".join(stream)))
        member = next(m for m in tar if m.isfile())
        return hashlib.sha256(tar.extractfile(member).read()).hexdigest()
    finally:
        container.remove(force=True)
        client.close()


def test_the_modules_the_traces_name_are_the_images_own_files(run, engine):
    m, run_dir = run
    assert m.ok and m.frames == 32 and m.env["HEAPCAST_FRAMES"] == "32"
    # THEN the program, its library and libc were copied, each at the path the traces name
    assert "/usr/bin/sqlite3" in m.sysroot
    assert any(p.endswith("/libsqlite3.so.0") for p in m.sysroot)
    assert any(p.endswith("/libc.so.6") for p in m.sysroot)
    sysroot = run_dir / SYSROOT_DIR
    copied = sorted("/" + str(p.relative_to(sysroot)) for p in sysroot.rglob("*") if p.is_file())
    assert copied == sorted(m.sysroot)
    # byte for byte the image's (its libsqlite3.so.0 is a link to the versioned file)
    lib = next(p for p in m.sysroot if p.endswith("/libsqlite3.so.0"))
    copy = hashlib.sha256((sysroot / lib.lstrip("/")).read_bytes()).hexdigest()
    assert copy == _image_file_sha256(engine, m.image_id, lib)


def test_callers_and_frames_are_named_from_the_sysroot(run):
    m, run_dir = run
    (trace,) = [read_trace(run_dir / f) for f in m.files]
    # every distinct return address the run recorded: callers and stack frames
    assert trace.header.has_stacks and int(trace.stacks.depth.max()) > 3
    distinct = np.unique(np.concatenate([trace.caller[trace.caller != 0], trace.stacks.address]))
    idx, offset = trace.modules.locate(distinct)
    modules = [trace.modules.path[i] if i >= 0 else "" for i in idx]
    names = frame_names(modules, offset, run_dir / SYSROOT_DIR)
    named = {n for n in names if n}
    # sqlite3's allocator wrapper (exported) is named, and the program's start in libc: a
    # stack's outer frames are named from the image's files; every image module was copied
    assert "sqlite3_free" in named or "sqlite3_malloc64" in named, sorted(named)
    assert "__libc_start_call_main" in named or "__libc_start_main" in named, sorted(named)
    assert all(mod in m.sysroot for mod in modules if image_module(mod))
