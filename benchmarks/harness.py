"""What every maintained benchmark writes: one JSON shape, the machine, the commit, the reference.

A benchmark measures heapcast beside a reference in the same run (the article's tracer, a
plain-Python loop, glibc) and hands its figures to `write_result`, which writes

    {"benchmark": NAME, "command": the line that reproduces the file, "commit": {"sha", "dirty"},
     "when": UTC time, "machine": {"cpu", "cores", "cores_usable", "memory_gib", "platform",
     "python", "load_average"}, "reference": what was measured beside it, "results": {...}}

Paths inside the figures are written relative to the repository (`data/...`, `configs/...`),
a data root given as `roots` as `<root>`, temporary folders as `<tmp>`: a result file never
names a private path (tests/benchmarks/test_results.py scans for them).

The runner (`python -m benchmarks`, benchmarks/suite.py) runs the maintained benchmarks and
fails one whose file is not in this shape.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ENVELOPE = ("benchmark", "command", "commit", "when", "machine", "reference", "results")
# What `portable` leaves in no result: an absolute path under a private root (/work, /root, /tmp,
# /home), not `configs/workloads.yaml` nor a bare `/tmp` (the benchmarks' and the studies' tests)
PRIVATE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|tmp|home)/\S")


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model, cores, memory, load."""
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def commit() -> dict[str, Any]:
    """The commit measured (`git rev-parse HEAD`) and whether tracked files differed from it."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def command(argv: list[str] | None = None, script: str | None = None) -> str:
    """The command line that reproduces the file, from the repository root, paths relative."""
    script = script or sys.argv[0]
    args = sys.argv[1:] if argv is None else argv
    return portable(shlex.join(["python", _relative(script), *args]))


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return path


def portable(value: Any, roots: tuple[str | Path, ...] = ()) -> Any:
    """`value` with every absolute path of this machine made portable: the repository's prefix
    dropped, a data root in `roots` as `<root>`, the temporary folder as `<tmp>`, home as `~`."""
    resolved = [Path(r).resolve() for r in roots]
    # a root inside the repository (`data`) is written relative, as any path there
    swaps = [(str(r), "<root>") for r in resolved if not r.is_relative_to(REPO)]
    swaps += [(str(REPO) + "/", ""), (str(REPO), ".")]
    swaps += [(tempfile.gettempdir().rstrip("/") + "/", "<tmp>/"), (str(Path.home()) + "/", "~/")]

    def fix(v: Any) -> Any:
        if isinstance(v, str):
            for old, new in swaps:
                if old not in ("/", "./"):
                    v = v.replace(old, new)
            return v
        if isinstance(v, dict):
            return {fix(k): fix(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [fix(x) for x in v]
        return v

    return fix(value)


def envelope(
    name: str,
    results: dict[str, Any],
    *,
    reference: str,
    command_line: str,
    roots: tuple[str | Path, ...] = (),
) -> dict[str, Any]:
    """The one JSON shape of a benchmark's result."""
    return portable(
        {
            "benchmark": name,
            "command": command_line,
            "commit": commit(),
            "when": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine(),
            "reference": reference,
            "results": results,
        },
        roots,
    )


def write_result(
    name: str,
    results: dict[str, Any],
    *,
    reference: str,
    out: str | Path | None = None,
    roots: tuple[str | Path, ...] = (),
    argv: list[str] | None = None,
) -> Path:
    """Write `results` in the one shape to `out` (default benchmarks/results/<name>.json)."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    doc = envelope(name, results, reference=reference, command_line=command(argv), roots=roots)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    return path


def compile_c(src: Path, exe: Path, *flags: str, compiler: str = "gcc") -> Path:
    """A C program a benchmark runs (benchmarks/programs/, tests/native/programs/), built with
    the flags its figures were measured with: `compiler FLAGS -o exe src`; `exe`."""
    subprocess.run([compiler, *flags, "-o", str(exe), str(src)], check=True)
    return exe


def is_envelope(doc: Any) -> bool:
    return isinstance(doc, dict) and all(k in doc for k in ENVELOPE)


def _jsonable(v: Any) -> Any:
    """numpy scalars and arrays, paths: as JSON takes them."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serializable: {type(v).__name__}")
