"""The `local` runner: the workload on this host, no engine needed (the embedded default).

Inside a bubblewrap sandbox where `bwrap` works (the host's system folders read-only, the same
/heapcast layout as a container, new namespaces, running as nobody); without it the program runs
directly with host paths, as nobody when heapcast runs as root. Weaker than a container: no image.

Limits as the docker runner's (limits.py): a cgroup made for the run, else RLIMIT_NPROC with the
memory limit not enforced (the result's `limits` and `warnings` say which), the time limit by the
runner's timer. The program starts behind a gate (`GATE_SCRIPT`) opened once its pid is in the
cgroup. A measured run (`measure_dir`) runs under `hc-measure` (measure_tool.py). The details:
docs/tracing.md#the-local-runner. No sysroot (`RunRequest.sysroot`): the program ran this host's
own files, where its frames are named.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from tasks.replay.runners.base import (
    PROBE_REPORT,
    RUN_GID,
    RUN_UID,
    SANDBOX,
    SANDBOX_BIN,
    SANDBOX_INPUT,
    SANDBOX_LIB,
    SANDBOX_MEASURE,
    SANDBOX_MEASURE_TOOL,
    SANDBOX_PATHS,
    SANDBOX_PROBE,
    SANDBOX_TRACE,
    SANDBOX_TRACER,
    SANDBOX_WORK,
    Paths,
    Runner,
    RunnerUnavailable,
    RunRequest,
    RunResult,
    program_argv,
    program_env,
    tail_lines,
)
from tasks.replay.runners.limits import RunLimits
from tasks.replay.runners.measure_tool import (
    build_measure_tool,
    measured_command,
    read_measurement,
)
from tasks.replay.workloads import Workload

# Top-level folders of the host shown read-only inside the sandbox (a symlink stays a symlink,
# as /bin -> usr/bin on a merged-/usr Debian).
HOST_SYSTEM_DIRS = (
    "usr",
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "etc",
    "opt",
    "var",
    "srv",
)
KILL_GRACE_S = 2.0
# How often a running program's cgroup is read for an exceeded limit (a fork refused at the pid
# limit leaves the program running, maybe retrying forever: only the runner can stop it).
POLL_S = 0.1
# The gate: waits for the runner's line on standard input (EOF, when the runner could not place
# the run under its limits: exit without running anything), then execs the program with
# /dev/null as its standard input, as before the gate. Unsandboxed, the gate gets the program's
# environment: LD_PRELOAD arrives as GATE_PRELOAD (so the shell itself is not traced), and the
# PWD dash exports is dropped unless the program's environment has one.
GATE_PRELOAD = "HEAPCAST_GATE_PRELOAD"
GATE_SCRIPT = (
    'read -r _ || exit 125; if [ -n "${%(v)s+x}" ]; then LD_PRELOAD=$%(v)s; export LD_PRELOAD; '
    'unset %(v)s; fi; %(pwd)sexec "$@" </dev/null'
)


@functools.cache
def bwrap_works() -> bool:
    """bubblewrap is installed and may create the namespaces it needs here."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False
    try:
        probe = subprocess.run(
            [
                bwrap,
                "--unshare-all",
                "--uid",
                str(RUN_UID),
                "--gid",
                str(RUN_GID),
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "/bin/true",
            ],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


class LocalRunner(Runner):
    kind = "local"

    def __init__(self, sandbox: str = "auto"):
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be auto, bwrap or none, not {sandbox!r}")
        self._want = sandbox

    @property
    def sandbox(self) -> str:
        if self._want == "auto":
            return "bwrap" if bwrap_works() else "none"
        return self._want

    def describe(self) -> str:
        if self.sandbox == "bwrap":
            return "local host, bubblewrap sandbox"
        return "local host, no sandbox (bubblewrap missing or refused: apt-get install bubblewrap)"

    def check(self) -> None:
        if self._want == "bwrap" and not bwrap_works():
            raise RunnerUnavailable(
                "bubblewrap (bwrap) is missing or cannot create namespaces "
                "here: apt-get install bubblewrap, or use sandbox='none'"
            )

    def missing_files(self, workload: Workload, paths: list[str]) -> list[str]:
        """Those of `paths` absent from this host (the sandbox shows the host's /usr)."""
        return [p for p in paths if not os.path.exists(p)]

    def run(self, request: RunRequest) -> RunResult:
        w, inp = request.workload, request.input
        sandboxed = self.sandbox == "bwrap"
        tool = build_measure_tool() if request.measure_dir is not None else None
        if sandboxed:
            paths = SANDBOX_PATHS
            if request.tracer is None:
                paths = dataclasses.replace(paths, tracer=None)
        else:
            paths = Paths(
                tracer=str(request.tracer.resolve()) if request.tracer is not None else None,
                input=str(request.input_dir),
                bin=str(w.bin_dir),
                trace=str(request.trace_dir),
                work=str(request.work_dir),
            )
        argv = program_argv(w, inp, paths)
        if sandboxed:
            libs = tuple(str(SANDBOX_LIB / p.name) for p in request.host_libraries)
            probe = str(SANDBOX_PROBE) if request.probe is not None else None
            probe_out = f"{SANDBOX_MEASURE}/{PROBE_REPORT}"
            measure = str(SANDBOX_MEASURE)
        else:
            libs = tuple(str(p.resolve()) for p in request.host_libraries)
            probe = str(request.probe.resolve()) if request.probe is not None else None
            probe_out = str(Path(request.measure_dir or ".").resolve() / PROBE_REPORT)
            measure = str(request.measure_dir.resolve()) if request.measure_dir else None
        env = program_env(
            w,
            inp,
            paths,
            request.caller,
            request.preload + libs,
            probe=probe,
            probe_out=probe_out,
            extra=request.env,
            measure=measure if request.measure_dir is not None else None,
            frames=request.frames,
        )
        command = argv
        if tool is not None and request.measure_dir is not None:
            if sandboxed:
                command = measured_command(
                    str(SANDBOX_MEASURE_TOOL), str(SANDBOX_MEASURE), argv, cgroup=False
                )
            else:
                command = measured_command(str(tool), str(request.measure_dir), argv, cgroup=False)
        if sandboxed:
            full = bwrap_argv(request, env, tool) + command
            gate_env: dict[str, str] = {"PATH": env["PATH"]}
            extra: dict = {}
        else:
            full = command
            gate_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
            if "LD_PRELOAD" in env:
                gate_env[GATE_PRELOAD] = env["LD_PRELOAD"]
            extra = {}
            if os.geteuid() == 0:
                for d in (request.trace_dir, request.work_dir, request.measure_dir):
                    if d is not None:
                        os.chown(d, RUN_UID, RUN_GID)
                extra = {"user": RUN_UID, "group": RUN_GID, "extra_groups": []}
        pwd = "" if "PWD" in gate_env else "unset PWD; "
        gated = ["/bin/sh", "-c", GATE_SCRIPT % {"v": GATE_PRELOAD, "pwd": pwd}, "heapcast-gate"]
        # the uid the program's processes have on the host (RLIMIT_NPROC counts that uid's):
        # the caller's under bubblewrap (its user namespace maps nobody to the caller: root
        # stays root), else nobody under a root caller, else the caller
        if sandboxed or os.geteuid() != 0:
            run_uid = os.getuid()
        else:
            run_uid = RUN_UID
        limits = RunLimits(w.memory, w.pids_limit, name=f"{w.name}-{inp.name}").setup(run_uid)
        try:
            return self._run_limited(request, gated + full, gate_env, extra, argv, env, limits)
        finally:
            limits.close()

    def _run_limited(
        self,
        request: RunRequest,
        full: list[str],
        gate_env: dict[str, str],
        extra: dict,
        argv: list[str],
        env: dict[str, str],
        limits: RunLimits,
    ) -> RunResult:
        enforcement = limits.enforcement
        log_path = request.work_dir.parent / f"{request.work_dir.name}.log"
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        t0 = time.monotonic()

        def failed(error: str) -> RunResult:
            return RunResult(
                runner=self.kind,
                sandbox=self.sandbox,
                command=argv,
                env=env,
                started_at=started_at,
                duration_s=0.0,
                exit_code=None,
                timed_out=False,
                error=error,
                limits=enforcement.as_dict(),
                warnings=list(enforcement.unenforced),
            )

        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(
                    full,
                    env=gate_env,
                    cwd=request.work_dir,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **extra,
                )
            except OSError as err:
                return failed(f"could not start {full[0]}: {err}")
            assert proc.stdin is not None
            try:
                limits.attach(proc.pid)
            except OSError as err:
                proc.stdin.close()  # EOF: the gate exits without running the program
                proc.wait()
                return failed(f"could not put the run under its limits ({limits.tag}): {err}")
            _open_gate(proc, log, enforcement.unenforced)
            code, timed_out, hit = _watch(proc, limits, t0 + request.time_limit_s)
        duration = time.monotonic() - t0
        logs = log_path.read_bytes().decode("utf-8", "replace") if log_path.exists() else ""
        log_path.unlink(missing_ok=True)
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal: the shell's convention, as docker reports
        result = RunResult(
            runner=self.kind,
            sandbox=self.sandbox,
            command=argv,
            env=env,
            started_at=started_at,
            duration_s=round(duration, 3),
            exit_code=code,
            timed_out=timed_out,
            log_tail=tail_lines(logs),
            error=hit,
            limits=enforcement.as_dict(),
            warnings=list(enforcement.unenforced),
        )
        if request.measure_dir is not None and not timed_out and hit is None:
            read_measurement(request.measure_dir, result)
        return result


def bwrap_argv(
    request: RunRequest, env: dict[str, str], measure_tool: Path | None = None
) -> list[str]:
    """The bubblewrap command line that sets up the /heapcast layout around the program."""
    args = [
        "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--uid",
        str(RUN_UID),
        "--gid",
        str(RUN_GID),
        "--hostname",
        "heapcast",
    ]
    for name in HOST_SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/run",
        "--dir",
        str(SANDBOX),
    ]
    if request.tracer is not None:
        args += ["--ro-bind", str(request.tracer.resolve()), str(SANDBOX_TRACER)]
    if request.probe is not None:
        args += ["--ro-bind", str(request.probe.resolve()), str(SANDBOX_PROBE)]
    for lib in request.host_libraries:
        args += ["--ro-bind", str(lib.resolve()), str(SANDBOX_LIB / lib.name)]
    for host, target in request.workload.host_mounts():
        args += ["--ro-bind", str(host), target]
    if measure_tool is not None and request.measure_dir is not None:
        args += ["--ro-bind", str(measure_tool), str(SANDBOX_MEASURE_TOOL)]
        args += ["--bind", str(request.measure_dir.resolve()), str(SANDBOX_MEASURE)]
    args += [
        "--ro-bind",
        str(request.input_dir.resolve()),
        str(SANDBOX_INPUT),
        "--ro-bind",
        str(request.workload.bin_dir.resolve()),
        str(SANDBOX_BIN),
        "--bind",
        str(request.trace_dir.resolve()),
        str(SANDBOX_TRACE),
        "--bind",
        str(request.work_dir.resolve()),
        str(SANDBOX_WORK),
        "--chdir",
        str(SANDBOX_WORK),
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--"]


def _open_gate(proc: subprocess.Popen, log: BinaryIO, unenforced: list[str]) -> None:
    """Let the gate run the program, once the run's own log says first (the gate has written
    nothing yet) which limits the catalog sets the run is not held to."""
    assert proc.stdin is not None
    for note in unenforced:
        log.write(f"heapcast local runner: {note}\n".encode())
    log.flush()
    try:
        proc.stdin.write(b"go\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the gate is gone already: its exit code says why


def _watch(
    proc: subprocess.Popen, limits: RunLimits, deadline: float
) -> tuple[int | None, bool, str | None]:
    """Wait for the run, stopping it at a limit or the deadline: (its exit code, None when it
    timed out; whether it timed out; the limit it hit)."""
    while True:
        try:
            code = proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            pass
        hit = limits.exceeded()
        if hit is not None:
            _stop(proc, limits)
            return proc.wait(), False, hit
        if time.monotonic() >= deadline:
            _stop(proc, limits)
            return None, True, None
    # an OOM kill or a refused fork the program outlived (or died of) still fails the run: it
    # did not run as it would have with room enough
    return code, False, limits.exceeded()


def _stop(proc: subprocess.Popen, limits: RunLimits) -> None:
    """Stop a run at a limit: every process of its cgroup where it has one (bubblewrap's
    children are in sessions of their own), else its process group."""
    if limits.version:
        limits.stop(KILL_GRACE_S)
        proc.wait()
    else:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL after a grace period (the tracer keeps what it
    flushed; a program that exits on SIGTERM flushes the rest)."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
