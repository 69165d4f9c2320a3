"""Runners execute one workload input with the tracer preloaded: `docker` (a container per
run, through the Docker SDK) or `local` (this host, in bubblewrap where it works); `auto`
picks docker when an engine answers."""

from tasks.replay.runners.base import EngineError, Runner, RunnerUnavailable, RunRequest, RunResult
from tasks.replay.runners.select import make_runner, resolve_runner_kind, select_runner

__all__ = [
    "EngineError",
    "RunRequest",
    "RunResult",
    "Runner",
    "RunnerUnavailable",
    "make_runner",
    "resolve_runner_kind",
    "select_runner",
]
