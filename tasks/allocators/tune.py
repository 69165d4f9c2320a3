"""`heapcast tune -- PROG ARGS`: which allocator and settings suit any program, measured here.

The program runs on this host, in the caller's folder and environment, under each candidate of
configs/allocators.yaml's `tune` list (or those asked for), each run through
tasks.replay.runners.preload.run_preloaded: hc-measure (wall, CPU, ru_maxrss, faults, a digest of
the standard output) and the probe (the candidate verified in force, run by run). The analysis is
the allocators stage's own (tasks.allocators.stats), on a `Measurements` of one case.

Order of work (docs/allocators.md#tunes-order-of-work): one traced run
(tasks.allocators.trace_facts), candidates derived (tasks.allocators.advise), rounds
(tasks.allocators.rounds), a check run of the recommendation, the answer and its HTML page. A
program whose output differs from run to run under glibc has only its exit codes compared.
"""

from __future__ import annotations

import html
import os
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

import numpy as np
import plotly.graph_objects as go

from tasks.allocators.advise import Advice, advise
from tasks.allocators.config import LAYER_STATS, Allocator, AllocatorsConfig, RecommendationRule
from tasks.allocators.measure import (
    NOT_APPLIED,
    CaseInfo,
    CaseRounds,
    Measurements,
    Sample,
    Unavailable,
    night_stamp,
    place_error,
    read_layer_stats,
    rule_round,
    usage_fields,
)
from tasks.allocators.place import PLACE_STATS, PlaceBuildError, build_place, read_place_stats
from tasks.allocators.rounds import Race, plan_rounds
from tasks.allocators.stats import PairSummary, Recommendation, analyse
from tasks.allocators.trace_facts import HeapFacts, TraceFactsError, heap_facts, mallopt_lines
from tasks.core.config import PROJECT_DIR
from tasks.format.build import TracerBuildError, build_tracer
from tasks.format.native_sources import TRACER_SOURCES
from tasks.replay.runners.base import PROBE_REPORT
from tasks.replay.runners.preload import (
    PreloadedRun,
    PreloadSpec,
    balanced_orders,
    run_preloaded,
)
from tasks.report.page import html_table, standalone_page

# progress(done, total, what): one call before each run
Progress = Callable[[int, int, str], None]
NATIVE_DIR = PROJECT_DIR / "native"


class TuneError(RuntimeError):
    """tune cannot answer for this program; the message says why and what to do."""


@dataclass(frozen=True)
class TuneOutcome:
    measurements: Measurements
    pairs: list[PairSummary]
    recommendation: Recommendation
    table: str  # the terminal answer: facts, candidates, table, recommendation, line to paste
    line: str  # the exact line to paste (the program included)
    html_path: Path | None
    output_note: str | None  # set when outputs could not be compared
    facts: HeapFacts | None = None  # what the traced run showed; None: no trace read
    advice: Advice | None = None  # the candidates derived and ruled out
    check: CheckRun | None = None  # the recommended setting run alone after the choice
    stopped: str = ""  # why the rounds stopped


