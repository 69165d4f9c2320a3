"""Replay one workload input with the tracer preloaded and publish its traces and manifest.

    <root>/raw/<workload>/<run>/<pid>-<ns>.hct ... manifest.json      (run = the input's name)
    <root>/raw/<workload>/<run>/sysroot/<path>    a container run's modules (runners/sysroot.py)

The traces are written into a staging folder and swapped in when the replay ends, so a replay
that fails never destroys the previous good run: a failed run (wrong exit code, time limit,
no events) goes to `<run>/` only when there was no good run there, else to
`<root>/raw/<workload>/_failed/<run>/`; either way its partial traces are kept and its manifest
says `ok: false` and why. Readers take runs from manifests with `ok: true`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import socket
import tempfile
import uuid
from collections import deque
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from tasks.core.storage import Root
from tasks.format.trace_reader import TraceCounts, count_traces
from tasks.replay.inputs import generate_input
from tasks.replay.manifest import MANIFEST_NAME, RunManifest
from tasks.replay.runners.base import EngineError, RunRequest, RunResult
from tasks.replay.runners.select import make_runner, resolve_runner_kind
from tasks.replay.workloads import Workload, WorkloadInput

FAILED_DIR = "_failed"


class ReplayFailed(RuntimeError):
    """The workload ran but its run is not good (exit code, time limit, no events); the
    manifest, already published with its partial traces, says why."""

    def __init__(self, manifest: RunManifest, where: str):
        self.manifest = manifest
        self.where = where
        super().__init__(
            f"workload {manifest.workload!r} input {manifest.input!r}: "
            f"{manifest.error} (partial traces and manifest in {where})"
        )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def judge(
    workload: Workload, result: RunResult, counts: TraceCounts, time_limit_s: float
) -> str | None:
    """Why a run is not good, or None when it is."""
    if result.error and result.exit_code is None and not result.timed_out:
        return result.error
    if result.timed_out:
        return (
            f"exceeded its time limit of {time_limit_s:g} s and was killed "
            f"(log: {result.log_tail.splitlines()[-1] if result.log_tail else 'empty'})"
        )
    if result.error:
        return result.error
    if result.exit_code != workload.expected_exit_code:
        last = result.log_tail.splitlines()[-3:] if result.log_tail else []
        return (
            f"exit code {result.exit_code}, expected {workload.expected_exit_code}; "
            f"last output: {' | '.join(last) or '(none)'}"
        )
    if counts.events == 0:
        return (
            "the program ran but no heap events were recorded: the tracer did not load "
            "(is LD_PRELOAD reaching the program? a static binary?)"
        )
    return None


def _read_manifest(fs, path: str) -> RunManifest | None:
    try:
        with fs.open(posixpath.join(path, MANIFEST_NAME), "rb") as f:
            return RunManifest.from_json(f.read())
    except Exception:  # missing or unreadable: not a good run
        return None


def publish_run(root: Root, local_dir: Path, workload: str, run: str, ok: bool) -> str:
    """Move `local_dir` (traces + manifest) to its place under the root; returns the path.

    Staged next to the target and swapped in, so readers never see half a run."""
    fs = root.fs
    final = root.raw_run(workload, run)
    parent = posixpath.dirname(final)
    if not ok:
        previous = _read_manifest(fs, final) if fs.exists(final) else None
        if previous is not None and previous.ok:
            final = root.join("raw", workload, FAILED_DIR, run)
            parent = posixpath.dirname(final)
    tag = uuid.uuid4().hex[:8]
    staging = posixpath.join(parent, f".{run}.staging-{tag}")
    old = posixpath.join(parent, f".{run}.old-{tag}")
    fs.makedirs(parent, exist_ok=True)
    if root.is_local:
        shutil.move(str(local_dir), staging)
    else:
        for p in sorted(local_dir.rglob("*")):  # the traces, the manifest, sysroot/'s files
            if p.is_file():
                fs.put_file(str(p), posixpath.join(staging, *p.relative_to(local_dir).parts))
    if fs.exists(final):
        _move_tree(root, final, old)
    _move_tree(root, staging, final)
    if fs.exists(old):
        fs.rm(old, recursive=True)
    return final


def _move_tree(root: Root, src: str, dst: str) -> None:
    """A rename on a local root; on object storage (no folders, no rename) a copy of every
    object under `src`, then its removal."""
    fs = root.fs
    if root.is_local:
        fs.mv(src, dst, recursive=True)
        return
    for path in fs.find(src):
        fs.copy(path, dst + path[len(src) :])
    fs.rm(src, recursive=True)


def _scratch_parent(root: Root) -> str:
    """Scratch beside the data for a local root (the traces are then renamed into place)."""
    env = os.environ.get("HEAPCAST_SCRATCH")
    if env:
        return env
    if root.is_local:
        return root.join("raw")
    return tempfile.gettempdir()


def _own(path: Path) -> None:
    """Give the files the sandbox user wrote back to us (chown only works as root)."""
    if os.geteuid() != 0:
        return
    uid, gid = os.getuid(), os.getgid()
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, uid, gid)
        for n in filenames:
            os.chown(os.path.join(dirpath, n), uid, gid)


def _manifest(
    workload: Workload,
    inp: WorkloadInput,
    request: RunRequest,
    result: RunResult,
    counts: TraceCounts,
    input_files: list[str],
) -> RunManifest:
    """The run's manifest: what ran where, how it ended, what it traced, and the verdict."""
    error = judge(workload, result, counts, request.time_limit_s)
    tracer = request.tracer
    return RunManifest(
        workload=workload.name,
        input=inp.name,
        run=inp.name,
        seed=inp.seed,
        size=inp.size,
        runner=result.runner,
        sandbox=result.sandbox,
        image=result.image,
        image_id=result.image_id,
        command=result.command,
        env=result.env,
        exit_code=result.exit_code,
        expected_exit_code=workload.expected_exit_code,
        ok=error is None,
        error=error,
        timed_out=result.timed_out,
        time_limit_s=request.time_limit_s,
        started_at=result.started_at,
        duration_s=result.duration_s,
        processes=counts.processes,
        threads=counts.threads,
        events=counts.events,
        events_by_op=counts.events_by_op,
        files=counts.files,
        unreadable_files=counts.unreadable_files,
        input_files=input_files,
        tracer_sha256=sha256_file(tracer),
        caller=request.caller,
        frames=request.frames,
        sysroot=list(result.sysroot.modules) if result.sysroot else [],
        sysroot_bytes=result.sysroot.bytes if result.sysroot else 0,
        sysroot_s=result.sysroot.seconds if result.sysroot else 0.0,
        host=result.host or socket.gethostname(),
        log_tail=result.log_tail,
    )


