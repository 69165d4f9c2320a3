"""What every runner shares: a run request, its result, the sandbox layout, argv and env.

A runner executes one (workload, input) with the tracer preloaded and reports what happened;
it does not judge (the replay task compares the exit code) and does not read traces.

Inside a container (and inside a bubblewrap sandbox, so that both see the same paths and
command lines, hence the same heap calls) the layout is:

  /heapcast/tracer/libheapcast.so   the tracer, read-only
  /heapcast/input                   the generated input files, read-only
  /heapcast/bin                     the workload's helper scripts (from docker/workloads/<image>/)
  /heapcast/trace                   where the tracer writes (HEAPCAST_OUT)
  /heapcast/work                    scratch, and $HOME
"""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass, field
from pathlib import Path

from tasks.workloads import Workload, WorkloadInput

SANDBOX = Path("/heapcast")
SANDBOX_TRACER = SANDBOX / "tracer" / "libheapcast.so"
SANDBOX_INPUT = SANDBOX / "input"
SANDBOX_BIN = SANDBOX / "bin"
SANDBOX_TRACE = SANDBOX / "trace"
SANDBOX_WORK = SANDBOX / "work"

# The unprivileged user every workload runs as (nobody); freeciv refuses to run as root.
RUN_UID = 65534
RUN_GID = 65534
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/games"
LOG_TAIL_LINES = 40


class RunnerUnavailable(RuntimeError):
    """The runner cannot run anything here (no engine answers, no sandbox); says what to do."""


class EngineError(RuntimeError):
    """A transient failure of the container engine (API error, lost connection): worth a retry."""


@dataclass(frozen=True)
class Paths:
    """Where the run's folders are, as the traced program sees them."""

    tracer: str
    input: str
    bin: str
    trace: str
    work: str


SANDBOX_PATHS = Paths(tracer=str(SANDBOX_TRACER), input=str(SANDBOX_INPUT), bin=str(SANDBOX_BIN),
                      trace=str(SANDBOX_TRACE), work=str(SANDBOX_WORK))


@dataclass(frozen=True)
class RunRequest:
    """One replay: host folders the runner mounts or binds, and the workload to run."""

    workload: Workload
    input: WorkloadInput
    tracer: Path
    input_dir: Path
    trace_dir: Path
    work_dir: Path
    caller: bool = False

    @property
    def time_limit_s(self) -> float:
        return self.workload.time_limit_for(self.input)


@dataclass
class RunResult:
    runner: str
    sandbox: str
    command: list[str]
    env: dict[str, str]
    started_at: str
    duration_s: float
    exit_code: int | None
    timed_out: bool
    image: str | None = None
    image_id: str | None = None
    log_tail: str = ""
    error: str | None = None
    host: str = field(default_factory=socket.gethostname)


def substitute(text: str, workload: Workload, inp: WorkloadInput, paths: Paths) -> str:
    """Fill a command argument's placeholders; the result stays one argument."""
    return text.format(input=paths.input, work=paths.work, bin=paths.bin, seed=inp.seed,
                       size=inp.size, name=inp.name)


def program_argv(workload: Workload, inp: WorkloadInput, paths: Paths) -> list[str]:
    return [substitute(a, workload, inp, paths) for a in workload.command]


def program_env(workload: Workload, inp: WorkloadInput, paths: Paths, caller: bool,
                ) -> dict[str, str]:
    """The whole environment of the traced program: nothing leaks in from the caller's."""
    env = {
        "PATH": SEARCH_PATH,
        "HOME": paths.work,
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "LD_PRELOAD": paths.tracer,
        "HEAPCAST_OUT": paths.trace,
    }
    if caller:
        env["HEAPCAST_CALLER"] = "1"
    for key, value in workload.env.items():
        env[key] = substitute(value, workload, inp, paths)
    return env


def tail_lines(text: str, n: int = LOG_TAIL_LINES) -> str:
    lines = text.replace("\r", "\n").splitlines()
    return "\n".join(line[:400] for line in lines[-n:])


class Runner(abc.ABC):
    kind: str

    @abc.abstractmethod
    def check(self) -> None:
        """Raise RunnerUnavailable, with what to do, when this runner cannot run here."""

    @abc.abstractmethod
    def run(self, request: RunRequest) -> RunResult:
        """Run the workload to its end or its time limit; a killed run keeps its traces."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line: what this runner is (engine address, sandbox)."""
