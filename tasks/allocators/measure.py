"""Replay workloads untraced under each allocator, side by side, and measure every run.

A *case* is one (workload, input): its input generated once, warm-up runs of the baseline
(discarded), then `repetitions` rounds of every available allocator in a balanced order (Williams
squares from `order_seed`), more rounds up to `max_repetitions` while the decision sits in the
noise. Cases run one after the other, never in parallel. Each run is the runner's measured run and
comes back as a `Sample` (times, peak memory, faults, exit code, the output's SHA-256). A missing
library is recorded in `Measurements.unavailable`; a failed run is a failed sample and the rest go
on. In full: docs/allocators.md#the-measured-runs.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from tasks.allocators.config import (
    LAYER_DIR,
    LAYER_STATS,
    Allocator,
    AllocatorsConfig,
    RecommendationRule,
)
from tasks.allocators.place import (
    JEMALLOC_PACKAGE,
    PLACE_STATS,
    PlaceBuildError,
    build_place,
    not_in_force,
    read_place_stats,
)
from tasks.allocators.rounds import (
    Plan,
    Race,
    RoundVerdict,
    after_round,
    over_bound,
    plan_rounds,
)
from tasks.core.storage import Root, scratch_parent
from tasks.format.trace_reader import count_traces
from tasks.replay.inputs import prepare_input_dir
from tasks.replay.runners.base import EngineError, Runner, RunRequest, RunResult
from tasks.replay.runners.measure_tool import ResourceUsage
from tasks.replay.runners.preload import (
    Verification,
    balanced_orders,
    build_probe,
    fresh_probed_request,
    verify_result,
)
from tasks.replay.runners.select import make_runner, resolve_runner_kind
from tasks.replay.workloads import Catalog, Workload, WorkloadInput, load_catalog

MB = 1024 * 1024
NOT_APPLIED = "not applied"  # how a run's error starts when its allocator was not in force


class AllocatorMissing(RuntimeError):
    """An allocator's library is not where the workload runs; names the Debian package."""


@dataclass(frozen=True)
class Case:
    """One (workload, input) measured under every allocator; `label` names it in the results:
    the workload's name, or `<workload>/<input>` when several inputs of it are measured."""

    workload: Workload
    input: WorkloadInput
    label: str


class CaseInfo(BaseModel):
    label: str
    workload: str
    input: str
    expected_exit_code: int