def _sample(label: str, name: str, rep: int, pos: int, run: PreloadedRun, expected: int) -> Sample:
    u = run.usage
    error = run.error
    if error is None:
        if run.timed_out:
            error = "exceeded its time limit"
        elif not run.verification.applied and run.exit_code is not None:
            error = f"{NOT_APPLIED}: {run.verification.reason}"
        elif run.exit_code != expected:
            error = f"exit code {run.exit_code}, expected {expected}; {run.stderr_tail[-300:]}"
        elif u is None:
            error = "no resource usage measured"
    return Sample(
        case=label,
        workload=label,
        input="args",
        allocator=name,
        rep=rep,
        position=pos,
        traced=False,
        ok=error is None,
        exit_code=run.exit_code,
        timed_out=run.timed_out,
        **usage_fields(u),
        run_s=u.wall_s if u else 0.0,
        stdout_sha256=run.stdout_sha256,
        stdout_bytes=run.stdout_bytes,
        error=error,
        applied=run.verification.applied,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def missing_library(a: Allocator) -> str | None:
    """Why candidate `a` cannot run on this host (its library absent, naming the package; the
    model's table it reads not handed to it), or None."""
    if a.table is not None and a.model_table is None:
        # run without it, it would measure the online counter under the table's name
        return (
            f"candidate {a.name!r} reads the registered model's {a.table_kind} table, which "
            "`heapcast tune` does not fetch; the allocators stage measures it "
            "(python -m flows.allocators --seeds)"
        )
    if a.kind == "place":
        if not Path(str(a.library)).is_file():
            return (
                f"candidate {a.name!r}: {a.library} (the jemalloc behind the placement layer) is "
                f"missing on this host; install the Debian package {a.package} "
                f"(apt-get install {a.package})"
            )
        try:
            build_place()  # on demand: make rebuilds it when a source changed
        except PlaceBuildError as err:
            return f"candidate {a.name!r}: {err}"
        return None
    spec = a.spec
    path = spec.host_library or (Path(spec.library) if spec.library else None)
    if path is None or path.exists():
        return None
    if a.kind == "layer":
        return f"candidate {a.name!r}: {path} is not built; build it with `make -C native`"
    return (
        f"candidate {a.name!r}: {path} is missing on this host; install the Debian package "
        f"{a.package} (apt-get install {a.package})"
    )


def run_candidate(
    argv: list[str], a: Allocator, run_dir: Path, *, cwd: Path | None, timeout_s: float
) -> PreloadedRun:
    """One measured run of `argv` under candidate `a` (run_preloaded). The placement layer
    (`kind: place`) needs jemalloc right after it: jemalloc joins the caller's own preloads, which
    run_preloaded puts after the candidate's library, and the layer's stats line goes to
    `run_dir` (tasks.allocators.place.PLACE_STATS)."""
    if a.kind != "place":
        return run_preloaded(argv, a.spec, run_dir, cwd=cwd, timeout_s=timeout_s)
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join([str(a.library), *filter(None, [env.get("LD_PRELOAD")])])
    env.update(a.place_env(str(run_dir)))
    return run_preloaded(argv, a.spec, run_dir, base_env=env, cwd=cwd, timeout_s=timeout_s)


def tracer_library() -> Path:
    """native/build/libheapcast.so, built (make) when missing or older than a source."""
    lib = NATIVE_DIR / "build" / "libheapcast.so"
    try:
        built = lib.stat().st_mtime_ns
        if all((NATIVE_DIR / s).stat().st_mtime_ns <= built for s in TRACER_SOURCES):
            return lib
    except FileNotFoundError:
        pass
    try:
        return build_tracer.fn()
    except TracerBuildError as err:
        raise TuneError(f"the tracer cannot be built: {err}") from None


@dataclass(frozen=True)
class FirstRun:
    """The first run of the program: traced (the facts read from it) or, where tracing was off or
    failed, under the baseline alone. It checks the program works and LD_PRELOAD reaches it."""

    run: PreloadedRun
    traced: bool
    facts: HeapFacts | None
    note: str | None  # why there is no advice from the trace, when there is none


def _fail_under_baseline(argv: list[str], run: PreloadedRun, baseline: str, how: str) -> None:
    if run.error:
        raise TuneError(f"{shlex.join(argv)}: {run.error}")
    if run.timed_out:
        raise TuneError(
            f"{shlex.join(argv)} did not finish in its time limit under {baseline}{how}; "
            "tune measures a program that ends: give it a shorter input"
        )
    if run.exit_code != 0:
        raise TuneError(
            f"{shlex.join(argv)} exits {run.exit_code} under {baseline}{how} (stderr: "
            f"{run.stderr_tail.strip()[-400:] or 'nothing'}); tune measures a program "
            "that works: fix the command first"
        )
    if not run.verification.applied:
        raise TuneError(
            f"LD_PRELOAD cannot reach {argv[0]}: {run.verification.reason}. An allocator "
            "can only be changed there by relinking the program"
        )


def first_run(
    argv: list[str],
    config: AllocatorsConfig,
    work: Path,
    *,
    trace: bool,
    cwd: Path | None,
    timeout_s: float,
) -> FirstRun:
    """Run the program once, traced with callers where `trace` (as `heapcast trace` does), and
    read the facts; where the traced run fails but the program works alone, tune goes on with
    the fixed list and says why. A program that fails alone, or that LD_PRELOAD cannot reach, is
    a TuneError naming it."""
    baseline = config.get(config.baseline)
    lib = None
    if trace:
        try:
            lib = tracer_library()
        except TuneError as err:
            note = f"{err}: no advice from the trace"
    if lib is not None:
        out = work / "trace"
        out.mkdir(parents=True)
        env = dict(os.environ, HEAPCAST_OUT=str(out), HEAPCAST_CALLER="1")
        spec = PreloadSpec(name="traced", library=str(lib))
        run = run_preloaded(argv, spec, work / "traced", base_env=env, cwd=cwd, timeout_s=timeout_s)
        if not run.verification.applied and run.exit_code == 0 and not run.error:
            _fail_under_baseline(argv, run, config.baseline, " (traced)")
        if run.exit_code == 0 and not run.error and not run.timed_out:
            probe = work / "traced" / PROBE_REPORT
            try:
                facts = heap_facts(
                    out,
                    large_block_bytes=config.large_block_bytes,
                    peak_rss_bytes=run.usage.max_process_rss_bytes if run.usage else None,
                    wall_s=run.usage.wall_s if run.usage else None,
                    mallopt_calls=mallopt_lines(
                        probe.read_text(errors="replace") if probe.is_file() else None
                    ),
                )
                return FirstRun(run, True, facts, None)
            except TraceFactsError as err:
                note = f"the trace could not be read ({err}): no advice from the trace"
        else:
            why = run.error or (
                "it ran past its time limit"
                if run.timed_out
                else f"exit {run.exit_code}: {run.stderr_tail.strip()[-300:] or 'no stderr'}"
            )
            note = f"the traced run failed ({why}): no advice from the trace"
    elif not trace:
        note = "tracing off (--no-trace): the fixed list measured"
    run = run_preloaded(argv, baseline.spec, work / "check", cwd=cwd, timeout_s=timeout_s)
    _fail_under_baseline(argv, run, config.baseline, "")
    return FirstRun(run, False, None, note)


@dataclass(frozen=True)
class CheckRun:
    """The recommended setting run alone after the choice: its output and its gain."""

    allocator: str
    wall_s: float | None
    gain: float | None  # 1 - its metric / the baseline's median (wall time, or peak memory)
    output_same: bool | None  # None: outputs could not be compared
    within: bool | None  # the gain inside the margin's interval
    error: str | None = None
    metric: str = "wall_s"  # the objective's metric the gain is on

    def line(self, rec: Recommendation) -> str:
        if self.error:
            return f"check run of {self.allocator} alone: {self.error}"
        out = {True: "output unchanged", False: "OUTPUT DIFFERS", None: "output not comparable"}
        gain = (
            f"gain {self.gain * 100:+.1f}% in {self.metric}"
            if self.gain is not None
            else f"no {self.metric}"
        )
        where = ""
        if self.within is not None:
            where = (
                f", {'within' if self.within else 'outside'} the interval "
                f"[{rec.margin_low * 100:+.1f}%, {rec.margin_high * 100:+.1f}%]"
                + ("" if self.within else " (one run: its noise is wider than a median's)")
            )
        return (
            f"check run of {self.allocator} alone: wall {self.wall_s:.3f} s, {gain}{where}, "
            f"{out[self.output_same]}"
        )


# the memories the rule may compare (RecommendationRule.memory's values)
MEMORY_METRICS = get_args(RecommendationRule.model_fields["memory"].annotation)


def _with_objective(
    config: AllocatorsConfig, objective: str | None, memory: str | None = None
) -> AllocatorsConfig:
    """The config with its rule judged on `objective` (time or memory) and its memory read as
    `memory` (one of MEMORY_METRICS); None: as it is."""
    update = {}
    if objective is not None:
        if objective not in ("time", "memory"):
            raise TuneError(f"objective must be time or memory, not {objective!r}")
        update["objective"] = objective
    if memory is not None:
        if memory not in MEMORY_METRICS:
            raise TuneError(f"memory must be one of {', '.join(MEMORY_METRICS)}, not {memory!r}")
        update["memory"] = memory
    if not update:
        return config
    return config.model_copy(update={"rule": config.rule.model_copy(update=update)})


def _resolved_argv(argv: list[str]) -> list[str]:
    """argv with its program's path (looked up on PATH where it names no folder); TuneError
    when there is no such executable."""
    program = shutil.which(argv[0]) if "/" not in argv[0] else argv[0]
    if program is None or not os.path.exists(program):
        raise TuneError(
            f"program not found: {argv[0]} ("
            + ("no such file" if "/" in argv[0] else "not on PATH")
            + "); give the path of an executable, or a command on PATH"
        )
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise TuneError(f"{program} is not an executable file; give the program to run")
    return [program, *argv[1:]]


def _candidate_names(config: AllocatorsConfig, candidates: list[str] | None) -> list[str]:
    """The candidates asked for, else the config's tune list (else all it names), the baseline
    first where it is missing; a former name (config.resolve, RENAMED_POLICIES) is the
    candidate's name now; TuneError naming any the config does not have."""
    tcfg = config.tune
    names = [
        config.resolve(n) for n in (candidates or (tcfg.candidates if tcfg else config.names()))
    ]
    unknown = [n for n in names if n not in config.names()]
    if unknown:
        raise TuneError(
            f"no candidate {', '.join(unknown)} in the allocators config; it has: "
            f"{', '.join(config.names())}"
        )
    return names if config.baseline in names else [config.baseline, *names]


def _advised(
    first: FirstRun,
    config: AllocatorsConfig,
    names: list[str],
    asked: bool,
    cpus: int | None,
) -> tuple[AllocatorsConfig, list[str], Advice | None]:
    """What the traced first run advises (None without a trace): the derived candidates join
    the config (replacing a same-named one) and the names, those ruled out leave; candidates
    `asked` for are measured as they are, the trace only shown."""
    if first.facts is None:
        return config, names, None
    advice = advise(
        first.facts,
        config,
        names,
        cpus or len(os.sched_getaffinity(0)) or 1,
        config.rule.objective,
    )
    if asked:
        return config, names, Advice(facts=advice.facts, run={n: "asked for" for n in names})
    fresh = {a.name for a in advice.derived}
    kept = [a for a in config.allocators if a.name not in fresh]
    config = config.model_copy(update={"allocators": kept + list(advice.derived)})
    names = [n for n in names if n not in advice.ruled_out]
    names += [a.name for a in advice.derived if a.name not in names]
    return config, names, advice


def tune(
    argv: list[str],
    config: AllocatorsConfig,
    *,
    candidates: list[str] | None = None,
    repetitions: int | None = None,
    max_repetitions: int | None = None,
    warmup: int | None = None,
    html_out: Path | None = None,
    cwd: Path | None = None,
    timeout_s: float = 3600.0,
    progress: Progress | None = None,
    objective: str | None = None,
    trace: bool = True,
    cpus: int | None = None,
    check: bool = True,
    memory: str | None = None,
) -> TuneOutcome:
    """Trace `argv` once, derive candidates from what it does, measure them beside the fixed
    list and recommend one (see the module); `objective` (time or memory) overrides the rule's,
    `memory` (MEMORY_METRICS) the memory it reads.
    `candidates` given: exactly those are measured (the trace still shown, nothing derived or
    ruled out). `cpus`: the cores the derivation assumes (default: this host's)."""
    if not argv:
        raise TuneError("give a program: heapcast tune -- PROGRAM ARGS...")
    config = _with_objective(config, objective, memory)
    argv = _resolved_argv(argv)
    tcfg = config.tune
    names = _candidate_names(config, candidates)
    reps = repetitions or (tcfg.repetitions if tcfg else config.repetitions)
    bound = max(reps, max_repetitions or (tcfg.max_repetitions if tcfg else config.rounds_bound))
    warm = (tcfg.warmup if tcfg else config.warmup) if warmup is None else warmup
    label = Path(argv[0]).name
    started = datetime.now(UTC)
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="heapcast-tune-"))
    try:
        if progress is not None:
            progress(0, 1 + reps * len(names), "traced run" if trace else config.baseline)
        first = first_run(
            argv, config, scratch / "first", trace=trace, cwd=cwd, timeout_s=timeout_s
        )
        config, names, advice = _advised(first, config, names, candidates is not None, cpus)
        m, dropped, stop = _measure(
            argv, config, names, label, reps, bound, warm, scratch, cwd, timeout_s, progress, first
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    m = m.model_copy(
        update={
            "started_at": started.isoformat(timespec="seconds"),
            "night": night_stamp(started),
        }
    )
    pairs, (rec,) = analyse(m, config)
    note = None
    base_pair = next(p for p in pairs if p.allocator == config.baseline)
    if base_pair.output.startswith("unchecked:"):
        note = (
            f"{label}'s output differs from run to run under {config.baseline}: outputs "
            "cannot be compared, only exit codes are"
        )
    checked = None
    if check and rec.allocator and rec.allocator != rec.baseline:
        if progress is not None:
            progress(len(m.samples) + 1, len(m.samples) + 2, f"check: {rec.allocator}")
        checked = _check_run(argv, config, m, rec, note is None, cwd, timeout_s)
    if progress is not None:
        total = len(m.samples) + 1 + (checked is not None)
        progress(total, total, "done")
    m = m.model_copy(update={"elapsed_s": round(time.monotonic() - t0, 3)})
    line = _paste_line(config, rec, argv)
    answer = Answer(m, pairs, rec, config, line, note, first, advice, dropped, stop, checked)
    text = render_table(answer)
    page = None
    if html_out is not None:
        html_out.write_text(render_html(answer, argv))
        page = html_out
    return TuneOutcome(m, pairs, rec, text, line, page, note, first.facts, advice, checked, stop)


def _unavailable(config: AllocatorsConfig, names: list[str], label: str) -> list[Unavailable]:
    """The candidates whose library this host lacks, each with what to install."""
    out = []
    for n in names:
        why = missing_library(config.get(n))
        if why:
            out.append(Unavailable.of(config.get(n), label, label, why))
    return out


def _with_layer_counts(sample: Sample, allocator: Allocator, counts: dict[str, int]) -> Sample:
    """The sample with its layer's counters; a placement layer that was loaded but passed every
    call through makes a clean run a failed one."""
    why = place_error(allocator, counts)
    if why and sample.ok:
        sample = sample.model_copy(update={"ok": False, "error": why, "applied": False})
    return sample.model_copy(update=counts)


@dataclass
class _CandidateRuns:
    """Runs of the candidates one at a time, with the progress they make and each one's
    layer counters from its last run."""

    argv: list[str]
    config: AllocatorsConfig
    cwd: Path | None
    timeout_s: float
    progress: Progress | None
    planned: int  # runs, at most, as far as is known
    done: int = 1  # the traced first run
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def one(self, name: str, run_dir: Path) -> PreloadedRun:
        """One run of candidate `name` in `run_dir` (removed after)."""
        if self.progress is not None:
            self.progress(self.done, self.planned, name)
        self.done += 1
        a = self.config.get(name)
        r = run_candidate(self.argv, a, run_dir, cwd=self.cwd, timeout_s=self.timeout_s)
        # a layer's counters, written to the run's folder by its `stats` setting
        if a.kind == "place":
            self.counts[name] = read_place_stats(run_dir / PLACE_STATS)
        else:
            self.counts[name] = read_layer_stats(run_dir / LAYER_STATS)
        shutil.rmtree(run_dir, ignore_errors=True)
        return r


def _measure(
    argv: list[str],
    config: AllocatorsConfig,
    names: list[str],
    label: str,
    reps: int,
    bound: int,
    warm: int,
    scratch: Path,
    cwd: Path | None,
    timeout_s: float,
    progress: Progress | None,
    first: FirstRun,
) -> tuple[Measurements, dict[str, str], str]:
    """The balanced rounds, candidates dropped and rounds stopped by tasks.allocators.rounds."""
    unavailable = _unavailable(config, names, label)
    gone = {u.allocator for u in unavailable}
    if config.baseline in gone:
        raise TuneError(next(u.message for u in unavailable if u.allocator == config.baseline))
    live = [n for n in names if n not in gone]
    samples: list[Sample] = []
    runs = _CandidateRuns(
        argv, config, cwd, timeout_s, progress, planned=1 + warm + reps * len(live)
    )
    for i in range(warm):
        runs.one(config.baseline, scratch / f"warmup-{i}")
    expected = first.run.exit_code
    orders = balanced_orders(live, bound, config.order_seed)
    race = Race(list(live))
    rule = config.rule
    plan = plan_rounds(len(live) - 1, reps, bound, rule.alpha, rule.correction, rule.noise)
    rep = 0
    for rep in range(bound):
        order = [n for n in orders[rep] if n in race.active]
        for pos, name in enumerate(order):
            run = runs.one(name, scratch / f"r{rep + 1}-{name}")
            sample = _sample(label, name, rep + 1, pos + 1, run, expected)
            samples.append(_with_layer_counts(sample, config.get(name), runs.counts[name]))
        if rule_round(samples, live, race, config.baseline, rule, plan, rep + 1, eliminate=True):
            break
        # what is left to run, at most: the next rounds of those still in
        runs.planned = runs.done + max(reps - rep - 1, 1) * len(race.active)
    stop = race.stop or f"the bound of {bound} rounds"
    m = Measurements(
        night=night_stamp(),
        runner="host",
        runner_detail="this host, the caller's folder and environment",
        host=socket.gethostname(),
        traced=False,
        allocators=[config.get(n) for n in names],
        baseline=config.baseline,
        repetitions=reps,
        warmup=warm,
        cases=[CaseInfo(label=label, workload=label, input="args", expected_exit_code=expected)],
        samples=samples,
        unavailable=unavailable,
        started_at="",
        elapsed_s=0.0,
        rounds={
            label: CaseRounds(
                plan=plan, rounds=rep + 1, dropped=race.dropped, stop=stop, winner=race.winner
            )
        },
    )
    return m, race.dropped, stop


def _check_run(
    argv: list[str],
    config: AllocatorsConfig,
    m: Measurements,
    rec: Recommendation,
    comparable: bool,
    cwd: Path | None,
    timeout_s: float,
) -> CheckRun:
    """Run the recommended setting alone, once: its output against the baseline's, its gain
    against the margin's interval."""
    with tempfile.TemporaryDirectory(prefix="heapcast-tune-check-") as d:
        run = run_candidate(argv, config.get(rec.allocator), Path(d), cwd=cwd, timeout_s=timeout_s)
    if run.error or run.exit_code != m.cases[0].expected_exit_code or not run.verification.applied:
        why = run.error or (
            f"exit {run.exit_code}" if run.verification.applied else run.verification.reason
        )
        return CheckRun(rec.allocator, None, None, None, None, error=f"failed: {why}")
    # the gain on the objective's metric (wall time, or peak memory), against its interval
    memory = rec.objective == "memory"
    metric = rec.memory_metric if memory else rec.time_metric
    base = [getattr(s, metric) for s in m.samples if s.allocator == rec.baseline and s.ok]
    base = [v for v in base if v]
    wall = run.usage.wall_s if run.usage else None
    value = usage_fields(run.usage).get(metric)
    gain = 1 - value / float(np.median(base)) if value and base else None
    ref = {s.stdout_sha256 for s in m.samples if s.allocator == rec.baseline and s.ok}
    same = (run.stdout_sha256 in ref) if comparable and len(ref) == 1 else None
    within = None
    if gain is not None and rec.margin_low is not None:
        within = rec.margin_low <= gain <= rec.margin_high
    return CheckRun(rec.allocator, wall, gain, same, within, metric=metric)


def _paste_line(config: AllocatorsConfig, rec: Recommendation, argv: list[str]) -> str:
    prefix = config.get(rec.allocator).line() if rec.allocator else ""
    return " ".join(p for p in (prefix, shlex.join(argv)) if p)


def _ratio_cell(p: PairSummary, base: PairSummary | None, metric: str, fmt: str) -> str:
    s = p.stats.get(metric)
    if s is None:
        return "-"
    b = base.stats.get(metric) if base is not None else None
    if p is base or b is None or not b.median:
        return f"{fmt.format(s.median)} [{fmt.format(s.min)}–{fmt.format(s.max)}]"
    return f"×{s.median / b.median:.3f} [{s.min / b.median:.3f}–{s.max / b.median:.3f}]"


ROWS = (
    ("wall_s", "wall s", "{:.3f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.1f}"),
    ("mean_rss_mb", "mean RSS MB", "{:.1f}"),  # averaged over the run: placement's saving
)


def _rows(m: Measurements, pairs: list[PairSummary]) -> list[list[str]]:
    base = next((p for p in pairs if p.allocator == m.baseline and p.status == "ok"), None)
    rows = []
    for p in pairs:
        mark = " ★" if p.recommended else ""
        cells = [p.allocator + mark, str(p.ok_runs) + "/" + str(p.runs)]
        cells += [_ratio_cell(p, base, metric, fmt) for metric, _, fmt in ROWS]
        cells.append(_ratio_cell(p, base, "minor_faults", "{:.0f}"))
        cells.append(p.status if p.status == "ok" else f"{p.status}: {p.reason}")
        rows.append(cells)
    return rows


HEAD = ["candidate", "runs", *(name for _, name, _ in ROWS), "minor faults", "status"]


def _verdict(rec: Recommendation, config: AllocatorsConfig) -> str:
    if rec.allocator is None:
        return f"No recommendation: {rec.note}"
    if rec.allocator == rec.baseline:
        why = rec.note or "nothing beats it"
        extra = ""
        if rec.best_challenger and rec.margin_low is not None:
            extra = (
                f"; {rec.best_challenger}'s margin {rec.margin_low * 100:+.1f}% to "
                f"{rec.margin_high * 100:+.1f}% ({config.rule.confidence:.0%} interval), "
                f"p={rec.p_value:.3f}, Holm-adjusted {rec.p_adjusted:.3f}"
            )
        return f"Keep {rec.baseline}: {why}{extra}."
    on_time = rec.objective == "time"
    metric = rec.time_metric if on_time else rec.memory_metric
    # the other side of the bargain: what a time win costs in memory, a memory win in time
    other = (
        f"memory ×{rec.memory_vs_baseline:.2f}"
        if on_time or rec.time_vs_baseline is None
        else f"at ×{rec.time_vs_baseline:.2f} its time"
    )
    return (
        f"Recommended: {rec.allocator}, {rec.margin * 100:.1f}% less {metric} than "
        f"{rec.baseline} ({config.rule.confidence:.0%} interval {rec.margin_low * 100:.1f}% to "
        f"{rec.margin_high * 100:.1f}%), {other}; p={rec.p_value:.4f}, "
        f"Holm-adjusted over {rec.compared} candidates {rec.p_adjusted:.4f}."
        + (f" ({rec.note})" if rec.note else "")
    )


@dataclass(frozen=True)
class Answer:
    """Everything the terminal and the page show."""

    m: Measurements
    pairs: list[PairSummary]
    rec: Recommendation
    config: AllocatorsConfig
    line: str
    note: str | None
    first: FirstRun
    advice: Advice | None
    dropped: dict[str, str]
    stop: str
    check: CheckRun | None


def _candidate_lines(a: Answer) -> tuple[list[str], list[str]]:
    """(what runs and why, what does not and why), one line each."""
    runs, not_run = [], []
    if a.advice is not None:
        for name, why in a.advice.run.items():
            knobs = a.config.get(name).line() if name in a.config.names() else ""
            runs.append(f"{name}{' (' + knobs + ')' if knobs else ''}: {why}")
        not_run = [f"{name}: {why}" for name, why in a.advice.ruled_out.items()]
    not_run += [f"{name}: dropped, {why}" for name, why in a.dropped.items()]
    return runs, not_run


def render_table(a: Answer) -> str:
    m, pairs, rec, config = a.m, a.pairs, a.rec, a.config
    out: list[str] = []
    first = a.first
    if first.facts is not None:
        u = first.run.usage
        out.append(
            f"What the traced run showed ({u.wall_s:.2f} s under the tracer):"
            if u
            else "What the traced run showed:"
        )
        out += [f"  - {line}" for line in first.facts.lines()]
    if first.note:
        out.append(f"note: {first.note}")
    runs, not_run = _candidate_lines(a)
    if runs:
        out += ["", "Candidates run:"] + [f"  - {r}" for r in runs]
    if not_run:
        out += ["Not run:"] + [f"  - {r}" for r in not_run]
    if a.advice is not None and a.advice.place:
        out.append(f"Placement (jemalloc-place): {a.advice.place}")
    rows = [HEAD] + _rows(m, pairs)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD) - 1)]
    out += [
        "",
        f"{m.baseline}: median [min–max]; others: ratio to {m.baseline}'s median [min–max]. "
        f"★ recommended. {max((s.rep for s in m.samples), default=0)} rounds, stopped: {a.stop}.",
        *(f"The rounds' rule: {r.plan.describe()}." for r in m.rounds.values()),
    ]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for u in m.unavailable:
        out.append(f"not measured: {u.message}")
    if a.note:
        out.append(f"note: {a.note}")
    out += ["", _verdict(rec, config)]
    if a.check is not None:
        out.append(a.check.line(rec))
    out += ["", "  " + a.line]
    return "\n".join(out)


