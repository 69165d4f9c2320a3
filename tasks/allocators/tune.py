"""`heapcast tune -- PROG ARGS`: which allocator and settings suit any program, measured here.

The program runs on this host, in the caller's folder and environment, under each candidate of
configs/allocators.yaml's `tune` list (or those asked for), each run through
tasks.replay.runners.preload.run_preloaded: hc-measure (wall, CPU, ru_maxrss, faults, a digest
of the standard output) and the probe (the candidate verified in force, run by run). The
analysis is the allocators stage's own (tasks.allocators.stats: the output checked against
glibc's, the Holm-corrected choice, the margin's interval), on a `Measurements` of one case.

Order of work:
1. the program is found, and run once under the baseline (the warm-up, discarded): a program
   that fails there, or that LD_PRELOAD cannot reach (static, setuid), stops here with an error
   saying so; a candidate whose library is missing is named with its Debian package and left
   out, the others measured;
2. `repetitions` rounds, every candidate once per round in a balanced order; rounds added, up to
   `max_repetitions`, while the choice sits in the noise;
3. the answer: a table (time, peak RSS, minor faults per candidate relative to glibc, with their
   spread), the recommendation and the exact line to paste, and an HTML page in the heap
   report's style with time against memory.

A program whose output differs from run to run under glibc (it prints times, addresses) cannot
have its output compared: the answer says so and only exit codes are compared.
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from tasks.allocators.config import LAYER_STATS, Allocator, AllocatorsConfig
from tasks.allocators.decide import undecided
from tasks.allocators.measure import (
    NOT_APPLIED,
    CaseInfo,
    Measurements,
    Sample,
    Unavailable,
    night_stamp,
    read_layer_stats,
    usage_fields,
)
from tasks.allocators.stats import PairSummary, Recommendation, analyse
from tasks.replay.runners.preload import PreloadedRun, balanced_orders, run_preloaded
from tasks.report.page import html_table, standalone_page

# progress(done, total, what): one call before each run
Progress = Callable[[int, int, str], None]


class TuneError(RuntimeError):
    """tune cannot answer for this program; the message says why and what to do."""


@dataclass(frozen=True)
class TuneOutcome:
    measurements: Measurements
    pairs: list[PairSummary]
    recommendation: Recommendation
    table: str  # the terminal answer: table, recommendation, line to paste
    line: str  # the exact line to paste (the program included)
    html_path: Path | None
    output_note: str | None  # set when outputs could not be compared


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
    """Why candidate `a` cannot run on this host (its library absent), naming the package."""
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
) -> TuneOutcome:
    """Measure `argv` under each candidate and recommend one (see the module); `objective`
    (time or memory) overrides the rule's."""
    if not argv:
        raise TuneError("give a program: heapcast tune -- PROGRAM ARGS...")
    if objective is not None:
        if objective not in ("time", "memory"):
            raise TuneError(f"objective must be time or memory, not {objective!r}")
        rule = config.rule.model_copy(update={"objective": objective})
        config = config.model_copy(update={"rule": rule})
    program = shutil.which(argv[0]) if "/" not in argv[0] else argv[0]
    if program is None or not os.path.exists(program):
        raise TuneError(f"program not found: {argv[0]}")
    argv = [program, *argv[1:]]
    tcfg = config.tune
    names = candidates or (tcfg.candidates if tcfg else config.names())
    unknown = [n for n in names if n not in config.names()]
    if unknown:
        raise TuneError(
            f"no candidate {', '.join(unknown)} in the allocators config; it has: "
            f"{', '.join(config.names())}"
        )
    if config.baseline not in names:
        names = [config.baseline, *names]
    reps = repetitions or (tcfg.repetitions if tcfg else config.repetitions)
    bound = max(reps, max_repetitions or (tcfg.max_repetitions if tcfg else config.rounds_bound))
    warm = (tcfg.warmup if tcfg else config.warmup) if warmup is None else warmup
    label = Path(argv[0]).name
    unavailable = []
    for n in names:
        why = missing_library(config.get(n))
        if why:
            a = config.get(n)
            unavailable.append(
                Unavailable(
                    case=label,
                    workload=label,
                    allocator=n,
                    library=a.library,
                    package=a.package,
                    message=why,
                )
            )
    gone = {u.allocator for u in unavailable}
    if config.baseline in gone:
        raise TuneError(next(u.message for u in unavailable if u.allocator == config.baseline))
    live = [n for n in names if n not in gone]
    started = datetime.now(UTC)
    t0 = time.monotonic()
    samples: list[Sample] = []
    scratch = Path(tempfile.mkdtemp(prefix="heapcast-tune-"))
    planned = warm + 1 + reps * len(live)
    done = 0

    layer_counts: dict[str, dict[str, int]] = {}  # the last run's, per candidate

    def one(name: str, run_dir: Path) -> PreloadedRun:
        nonlocal done
        if progress is not None:
            progress(done, planned, name)
        done += 1
        r = run_preloaded(argv, config.get(name).spec, run_dir, cwd=cwd, timeout_s=timeout_s)
        # a layer's counters, written to the run's folder by its `stats` setting
        layer_counts[name] = read_layer_stats(run_dir / LAYER_STATS)
        shutil.rmtree(run_dir, ignore_errors=True)
        return r

    try:
        # the baseline first, twice (warm-up, then a check): it must work, be reached, and
        # tell whether its output is the same run to run
        first = one(config.baseline, scratch / "check")
        if first.error:
            raise TuneError(f"{shlex.join(argv)}: {first.error}")
        if first.exit_code != 0:
            raise TuneError(
                f"{shlex.join(argv)} exits {first.exit_code} under {config.baseline} (stderr: "
                f"{first.stderr_tail.strip()[-400:] or 'nothing'}); tune measures a program "
                "that works: fix the command first"
            )
        if not first.verification.applied:
            raise TuneError(
                f"LD_PRELOAD cannot reach {argv[0]}: {first.verification.reason}. An allocator "
                "can only be changed there by relinking the program"
            )
        for i in range(warm):
            one(config.baseline, scratch / f"warmup-{i}")
        expected = first.exit_code
        orders = balanced_orders(live, bound, config.order_seed)
        rep = 0
        while rep < bound:
            if rep >= reps:
                ok = [s for s in samples if s.ok]
                times = {
                    n: np.array([getattr(s, config.rule.primary) for s in ok if s.allocator == n])
                    for n in live
                }
                if not undecided(
                    times, config.baseline, config.rule.alpha, config.rule.promising_p
                ):
                    break
                planned += len(live)
            for pos, name in enumerate(orders[rep]):
                run = one(name, scratch / f"r{rep + 1}-{name}")
                sample = _sample(label, name, rep + 1, pos + 1, run, expected)
                samples.append(sample.model_copy(update=layer_counts[name]))
            rep += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if progress is not None:
        progress(planned, planned, "done")
    m = Measurements(
        night=night_stamp(started),
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
        started_at=started.isoformat(timespec="seconds"),
        elapsed_s=round(time.monotonic() - t0, 3),
    )
    pairs, (rec,) = analyse(m, config)
    note = None
    base_pair = next(p for p in pairs if p.allocator == config.baseline)
    if base_pair.output.startswith("unchecked:"):
        note = (
            f"{label}'s output differs from run to run under {config.baseline}: outputs "
            "cannot be compared, only exit codes are"
        )
    line = _paste_line(config, rec, argv)
    text = render_table(m, pairs, rec, config, line, note)
    page = None
    if html_out is not None:
        html_out.write_text(render_html(m, pairs, rec, config, line, note, argv))
        page = html_out
    return TuneOutcome(m, pairs, rec, text, line, page, note)


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


