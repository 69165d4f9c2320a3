"""Run a program under an LD_PRELOAD library, and confirm from inside it that it really was.

LD_PRELOAD fails quietly, so every measured run carries the probe (native/probe/hc_probe.c,
built here), and `verify` checks what it wrote against the `PreloadSpec`: applied, or not
applied and why. Through a replay runner (`probed_request`, then `verify_result`) or on this
host (`run_preloaded`, for `heapcast tune`).

The checks: docs/allocators-measured.md#confirming-the-library-was-loaded
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from tasks.core.config import PROJECT_DIR
from tasks.replay.runners.base import (
    MEASURE_PLACEHOLDER,
    PROBE_REPORT,
    RunRequest,
    RunResult,
    tail_lines,
)
from tasks.replay.runners.measure_tool import (
    CACHE_DIR,
    REPORT_NAME,
    STDOUT_NAME,
    ResourceUsage,
    build_measure_tool,
    compile_once,
    measured_command,
    sha256_of,
    usage_from_report,
)
from tasks.replay.workloads import Workload, WorkloadInput

PROBE_SOURCE = PROJECT_DIR / "native" / "probe" / "hc_probe.c"
MIN_CPU_S = 0.05  # below this the CPU share says nothing (start-up noise)
MIN_CPU_SHARE = 0.5


class ProbeBuildError(RuntimeError):
    """The probe cannot be built; the message names the missing tool or the compiler's error."""


@dataclass(frozen=True)
class PreloadSpec:
    """What a run asks for: `library` preloaded (as the program sees it; None: the C library's
    own malloc), `host_library` (a heapcast layer on this host, shown to the program by the
    runner), and `env`, the allocator knobs set for the program."""

    name: str
    library: str | None = None
    host_library: Path | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def expected_malloc(self) -> str:
        """The file name that must define `malloc` in every process."""
        if self.host_library is not None:
            return self.host_library.name
        return os.path.basename(self.library) if self.library else "libc.so.6"

    def line(self) -> str:
        """The shell line a user pastes to run a program this way."""
        parts = [f"{k}={v}" for k, v in self.env]
        lib = str(self.host_library) if self.host_library else self.library
        if lib:
            parts.insert(0, f"LD_PRELOAD={lib}")
        return " ".join(parts)


@dataclass(frozen=True)
class Verification:
    applied: bool
    reason: str | None = None  # why not applied
    processes: int = 0  # process images that loaded the probe
    cpu_share: float | None = None  # of the program's CPU time, in those images
    mallocs: tuple[str, ...] = ()  # the files that defined malloc, as seen


def build_probe(cache_dir: Path | None = None) -> Path:
    """Compile the probe (once per source version); its path."""
    return compile_once(
        PROBE_SOURCE,
        (cache_dir or CACHE_DIR) / "libhcprobe-{digest}.so",
        ["-fPIC", "-shared", "-fvisibility=hidden"],
        ["-ldl"],
        ProbeBuildError,
        what="the probe",
        packages="gcc",
    )


def preload_refused(log_tail: str) -> str | None:
    """The dynamic loader's complaint about a preloaded library, if the run's log has one."""
    for line in log_tail.splitlines():
        if "from LD_PRELOAD cannot be preloaded" in line:
            return line.strip()
    return None


def parse_probe(text: str) -> list[dict[str, str]]:
    """The probe's lines as dicts (`kind`: start, exit or mallopt, then its fields)."""
    out = []
    for line in text.splitlines():
        kind, *fields = line.split("\t")
        if kind in ("start", "exit", "mallopt"):
            rec = {"kind": kind}
            rec.update(f.split("=", 1) for f in fields if "=" in f)
            out.append(rec)
    return out


