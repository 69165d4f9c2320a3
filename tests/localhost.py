"""For tests that start real servers on this machine: free loopback ports, live processes."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MLFLOW_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mlflow-server.sh"


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 (all bound at once, so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class MlflowServer:
    """A tracking server started by scripts/mlflow-server.sh for a test."""

    url: str
    root: Path  # the data root it serves (<root>/mlflow)
    pid: int
    env: dict[str, str]  # the script's environment, for its other commands (status)
    start_stdout: str  # what `start` printed (the export line)


@contextmanager
def mlflow_server(root: Path) -> Iterator[MlflowServer]:
    """The project's own script serves `root`'s store on a free port; stopped afterwards, and
    killed when the script cannot stop it, so that no test leaves a server behind."""
    port = free_port()
    env = {
        **os.environ,
        "HEAPCAST_ROOT": str(root),
        "HEAPCAST_MLFLOW_PORT": str(port),
        "HEAPCAST_MLFLOW_WAIT_S": "600",
    }  # generous: the server takes ~25-80 s on a busy machine
    start = subprocess.run([str(MLFLOW_SCRIPT), "start"], env=env, capture_output=True, text=True)
    assert start.returncode == 0, start.stderr
    pid = int((root / "mlflow" / "server.pid").read_text())
    try:
        yield MlflowServer(f"http://127.0.0.1:{port}", root, pid, env, start.stdout)
    finally:
        stop = subprocess.run([str(MLFLOW_SCRIPT), "stop"], env=env, capture_output=True, text=True)
        if stop.returncode != 0 or alive(pid):  # never leave our server behind
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