def replay_input(
    workload: Workload,
    inp: WorkloadInput,
    tracer: str | Path,
    root: Root,
    runner: str = "auto",
    caller: bool = False,
    log=None,
    frames: int = 0,
) -> RunManifest:
    """Generate the input, run it, count the traces, publish traces + manifest.

    `frames`: the call stacks' depth asked for (the workload's own `frames` caps it; stacks need
    `caller`). A run in a container also brings home the image's modules its traces name
    (`<run>/sysroot/`, runners/sysroot.py), so that its frames can be named.

    Returns the manifest of a good run; raises ReplayFailed (after publishing) for a bad one,
    EngineError for an engine hiccup (nothing published: worth a retry), RunnerUnavailable
    when the runner cannot run here."""

    log = log or _logger()
    tracer = Path(tracer)
    if not tracer.is_file():
        raise FileNotFoundError(f"tracer {tracer} not found: build it with `make -C native`")
    kind, why = resolve_runner_kind(runner)  # type: ignore[arg-type]
    log.info(f"{workload.name}/{inp.name}: {why}")
    run_runner = make_runner(kind)
    run_runner.check()
    scratch_parent = Path(_scratch_parent(root)) / workload.name
    scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".replay-{inp.name}-", dir=scratch_parent))
    try:
        input_dir, trace_dir, work_dir = (scratch / d for d in ("input", "trace", "work"))
        for d in (input_dir, trace_dir, work_dir):
            d.mkdir()
        input_files = generate_input(workload.generator, inp.seed, inp.size, input_dir)
        for d in (scratch, input_dir):
            d.chmod(0o755)
        for f in input_files:
            (input_dir / f).chmod(0o644)
        request = RunRequest(
            workload=workload,
            input=inp,
            tracer=tracer,
            input_dir=input_dir,
            trace_dir=trace_dir,
            work_dir=work_dir,
            caller=caller,
            frames=workload.frames_for(frames),
            sysroot=True,
        )
        result = run_runner.run(request)
        for note in result.warnings:  # a limit of the catalog this run was not held to
            log.warning(f"{workload.name}/{inp.name}: {note}")
        _own(trace_dir)
        counts = count_traces(trace_dir)
        manifest = _manifest(workload, inp, request, result, counts, input_files)
        (trace_dir / MANIFEST_NAME).write_text(manifest.to_json())
        where = publish_run(root, trace_dir, workload.name, inp.name, manifest.ok)
        where_url = where if root.is_local else root.url.split("://")[0] + "://" + where
        if not manifest.ok:
            log.error(f"{workload.name}/{inp.name} failed: {manifest.error}")
            raise ReplayFailed(manifest, where_url)
        log.info(
            f"{workload.name}/{inp.name}: {manifest.events:,} events, "
            f"{manifest.processes} processes, {manifest.duration_s:.1f} s -> {where_url}"
        )
        if result.sysroot is not None:
            s = result.sysroot
            log.info(
                f"{workload.name}/{inp.name}: sysroot: {len(s.modules)} modules, "
                f"{len(s.debug_files)} debug files, {s.bytes / 1e6:.1f} MB in {s.seconds:.1f} s"
                + (f"; not in the image: {', '.join(s.missing)}" if s.missing else "")
            )
        return manifest
    finally:
        _own(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def _logger():
    try:
        return get_run_logger()
    except Exception:  # outside a run: plain logging
        return logging.getLogger("heapcast.replay")


def _retry_engine_hiccups(task, task_run, state) -> bool:
    """Retry only what a retry can fix: the engine failing, not the workload."""
    try:
        state.result()
    except EngineError:
        return True
    except Exception:
        return False
    return False


@task(
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_engine_hiccups,
    cache_policy=NO_CACHE,
    task_run_name="replay-{workload.name}-{input.name}",
)
def replay(
    workload: Workload,
    input: WorkloadInput,
    tracer: str,
    root: Root,
    runner: str = "auto",
    caller: bool = False,
    frames: int = 0,
) -> RunManifest:
    """Replay one workload input in its container (or sandbox) and publish its traces."""
    return replay_input(
        workload, input, tracer, root=root, runner=runner, caller=caller, frames=frames
    )


class ReplayOutcome(BaseModel):
    workload: str
    input: str
    ok: bool
    error: str | None = None
    events: int | None = None
    processes: int | None = None
    threads: int | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    timed_out: bool = False


class TraceSummary(BaseModel):
    runner: str
    runner_reason: str
    tracer: str
    root: str
    runs: list[ReplayOutcome]

    @property
    def failed(self) -> list[ReplayOutcome]:
        return [r for r in self.runs if not r.ok]

    def markdown(self) -> str:
        lines = [
            f"# heapcast trace: {len(self.runs) - len(self.failed)} of {len(self.runs)} runs ok",
            "",
            f"Runner: {self.runner_reason}. Root: `{self.root}`.",
            "",
            "| workload | input | result | events | processes | threads | duration (s) | why |",
            "|---|---|---|---:|---:|---:|---:|---|",
        ]
        for r in self.runs:
            why = (r.error or "").replace("|", "\\|").replace("\n", " ")[:300]

            def fmt(v):
                return "" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.1f}"

            lines.append(
                f"| {r.workload} | {r.input} | {'ok' if r.ok else '**failed**'} | "
                f"{fmt(r.events)} | {fmt(r.processes)} | {fmt(r.threads)} | "
                f"{fmt(r.duration_s)} | {why} |"
            )
        return "\n".join(lines) + "\n"