def _in_force(key: str, value: str, rec: dict[str, str]) -> str | None:
    """Why the allocator's own answer in `rec` contradicts knob `key`=`value`; None if not."""
    if key == "MALLOC_CONF":
        if not any(k.startswith("jemalloc.") for k in rec):
            return "MALLOC_CONF set, but no jemalloc answered in the process"
        for pair in value.split(","):
            name, _, want = pair.partition(":")
            got = rec.get(f"jemalloc.opt.{name}")
            if got is None:
                continue  # an option the probe does not read
            want = {"true": "1", "false": "0"}.get(want, want)
            if got != want:
                return f"jemalloc's opt.{name} is {got}, not {want}"
    if key == "TCMALLOC_RELEASE_RATE":
        got = rec.get("tcmalloc.release_rate")
        if got is None:
            return "TCMALLOC_RELEASE_RATE set, but no tcmalloc answered in the process"
        if abs(float(got) - float(value)) > 1e-6 * max(1.0, abs(float(value))):
            return f"tcmalloc's release rate is {got}, not {value}"
    return None


# glibc's knobs that the program can set again itself by mallopt (the probe's `mallopt.<name>`):
# the environment variable or GLIBC_TUNABLES name -> that name
_MALLOPT_NAMES = ("trim_threshold", "top_pad", "mmap_threshold", "mmap_max")  # MALLOC_<N>_
MALLOPT_KNOBS = {
    **{f"MALLOC_{n.upper()}_": n for n in _MALLOPT_NAMES},
    "MALLOC_ARENA_TEST": "arena_test",
    "MALLOC_ARENA_MAX": "arena_max",
    **{f"glibc.malloc.{n}": n for n in (*_MALLOPT_NAMES, "arena_test", "arena_max")},
}


def _glibc_knobs(key: str, value: str) -> list[tuple[str, str, str]]:
    """(how the user set it, mallopt name, value) for each of glibc's knobs in `key`=`value`
    that the program could set again by mallopt."""
    if key == "GLIBC_TUNABLES":
        pairs = (t.partition("=") for t in value.split(":"))
        return [(f"{n}={v}", MALLOPT_KNOBS[n], v) for n, _, v in pairs if n in MALLOPT_KNOBS]
    return [(f"{key}={value}", MALLOPT_KNOBS[key], value)] if key in MALLOPT_KNOBS else []


def _same_number(a: str, b: str) -> bool:
    """Whether two knob values are the same number (a tunable may be written 0x400000)."""
    try:
        return int(a, 0) == int(b, 0)
    except ValueError:
        return a == b


def _overridden(key: str, value: str, recs: list[dict[str, str]]) -> str | None:
    """Why knob `key`=`value` was not in force: a process of the run set the same parameter to
    another value by mallopt (TensorFlow's generator dataset fixes M_MMAP_THRESHOLD at 128 KiB);
    None if none did."""
    exes = {r.get("pid"): r.get("exe", "?") for r in recs if r["kind"] == "start"}
    for asked, name, want in _glibc_knobs(key, value):
        for r in recs:
            got = r.get(f"mallopt.{name}")
            if got is not None and not _same_number(got, want):
                who = f"pid {r.get('pid')} ({exes.get(r.get('pid'), '?')})"
                return (
                    f"{who} set M_{name.upper()} to {got} itself (mallopt), so {asked} was not "
                    "in force"
                )
    return None


def _same_knob(want: str, seen: str | None) -> bool:
    """Whether knob value `seen` is `want`, MEASURE_PLACEHOLDER standing for any folder."""
    if seen is None or MEASURE_PLACEHOLDER not in want:
        return seen == want
    parts = (re.escape(p) for p in want.split(MEASURE_PLACEHOLDER))
    return re.fullmatch("/.+".join(parts), seen) is not None