def _figure(m: Measurements, pairs: list[PairSummary], config: AllocatorsConfig):
    fig = go.Figure()
    for p in pairs:
        t, mem = p.stats.get(config.rule.time), p.stats.get(config.rule.memory)
        if t is None or mem is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=[mem.median],
                y=[t.median],
                mode="markers+text",
                text=[p.allocator + (" ★" if p.recommended else "")],
                textposition="top center",
                marker=dict(size=16 if p.recommended else 10, symbol="star" if p.recommended else "circle"),
                error_x=dict(type="data", symmetric=False, array=[mem.max - mem.median], arrayminus=[mem.median - mem.min]),
                error_y=dict(type="data", symmetric=False, array=[t.max - t.median], arrayminus=[t.median - t.min]),
                name=p.allocator,
            )
        )  # fmt: skip
    fig.update_layout(
        title=dict(text="time against peak memory (median, min–max)", x=0.01),
        height=460,
        template="plotly_white",
        xaxis_title=f"{config.rule.memory}",
        yaxis_title=f"{config.rule.time}",
    )
    return fig


def render_html(a: Answer, argv: list[str]) -> str:
    m, rec, config = a.m, a.rec, a.config
    title = f"heapcast tune: {Path(argv[0]).name}"
    rows = [[html.escape(c) for c in r] for r in _rows(m, a.pairs)]

    def items(lines: list[str]) -> str:
        return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in lines) + "</ul>"

    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>command <code>{html.escape(shlex.join(argv))}</code> on {m.host}, "
        f"{m.started_at}, {m.elapsed_s:.1f} s in all; rule: "
        f"{html.escape(config.rule.describe())}</p>",
        f"<h2>Recommendation</h2><p>{html.escape(_verdict(rec, config))}</p>"
        f"<pre>{html.escape(a.line)}</pre>",
    ]
    if a.check is not None:
        body.append(f"<p>{html.escape(a.check.line(rec))}</p>")
    if a.first.facts is not None:
        body.append("<h2>What the traced run showed</h2>" + items(a.first.facts.lines()))
    runs, not_run = _candidate_lines(a)
    if runs:
        body.append("<h2>Candidates and why</h2>" + items(runs))
    if not_run:
        body.append("<h3>Not run</h3>" + items(not_run))
    if a.advice is not None and a.advice.place:
        body.append(f"<p><b>Placement (jemalloc-place)</b>: {html.escape(a.advice.place)}</p>")
    warn = ([a.first.note] if a.first.note else []) + ([a.note] if a.note else [])
    warn += [u.message for u in m.unavailable]
    if warn:
        body.append("<div class='warn'>" + items(warn) + "</div>")
    body.append(
        f"<h2>Candidates measured</h2><p class='note'>{m.baseline}: median [min–max]; others: "
        f"ratio to {m.baseline}'s median. Rounds stopped: {html.escape(a.stop)}.</p>"
        + html_table(HEAD, rows)
    )
    body.append("<h2>Time against memory</h2>")
    return standalone_page(title, body, [("tune", _figure(m, a.pairs, config))])
