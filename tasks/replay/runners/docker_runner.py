"""The `docker` runner: each replay in a fresh container of the workload's image.

Through the Docker SDK at DOCKER_HOST (else the socket `scripts/engine.sh up` starts, else the
default one). The container runs as nobody, with no network but its own loopback, memory and
pid limits, no capabilities, the tracer mounted read-only and the trace folder mounted
read-write. At the time limit it is killed; what the tracer had written stays on the host.
The folders it writes into (trace, work, measure) are shared with the container's user and no
one else (`share_with_run_user`).

Containers are created, started, waited for and removed explicitly (never `run --rm`): through
Podman's Docker-compatible socket `--rm` reports exit code 0 for a failing command.

A measured run (`measure_dir`) runs under `hc-measure` as the container's PID 1
(docs/tracing.md#measured-runs).
"""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

import docker
from tasks.replay.runners.base import (
    PROBE_REPORT,
    RUN_GID,
    RUN_UID,
    SANDBOX_INPUT,
    SANDBOX_LIB,
    SANDBOX_MEASURE,
    SANDBOX_MEASURE_TOOL,
    SANDBOX_PATHS,
    SANDBOX_PROBE,
    SANDBOX_TRACE,
    SANDBOX_TRACER,
    SANDBOX_WORK,
    EngineError,
    Runner,
    RunnerUnavailable,
    RunRequest,
    RunResult,
    program_argv,
    program_env,
    tail_lines,
)
from tasks.replay.runners.measure_tool import (
    build_measure_tool,
    measured_command,
    read_measurement,
)
from tasks.replay.runners.sysroot import (
    SYSROOT_DIR,
    SysrootCopy,
    archive,
    copy_modules,
    image_cache,
    named_modules,
)
from tasks.replay.workloads import Workload

# The socket scripts/engine.sh starts when no engine runs.
HEAPCAST_ENGINE_HOST = "unix:///run/heapcast-docker/docker.sock"
DEFAULT_HOST = "unix:///var/run/docker.sock"
START_HINT = (
    "start one with `scripts/engine.sh up` and export the DOCKER_HOST it prints "
    "(or replay with runner='local')"
)