def verify(
    spec: PreloadSpec, probe_text: str | None, tree_cpu_s: float | None, log_tail: str = ""
) -> Verification:
    """Whether the run ran as `spec` asks, from the probe's lines (see the module)."""
    refused = preload_refused(log_tail)
    if refused:
        return Verification(False, f"LD_PRELOAD refused: {refused}")
    recs = parse_probe(probe_text or "")
    starts = [r for r in recs if r["kind"] == "start"]
    if not starts:
        return Verification(
            False,
            "no process of the run loaded the preload (a statically linked or setuid program, "
            "or one whose environment was cleared before it started)",
        )
    mallocs = tuple(dict.fromkeys(r.get("malloc", "?") for r in starts))
    n = len(starts)

    def no(reason: str) -> Verification:
        return Verification(False, reason, n, None, mallocs)

    want = spec.expected_malloc
    for r in starts:
        who = f"pid {r.get('pid')} ({r.get('exe', '?')})"
        if r.get("secure") != "0":
            return no(f"{who} runs setuid (AT_SECURE): the loader ignores LD_PRELOAD there")
        got = os.path.basename(r.get("malloc", "?"))
        if got != want and not (want == "libc.so.6" and got.startswith("libc.so")):
            return no(f"{who} runs the malloc of {r.get('malloc')}, not {want}")
        for key, value in spec.env:
            seen = r.get(f"env.{key}")
            if not _same_knob(value, seen):
                return no(f"{who} has {key}={seen!r}, not {value!r} (its environment changed)")
            why = _in_force(key, value, r)
            if why:
                return no(f"{who}: {why}")
    for key, value in spec.env:
        why = _overridden(key, value, recs)
        if why:
            return no(why)
    # each image's CPU from its start, and what its process used before (the loader's work, or
    # an earlier image of the process that exec'd it): a short process is mostly loading
    cpu_ns = sum(
        max(0, int(r.get("cpu_ns", "0"))) + max(0, int(r.get("cpu_ns_before", "0")))
        for r in recs
        if r["kind"] == "exit"
    )
    share = None
    if tree_cpu_s is not None and tree_cpu_s >= MIN_CPU_S:
        share = min(1.0, cpu_ns / 1e9 / tree_cpu_s)
        if share < MIN_CPU_SHARE:
            return Verification(
                False,
                f"only {share:.0%} of the program's CPU time ran in processes that loaded it (a "
                "child started with a cleared environment, or a static one, did the work)",
                n,
                share,
                mallocs,
            )
    return Verification(True, None, n, share, mallocs)


# ------------------------------------------------------------------ through a replay runner


def probed_request(request: RunRequest, spec: PreloadSpec, probe: Path) -> RunRequest:
    """`request` made to run under `spec`, with the probe (the request must be measured)."""
    return replace(
        request,
        preload=request.preload + ((spec.library,) if spec.library else ()),
        host_libraries=request.host_libraries + ((spec.host_library,) if spec.host_library else ()),
        probe=probe,
        env=request.env + spec.env,
    )


def fresh_probed_request(
    run_dir: Path,
    workload: Workload,
    inp: WorkloadInput,
    input_dir: Path,
    spec: PreloadSpec,
    probe: Path,
    tracer: Path | None = None,
) -> RunRequest:
    """A probed request (probed_request) for one measured run in `run_dir`, emptied first,
    with its trace, work and measure folders made there."""
    shutil.rmtree(run_dir, ignore_errors=True)
    dirs = {d: run_dir / d for d in ("trace", "work", "measure")}
    for d in dirs.values():
        d.mkdir(parents=True)
    request = RunRequest(
        workload=workload,
        input=inp,
        tracer=tracer,
        input_dir=input_dir,
        trace_dir=dirs["trace"],
        work_dir=dirs["work"],
        measure_dir=dirs["measure"],
    )
    return probed_request(request, spec, probe)


def verify_result(spec: PreloadSpec, request: RunRequest, result: RunResult) -> Verification:
    """Verify a probed run of a replay runner from its measure folder."""
    assert request.measure_dir is not None
    path = request.measure_dir / PROBE_REPORT
    text = path.read_text(errors="replace") if path.is_file() else None
    cpu = result.usage.cpu_s if result.usage is not None else None
    return verify(spec, text, cpu, result.log_tail)


# ------------------------------------------------------------------ directly on this host


