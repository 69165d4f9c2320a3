"""Pick a runner: `docker` when an engine answers, else `local`; say which and why."""

from __future__ import annotations

import logging
from typing import Literal

from tasks.replay.runners.base import Runner
from tasks.replay.runners.docker_runner import DockerRunner, engine_answers, engine_host
from tasks.replay.runners.local_runner import LocalRunner

RunnerKind = Literal["auto", "docker", "local"]
log = logging.getLogger("heapcast.runners")


def resolve_runner_kind(kind: RunnerKind) -> tuple[Literal["docker", "local"], str]:
    """The concrete runner for `kind`, and a sentence saying why it was picked."""
    if kind == "docker":
        return "docker", f"docker (asked for), engine at {engine_host()}"
    if kind == "local":
        return "local", f"local (asked for), {LocalRunner().describe()}"
    if kind != "auto":
        raise ValueError(f"runner must be auto, docker or local, not {kind!r}")
    host = engine_host()
    if engine_answers(host):
        return "docker", f"auto picked docker: an engine answers at {host}"
    return "local", (
        f"auto picked local ({LocalRunner().describe()}): no engine answers at "
        f"{host}; `scripts/engine.sh up` starts one"
    )


def make_runner(kind: Literal["docker", "local"]) -> Runner:
    if kind == "docker":
        return DockerRunner()
    if kind == "local":
        return LocalRunner()
    raise ValueError(f"no runner {kind!r}; pick docker or local (or auto)")


def select_runner(kind: RunnerKind = "auto") -> Runner:
    concrete, why = resolve_runner_kind(kind)
    log.info(why)
    return make_runner(concrete)