class Sample(BaseModel):
    """One measured run of a case under an allocator."""

    case: str
    workload: str
    input: str
    allocator: str
    rep: int  # 1-based round
    position: int  # 1-based place in its round's order
    traced: bool
    ok: bool  # expected exit code, not timed out, no runner error, usage measured
    exit_code: int | None
    timed_out: bool
    wall_s: float | None = None
    cpu_s: float | None = None
    user_s: float | None = None
    sys_s: float | None = None
    peak_rss_mb: float | None = None  # the container's cgroup peak (local: ru_maxrss)
    max_process_rss_mb: float | None = None  # ru_maxrss: the largest single process
    # memory averaged over the run (hc-measure samples it every 10 ms): the container's cgroup,
    # else the program's own process's resident set; what a burst's returned pages lower though
    # the peak stays
    mean_rss_mb: float | None = None
    minor_faults: int | None = None
    major_faults: int | None = None
    peak_source: str | None = None
    run_s: float  # the runner's whole run: container start and removal included
    stdout_sha256: str | None = None
    stdout_bytes: int | None = None
    events: int | None = None  # traced runs: heap events recorded
    error: str | None = None
    applied: bool | None = None  # the probe saw the allocator (and its knobs) in force
    started_at: str
    # a heapcast layer's own counters, summed over the run's processes (None: not a layer, or
    # no process wrote them; a process leaving by _exit writes none)
    layer_processes: int | None = None
    layer_hits: int | None = None
    layer_misses: int | None = None
    layer_kept: int | None = None
    layer_given_back: int | None = None
    layer_bytes_kept_peak: int | None = None  # the largest of the processes'
    layer_bytes_given_back: int | None = None
    layer_bytes_advised: int | None = None
    layer_passed: int | None = None
    layer_double_frees: int | None = None
    layer_outgrown: int | None = None  # frees left to the allocator: the program outgrew them
    layer_heap: int | None = None  # frees left to glibc's heap (scope=mapped)
    layer_bounded: int | None = None  # kept blocks given back to stay within the live peak
    # processes whose proof came (they kept blocks; the others stepped aside), and the frees
    # passed on while the proof was awaited
    layer_proven: int | None = None
    layer_unproven: int | None = None
    layer_table: int | None = None
    layer_table_refused: int | None = None
    layer_table_sites: int | None = None  # frees a table's call-site entries answered
    layer_table_contexts: int | None = None  # ... its allocation-context entries (format 4)
    # regret=1: misses a block the prediction passed on would have served, and the frees kept
    # on those regrets against the prediction (layer.c, The regret)
    layer_regret_hits: int | None = None
    layer_regret_keeps: int | None = None
    # the placement layer's stats line (kind: place; tasks.allocators.place), over the run's
    # processes: allocations placed long, sampled blocks that died young / outlived the horizon,
    # call sites seen and found long (the largest process's table)
    place_processes: int | None = None
    place_mode: str | None = None
    place_long: int | None = None
    place_sampled: int | None = None
    place_dropped: int | None = None
    place_freed_short: int | None = None
    place_freed_long: int | None = None
    place_evicted_long: int | None = None
    place_sites_seen: int | None = None
    place_sites_long: int | None = None
    place_sites_aside: int | None = None
    # with a lifetime table (table=FILE): processes that used it / refused it, and the
    # allocations the table placed / the online counter placed (keys the table lacks)
    place_table: int | None = None
    place_table_refused: int | None = None
    place_table_answers: int | None = None
    place_counter_answers: int | None = None
    # sampled blocks placed long that died within the horizon (wrong placements) / outlived it
    # (right ones): native/layers/place.c, hp_verdict
    place_long_young: int | None = None
    place_long_old: int | None = None
    place_held_small: int | None = None  # long by the counter, short: the process under min_mb
    place_waiting: int | None = None  # processes whose counter never learned (under learn_mb)


# The layer's counters kept per run (native/layers/layer.c, hl_fini): summed over processes,
# except bytes_kept_peak (the largest).
LAYER_COUNTERS = (
    "hits",
    "misses",
    "kept",
    "given_back",
    "bytes_kept_peak",
    "bytes_given_back",
    "bytes_advised",
    "passed",
    "double_frees",
    "outgrown",
    "heap",
    "bounded",  # kept blocks given back at a miss: live + kept within the live blocks' peak
    "proven",  # processes that kept blocks once reuse was proven (layer.c hl_ghost_hit)
    "unproven",  # frees passed on before the proof
    "table",  # processes that used a table (the model's, for a table candidate)
    "table_refused",  # processes that refused the one they were given (one stderr line each)
    "table_sites",  # frees the table answered by call site and class (format 3), not by class
    "table_contexts",  # frees the table answered by allocation context and class (format 4)
    "regret_hits",  # regret=1: misses a block the prediction passed on would have served
    "regret_keeps",  # regret=1: frees kept on the process's regrets against the prediction
)


def read_layer_stats(path: Path) -> dict[str, int]:
    """The layer's counters of one run (`layer_<name>`, and layer_processes) from its stats
    file (one line of `name=value` per process); {} when no process wrote one."""
    if not path.is_file():
        return {}
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if "hits=" in ln]
    if not lines:
        return {}
    table = np.array(
        [
            [
                int(dict(f.split("=", 1) for f in ln.split() if "=" in f).get(k, 0))
                for k in LAYER_COUNTERS
            ]
            for ln in lines
        ],
        dtype=np.int64,
    )
    out = {f"layer_{k}": int(table[:, i].sum()) for i, k in enumerate(LAYER_COUNTERS)}
    out["layer_bytes_kept_peak"] = int(table[:, LAYER_COUNTERS.index("bytes_kept_peak")].max())
    out["layer_processes"] = len(lines)
    return out


