"""What a measured run cost: the `hc-measure` helper (built here, static) and its report.

A runner measures a run when its request has a `measure_dir`: the program runs under
`hc-measure` (native/measure/hc_measure.c, linked statically so that LD_PRELOAD never loads into
it), which sends the program's standard output to `<measure_dir>/stdout` (hashed into the
result), waits for it with wait4 and writes its usage to `<measure_dir>/usage`, read back here as
a `ResourceUsage`. The peak memory is the container's cgroup peak under docker, the largest
process's `ru_maxrss` under the local runner; the memory averaged over the run is the cgroup's
under docker, the program's own process's resident set elsewhere (why not the runner's own wait4:
docs/tracing.md#measured-runs). Wall time is the program's own (fork to exit), without the
container's or sandbox's start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tasks.core.config import PROJECT_DIR

# The C lives with the project's other C (native/); the runners build it on demand here (static,
# keyed by the source's digest, cached in .cache/heapcast) and mount that binary.
SOURCE = PROJECT_DIR / "native" / "measure" / "hc_measure.c"
CACHE_DIR = PROJECT_DIR / ".cache" / "heapcast"
REPORT_NAME = "usage"
STDOUT_NAME = "stdout"


class MeasureToolError(RuntimeError):
    """hc-measure cannot be built; the message names the missing tool or the compiler's error."""


@dataclass(frozen=True)
class ResourceUsage:
    """What one run cost. Times in seconds, memory in bytes."""

    wall_s: float  # the program's own wall time (no container start or removal)
    user_s: float  # user CPU of the program's tree (waited-for descendants)
    sys_s: float  # system CPU of the same
    max_process_rss_bytes: int  # ru_maxrss: the largest single process of the tree
    minor_faults: int  # of the program's tree (rusage)
    major_faults: int
    peak_memory_bytes: int  # the tree's peak: the cgroup's where there is one, else ru_maxrss
    peak_source: str  # where peak_memory_bytes comes from: a cgroup file, or "ru_maxrss"
    # memory averaged over the run (sampled every 10 ms, time-weighted): the cgroup's where there
    # is one, else the program's own process's resident set; what it held, bursts' freed pages
    # returned or not. None where hc-measure could not sample (no pidfd)
    mean_memory_bytes: int | None = None

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


def build_measure_tool(cache_dir: Path | None = None) -> Path:
    """Compile hc_measure.c statically (once per source version); return the binary's path."""
    cache = cache_dir or CACHE_DIR
    if not SOURCE.is_file():
        raise MeasureToolError(
            f"cannot build hc-measure: {SOURCE} is missing (run from a checkout of the repository, "
            "whose native/ folder holds it)"
        )
    return compile_once(
        SOURCE,
        cache / "hc-measure-{digest}",
        ["-static"],
        [],
        MeasureToolError,
        what="hc-measure",
        packages="gcc libc6-dev",
        needs=" (static: needs libc6-dev's libc.a)",
    )


def compile_once(
    source: Path,
    pattern: Path,
    flags: list[str],
    libs: list[str],
    error: type[Exception],
    *,
    what: str,
    packages: str,
    needs: str = "",
) -> Path:
    """`source` compiled by gcc -O2 -Wall with `flags` and `libs` into `pattern` ({digest}: the
    source's), once per source version: a finished file is reused, and a build writes a file
    of its own then renames it into place, so that concurrent builds agree. `error` says what
    is missing (gcc: `packages` to install) or gcc's own message."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = pattern.with_name(pattern.name.format(digest=digest))
    if out.is_file():
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise error(f"cannot build {what}: gcc is not on PATH (apt-get install {packages})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    proc = subprocess.run(
        [gcc, "-O2", "-Wall", *flags, "-o", str(tmp), str(source), *libs],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise error(f"cannot build {what} from {source}{needs}:\n{proc.stderr[-2000:]}")
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def measured_command(tool: str, measure_dir: str, argv: list[str], *, cgroup: bool) -> list[str]:
    """`argv` run under hc-measure, with the report and stdout in `measure_dir` (paths as the
    program sees them); `cgroup` only where the program has a cgroup of its own (a container)."""
    report = f"{measure_dir}/{REPORT_NAME}"
    stdout = f"{measure_dir}/{STDOUT_NAME}"
    return [tool, *(["--cgroup"] if cgroup else []), report, stdout, "--", *argv]


def read_measurement(measure_dir: Path, result) -> None:
    """Fill a RunResult's usage and stdout hash from what hc-measure left in `measure_dir`."""
    report, stdout = measure_dir / REPORT_NAME, measure_dir / STDOUT_NAME
    if report.is_file():
        result.usage = usage_from_report(report.read_text())
    elif result.error is None:
        result.error = "hc-measure wrote no report (the run ended before the program did)"
    if stdout.is_file():
        result.stdout_sha256, result.stdout_bytes = sha256_of(stdout)


def parse_report(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _mean_bytes(r: dict[str, str]) -> int | None:
    """The report's memory averaged over the run: the cgroup's, else the program process's."""
    for key in ("cgroup_mean_bytes", "process_mean_bytes"):
        if key in r:
            return int(r[key])
    return None


def usage_from_report(text: str) -> ResourceUsage:
    """A ResourceUsage from hc-measure's report (the cgroup's peak where it has one)."""
    r = parse_report(text)
    maxrss = int(r["maxrss_kb"]) * 1024
    if "cgroup_peak_bytes" in r:
        peak, source = int(r["cgroup_peak_bytes"]), r.get("cgroup_peak_source", "cgroup")
    else:
        peak, source = maxrss, "ru_maxrss"
    return ResourceUsage(
        wall_s=int(r["wall_ns"]) / 1e9,
        user_s=float(r["user_s"]),
        sys_s=float(r["sys_s"]),
        max_process_rss_bytes=maxrss,
        minor_faults=int(r["minflt"]),
        major_faults=int(r["majflt"]),
        peak_memory_bytes=peak,
        peak_source=source,
        mean_memory_bytes=_mean_bytes(r),
    )


def sha256_of(path: Path) -> tuple[str, int]:
    """The SHA-256 and size of a file (the program's standard output)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n
