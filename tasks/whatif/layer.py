"""heapcast's allocator layer (native/layers/layer.c) as the largest policy: build it, and
measure a command with and without.

The layer runs with HEAPCAST_LAYER=policy=largest,n=N,min=MIN,madv=off,peak=4,proof=2,stats=PATH
(`layer_env` of a `LargestConfig`): the rules the simulator's `largest` replays with the same
config (tasks/whatif/simulate.py), so its counters (one line per process) are the measured side
of the simulated hits.

`measure_layer(argv, env)` runs the command plainly and with native/build/libheapcast_layer.so
preloaded: page faults, peak RSS, times (os.wait4) and whether both printed and exited the same.
`measure_layer_workload(workload, input, runner)` does the same for a catalog workload through the
replay runners' verified preload, in three arms in balanced order: plain, loaded but disabled
(N = 0), on. `static_threshold=True` (default) fixes glibc's mmap threshold at 131072, as the
simulator's fault model assumes. The details: docs/whatif.md#the-real-layer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.dataset.convert import convert_trace
from tasks.format.native_sources import LAYER_SOURCES, NativeBuildError, build_native
from tasks.format.trace_reader import read_trace
from tasks.replay.inputs import prepare_input_dir
from tasks.replay.runners.base import SANDBOX_TRACE, EngineError, Runner
from tasks.replay.runners.preload import (
    PreloadSpec,
    balanced_orders,
    build_probe,
    fresh_probed_request,
    verify_result,
)
from tasks.replay.workloads import Workload, WorkloadInput
from tasks.whatif.policies import MMAP_THRESHOLD, LargestConfig

LAYER_RELPATH = Path("build") / "libheapcast_layer.so"
SOURCES = LAYER_SOURCES
MAKE_TARGET = "layer"
# the layer's counters compared with the simulator's (native/layers/layer.c, hl_fini)
STAT_KEYS = (
    "hits",
    "misses",
    "kept",
    "bytes_kept_peak",
    "bytes_kept_at_exit",
    "given_back",
    "passed",
)


class LayerBuildError(NativeBuildError):
    """The layer cannot be built; the message names the missing tool or make's error."""


def build_layer(native_dir: str | Path | None = None) -> Path:
    """`make -C native layer` when a source is newer than the library; its path."""
    return build_native(
        MAKE_TARGET, LAYER_RELPATH.name, SOURCES, "the layer", native_dir, LayerBuildError
    )