class Unavailable(BaseModel):
    """An allocator that could not be run for a case (its library is missing there)."""

    case: str
    workload: str
    allocator: str
    library: str | None
    package: str | None
    message: str

    @classmethod
    def of(cls, allocator: Allocator, case: str, workload: str, message: str) -> Unavailable:
        """`allocator` unavailable for a case, with its library and package named."""
        return cls(
            case=case,
            workload=workload,
            allocator=allocator.name,
            library=allocator.library,
            package=allocator.package,
            message=message,
        )


class CaseRounds(BaseModel):
    """How a case's rounds went by the rule (tasks.allocators.rounds): the plan made before any
    run, the rounds run, the candidates out of the race and why, why the rounds stopped."""

    plan: Plan
    rounds: int
    dropped: dict[str, str] = {}
    stop: str = ""
    winner: str | None = None  # the candidate the rounds stopped on, if one beat the baseline


class Measurements(BaseModel):
    """Everything one measurement produced; `stats` and `report` read it."""

    night: str  # UTC stamp naming this measurement (its folder under <root>/allocators/)
    runner: str
    runner_detail: str
    host: str
    traced: bool
    allocators: list[Allocator]
    baseline: str
    repetitions: int
    warmup: int
    cases: list[CaseInfo]
    samples: list[Sample]
    unavailable: list[Unavailable]
    started_at: str
    elapsed_s: float
    # per case label, how its rounds went (absent in measurements made before the rule kept it,
    # or made without it: stats then judges the runs as one look at the rounds measured)
    rounds: dict[str, CaseRounds] = {}


