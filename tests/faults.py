"""Provoking faults for real: a child Python process that is SIGKILLed at a chosen point.

The child runs real heapcast code; a hook placed in it (`pause_here`) writes a marker file when
the chosen point is reached and then waits forever. `kill_at_marker` starts the child, waits
for the marker (or for the child to end, which is an error naming its output) and kills it with
SIGKILL: no handler, no `finally`, no flush runs, as when the OOM killer or a power cut ends a
night. Used by the fault tests and by studies/fault_drill/fault_drill.py.

    kill_at_marker(f'''
        import tasks.dataset.partitions as p
        def hooked(*a, **k):
            pause_here({str(marker)!r})     # CHILD_PRELUDE defines it in every child
        p._commit = hooked
        ...
    ''', marker)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

from tasks.core.config import PROJECT_DIR

# Defines pause_here(marker) inside the child.
CHILD_PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {project!r})

    def pause_here(marker):
        tmp = marker + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, marker)
        while True:  # until SIGKILL
            time.sleep(3600)
    """
).format(project=str(PROJECT_DIR))


class ChildEnded(AssertionError):
    """The child ended before reaching its kill point."""


def start_child(code: str, log: Path) -> subprocess.Popen:
    """`python -c code` (after CHILD_PRELUDE) in the project folder, its output into `log`."""
    out = open(log, "w")  # noqa: SIM115 - closed when the child is reaped
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(code)],
        cwd=PROJECT_DIR,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    proc._heapcast_log = out  # type: ignore[attr-defined]
    return proc


def wait_for(marker: Path, proc: subprocess.Popen, log: Path) -> None:
    """Until `marker` exists; ChildEnded (with the child's output) if the child ends first."""
    while not marker.exists():
        if proc.poll() is not None:
            raise ChildEnded(
                f"the child ended (exit {proc.returncode}) before {marker.name}:\n"
                + log.read_text()[-4000:]
            )
        time.sleep(0.05)


def kill(proc: subprocess.Popen) -> int:
    """SIGKILL the child and reap it; its exit status (-9)."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    rc = proc.wait()
    proc._heapcast_log.close()  # type: ignore[attr-defined]
    return rc


def kill_at_marker(code: str, marker: Path, log: Path | None = None) -> int:
    """Run `code` in a child until it writes `marker`, then SIGKILL it. Returns its pid."""
    log = log or marker.with_suffix(".log")
    proc = start_child(code, log)
    try:
        wait_for(marker, proc, log)
    finally:
        rc = kill(proc)
    assert rc == -signal.SIGKILL, f"child ended with {rc}, not by SIGKILL:\n{log.read_text()}"
    return proc.pid


def run_child(code: str, log: Path) -> None:
    """Run `code` in a child to its end; AssertionError with its output when it fails."""
    proc = start_child(code, log)
    rc = proc.wait()
    proc._heapcast_log.close()  # type: ignore[attr-defined]
    assert rc == 0, f"child failed (exit {rc}):\n{log.read_text()[-4000:]}"


@contextmanager
def small_tmpfs(path: Path, size: str = "8m"):
    """A tmpfs of `size` mounted at `path` (root only); unmounted at the end. Skips the caller
    (pytest.skip) where mounting is not allowed, unless CI=true, where it fails."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        import pytest

        msg = f"cannot mount a tmpfs at {path} (root needed): {res.stderr.strip()}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def can_mount_tmpfs() -> bool:
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], capture_output=True
        )
        if res.returncode == 0:
            subprocess.run(["umount", d], capture_output=True)
        return res.returncode == 0