def outcome_of(workload: str, input: str, state) -> ReplayOutcome:
    """A replay task's final state as one summary row."""
    value = state.result(raise_on_failure=False)
    if isinstance(value, RunManifest):
        m = value
    elif isinstance(value, ReplayFailed):
        m = value.manifest
    else:
        err = value if isinstance(value, BaseException) else None
        why = f"{type(err).__name__}: {err}" if err else f"task ended {state.type.value}"
        return ReplayOutcome(workload=workload, input=input, ok=False, error=why)
    return ReplayOutcome(
        workload=m.workload,
        input=m.input,
        ok=m.ok,
        error=m.error,
        events=m.events,
        processes=m.processes,
        threads=m.threads,
        duration_s=m.duration_s,
        exit_code=m.exit_code,
        timed_out=m.timed_out,
    )


def replay_all(pairs: list, max_parallel: int, **kwargs) -> list:
    """Submit one `replay` per (workload, input), at most `max_parallel` in flight (replays
    are heavy: containers, CPU, disk), and wait for all; one failure stops none of the others."""
    futures: list = []
    in_flight: deque = deque()
    for workload, inp in pairs:
        while len(in_flight) >= max_parallel:
            in_flight.popleft().wait()
        f = replay.submit(workload, inp, **kwargs)
        futures.append(f)
        in_flight.append(f)
    for f in futures:
        f.wait()
    return futures


def report_replays(
    pairs: list, futures: list, *, runner: str, runner_reason: str, tracer: str, root: Root
) -> TraceSummary:
    """The replays' summary: published as the `trace-summary` artifact, failures logged."""
    log = get_run_logger()
    summary = TraceSummary(
        runner=runner,
        runner_reason=runner_reason,
        tracer=tracer,
        root=root.url,
        runs=[outcome_of(w.name, i.name, f.state) for (w, i), f in zip(pairs, futures)],
    )
    create_markdown_artifact(
        summary.markdown(), key="trace-summary", description="replays: ok or failed, why, events"
    )
    for r in summary.failed:
        log.error(f"{r.workload}/{r.input} failed: {r.error}")
    log.info(f"{len(summary.runs) - len(summary.failed)} of {len(summary.runs)} replays ok")
    return summary