def night_stamp(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def select_cases(
    catalog: Catalog,
    config: AllocatorsConfig,
    workloads: list[str] | None = None,
    quick: bool = False,
) -> list[Case]:
    """The cases to measure: the catalog's selection, kept to the config's input names."""
    unknown = sorted(set(config.objectives) - set(catalog.names()))
    if unknown:
        raise ValueError(
            f"allocators config `objectives`: {', '.join(unknown)} is no workload of the catalog "
            f"({', '.join(catalog.names())}); name a catalog workload or remove the entry"
        )
    pairs = catalog.select(workloads, quick=quick)
    if config.inputs is not None:
        pairs = [(w, i) for w, i in pairs if i.name in config.inputs]
    if not pairs:
        raise ValueError(
            f"nothing to measure: no input named {config.inputs} among the selected workloads "
            f"({', '.join(workloads or catalog.names())}{', quick inputs' if quick else ''})"
        )
    per_workload = Counter(w.name for w, _ in pairs)
    return [
        Case(w, i, w.name if per_workload[w.name] == 1 else f"{w.name}/{i.name}") for w, i in pairs
    ]


def round_orders(names: list[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """Each round's order: balanced (Williams squares, relabelled by `seed`; see
    tasks.replay.runners.preload.balanced_orders), never round one's order again at round n+1."""
    return balanced_orders(names, rounds, seed)


def missing_message(allocator: Allocator, workload: Workload, runner_kind: str) -> str:
    if runner_kind == "docker":
        return (
            f"allocator {allocator.name!r}: {allocator.library} is missing in image "
            f"{workload.image_tag} (workload {workload.name!r}); install the Debian package "
            f"{allocator.package} there (apt-get install {allocator.package} in "
            f"docker/workloads/{workload.image}/Dockerfile)"
        )
    return (
        f"allocator {allocator.name!r}: {allocator.library} is missing on this host (local "
        f"runner, workload {workload.name!r}); install the Debian package {allocator.package} "
        f"(apt-get install {allocator.package}; scripts/setup.sh does)"
    )


# why an allocator that reads a registered version's table has none, by its table_kind: what it
# reads, then the cases besides "no version is registered yet"
_NO_TABLE = {
    "reuse": (
        "table",
        "or the one named has no table (a night registers a version and logs its table; "
        "`python -m flows.allocators` reads the champion's, or --table-model's)",
    ),
    "lifetime": (
        "lifetime table",
        "the one named has none (registered before lifetime tables were logged with each "
        "version; the stage's log says which), or a layer table file was given (--table-file: "
        "the lifetime table comes from a registered version only)",
    ),
}


def check_allocators(
    runner: Runner, runner_kind: str, workload: Workload, allocators: list[Allocator]
) -> dict[str, AllocatorMissing]:
    """{allocator name: AllocatorMissing} for each allocator whose library is not where
    `workload` runs (in its image, or on the host), and each layer that reads the model's
    table but was handed none (no registered version has one: run unguided, it would be
    measured under a name that says otherwise)."""
    libs = [a.library for a in allocators if a.library and a.kind == "malloc"]
    missing = set(runner.missing_files(workload, libs)) if libs else set()
    out = {
        a.name: AllocatorMissing(missing_message(a, workload, runner_kind))
        for a in allocators
        if a.library in missing and a.kind == "malloc"
    }
    for a in allocators:
        # the jemalloc behind the placement layer is this host's, shown to the program beside
        # the layer (the runner's host libraries: the layer must come first in LD_PRELOAD)
        if a.kind == "place" and not Path(str(a.library)).is_file():
            out[a.name] = AllocatorMissing(
                f"allocator {a.name!r}: {a.library} (the jemalloc behind the placement layer) is "
                f"missing on this host; install the Debian package {a.package or JEMALLOC_PACKAGE} "
                f"(apt-get install {a.package or JEMALLOC_PACKAGE}; scripts/setup.sh does)"
            )
    for a in allocators:
        if a.table_kind in _NO_TABLE and a.model_table is None:
            what, why = _NO_TABLE[a.table_kind]
            out[a.name] = AllocatorMissing(
                f"allocator {a.name!r} reads the registered model's {what}, and none was given: "
                f"no version is registered yet, {why}"
            )
    return out


def build_layers(allocators: list[Allocator]) -> None:
    """Build heapcast's layers (native/, `make layer`) when a candidate is one: make rebuilds
    the library when a source changed, so a run never measures a stale layer; the placement
    layer likewise (`make place`) when a candidate is `kind: place`."""
    if any(a.kind == "place" for a in allocators):
        try:
            build_place()
        except PlaceBuildError as err:
            raise RuntimeError(f"cannot build the placement layer: {err}") from None
    if not any(a.kind == "layer" for a in allocators):
        return
    native = LAYER_DIR.parent
    proc = subprocess.run(
        ["make", "-s", "-C", str(native), "layer"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"cannot build the layer: `make -C {native} layer` failed:\n{proc.stderr[-2000:]}"
        )
    for a in allocators:
        if a.kind == "layer" and not (LAYER_DIR / str(a.library)).is_file():
            raise RuntimeError(
                f"allocator {a.name!r}: {LAYER_DIR / str(a.library)} is not built by "
                f"`make -C {native} layer`; its `library` names another file"
            )


def run_logger():
    try:
        return get_run_logger()
    except Exception:  # outside a flow or task run
        return logging.getLogger("heapcast.allocators")


def usage_fields(u: ResourceUsage | None) -> dict[str, Any]:
    """A Sample's figures from a run's resource usage (all None when nothing was measured)."""
    return dict(
        wall_s=u.wall_s if u else None,
        cpu_s=u.cpu_s if u else None,
        user_s=u.user_s if u else None,
        sys_s=u.sys_s if u else None,
        peak_rss_mb=u.peak_memory_bytes / MB if u else None,
        max_process_rss_mb=u.max_process_rss_bytes / MB if u else None,
        mean_rss_mb=u.mean_memory_bytes / MB if u and u.mean_memory_bytes is not None else None,
        minor_faults=u.minor_faults if u else None,
        major_faults=u.major_faults if u else None,
        peak_source=u.peak_source if u else None,
    )


def _sample(
    case: Case,
    allocator: str,
    rep: int,
    position: int,
    result: RunResult | None,
    traced: bool,
    events: int | None,
    error: str | None,
    started_at: str,
    run_s: float,
    verification: Verification | None = None,
    layer: dict[str, Any] | None = None,
) -> Sample:
    expected = case.workload.expected_exit_code
    base = dict(
        case=case.label,
        workload=case.workload.name,
        input=case.input.name,
        allocator=allocator,
        rep=rep,
        position=position,
        traced=traced,
        started_at=started_at,
        events=events,
    )
    if result is None:
        return Sample(**base, ok=False, exit_code=None, timed_out=False, run_s=run_s, error=error)
    u = result.usage
    applied = verification.applied if verification is not None else None
    if error is not None and error.startswith(NOT_APPLIED):
        applied = False  # loaded, but the layer itself said it was not in force
    if error is None:
        if verification is not None and not verification.applied and result.exit_code is not None:
            # glibc (or another malloc) measured under this allocator's name unless caught here
            error = f"{NOT_APPLIED}: {verification.reason}"
        elif result.timed_out:
            error = f"exceeded its time limit of {case.workload.time_limit_for(case.input):g} s"
        elif result.error:
            error = result.error
        elif result.exit_code != expected:
            last = result.log_tail.splitlines()[-3:] if result.log_tail else []
            error = (
                f"exit code {result.exit_code}, expected {expected}; "
                f"last output: {' | '.join(last) or '(none)'}"
            )
        elif u is None:
            error = "no resource usage measured"
    return Sample(
        **base,
        ok=error is None,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        **usage_fields(u),
        run_s=run_s,
        stdout_sha256=result.stdout_sha256,
        stdout_bytes=result.stdout_bytes,
        error=error,
        applied=applied,
        **(layer or {}),
    )


def run_once(
    case: Case,
    allocator: Allocator,
    runner: Runner,
    input_dir: Path,
    run_dir: Path,
    tracer: Path | None,
) -> tuple[RunResult | None, int | None, str | None, Verification | None, dict[str, Any]]:
    """One measured run in a fresh folder, its loading verified by the probe
    (tasks.replay.runners.preload); (result, traced events, error, verification, the layer's
    counters: `read_layer_stats`, {} for others). An engine hiccup is tried once more, then
    recorded as the run's error; a workload the host cannot run (a `mounts` source missing:
    FileNotFoundError naming it) is recorded at once, so that only its case fails."""
    error = None
    spec = allocator.spec
    probe = build_probe()
    for attempt in (1, 2):
        probed = fresh_probed_request(
            run_dir, case.workload, case.input, input_dir, spec, probe, tracer
        )
        dirs = {"trace": probed.trace_dir, "measure": probed.measure_dir}
        if allocator.model_table is not None:  # the run's own copy, where its settings say
            shutil.copyfile(allocator.model_table.path, dirs["measure"] / allocator.table_copy)
        request = place_request(probed, allocator)
        try:
            result = runner.run(request)
        except EngineError as err:
            error = f"engine error (attempt {attempt}): {err}"
            continue
        except FileNotFoundError as err:
            # not transient: another attempt would miss the same folder
            return None, None, f"cannot run here: {err}", None, {}
        events = count_traces(dirs["trace"]).events if tracer is not None else None
        layer: dict[str, Any] = {}
        if allocator.kind == "layer":
            layer = read_layer_stats(dirs["measure"] / LAYER_STATS)
        elif allocator.kind == "place":
            layer = read_place_stats(dirs["measure"] / PLACE_STATS)
        return (
            result,
            events,
            table_error(allocator, layer) or place_error(allocator, layer),
            verify_result(spec, request, result),
            layer,
        )
    return None, None, error, None, {}


def place_request(request: RunRequest, allocator: Allocator) -> RunRequest:
    """`request` (probed, under allocator.spec: the placement layer) with jemalloc after the
    layer and the layer's settings, stats line into the measure folder; as is for other kinds.
    jemalloc is this host's file, shown to the program as the layer is (a host library): the
    runner's `preload` would come before the layer, and the layer must come first."""
    if allocator.kind != "place":
        return request
    return replace(
        request,
        host_libraries=request.host_libraries + (Path(str(allocator.library)),),
        env=request.env + tuple(allocator.place_env().items()),
    )


def place_error(allocator: Allocator, stats: dict[str, Any]) -> str | None:
    """Why a place candidate's run does not count (the layer was not in force: no stats line,
    or another mode), or None; None for other kinds."""
    if allocator.kind != "place":
        return None
    why = not_in_force(stats, allocator.place_mode)
    return f"{NOT_APPLIED}: {why}" if why else None


def table_error(allocator: Allocator, layer: dict[str, Any]) -> str | None:
    """Why a table candidate's run does not count (its layer refused the model's table, or no
    process said it used it: the run was the online counter under the table's name; for a
    place candidate also: the lifetime table answered no allocation), or None."""
    if allocator.model_table is None or not layer:
        return None
    if allocator.kind == "place":
        return lifetime_table_error(allocator, layer)
    if layer.get("layer_table_refused", 0) or layer.get("layer_table", 0) < layer.get(
        "layer_processes", 0
    ):
        return (
            f"the layer did not use the model's table v{allocator.model_table.version} "
            f"({allocator.model_table.path}) in every process: refused in "
            f"{layer.get('layer_table_refused', 0)} of {layer.get('layer_processes', 0)} (the "
            "run's stderr says why); its figures would be the online counter's"
        )
    return None


def lifetime_table_error(allocator: Allocator, stats: dict[str, Any]) -> str | None:
    """table_error for a place candidate, from its stats line's counters (read_place_stats)."""
    t = allocator.model_table
    if t is None or not stats:
        return None
    n, used = stats.get("place_processes", 0), stats.get("place_table", 0)
    refused = stats.get("place_table_refused", 0)
    if refused or used < n:
        return (
            f"the placement layer did not use the model's lifetime table v{t.version} "
            f"({t.path}) in every process: refused in {refused} of {n} (the run's stderr says "
            "why); its figures would be the online counter's"
        )
    if not stats.get("place_table_answers", 0):
        return (
            f"the model's lifetime table v{t.version} ({t.path}) placed no allocation (it "
            "knows none of the run's call sites and size classes): its figures would be the "
            "online counter's"
        )
    return None


def rule_round(
    samples: list[Sample],
    names: list[str],
    race: Race,
    base: str,
    rule: RecommendationRule,
    plan: Plan,
    rounds: int,
    *,
    eliminate: bool,
) -> bool:
    """After `rounds` rounds, the rule's verdict (tasks.allocators.rounds.after_round) over the
    samples so far, taken by `race`; True when the rounds stop. `eliminate`: tune's drops before
    the planned rounds (the stage runs every candidate for them)."""
    verdict = after_round(
        _race_runs(samples, names, race, base, rule, rounds),
        race.active,
        base,
        rounds,
        plan=plan,
        promising_p=rule.promising_p,
        metric=rule.primary,
        eliminate=eliminate,
        out=set(race.dropped),
        **_guard_bounds(samples, names, rule),
    )
    return race.apply(verdict)


def _race_runs(
    samples: list[Sample],
    names: list[str],
    race: Race,
    base: str,
    rule: RecommendationRule,
    rounds: int,
) -> dict[str, np.ndarray]:
    """Each candidate's ok runs of the rule's metric; a candidate with a failed run leaves the
    race (its pair is `failed`, never recommended), saying so."""
    failed = {
        n: f"a run failed by {rounds} rounds (its row says why)"
        for n in race.active
        if n != base and any(x.allocator == n and not x.ok for x in samples)
    }
    race.apply(RoundVerdict(dropped=failed))
    ok = [x for x in samples if x.ok]
    runs = {
        n: np.array(
            [v for x in ok if x.allocator == n and (v := getattr(x, rule.primary)) is not None],
            dtype=float,
        )
        for n in names
    }
    return runs


def _guard_bounds(samples: list[Sample], names: list[str], rule: RecommendationRule) -> dict:
    """after_round's `ineligible` (time objective: memory over its tolerance, out) or `unfit`
    (memory objective: time over its tolerance, never the leader)."""
    metric, tolerance = rule.guard
    values = {
        n: np.array([getattr(x, metric) or 0.0 for x in samples if x.ok and x.allocator == n])
        for n in names
    }
    over = over_bound(values, metric, tolerance)
    return {"ineligible": over} if rule.objective == "time" else {"unfit": set(over)}


def _timed_sample(
    case: Case,
    allocator: Allocator,
    runner: Runner,
    input_dir: Path,
    run_dir: Path,
    tracer: Path | None,
    rep: int,
    pos: int,
) -> Sample:
    """The sample of one run (run_once) of round rep + 1, at position pos + 1, with when it
    started and how long it took; its folder removed after."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    result, events, error, verified, layer = run_once(
        case, allocator, runner, input_dir, run_dir, tracer
    )
    s = _sample(
        case,
        allocator.name,
        rep + 1,
        pos + 1,
        result,
        tracer is not None,
        events,
        error,
        started_at,
        round(time.monotonic() - t0, 4),
        verified,
        layer,
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    return s


def measure_case(
    case: Case,
    config: AllocatorsConfig,
    runner: Runner,
    runner_kind: str,
    scratch_parent: Path,
    *,
    repetitions: int | None = None,
    warmup: int | None = None,
    tracer: Path | None = None,
    log=None,
) -> tuple[list[Sample], list[Unavailable], CaseRounds | None]:
    """Every available allocator on one case, `repetitions` rotated rounds, more while the rule
    (tasks.allocators.rounds) has not decided, up to the bound (see the module); `repetitions`
    given: exactly that many."""
    log = log or run_logger()
    reps = config.repetitions if repetitions is None else repetitions
    warm = config.warmup if warmup is None else warmup
    missing = check_allocators(runner, runner_kind, case.workload, config.allocators)
    unavailable = []
    for name, err in missing.items():
        log.error(f"{case.label}: {err}")
        unavailable.append(
            Unavailable.of(config.get(name), case.label, case.workload.name, str(err))
        )
    names = [n for n in config.names() if n not in missing]
    samples: list[Sample] = []
    if not names:
        return samples, unavailable, None
    scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(
        tempfile.mkdtemp(prefix=f"{case.workload.name}-{case.input.name}-", dir=scratch_parent)
    )
    try:
        input_dir = prepare_input_dir(
            case.workload.generator, case.input.seed, case.input.size, scratch
        )
        first = config.baseline if config.baseline in names else names[0]
        for i in range(warm):
            run_once(case, config.get(first), runner, input_dir, scratch / f"warmup-{i}", tracer)
        bound = max(reps, config.rounds_bound) if repetitions is None else reps
        rule = config.rule_for(case.workload.name)  # the objective rounds are judged on
        base = config.baseline
        plan = plan_rounds(
            len(names) - 1 if base in names else 0,
            reps,
            bound,
            rule.alpha,
            rule.correction,
            rule.noise,
        )
        orders = round_orders(names, bound, config.order_seed)
        race, rep = Race(list(names)), 0
        for rep in range(bound):
            order = [n for n in orders[rep] if n in race.active]
            if rep >= reps:
                log.info(f"{case.label}: round {rep + 1} added for {', '.join(order)}")
            for pos, name in enumerate(order):
                run_dir = scratch / f"r{rep + 1}-{name}"
                s = _timed_sample(
                    case, config.get(name), runner, input_dir, run_dir, tracer, rep, pos
                )
                if not s.ok:
                    log.warning(f"{case.label} under {name} (round {rep + 1}): {s.error}")
                samples.append(s)
            if base not in names or rep + 1 < reps:
                continue
            # past the planned rounds: the rule narrows the race, or stops it
            if rule_round(samples, names, race, base, rule, plan, rep + 1, eliminate=False):
                break
        stop = race.stop or f"the bound of {bound} rounds"
        rounds = CaseRounds(
            plan=plan, rounds=rep + 1, dropped=race.dropped, stop=stop, winner=race.winner
        )
        log.info(f"{case.label}: {rep + 1} rounds, {stop}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return samples, unavailable, rounds


def measure_cases(
    cases: list[Case],
    config: AllocatorsConfig,
    root: Root,
    runner: str = "auto",
    *,
    repetitions: int | None = None,
    warmup: int | None = None,
    tracer: str | Path | None = None,
) -> Measurements:
    """Measure `cases` one after the other under every allocator of `config` (not a task: the
    tests and the benchmark call it directly; `measure_all` is the flow's task)."""
    log = run_logger()
    kind, why = resolve_runner_kind(runner)  # type: ignore[arg-type]
    log.info(f"allocators: {why}")
    run_runner = make_runner(kind)
    run_runner.check()
    build_layers(config.allocators)
    tracer_path = Path(tracer) if tracer is not None else None
    if tracer_path is not None and not tracer_path.is_file():
        raise FileNotFoundError(f"tracer {tracer_path} not found: build it with `make -C native`")
    started = datetime.now(UTC)
    t0 = time.monotonic()
    scratch = scratch_parent(root)
    samples: list[Sample] = []
    unavailable: list[Unavailable] = []
    rounds: dict[str, CaseRounds] = {}
    for case in cases:
        log.info(f"{case.label}: {len(config.allocators)} allocators")
        s, u, r = measure_case(
            case,
            config,
            run_runner,
            kind,
            scratch,
            repetitions=repetitions,
            warmup=warmup,
            tracer=tracer_path,
            log=log,
        )
        samples += s
        unavailable += u
        if r is not None:
            rounds[case.label] = r
    return Measurements(
        night=night_stamp(started),
        runner=kind,
        runner_detail=run_runner.describe(),
        host=socket.gethostname(),
        traced=tracer_path is not None,
        allocators=list(config.allocators),
        baseline=config.baseline,
        repetitions=config.repetitions if repetitions is None else repetitions,
        warmup=config.warmup if warmup is None else warmup,
        cases=[
            CaseInfo(
                label=c.label,
                workload=c.workload.name,
                input=c.input.name,
                expected_exit_code=c.workload.expected_exit_code,
            )
            for c in cases
        ],
        samples=samples,
        unavailable=unavailable,
        started_at=started.isoformat(timespec="seconds"),
        elapsed_s=round(time.monotonic() - t0, 3),
        rounds=rounds,
    )


@task(name="measure-allocators", cache_policy=NO_CACHE)
def measure_all(
    root: Root,
    config: AllocatorsConfig,
    workloads: list[str] | None = None,
    quick: bool = False,
    runner: str = "auto",
    catalog: str | None = None,
) -> Measurements:
    """Replay the selected workloads untraced under every allocator, side by side, measured.

    Needs the workload images built (tasks.replay.images.build_images over `images_for(...)`)
    for the docker runner. Sequential by design; a failure fails only its (case, allocator)."""
    cat = load_catalog(catalog)
    cases = select_cases(cat, config, workloads, quick)
    return measure_cases(cases, config, root, runner)


def images_for(
    config: AllocatorsConfig,
    workloads: list[str] | None = None,
    quick: bool = False,
    catalog: str | None = None,
) -> list[str]:
    """The image folders the selection needs, for tasks.replay.images.build_images."""
    cases = select_cases(load_catalog(catalog), config, workloads, quick)
    return list(dict.fromkeys(c.workload.image for c in cases))


if __name__ == "__main__":  # python -m tasks.allocators.measure [WORKLOAD...]: the quick inputs
    from tasks.allocators.config import load_allocators_config
    from tasks.core.config import default_root

    cfg = load_allocators_config()
    m = measure_cases(
        select_cases(load_catalog(), cfg, sys.argv[1:] or None, quick=True),
        cfg,
        Root.from_url(default_root()),
    )
    print(m.model_dump_json(indent=1))
