"""The `local` runner: the workload on this host, no engine needed (the embedded default).

Inside a bubblewrap sandbox where `bwrap` works: the host's system folders read-only, the same
/heapcast layout as a container (so command lines, and heap calls, match the docker runner),
new pid/net/ipc/uts namespaces (loopback only), running as nobody. Without bubblewrap the
program runs directly with host paths, as nobody when heapcast runs as root. Weaker than a
container: no image (the host's packages), no memory or pid limit; the time limit holds.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from tasks.runners.base import (
    RUN_GID, RUN_UID, SANDBOX, SANDBOX_BIN, SANDBOX_INPUT, SANDBOX_PATHS, SANDBOX_TRACE,
    SANDBOX_TRACER, SANDBOX_WORK, Paths, RunRequest, RunResult, Runner, RunnerUnavailable,
    program_argv, program_env, tail_lines,
)

# Top-level folders of the host shown read-only inside the sandbox (a symlink stays a symlink,
# as /bin -> usr/bin on a merged-/usr Debian).
HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var",
                    "srv")
KILL_GRACE_S = 2.0


@functools.cache
def bwrap_works() -> bool:
    """bubblewrap is installed and may create the namespaces it needs here."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False
    try:
        probe = subprocess.run(
            [bwrap, "--unshare-all", "--uid", str(RUN_UID), "--gid", str(RUN_GID),
             "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "/bin/true"],
            capture_output=True, timeout=30)
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
            raise RunnerUnavailable("bubblewrap (bwrap) is missing or cannot create namespaces "
                                    "here: apt-get install bubblewrap, or use sandbox='none'")

    def run(self, request: RunRequest) -> RunResult:
        w, inp = request.workload, request.input
        sandboxed = self.sandbox == "bwrap"
        if sandboxed:
            paths = SANDBOX_PATHS
        else:
            paths = Paths(tracer=str(request.tracer.resolve()), input=str(request.input_dir),
                          bin=str(w.bin_dir), trace=str(request.trace_dir),
                          work=str(request.work_dir))
        argv = program_argv(w, inp, paths)
        env = program_env(w, inp, paths, request.caller)
        if sandboxed:
            full = bwrap_argv(request, env) + argv
            popen_env: dict[str, str] = {"PATH": env["PATH"]}
            extra: dict = {}
        else:
            full = argv
            popen_env = env
            extra = {}
            if os.geteuid() == 0:
                for d in (request.trace_dir, request.work_dir):
                    os.chown(d, RUN_UID, RUN_GID)
                extra = {"user": RUN_UID, "group": RUN_GID, "extra_groups": []}
        log_path = request.work_dir.parent / f"{request.work_dir.name}.log"
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t0 = time.monotonic()
        timed_out = False
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(full, env=popen_env, cwd=request.work_dir,
                                        stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        **extra)
            except OSError as err:
                return RunResult(runner=self.kind, sandbox=self.sandbox, command=argv, env=env,
                                 started_at=started_at, duration_s=0.0, exit_code=None,
                                 timed_out=False, error=f"could not start {full[0]}: {err}")
            try:
                code: int | None = proc.wait(timeout=request.time_limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                code = None
        duration = time.monotonic() - t0
        logs = log_path.read_bytes().decode("utf-8", "replace") if log_path.exists() else ""
        log_path.unlink(missing_ok=True)
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal: the shell's convention, as docker reports
        return RunResult(runner=self.kind, sandbox=self.sandbox, command=argv, env=env,
                         started_at=started_at, duration_s=round(duration, 3), exit_code=code,
                         timed_out=timed_out, log_tail=tail_lines(logs))


def bwrap_argv(request: RunRequest, env: dict[str, str]) -> list[str]:
    """The bubblewrap command line that sets up the /heapcast layout around the program."""
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all",
            "--uid", str(RUN_UID), "--gid", str(RUN_GID), "--hostname", "heapcast"]
    for name in HOST_SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",
             "--dir", str(SANDBOX),
             "--ro-bind", str(request.tracer.resolve()), str(SANDBOX_TRACER),
             "--ro-bind", str(request.input_dir.resolve()), str(SANDBOX_INPUT),
             "--ro-bind", str(request.workload.bin_dir.resolve()), str(SANDBOX_BIN),
             "--bind", str(request.trace_dir.resolve()), str(SANDBOX_TRACE),
             "--bind", str(request.work_dir.resolve()), str(SANDBOX_WORK),
             "--chdir", str(SANDBOX_WORK), "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--"]


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
