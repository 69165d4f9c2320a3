"""What every runner shares: a run request, its result, the sandbox layout, argv and env.

A runner executes one (workload, input) with the tracer preloaded (or none: `tracer=None`; more
libraries, an allocator, may follow it) and reports what happened; it does not judge (the replay
task compares the exit code) and does not read traces. `measure_dir` asks for the run to be
measured (measure_tool.py).

The layout, inside a container and a bubblewrap sandbox alike (the same paths and command lines,
hence the same heap calls):

  /heapcast/tracer/libheapcast.so   the tracer, read-only
  /heapcast/input                   the generated input files, read-only
  /heapcast/bin                     the workload's helper scripts (from docker/workloads/<image>/)
  /heapcast/trace                   where the tracer writes (HEAPCAST_OUT)
  /heapcast/work                    scratch, and $HOME
  /heapcast/measure                 a measured run's report and standard output
  /heapcast/tools/hc-measure        the measuring helper (measure_tool.py), read-only
  /heapcast/tools/libhcprobe.so     the loading probe (preload.py), read-only
  /heapcast/lib/<name>              host libraries preloaded into the run (a heapcast layer)
"""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass, field
from pathlib import Path

from tasks.format.stack_depth import FRAMES_ENV, frames_problem
from tasks.replay.runners.measure_tool import ResourceUsage
from tasks.replay.runners.sysroot import SysrootCopy
from tasks.replay.workloads import Workload, WorkloadInput

SANDBOX = Path("/heapcast")
SANDBOX_TRACER = SANDBOX / "tracer" / "libheapcast.so"
SANDBOX_INPUT = SANDBOX / "input"
SANDBOX_BIN = SANDBOX / "bin"
SANDBOX_TRACE = SANDBOX / "trace"
SANDBOX_WORK = SANDBOX / "work"
SANDBOX_MEASURE = SANDBOX / "measure"
SANDBOX_MEASURE_TOOL = SANDBOX / "tools" / "hc-measure"
SANDBOX_PROBE = SANDBOX / "tools" / "libhcprobe.so"
SANDBOX_LIB = SANDBOX / "lib"
# In an allocator knob's value (RunRequest.env), the run's measure folder as the program sees
# it (a heapcast layer writes its counters there).
MEASURE_PLACEHOLDER = "{measure}"
PROBE_REPORT = "probe"  # the probe's lines, in a measured run's measure folder

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
    """Where the run's folders are, as the traced program sees them (tracer None: untraced)."""

    tracer: str | None
    input: str
    bin: str
    trace: str
    work: str


SANDBOX_PATHS = Paths(
    tracer=str(SANDBOX_TRACER),
    input=str(SANDBOX_INPUT),
    bin=str(SANDBOX_BIN),
    trace=str(SANDBOX_TRACE),
    work=str(SANDBOX_WORK),
)


