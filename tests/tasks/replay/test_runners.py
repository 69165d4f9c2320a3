"""Runners on real programs: the local runner end to end, time limits, a missing engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core.storage import Root
from tasks.format.trace_reader import read_trace
from tasks.replay.manifest import MANIFEST_NAME, RunManifest
from tasks.replay.replays import FAILED_DIR, ReplayFailed, replay_input
from tasks.replay.runners import RunnerUnavailable, resolve_runner_kind
from tasks.replay.runners.docker_runner import DockerRunner
from tasks.replay.runners.local_runner import LocalRunner, bwrap_works
from tasks.replay.workloads import load_catalog
from tests.tasks.replay.replay_checks import (
    reachable_by_nobody,
    run_request,
    tracer_path,
    unpaired_frees,
)

LIMITS = Path(__file__).parent / "catalogs" / "limits.yaml"
NO_ENGINE = "unix:///nonexistent/heapcast-test/docker.sock"


@pytest.fixture(scope="module")
def tracer() -> Path:
    return tracer_path()


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(LIMITS)


def _manifest(run_dir: Path) -> RunManifest:
    return RunManifest.from_json((run_dir / MANIFEST_NAME).read_bytes())


def test_local_replay_of_sqlite3_writes_traces_and_manifest(tracer, catalog, tmp_path):
    # GIVEN a deterministic real workload WHEN it is replayed through the local runner
    w = catalog.get("sqlite3")
    m = replay_input(w, w.input("small"), tracer, root=Root.from_url(str(tmp_path)), runner="local")
    # THEN its run folder holds the traces and a manifest that counts them
    run_dir = tmp_path / "raw" / "sqlite3" / "small"
    assert _manifest(run_dir) == m
    assert m.ok and m.exit_code == 0 and m.error is None and not m.timed_out
    assert m.runner == "local" and m.sandbox == ("bwrap" if bwrap_works() else "none")
    assert m.processes == 1 and m.threads == 1 and m.events > 10_000
    assert sorted(p.name for p in run_dir.glob("*.hct")) == m.files
    trace = read_trace(run_dir / m.files[0])
    assert trace.header.cmdline[0] == "/usr/bin/sqlite3"
    assert unpaired_frees(trace) == 0
    assert m.events_by_op["free"] > 0 and m.env["LD_PRELOAD"].endswith("libheapcast.so")
    # nothing but the run folder is left behind (scratch removed)
    assert sorted(p.name for p in (tmp_path / "raw" / "sqlite3").iterdir()) == ["small"]


def test_time_limit_kills_marks_failed_and_keeps_partial_trace(tracer, catalog, tmp_path):
    # GIVEN a program that never ends and a 3 s limit
    w = catalog.get("forever")
    # WHEN it is replayed THEN the replay fails, naming the limit
    with pytest.raises(ReplayFailed, match="time limit") as err:
        replay_input(w, w.input("small"), tracer, root=Root.from_url(str(tmp_path)), runner="local")
    m = err.value.manifest
    assert m.timed_out and not m.ok and m.exit_code is None
    # AND the partial trace is kept, with the manifest that says so
    run_dir = tmp_path / "raw" / "forever" / "small"
    assert _manifest(run_dir) == m
    assert m.files and m.events > 0
    assert 3 <= m.duration_s


def test_failed_replay_keeps_the_previous_good_run(tracer, catalog, tmp_path):
    w = catalog.get("sqlite3")
    good = replay_input(
        w, w.input("small"), tracer, root=Root.from_url(str(tmp_path)), runner="local"
    )
    # WHEN the same run is replayed and fails (the catalog now expects another exit code)
    bad_w = w.model_copy(update={"expected_exit_code": 3})
    with pytest.raises(ReplayFailed, match="exit code 0, expected 3"):
        replay_input(
            bad_w, w.input("small"), tracer, root=Root.from_url(str(tmp_path)), runner="local"
        )
    # THEN the good run stays in place and the failed one is kept beside it
    raw = tmp_path / "raw" / "sqlite3"
    assert _manifest(raw / "small") == good
    failed = _manifest(raw / FAILED_DIR / "small")
    assert not failed.ok and failed.exit_code == 0 and failed.events == good.events


def test_docker_runner_with_engine_down_says_how_to_start_it(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    with pytest.raises(RunnerUnavailable) as err:
        DockerRunner().check()
    msg = str(err.value)
    assert NO_ENGINE in msg and "scripts/engine.sh up" in msg


def test_auto_picks_local_and_says_why_when_no_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    kind, why = resolve_runner_kind("auto")
    assert kind == "local" and "no engine answers" in why and "scripts/engine.sh up" in why


def test_replay_through_docker_with_engine_down_fails_before_running(
    tracer, catalog, tmp_path, monkeypatch
):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    w = catalog.get("sqlite3")
    with pytest.raises(RunnerUnavailable, match="scripts/engine.sh up"):
        replay_input(
            w, w.input("small"), tracer, root=Root.from_url(str(tmp_path)), runner="docker"
        )
    assert not (tmp_path / "raw" / "sqlite3" / "small").exists()


def test_local_runner_without_sandbox_runs_with_host_paths(tracer, catalog, tmp_path):
    from tasks.replay.inputs import generate_input

    w = catalog.get("sqlite3")
    inp = w.input("small")
    # without a sandbox a root caller runs the program as nobody, who must reach the folders:
    # every folder above them too (under pytest-xdist the temporary root is one level deeper)
    reachable_by_nobody(tmp_path)
    request = run_request(w, tmp_path, tracer)
    generate_input(w.generator, inp.seed, inp.size, request.input_dir)
    res = LocalRunner(sandbox="none").run(request)
    assert res.exit_code == 0 and not res.timed_out and res.sandbox == "none"
    assert res.command[-1] == f".read {request.input_dir}/input.sql"
    assert list(request.trace_dir.glob("*.hct"))
    json.dumps(res.env)


def test_the_stack_depth_reaches_a_traced_program_only(catalog, tmp_path):
    import dataclasses

    from tasks.replay.runners.base import SANDBOX_PATHS, program_env

    w = catalog.get("sqlite3")
    inp = w.input("small")
    env = program_env(w, inp, SANDBOX_PATHS, True, frames=16)
    assert (env["HEAPCAST_FRAMES"], env["HEAPCAST_CALLER"]) == ("16", "1")
    assert "HEAPCAST_FRAMES" not in program_env(w, inp, SANDBOX_PATHS, True)
    untraced = dataclasses.replace(SANDBOX_PATHS, tracer=None)
    assert "HEAPCAST_FRAMES" not in program_env(w, inp, untraced, True, frames=16)
    # a request for stacks without the caller, or deeper than the tracer goes, is refused
    request = run_request(w, tmp_path, None)
    with pytest.raises(ValueError, match="'sqlite3': frames 8 records stacks.*set caller too"):
        dataclasses.replace(request, frames=8)
    with pytest.raises(ValueError, match="'sqlite3': frames must be 0 .* to 128 frames, not 129"):
        dataclasses.replace(request, caller=True, frames=129)


def test_local_replay_records_stacks_as_asked_and_needs_no_sysroot(tracer, catalog, tmp_path):
    # GIVEN a replay asked for stacks 8 deep WHEN it runs here
    w = catalog.get("sqlite3")
    root = Root.from_url(str(tmp_path))
    m = replay_input(w, w.input("small"), tracer, root=root, runner="local", caller=True, frames=8)
    # THEN the program was told, the manifest says so, and nothing was copied: the program ran
    # this host's own files, where its frames are named
    run_dir = tmp_path / "raw" / "sqlite3" / "small"
    assert m.ok and m.frames == 8 and m.caller and m.sysroot == []
    assert (m.env["HEAPCAST_FRAMES"], m.env["HEAPCAST_CALLER"]) == ("8", "1")
    assert not (run_dir / "sysroot").exists()
    trace = read_trace(run_dir / m.files[0])
    assert trace.header.has_caller and trace.header.has_stacks and trace.modules is not None
    assert 1 < int(trace.stacks.depth.max()) <= 8