def engine_host() -> str:
    """DOCKER_HOST, else the heapcast engine's socket when it exists, else Docker's default."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host
    if Path(HEAPCAST_ENGINE_HOST.removeprefix("unix://")).exists():
        return HEAPCAST_ENGINE_HOST
    return DEFAULT_HOST


def connect(host: str | None = None, timeout: int = 60):
    """A docker client that answered a ping; RunnerUnavailable with the way out otherwise."""

    host = host or engine_host()
    try:
        client = docker.DockerClient(base_url=host, timeout=timeout)
        client.ping()
    except DockerException as err:
        raise RunnerUnavailable(
            f"no container engine answers at DOCKER_HOST={host} ({err}); {START_HINT}"
        ) from None
    except Exception as err:  # requests' connection errors and the like
        raise RunnerUnavailable(
            f"no container engine answers at DOCKER_HOST={host} "
            f"({type(err).__name__}: {err}); {START_HINT}"
        ) from None
    return client


def engine_answers(host: str | None = None) -> bool:
    try:
        connect(host, timeout=5).close()
        return True
    except RunnerUnavailable:
        return False


class DockerRunner(Runner):
    kind = "docker"

    def __init__(self, host: str | None = None):
        self.host = host or engine_host()

    def describe(self) -> str:
        return f"docker engine at {self.host}"

    def check(self) -> None:
        connect(self.host, timeout=10).close()

    def missing_files(self, workload: Workload, paths: list[str]) -> list[str]:
        """Those of `paths` absent from the workload's image (read from a created, never
        started container: no process runs)."""

        client = connect(self.host)
        try:
            image = _image(client, workload)
            container = client.containers.create(image.id, command=["/bin/true"])
            try:
                return [p for p in paths if not _exists_in(container, p, NotFound)]
            finally:
                container.remove(force=True)
        finally:
            client.close()

    def run(self, request: RunRequest) -> RunResult:

        w, inp = request.workload, request.input
        paths = SANDBOX_PATHS
        if request.tracer is None:
            paths = dataclasses.replace(SANDBOX_PATHS, tracer=None)
        argv = program_argv(w, inp, paths)
        libs = tuple(str(SANDBOX_LIB / p.name) for p in request.host_libraries)
        env = program_env(
            w,
            inp,
            paths,
            request.caller,
            request.preload + libs,
            probe=str(SANDBOX_PROBE) if request.probe is not None else None,
            probe_out=f"{SANDBOX_MEASURE}/{PROBE_REPORT}",
            extra=request.env,
            measure=str(SANDBOX_MEASURE) if request.measure_dir is not None else None,
            frames=request.frames,
        )
        shared_gids = {
            share_with_run_user(d)
            for d in (request.trace_dir, request.work_dir, request.measure_dir)
            if d is not None
        }
        group_add = sorted(str(g) for g in shared_gids if g is not None)
        command = argv
        mounts = {
            str(request.input_dir.resolve()): {"bind": str(SANDBOX_INPUT), "mode": "ro"},
            str(request.trace_dir.resolve()): {"bind": str(SANDBOX_TRACE), "mode": "rw"},
            str(request.work_dir.resolve()): {"bind": str(SANDBOX_WORK), "mode": "rw"},
        }
        if request.tracer is not None:
            mounts[str(request.tracer.resolve())] = {"bind": str(SANDBOX_TRACER), "mode": "ro"}
        if request.probe is not None:
            mounts[str(request.probe.resolve())] = {"bind": str(SANDBOX_PROBE), "mode": "ro"}
        for lib in request.host_libraries:
            mounts[str(lib.resolve())] = {"bind": str(SANDBOX_LIB / lib.name), "mode": "ro"}
        for host, target in w.host_mounts():
            mounts[str(host)] = {"bind": target, "mode": "ro"}
        if request.measure_dir is not None:
            tool = build_measure_tool()
            mounts[str(tool)] = {"bind": str(SANDBOX_MEASURE_TOOL), "mode": "ro"}
            mounts[str(request.measure_dir.resolve())] = {
                "bind": str(SANDBOX_MEASURE),
                "mode": "rw",
            }
            command = measured_command(
                str(SANDBOX_MEASURE_TOOL), str(SANDBOX_MEASURE), argv, cgroup=True
            )
        client = connect(self.host)
        try:
            image = _image(client, w)
            try:
                container = client.containers.create(
                    image.id,
                    command=command,
                    environment=env,
                    user=f"{RUN_UID}:{RUN_GID}",
                    group_add=group_add or None,
                    working_dir=str(SANDBOX_WORK),
                    hostname="heapcast",
                    network_mode=w.network,
                    mem_limit=w.memory,
                    memswap_limit=w.memory,
                    pids_limit=w.pids_limit,
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    volumes=mounts,
                    detach=True,
                    labels={"heapcast.workload": w.name, "heapcast.input": inp.name},
                )
            except (APIError, DockerException) as err:
                raise EngineError(
                    f"workload {w.name!r}: the engine could not create its container: {err}"
                ) from err
            return self._start_and_wait(container, request, argv, env, image)
        finally:
            client.close()

    def _start_and_wait(self, container, request: RunRequest, argv, env, image) -> RunResult:

        w = request.workload
        limit = request.time_limit_s
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        t0 = time.monotonic()
        timed_out = False
        exit_code: int | None = None
        error = None
        sysroot: SysrootCopy | None = None
        warnings: list[str] = []
        try:
            try:
                container.start()
            except (APIError, DockerException) as err:
                raise EngineError(
                    f"workload {w.name!r}: the engine could not start its container: {err}"
                ) from err
            try:
                status = container.wait(timeout=limit)
                exit_code = int(status.get("StatusCode", -1))
                if status.get("Error"):
                    error = f"engine: {status['Error']}"
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                if time.monotonic() - t0 < limit * 0.99:
                    raise EngineError(
                        f"workload {w.name!r}: lost the engine while waiting for its container"
                    ) from None
                timed_out = True
                container.kill()
                container.wait(timeout=60)
            duration = time.monotonic() - t0
            if request.sysroot and request.tracer is not None:
                sysroot, warning = _copy_sysroot(
                    container, request, image_cache(w.image_tag, image.id)
                )
                warnings += [warning] if warning else []
            if not timed_out:
                container.reload()
                if container.attrs.get("State", {}).get("OOMKilled"):
                    error = (
                        f"killed by the memory limit ({w.memory}); raise `memory` in the catalog"
                    )
            try:
                logs = container.logs(stdout=True, stderr=True, tail=200).decode("utf-8", "replace")
            except (APIError, DockerException):
                logs = ""
        finally:
            try:
                container.remove(force=True)
            except Exception:  # the container is gone already, or the engine is: nothing to keep
                pass
        result = RunResult(
            runner=self.kind,
            sandbox="docker",
            command=argv,
            env=env,
            started_at=started_at,
            duration_s=round(duration, 3),
            exit_code=None if timed_out else exit_code,
            timed_out=timed_out,
            image=w.image_tag,
            image_id=image.id,
            log_tail=tail_lines(logs),
            error=error,
            warnings=warnings,
            sysroot=sysroot,
        )
        if request.measure_dir is not None and not timed_out:
            read_measurement(request.measure_dir, result)
        return result


def _copy_sysroot(
    container, request: RunRequest, cache: Path
) -> tuple[SysrootCopy | None, str | None]:
    """The image's modules the run's traces name, copied into `trace_dir/sysroot/` (sysroot.py)
    from the stopped container or the image's cache; a failure only warns: the frames then stay
    module + offset."""
    try:
        modules = named_modules(request.trace_dir)
        sysroot = request.trace_dir / SYSROOT_DIR
        return copy_modules(container, modules, sysroot, NotFound, cache), None
    except (APIError, DockerException, OSError, requests.exceptions.RequestException) as err:
        return None, (
            f"workload {request.workload.name!r}: could not copy its modules out of the "
            f"container ({type(err).__name__}: {err}); its frames stay unnamed (module + offset)"
        )


def _image(client, w: Workload):

    try:
        return client.images.get(w.image_tag)
    except ImageNotFound:
        raise RunnerUnavailable(
            f"workload {w.name!r}: image {w.image_tag} is not built; build it with "
            "tasks.replay.images.build_images (the trace flow does) or "
            "`python -m tasks.replay.images`"
        ) from None


def _exists_in(container, path: str, not_found: type[Exception]) -> bool:
    """Whether `path` exists in a container's file system, symlinks followed."""
    found = archive(container, path, not_found)
    if found is None:
        return False
    for _ in found[0]:  # drain the archive (a library: under a MB) so the connection is reused
        pass
    return True


def share_with_run_user(path: Path) -> int | None:
    """Let the container's user (RUN_UID:RUN_GID, the same ids on the host under a rootful
    engine) write into a host folder, and no other user.

    Root gives the folder to that user (mode 755: the host may read the traces). Anyone else
    cannot give a folder away: they keep it and share it through their own primary group (mode
    2770: setgid, so what the container writes there stays in that group; nothing for others),
    and the container's user joins that group (`group_add`). Returns the group to add, or None.
    Never mode 777: another local user could then plant trace files that get converted and
    trained on."""
    if os.geteuid() == 0:
        os.chown(path, RUN_UID, RUN_GID)
        path.chmod(0o755)
        return None
    gid = os.getegid()
    os.chown(path, -1, gid)  # an owner may give their folder to any group of theirs
    path.chmod(0o2770)
    return gid
