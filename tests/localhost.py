"""For tests that start real servers on this machine: free loopback ports, live processes."""

from __future__ import annotations

import os
import socket


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