@dataclass(frozen=True)
class RunRequest:
    """One replay: host folders the runner mounts or binds, and the workload to run.

    `tracer` None runs the program untraced. `preload`: more libraries for LD_PRELOAD after the
    tracer, as paths the program sees (inside the image for docker, on the host for local).
    `measure_dir`: a host folder; when set, the program's standard output goes to a file there
    (its SHA-256 comes back in the result) and the run's resource usage is measured.
    `host_libraries`: libraries on this host, shown to the program read-only (under
    /heapcast/lib in a sandbox) and preloaded after `preload` (a heapcast layer).
    `probe`: the loading probe on this host (preload.py), preloaded first after the tracer,
    writing into `measure_dir` (which it needs), so that the run's loading can be verified.
    `env`: variables set for the program after the workload's own (an allocator's knobs).
    `frames`: the call stacks' depth (HEAPCAST_FRAMES; 0: none); stacks imply `caller`.
    `sysroot`: after the run, copy the modules its traces name from where the program ran
    into `trace_dir/sysroot/` (sysroot.py; the docker runner: the image's own files)."""

    workload: Workload
    input: WorkloadInput
    tracer: Path | None
    input_dir: Path
    trace_dir: Path
    work_dir: Path
    caller: bool = False
    preload: tuple[str, ...] = ()
    measure_dir: Path | None = None
    host_libraries: tuple[Path, ...] = ()
    probe: Path | None = None
    env: tuple[tuple[str, str], ...] = ()
    frames: int = 0
    sysroot: bool = False

    def __post_init__(self) -> None:
        problem = frames_problem(self.frames)
        if problem is not None:
            raise ValueError(f"workload {self.workload.name!r}: frames {problem}")
        if self.frames and not self.caller:
            raise ValueError(
                f"workload {self.workload.name!r}: frames {self.frames} records stacks, whose "
                "first frame is the caller: set caller too (or frames 0)"
            )
        if self.probe is not None and self.measure_dir is None:
            raise ValueError("a probed run writes into measure_dir: set measure_dir too")

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
    usage: ResourceUsage | None = None  # measured runs only
    stdout_sha256: str | None = None  # measured runs only
    stdout_bytes: int | None = None
    # how each limit (memory, pids, time) was enforced, in words; "NOT ENFORCED ..." where it
    # could not be (a local run with no cgroup), and then a line in `warnings` too
    limits: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    sysroot: SysrootCopy | None = None  # what `RunRequest.sysroot` copied


def substitute(text: str, workload: Workload, inp: WorkloadInput, paths: Paths) -> str:
    """Fill a command argument's placeholders; the result stays one argument."""
    return text.format(
        input=paths.input,
        work=paths.work,
        bin=paths.bin,
        seed=inp.seed,
        size=inp.size,
        name=inp.name,
    )


def program_argv(workload: Workload, inp: WorkloadInput, paths: Paths) -> list[str]:
    return [substitute(a, workload, inp, paths) for a in workload.command]


def program_env(
    workload: Workload,
    inp: WorkloadInput,
    paths: Paths,
    caller: bool,
    preload: tuple[str, ...] = (),
    *,
    probe: str | None = None,
    probe_out: str | None = None,
    extra: tuple[tuple[str, str], ...] = (),
    measure: str | None = None,
    frames: int = 0,
) -> dict[str, str]:
    """The whole environment of the program: nothing leaks in from the caller's.

    LD_PRELOAD is the tracer (when traced), the probe (interposes nothing), then `preload`, so
    the tracer's dlsym(RTLD_NEXT) finds the preloaded allocator's malloc; no LD_PRELOAD at all
    when there is none. `probe_out`: the file the probe appends to (as the program sees it).
    `extra` comes last: an allocator's knobs win over the workload's; MEASURE_PLACEHOLDER in
    them is `measure`, the measure folder as the program sees it. `frames` > 0 (traced runs):
    HEAPCAST_FRAMES, the call stacks' depth."""
    env = {
        "PATH": SEARCH_PATH,
        "HOME": paths.work,
        "LANG": "C.UTF-8",
        "TZ": "UTC",
    }
    libs = ([paths.tracer] if paths.tracer else []) + ([probe] if probe else []) + list(preload)
    if libs:
        env["LD_PRELOAD"] = ":".join(libs)
    if probe and probe_out:
        env["HEAPCAST_PROBE_OUT"] = probe_out
    if paths.tracer:
        env["HEAPCAST_OUT"] = paths.trace
    if caller and paths.tracer:
        env["HEAPCAST_CALLER"] = "1"
    if frames and paths.tracer:
        env[FRAMES_ENV] = str(frames)
    for key, value in workload.env.items():
        env[key] = substitute(value, workload, inp, paths)
    for key, value in extra:
        if MEASURE_PLACEHOLDER in value:
            if measure is None:
                raise ValueError(f"{key}={value}: names the measure folder, but the run has none")
            value = value.replace(MEASURE_PLACEHOLDER, measure)
        env[key] = value
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

    @abc.abstractmethod
    def missing_files(self, workload: Workload, paths: list[str]) -> list[str]:
        """Those of `paths` (as the program sees them: in the image, on the host) that do not
        exist where the workload runs; a symlink counts when its target exists."""
