"""`make_report`: what `heapcast report` does, callable from Python: resolve the run (and the
one to compare it with), reduce each to a HeapReport, write the HTML page, and give the short
text summary the terminal shows.

    from tasks.report.summary import make_report
    result = make_report("data/raw/git/medium", "report.html", diff="git/small")
    print(result.text)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.report.analysis import (
    DEFAULT_BINS,
    DEFAULT_TEMPORARY_CALLS,
    DEFAULT_TOP_PROCESSES,
    HeapReport,
    analyze,
)
from tasks.report.calltree import has_stacks, stack_paths
from tasks.report.page import NO_CALL_SITES, class_range, fmt_bytes, render, top_callers
from tasks.report.run_stacks import read_stacks
from tasks.report.sources import resolve

STACK_LINE_FRAMES = 3  # frames of the top stack the summary names


@dataclass
class ReportResult:
    reports: list[HeapReport]  # the run, and the one it was compared with
    html_path: Path
    html_bytes: int
    text: str  # the terminal summary

    @property
    def warnings(self) -> list[str]:
        return [w for r in self.reports for w in r.warnings]


def make_report(
    spec: str | Sequence[str],
    out: str | Path = "report.html",
    *,
    diff: str | Sequence[str] | None = None,
    root: Root | None = None,
    bins: int = DEFAULT_BINS,
    temporary_calls: int = DEFAULT_TEMPORARY_CALLS,
    top_processes: int = DEFAULT_TOP_PROCESSES,
    plotly_src: str | None = None,
    sysroot: Path | None = None,
) -> ReportResult:
    """Report the run named by `spec` (a run folder, trace or part files, or WORKLOAD/RUN under
    `root`) into the HTML page `out`; with `diff`, side by side with that run (A = spec, B =
    diff). The page stands alone (plotly.js inlined) unless `plotly_src` names the shared copy it
    loads (page.PLOTLY_JS, which the caller writes next to it). The call stacks come from the
    runs' raw traces (run_stacks; `sysroot`: where a container run's modules were copied).
    Raises sources.ReportInputError when a run cannot be read at all."""
    names = [spec] + ([diff] if diff is not None else [])
    runs = [resolve(s, root) for s in names]  # both resolved before the long part starts
    reps = [
        analyze(r, bins=bins, temporary_calls=temporary_calls, top_processes=top_processes)
        for r in runs
    ]
    for rep, run in zip(reps, runs):
        rep.stacks = read_stacks(run, sysroot)
    page = render(reps, plotly_src).encode()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(page)
    tmp.replace(out)
    return ReportResult(reps, out, len(page), summary_text(reps, out))


def _top_classes(rep: HeapReport, n: int = 3) -> str:
    order = np.argsort(-rep.peak_by_class_bytes, kind="stable")[:n]
    parts = [
        f"{k} {class_range(int(k))}: {fmt_bytes(rep.peak_by_class_bytes[k])}"
        for k in order
        if rep.peak_by_class_bytes[k] > 0
    ]
    return ", ".join(parts) or "none"


def _pct(a: float, b: float) -> str:
    return f"{100.0 * a / b:.0f}%" if b else "0%"


def run_lines(rep: HeapReport) -> list[str]:
    """The summary of one run: a header line and one line per topic."""
    pp = rep.peak_process
    held = f", {fmt_bytes(rep.peak_by_process[pp.image])} in pid {pp.pid} {pp.name}" if pp else ""
    lines = [
        f"heapcast report: {rep.label}: {rep.events:,} heap calls, {len(rep.processes)} "
        f"process(es), {rep.thread_count} thread(s), {rep.span_s:.3f} s",
        f"  peak live   {fmt_bytes(rep.peak_bytes)} at +{(rep.peak_ns - rep.t0_ns) / 1e9:.3f} s"
        f"{held}; size classes {_top_classes(rep)}",
        f"  allocated   {rep.allocations:,} blocks, {fmt_bytes(rep.allocated_bytes)}; "
        f"{rep.frees:,} freed",
        f"  temporary   {rep.temporaries:,} blocks ({_pct(rep.temporaries, rep.allocations)}) freed "
        f"within {rep.temporary_calls} calls",
        f"  leaked      {rep.leaks:,} blocks, {fmt_bytes(rep.leak_bytes)} never freed",
    ]
    if rep.has_callers:
        top = top_callers(rep, "calls", 3)
        lines.append(
            "  callers     "
            + ", ".join(f"{a} {v['calls']:,} calls" for a, v in top)
            + f" ({len(rep.callers['caller']):,} distinct)"
        )
    else:
        lines.append(f"  callers     none: {NO_CALL_SITES}")
    lines.append("  stacks      " + stacks_line(rep))
    return lines


def stacks_line(rep: HeapReport) -> str:
    """The run's stacks in one line: how many, and the one that allocated the most bytes."""
    if not has_stacks(rep.stacks):
        return "none recorded (heapcast trace --frames N records them)"
    p = rep.stacks
    top = int(np.argmax(p.bytes))
    path = stack_paths(p)[top]
    shown = " <- ".join(path[:STACK_LINE_FRAMES]) + (
        " <- ..." if len(path) > STACK_LINE_FRAMES else ""
    )
    return f"{len(p):,} distinct; most bytes: {shown} ({fmt_bytes(p.bytes[top])})"


def _change(a: float, b: float, fmt=lambda v: f"{v:,}") -> str:
    rel = f" ({(b - a) / a:+.0%})" if a else ""
    return f"{fmt(a)} -> {fmt(b)}{rel}"


def summary_text(reps: Sequence[HeapReport], out: Path | None = None) -> str:
    lines = run_lines(reps[0])
    if len(reps) == 2:
        a, b = reps
        lines += run_lines(b)
        lines += [
            f"difference (A = {a.label}, B = {b.label}):",
            f"  heap calls  {_change(a.events, b.events)}",
            f"  peak live   {_change(a.peak_bytes, b.peak_bytes, fmt_bytes)}",
            f"  allocated   {_change(a.allocated_bytes, b.allocated_bytes, fmt_bytes)}",
            f"  temporary   {_change(a.temporaries, b.temporaries)}",
            f"  leaked      {_change(a.leak_bytes, b.leak_bytes, fmt_bytes)}",
        ]
    if out is not None:
        lines.append(f"  report      {out}")
    return "\n".join(lines)