ROWS = (("wall_s", "wall s", "{:.3f}"), ("peak_rss_mb", "peak RSS MB", "{:.1f}"))


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


HEAD = ["candidate", "runs", "wall s", "peak RSS MB", "minor faults", "status"]


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
    metric = rec.time_metric if rec.objective == "time" else rec.memory_metric
    return (
        f"Recommended: {rec.allocator}, {rec.margin * 100:.1f}% less {metric} than "
        f"{rec.baseline} ({config.rule.confidence:.0%} interval {rec.margin_low * 100:.1f}% to "
        f"{rec.margin_high * 100:.1f}%), memory ×{rec.memory_vs_baseline:.2f}; p={rec.p_value:.4f}, "
        f"Holm-adjusted over {rec.compared} candidates {rec.p_adjusted:.4f}."
        + (f" ({rec.note})" if rec.note else "")
    )


def render_table(
    m: Measurements,
    pairs: list[PairSummary],
    rec: Recommendation,
    config: AllocatorsConfig,
    line: str,
    note: str | None,
) -> str:
    rows = [HEAD] + _rows(m, pairs)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD) - 1)]
    out = [
        f"{m.baseline}: median [min–max]; others: ratio to {m.baseline}'s median [min–max]. "
        f"★ recommended. {max((s.rep for s in m.samples), default=0)} rounds.",
    ]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for u in m.unavailable:
        out.append(f"not measured: {u.message}")
    if note:
        out.append(f"note: {note}")
    out += ["", _verdict(rec, config), "", "  " + line]
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


def render_html(
    m: Measurements,
    pairs: list[PairSummary],
    rec: Recommendation,
    config: AllocatorsConfig,
    line: str,
    note: str | None,
    argv: list[str],
) -> str:
    title = f"heapcast tune: {Path(argv[0]).name}"
    rows = [[html.escape(c) for c in r] for r in _rows(m, pairs)]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>command <code>{html.escape(shlex.join(argv))}</code> on {m.host}, "
        f"{m.started_at}; rule: {html.escape(config.rule.describe())}</p>",
        f"<h2>Recommendation</h2><p>{html.escape(_verdict(rec, config))}</p>"
        f"<pre>{html.escape(line)}</pre>",
    ]
    if note or m.unavailable:
        items = ([note] if note else []) + [u.message for u in m.unavailable]
        body.append(
            "<div class='warn'><ul>"
            + "".join(f"<li>{html.escape(i)}</li>" for i in items)
            + "</ul></div>"
        )
    body.append(
        f"<h2>Candidates</h2><p class='note'>{m.baseline}: median [min–max]; others: ratio to "
        f"{m.baseline}'s median.</p>" + html_table(HEAD, rows)
    )
    body.append("<h2>Time against memory</h2>")
    return standalone_page(title, body, [("tune", _figure(m, pairs, config))])