@dataclass(frozen=True)
class PreloadedRun:
    """One measured run of a program on this host under a PreloadSpec."""

    spec: PreloadSpec
    exit_code: int | None
    timed_out: bool
    usage: ResourceUsage | None
    stdout_sha256: str | None
    stdout_bytes: int | None
    stderr_tail: str
    verification: Verification
    error: str | None = None
    stdout_head: bytes = field(default=b"", repr=False)


def run_preloaded(
    argv: list[str],
    spec: PreloadSpec,
    run_dir: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout_s: float = 600.0,
) -> PreloadedRun:
    """Run `argv` on this host under hc-measure with `spec` and the probe, in the caller's
    environment (`base_env`, default os.environ) and folder; `run_dir` (fresh, empty) keeps the
    measurement. The program's stdin is /dev/null, its stdout hashed, its stderr kept."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tool, probe = build_measure_tool(), build_probe()
    env = dict(os.environ if base_env is None else base_env)
    libs = [str(probe)]
    lib = str(spec.host_library) if spec.host_library else spec.library
    if lib:
        libs.append(lib)
    if env.get("LD_PRELOAD"):
        libs.append(env["LD_PRELOAD"])  # the caller's own preloads stay, after the allocator
    env["LD_PRELOAD"] = ":".join(libs)
    env["HEAPCAST_PROBE_OUT"] = str(run_dir / PROBE_REPORT)
    env.update((k, v.replace(MEASURE_PLACEHOLDER, str(run_dir))) for k, v in spec.env)
    command = measured_command(str(tool), str(run_dir), [str(a) for a in argv], cgroup=False)
    timed_out = False
    with open(run_dir / "stderr", "wb") as err:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    stderr = (run_dir / "stderr").read_bytes().decode("utf-8", "replace")
    usage = None
    report = run_dir / REPORT_NAME
    if report.is_file() and not timed_out:
        usage = usage_from_report(report.read_text())
    sha = nbytes = None
    head = b""
    out = run_dir / STDOUT_NAME
    if out.is_file():
        sha, nbytes = sha256_of(out)
        with open(out, "rb") as f:
            head = f.read(400)
    error = None
    if code == 125 or (code == 127 and "hc-measure: cannot run" in stderr):
        error = tail_lines(stderr, 3)
    probe_path = run_dir / PROBE_REPORT
    verification = verify(
        spec,
        probe_path.read_text(errors="replace") if probe_path.is_file() else None,
        usage.cpu_s if usage else None,
        tail_lines(stderr),
    )
    return PreloadedRun(
        spec=spec,
        exit_code=code,
        timed_out=timed_out,
        usage=usage,
        stdout_sha256=sha,
        stdout_bytes=nbytes,
        stderr_tail=tail_lines(stderr, 5),
        verification=verification,
        error=error,
        stdout_head=head,
    )


# ------------------------------------------------------------------ the order of the arms


def williams_square(n: int) -> list[list[int]]:
    """A Williams design on n arms: every arm once in every position, and every arm right
    after every other equally often (n rows for even n; 2n, the mirror rows added, for odd)."""
    if n <= 1:
        return [list(range(n))]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(a + i) % n for a in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def balanced_orders(names: list[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """The order of each of `rounds` rounds: Williams squares one after another, each square
    with the arms relabelled by a permutation drawn from `seed`, so that a load from elsewhere
    falls on every arm alike, and a round's order repeats only once every order has been used."""
    if not names:
        return [[] for _ in range(rounds)]
    rng = np.random.default_rng(seed)
    square = williams_square(len(names))
    orders: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    labels = list(names)
    while len(orders) < rounds:
        block = [[labels[i] for i in row] for row in square]
        fresh = [tuple(b) for b in block if tuple(b) not in seen]
        if not fresh and len(seen) < math.factorial(min(len(names), 10)):
            labels = [names[i] for i in rng.permutation(len(names))]
            continue
        for order in block:
            if len(orders) < rounds and (tuple(order) not in seen or not fresh):
                orders.append(list(order))
                seen.add(tuple(order))
        labels = [names[i] for i in rng.permutation(len(names))]
    return orders