def run_measured(
    argv: list[str], env: dict[str, str], timeout: float = 600, cwd: str | Path | None = None
) -> dict[str, Any]:
    """Run argv; its exit code, output digests and resource usage from os.wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(a) for a in argv],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "returncode": proc.returncode,
        "minor_faults": ru.ru_minflt,
        "major_faults": ru.ru_majflt,
        "max_rss_kb": ru.ru_maxrss,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "wall_s": wall,
        "stdout_sha256": hashlib.sha256(stdout).hexdigest(),
        "stderr_sha256": hashlib.sha256(stderr).hexdigest(),
        "stdout_tail": stdout[-2000:].decode(errors="replace"),
        "stderr_tail": stderr[-2000:].decode(errors="replace"),
    }


def layer_env(
    policy: LargestConfig = LargestConfig(),
    madv_free: bool = False,
    stats: str | None = None,
    keep: bool = True,
) -> str:
    """HEAPCAST_LAYER for the layer under the rules the simulator replays as `policy` (its n,
    min_size, bound `peak` (None: peak=off) and `proof`); keep=False: loaded, keeping nothing
    (n=0); madv_free: madvise(MADV_FREE) a block as it is kept (madv=0), else never (madv=off,
    the simulator's fault model: a kept block keeps its pages)."""
    opts = f"policy=largest,n={policy.n if keep else 0},min={policy.min_size}"
    opts += f",madv={'0' if madv_free else 'off'}"
    opts += f",peak={'off' if policy.peak is None else policy.peak},proof={policy.proof}"
    return opts + (f",stats={stats}" if stats else "")


def stat_sums(stats: list[dict[str, int]]) -> dict[str, int]:
    """The layer's counters summed over processes (STAT_KEYS)."""
    return {k: sum(s.get(k, 0) for s in stats) for k in STAT_KEYS}


def parse_stats(text: str) -> list[dict[str, int]]:
    """The layer's stats lines (`key=value ...`, one per process)."""
    rows = []
    for line in text.splitlines():
        if line.strip():
            rows.append({k: int(v) for k, v in (f.split("=", 1) for f in line.split())})
    return rows


def measure_layer(
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    policy: LargestConfig = LargestConfig(),
    keep: bool = True,
    madv_free: bool = False,
    static_threshold: bool = True,
    layer: str | Path | None = None,
    timeout: float = 600,
    cwd: str | Path | None = None,
) -> dict[str, Any]:
    """The command without and with the layer (the rules of `policy`; keep=False: loaded,
    keeping nothing): faults, RSS, times.

    `env`: added to os.environ for both runs (an LD_PRELOAD there stays, after the layer).
    Returns {"without": {...}, "with": {... "stats": [per process]}, "minor_faults_without",
    "minor_faults_with", "minor_faults_avoided", "fault_bytes_avoided" (avoided x page size),
    "same_output" (stdout, stderr and exit code identical), ...}."""
    lib = Path(layer) if layer is not None else build_layer()
    base = dict(os.environ)
    base.update(env or {})
    if static_threshold:
        base["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    without = run_measured(argv, base, timeout, cwd)
    with tempfile.TemporaryDirectory(prefix="heapcast-layer-") as tmp:
        stats_path = Path(tmp) / "stats"
        with_env = dict(base)
        with_env["LD_PRELOAD"] = " ".join(p for p in (str(lib), base.get("LD_PRELOAD", "")) if p)
        with_env["HEAPCAST_LAYER"] = layer_env(policy, madv_free, str(stats_path), keep)
        with_layer = run_measured(argv, with_env, timeout, cwd)
        with_layer["stats"] = parse_stats(stats_path.read_text()) if stats_path.exists() else []
    page = os.sysconf("SC_PAGE_SIZE")
    avoided = without["minor_faults"] - with_layer["minor_faults"]
    same = all(
        without[k] == with_layer[k] for k in ("returncode", "stdout_sha256", "stderr_sha256")
    )
    return {
        "argv": [str(a) for a in argv],
        "n": policy.n if keep else 0,
        "min_size": policy.min_size,
        "madv_free": madv_free,
        "static_threshold": static_threshold,
        "without": without,
        "with": with_layer,
        "minor_faults": with_layer["minor_faults"],
        "minor_faults_without": without["minor_faults"],
        "minor_faults_with": with_layer["minor_faults"],
        "minor_faults_avoided": avoided,
        "fault_bytes_avoided": avoided * page,
        "page_size": page,
        "same_output": same,
        **stat_sums(with_layer["stats"]),
    }


# ---------------------------------------------------------------------------------------------
# Catalog workloads through the replay runners (the allocators stage's machinery)

ARMS = ("plain", "disabled", "layer")
"""The arms of a workload measurement: `plain` (no LD_PRELOAD), `disabled` (the layer loaded
with n=0: what loading it costs, a few pages per process) and `layer` (N = n)."""

LAYER_FILE = "libheapcast_layer.so"
STATS_FILE = "layer.stats"


def traced_events(argv: list[str], tracer: str | Path, out: Path) -> tuple[Any, dict[str, str]]:
    """argv run once under the tracer, writing into `out` (made here), with glibc's mmap
    threshold fixed as the simulator assumes: its events as one table (what `simulate` takes,
    to compare with `measure_layer` on the same command), and the environment it ran with."""
    out.mkdir()
    env = dict(
        os.environ,
        LD_PRELOAD=str(tracer),
        HEAPCAST_OUT=str(out),
        MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
    )
    subprocess.run(argv, env=env, check=True, capture_output=True)
    table = pa.concat_tables([convert_trace(read_trace(p))[0] for p in sorted(out.glob("*.hct"))])
    return table, env


def _arm_workload(
    workload, arm: str, policy: LargestConfig, static_threshold: bool, stats: str | None = None
):
    """The workload with the arm's variables added to its environment (the runners pass a
    workload's `env` to the program and nothing of the caller's); `stats`: where the layer
    appends its counters (a file in the run's trace folder, as the program sees it)."""
    env = dict(workload.env)
    if static_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    if arm != "plain":
        env["HEAPCAST_LAYER"] = layer_env(policy, stats=stats, keep=arm == "layer")
    return workload.model_copy(update={"env": env})


@dataclass(frozen=True)
class _ArmRuns:
    """What every measured run of one workload's input under the arms shares."""

    workload: Workload
    inp: WorkloadInput
    input_dir: Path
    runner: Runner
    policy: LargestConfig
    static_threshold: bool
    layer: Path
    probe: Path
    sandboxed: bool  # the program sees its trace folder at SANDBOX_TRACE

    def sample(self, arm: str, run_dir: Path, rep: int) -> dict[str, Any]:
        """One measured run of `arm` in a fresh `run_dir`: its usage, output digest, any error
        (the engine's, or the probe's verdict that the layer was not loaded) and the layer's
        counters."""
        trace_dir = run_dir / "trace"
        trace_seen = str(SANDBOX_TRACE if self.sandboxed else trace_dir.resolve())
        stats_seen = f"{trace_seen}/{STATS_FILE}" if arm != "plain" else None
        w = _arm_workload(self.workload, arm, self.policy, self.static_threshold, stats_seen)
        spec = PreloadSpec(name=arm, host_library=self.layer if arm != "plain" else None)
        request = fresh_probed_request(run_dir, w, self.inp, self.input_dir, spec, self.probe)
        error = None
        result = None
        try:
            result = self.runner.run(request)
        except EngineError as err:
            error = f"engine error: {err}"
        stats_path = trace_dir / STATS_FILE
        stats = parse_stats(stats_path.read_text()) if stats_path.exists() else []
        verified = verify_result(spec, request, result) if result is not None else None
        if error is None and verified is not None and not verified.applied:
            error = f"not applied: {verified.reason}"
        u = result.usage if result is not None else None
        return {
            "arm": arm,
            "rep": rep,
            "exit_code": result.exit_code if result is not None else None,
            "timed_out": result.timed_out if result is not None else None,
            "error": error or (result.error if result is not None else None),
            "minor_faults": u.minor_faults if u else None,
            "major_faults": u.major_faults if u else None,
            "wall_s": u.wall_s if u else None,
            "peak_memory_bytes": u.peak_memory_bytes if u else None,
            "stdout_sha256": result.stdout_sha256 if result is not None else None,
            "processes_with_layer": len(stats),
            **stat_sums(stats),
        }


def _arms_summary(
    samples: list[dict[str, Any]], arms: tuple[str, ...], page: int
) -> dict[str, Any]:
    """Each arm's minor faults (clean runs), their median and range; whether every run printed
    and exited the same; the fault bytes the layer avoided against plain and disabled."""
    out: dict[str, Any] = {"arms": {}}
    ok = [s for s in samples if s["error"] is None and s["minor_faults"] is not None]
    for arm in arms:
        f = [s["minor_faults"] for s in ok if s["arm"] == arm]
        out["arms"][arm] = {
            "minor_faults": f,
            "median": float(np.median(f)) if f else None,
            "min": min(f) if f else None,
            "max": max(f) if f else None,
        }
    digests = {(s["exit_code"], s["stdout_sha256"]) for s in samples}
    out["same_output"] = len(digests) == 1 and len(ok) == len(samples)
    out["exit_codes"] = sorted({s["exit_code"] for s in samples}, key=str)
    med = {a: out["arms"][a]["median"] for a in arms}
    if med.get("plain") is not None and med.get("layer") is not None:
        out["fault_bytes_avoided"] = int((med["plain"] - med["layer"]) * page)
    if med.get("disabled") is not None and med.get("layer") is not None:
        out["fault_bytes_avoided_vs_disabled"] = int((med["disabled"] - med["layer"]) * page)
    return out


def measure_layer_workload(
    workload: Workload,
    inp: WorkloadInput,
    runner: Runner,
    *,
    repetitions: int = 3,
    warmup: int = 1,
    policy: LargestConfig = LargestConfig(),
    static_threshold: bool = True,
    arms: tuple[str, ...] = ARMS,
    layer: str | Path | None = None,
    scratch_parent: str | Path | None = None,
    log=None,
) -> dict[str, Any]:
    """A catalog workload's input run untraced under each arm (ARMS), `repetitions` rounds in
    balanced order (tasks.replay.runners.preload.balanced_orders), through `runner` (tasks.replay.runners: docker or local)
    and its measured run (hc-measure: rusage of the program's tree, output digest), as the
    allocators stage runs its allocators, each run's loading verified by the probe.

    The layer reaches the program as a file in the run's trace folder (empty when untraced, and
    mounted into the container by the docker runner), preloaded from there. `static_threshold`:
    MALLOC_MMAP_THRESHOLD_=131072 in every arm, the simulator's fault model.

    Returns {"samples": [per run], "arms": {arm: {"minor_faults": [...], "median": ...}},
    "fault_bytes_avoided" (median plain - median layer, x page size), "fault_bytes_avoided_vs_
    disabled" (median disabled - median layer: the policy alone), "same_output" (every run's
    exit code and stdout digest equal), ...}."""
    lib = Path(layer) if layer is not None else build_layer()
    label = f"{workload.name}/{inp.name}"
    parent = Path(scratch_parent or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"layer-{workload.name}-{inp.name}-", dir=parent))
    samples: list[dict[str, Any]] = []
    page = os.sysconf("SC_PAGE_SIZE")
    probe = build_probe()
    sandboxed = runner.kind == "docker" or getattr(runner, "sandbox", "") == "bwrap"
    try:
        input_dir = prepare_input_dir(workload.generator, inp.seed, inp.size, scratch)
        runs = _ArmRuns(
            workload, inp, input_dir, runner, policy, static_threshold, lib, probe, sandboxed
        )
        for i in range(warmup):
            runs.sample("plain", scratch / f"warmup-{i}", 0)
            shutil.rmtree(scratch / f"warmup-{i}", ignore_errors=True)
        for rep, order in enumerate(balanced_orders(list(arms), repetitions)):
            for arm in order:
                run_dir = scratch / f"r{rep + 1}-{arm}"
                s = runs.sample(arm, run_dir, rep + 1)
                shutil.rmtree(run_dir, ignore_errors=True)
                if log is not None:
                    log(f"{label} {arm} round {rep + 1}: {s['minor_faults']} minor faults")
                samples.append(s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = _arms_summary(samples, arms, page)
    return {
        "workload": workload.name,
        "input": inp.name,
        "runner": runner.kind,
        "n": policy.n,
        "min_size": policy.min_size,
        "static_threshold": static_threshold,
        "repetitions": repetitions,
        "page_size": page,
        "samples": samples,
        "arms": summary.pop("arms"),
        "same_output": summary.pop("same_output"),
        "exit_codes": summary.pop("exit_codes"),
        "expected_exit_code": workload.expected_exit_code,
        **summary,
    }
