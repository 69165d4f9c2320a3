"""The report as one HTML page: plotly figures and HTML tables, for one run or two side by side
with their differences. The page needs no network: plotly.js is either inlined once (a page that
stands alone: `heapcast report`, the page MLflow serves) or loaded from a copy next to the page,
`plotly.min.js` (`PLOTLY_JS`), which a folder of pages shares (the night's reports: ~4.6 MB once,
not in every page). A page whose shared copy is missing says so at its top.

Every figure's data is the HeapReport's small arrays (time bins, size classes, histograms, top
lists), never the events. Once plotly has drawn the figures, the page appends `[plots:N]` to
its title (and sets `data-plots` on <body>), N being the figures drawn with their traces, so a
headless browser can check that every plot rendered.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from tasks.report import stack_tables
from tasks.report.analysis import CALLER_COLUMNS, N_CLASSES, HeapReport, Process, calls_bin_range
from tasks.report.calltree import has_stacks
from tasks.report.flame import flame_graphs, vendor_scripts
from tasks.report.formats import fmt_bytes

COLORS = ("#1f77b4", "#d62728")  # run A, run B
FIG_HEIGHT = 420
MAX_TIMELINE = 60  # processes drawn on the timeline (the most events first)
MAX_THREADS = 30
MAX_TABLE_PROCESSES = 300
TOP_CALLERS = 20
# A trace without callers (`heapcast trace --no-caller`; callers are on by default) is said so
# plainly, on the page and in the summary, rather than shown without a callers section.
NO_CALL_SITES = (
    "this trace has no call sites (recorded with --no-caller): no callers to show; trace it "
    "again without --no-caller to see which functions allocate"
)
# A run whose traces hold no call stacks (recorded before the tracer kept them, or with
# --frames 0) says how to record them, rather than showing an empty graph.
NO_STACKS = (
    "this run's traces hold no call stacks (recorded with --frames 0, or by a tracer that did "
    "not record them): trace it again with `heapcast trace --frames N` (N frames deep, e.g. "
    "32) to see which call paths allocate"
)
PLOTLY_JS = "plotly.min.js"  # the shared copy of plotly.js, next to the pages that load it


# ---------------------------------------------------------------------------------- formats


def fmt_ns(ns: float) -> str:
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def class_range(k: int) -> str:
    """The sizes of size class k: bit length k (0: 0 bytes; 31: 1 GiB and more)."""
    if k == 0:
        return "0 B"
    lo = 1 << (k - 1)
    if k == N_CLASSES - 1:
        return f"≥ {fmt_bytes(lo)}"
    return f"{_short(lo)}" if k == 1 else f"[{_short(lo)}, {_short(lo << 1)})"


def _short(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def lifetime_label(k: int, unit: str) -> str:
    """Bin k of a lifetime histogram: ns, [2^(k-1), 2^k) (its lower end); calls: see
    analysis.calls_bin."""
    if unit == "calls":
        lo, hi = calls_bin_range(k)
        return f"{lo:,}" if hi == lo + 1 else f"{lo:,}–{hi - 1:,}"
    return "0" if k == 0 else fmt_ns(1 << (k - 1))


def hex_addr(a: int) -> str:
    return f"0x{int(a):x}"


# ---------------------------------------------------------------------------------- figures


def _go():

    return go, make_subplots


def _layout(fig, title: str, height: int = FIG_HEIGHT, side_legend: bool = False) -> None:
    legend = (
        dict(orientation="v", x=1.02, y=1, font=dict(size=10))
        if side_legend
        else dict(orientation="h", yanchor="bottom", y=1.06, xanchor="right", x=1)
    )
    fig.update_layout(
        title=dict(text=title, x=0.01),
        height=height,
        margin=dict(l=70, r=30, t=110, b=50),
        legend=legend,
        template="plotly_white",
        barmode="group",
    )
    fig.update_xaxes(exponentformat="SI")
    fig.update_yaxes(exponentformat="SI")  # 15G, not plotly's default 15B (B: bytes here)


def _seconds(rep: HeapReport) -> np.ndarray:
    """Bin starts in seconds since the run's first event."""
    return (rep.bin_edges_ns[:-1] - rep.t0_ns) / 1e9


def _names(reps: Sequence[HeapReport]) -> list[str]:
    return (
        [r.label for r in reps]
        if len(reps) == 1
        else [f"A: {reps[0].label}", f"B: {reps[1].label}"]
    )


def fig_live(reps: Sequence[HeapReport]):
    go, make_subplots = _go()
    names = _names(reps)
    fig = make_subplots(
        rows=1, cols=len(reps), shared_yaxes=True, subplot_titles=names if len(reps) > 1 else None
    )
    for c, rep in enumerate(reps, start=1):
        x = _seconds(rep)
        tag = f"{'AB'[c - 1]}: " if len(reps) > 1 else ""
        for s in rep.per_process:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=s.live_max,
                    name=tag + s.label,
                    mode="lines",
                    line=dict(width=1, shape="hv"),
                ),
                row=1,
                col=c,
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rep.total.live_max,
                name=tag + "all processes",
                mode="lines",
                line=dict(width=2.5, color=COLORS[c - 1], shape="hv"),
            ),
            row=1,
            col=c,
        )
        fig.add_trace(
            go.Scatter(
                x=[(rep.peak_ns - rep.t0_ns) / 1e9],
                y=[rep.peak_bytes],
                mode="markers+text",
                marker=dict(size=10, color="black", symbol="x"),
                text=[f"peak {fmt_bytes(rep.peak_bytes)}"],
                textposition="top center",
                name="peak",
                showlegend=False,
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="seconds since the first event", row=1, col=c)
    fig.update_yaxes(title_text="live bytes (largest in each bin)", row=1, col=1)
    _layout(
        fig,
        "Live heap bytes over time: in total and for the processes with the highest peaks",
        480,
        side_legend=True,
    )
    return fig


def fig_rate(reps: Sequence[HeapReport]):
    go, make_subplots = _go()
    fig = make_subplots(
        rows=2,
        cols=len(reps),
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=_names(reps) if len(reps) > 1 else None,
    )
    for c, rep in enumerate(reps, start=1):
        x = _seconds(rep)
        tag = f"{'AB'[c - 1]}: " if len(reps) > 1 else ""
        width_s = max(float(rep.bin_edges_ns[1] - rep.bin_edges_ns[0]), 1.0) / 1e9
        for s in rep.per_process:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=s.alloc_calls / width_s,
                    name=tag + s.label,
                    mode="lines",
                    line=dict(width=1),
                ),
                row=1,
                col=c,
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rep.total.alloc_calls / width_s,
                name=tag + "all processes",
                mode="lines",
                line=dict(width=2, color=COLORS[c - 1]),
            ),
            row=1,
            col=c,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rep.total.alloc_bytes / width_s,
                name=tag + "bytes allocated/s (all)",
                mode="lines",
                line=dict(width=1.5, color=COLORS[c - 1], dash="dot"),
            ),
            row=2,
            col=c,
        )
        fig.update_xaxes(title_text="seconds since the first event", row=2, col=c)
    fig.update_yaxes(title_text="allocations / s", row=1, col=1)
    fig.update_yaxes(title_text="bytes allocated / s", row=2, col=1)
    _layout(
        fig,
        "Allocation rate over time (calls and bytes per second, per time bin)",
        560,
        side_legend=True,
    )
    return fig


def _class_axis(fig, row: int, col: int) -> None:
    fig.update_xaxes(
        title_text="size class (bit length of the size)",
        tickmode="array",
        tickvals=list(range(0, N_CLASSES, 2)),
        row=row,
        col=col,
    )


def _bars_by_class(
    reps: Sequence[HeapReport], panels: list[tuple[str, str]], title: str, note: str = ""
):
    """Bars by size class, one panel per (attribute, y title); two runs: grouped, and B - A."""
    go, make_subplots = _go()
    rows = 1 if len(reps) == 1 else 2
    titles = [p[1] for p in panels] + ([f"B − A: {p[1]}" for p in panels] if rows == 2 else [])
    fig = make_subplots(rows=rows, cols=len(panels), subplot_titles=titles, vertical_spacing=0.15)
    x = np.arange(N_CLASSES)
    hover = [class_range(int(k)) for k in x]
    names = _names(reps)
    for c, (attr, _ytitle) in enumerate(panels, start=1):
        for i, rep in enumerate(reps):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=getattr(rep, attr),
                    name=names[i],
                    marker_color=COLORS[i],
                    customdata=hover,
                    hovertemplate="class %{x} (%{customdata}): %{y:,}<extra>"
                    + html.escape(names[i])
                    + "</extra>",
                    showlegend=c == 1 and len(reps) > 1,
                    legendgroup=names[i],
                ),
                row=1,
                col=c,
            )
        _class_axis(fig, 1, c)
        if rows == 2:
            d = getattr(reps[1], attr) - getattr(reps[0], attr)
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=d,
                    name="B − A",
                    marker_color=np.where(d >= 0, COLORS[1], COLORS[0]).tolist(),
                    customdata=hover,
                    hovertemplate="class %{x} (%{customdata}): %{y:+,}<extra>B − A</extra>",
                    showlegend=False,
                ),
                row=2,
                col=c,
            )
            _class_axis(fig, 2, c)
    _layout(
        fig, title + (f"<br><sup>{note}</sup>" if note else ""), FIG_HEIGHT if rows == 1 else 700
    )
    return fig


def fig_peak_classes(reps: Sequence[HeapReport]):
    return _bars_by_class(
        reps,
        [
            ("peak_by_class_bytes", "live bytes at the peak"),
            ("peak_by_class_blocks", "live blocks at the peak"),
        ],
        "What was live at the peak, by size class",
    )


def fig_size_classes(reps: Sequence[HeapReport]):
    return _bars_by_class(
        reps,
        [("alloc_count", "allocations"), ("alloc_bytes", "bytes allocated")],
        "Size classes of the blocks allocated (token 0..31 = bit length of the size)",
    )


def fig_temporaries(reps: Sequence[HeapReport]):
    t = reps[0].temporary_calls
    return _bars_by_class(
        reps,
        [("temp_by_class_count", "temporaries"), ("temp_by_class_bytes", "bytes in temporaries")],
        f"Temporaries: blocks freed within {t} call(s) of their allocation in their process",
    )


def fig_leaks(reps: Sequence[HeapReport]):
    return _bars_by_class(
        reps,
        [
            ("leak_by_class_count", "blocks never freed"),
            ("leak_by_class_bytes", "bytes never freed"),
        ],
        "Leaks: blocks allocated and never freed in the trace",
    )


def fig_lifetimes(reps: Sequence[HeapReport]):
    go, make_subplots = _go()
    rows = 1 if len(reps) == 1 else 2
    panels = [
        ("lifetime_ns_hist", "ns", "lifetime (time until freed)"),
        ("lifetime_calls_hist", "calls", "lifetime (calls of the process until freed)"),
    ]
    titles = [p[2] for p in panels] + ([f"B − A: {p[2]}" for p in panels] if rows == 2 else [])
    fig = make_subplots(rows=rows, cols=2, subplot_titles=titles, vertical_spacing=0.18)
    names = _names(reps)
    for c, (attr, unit, _t) in enumerate(panels, start=1):
        hists = [getattr(r, attr) for r in reps]
        nz = np.flatnonzero(np.sum(hists, axis=0))
        hi = int(nz[-1]) + 1 if len(nz) else 1
        lo = int(nz[0]) if len(nz) else 0
        labels = [lifetime_label(k, unit) for k in range(lo, hi)]
        for i, h in enumerate(hists):
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=h[lo:hi],
                    name=names[i],
                    marker_color=COLORS[i],
                    showlegend=c == 1 and len(reps) > 1,
                    legendgroup=names[i],
                ),
                row=1,
                col=c,
            )
        axis = "at least (ns, powers of 2)" if unit == "ns" else "calls (one bin each up to 15)"
        fig.update_xaxes(title_text=axis, type="category", row=1, col=c)
        if rows == 2:
            d = hists[1][lo:hi] - hists[0][lo:hi]
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=d,
                    name="B − A",
                    marker_color=np.where(d >= 0, COLORS[1], COLORS[0]).tolist(),
                    showlegend=False,
                ),
                row=2,
                col=c,
            )
            fig.update_xaxes(type="category", row=2, col=c)
    fig.update_yaxes(title_text="blocks freed", row=1, col=1)
    t = reps[0].temporary_calls
    _layout(
        fig,
        f"Lifetimes of the blocks freed in the trace<br><sup>temporaries: the bins 1 to {t} calls</sup>",
        FIG_HEIGHT if rows == 1 else 720,
    )
    return fig


def _timeline_rows(rep: HeapReport) -> list[Process]:
    alive = [p for p in rep.processes if p.events]
    alive.sort(key=lambda p: -p.events)
    shown = alive[:MAX_TIMELINE]
    shown.sort(key=lambda p: (p.first_ns, p.image))
    return shown


def _panel_per_report(reps: Sequence[HeapReport]):
    """(plotly's graph objects, a figure with one panel per report side by side, titled by the
    reports' names where there are two)."""
    go, make_subplots = _go()
    fig = make_subplots(
        rows=1,
        cols=len(reps),
        subplot_titles=_names(reps) if len(reps) > 1 else None,
        horizontal_spacing=0.2,
    )
    return go, fig


def _add_ranked_bars(fig, go, reps: Sequence[HeapReport], c: int, xtitle: str, **bar) -> None:
    """Report c's horizontal bars in panel c, in its colour, the first row at the top."""
    fig.add_trace(
        go.Bar(
            **bar,
            orientation="h",
            marker_color=COLORS[c - 1],
            name=_names(reps)[c - 1],
            showlegend=len(reps) > 1,
        ),
        row=1,
        col=c,
    )
    fig.update_yaxes(autorange="reversed", row=1, col=c)
    fig.update_xaxes(title_text=xtitle, row=1, col=c)


def fig_processes(reps: Sequence[HeapReport]):
    go, fig = _panel_per_report(reps)
    height = FIG_HEIGHT
    for c, rep in enumerate(reps, start=1):
        rows = _timeline_rows(rep)
        height = max(height, 120 + 22 * len(rows))
        labels = [f"#{p.image} pid {p.pid} {p.name}"[:48] for p in rows]
        start = [(p.first_ns - rep.t0_ns) / 1e9 for p in rows]
        dur = [max((p.last_ns - p.first_ns) / 1e9, 1e-6) for p in rows]
        hover = [
            f"pid {p.pid} (parent {p.ppid}, {p.relation or 'root'})<br>{html.escape(p.command[:120])}<br>"
            f"{p.events:,} events, {p.threads} thread(s), peak {fmt_bytes(p.peak_bytes)}"
            for p in rows
        ]
        _add_ranked_bars(
            fig,
            go,
            reps,
            c,
            "seconds since the first event",
            y=labels,
            x=dur,
            base=start,
            hovertext=hover,
            hoverinfo="text",
        )
    n = max(len([p for p in r.processes if p.events]) for r in reps)
    note = f" (the {MAX_TIMELINE} with the most events)" if n > MAX_TIMELINE else ""
    _layout(
        fig, f"Processes: first to last heap call of each process image{note}", min(height, 1600)
    )
    return fig


def fig_threads(reps: Sequence[HeapReport]):
    go, fig = _panel_per_report(reps)
    height = FIG_HEIGHT
    for c, rep in enumerate(reps, start=1):
        top = rep.threads[:MAX_THREADS]
        height = max(height, 120 + 20 * len(top))
        labels = [
            f"#{img} tid {tid} (pid {rep.processes[img].pid} {rep.processes[img].name})"[:52]
            for img, tid, _ in top
        ]
        _add_ranked_bars(fig, go, reps, c, "heap calls", y=labels, x=[n for _, _, n in top])
    n = max(r.thread_count for r in reps)
    note = f" (the {MAX_THREADS} busiest of {n})" if n > MAX_THREADS else ""
    _layout(fig, f"Threads: heap calls per thread{note}", min(height, 1200))
    return fig


_CALLER_INTS = (*CALLER_COLUMNS, "image")


def caller_name(rep: HeapReport, i: int) -> str:
    """The report's name of caller i: `function+0x.. (module)` or `module+0x..` where the trace
    recorded its module map (tasks.format.symbols), else the raw return address."""
    c = rep.callers
    if "label" in c:
        return str(c["label"][i])
    return hex_addr(int(c["caller"][i]))


def _caller_rows(rep: HeapReport) -> dict[str, dict[str, int]]:
    c = rep.callers
    return {
        caller_name(rep, i): {k: int(c[k][i]) for k in _CALLER_INTS}
        for i in range(len(c["caller"]))
    }


def top_callers(rep: HeapReport, by: str, n: int = TOP_CALLERS) -> list[tuple[str, dict[str, int]]]:
    """The n callers with the most `by` (CALLER_COLUMNS), named (caller_name), with their
    figures."""
    c = rep.callers
    if c is None or not len(c["caller"]):
        return []
    order = np.lexsort((c["caller"], -c[by]))[:n]
    return [
        (caller_name(rep, int(i)), {k: int(c[k][i]) for k in _CALLER_INTS})
        for i in order
        if c[by][i] > 0
    ]


def fig_callers(reps: Sequence[HeapReport]):
    go, make_subplots = _go()
    panels = [("calls", "calls"), ("bytes", "bytes allocated"), ("leaks", "blocks never freed")]
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=[p[1] for p in panels], horizontal_spacing=0.12
    )
    names = _names(reps)
    for c, (by, _t) in enumerate(panels, start=1):
        order: list[str] = []
        for rep in reps:
            for a, _ in top_callers(rep, by, 12 if len(reps) > 1 else TOP_CALLERS):
                if a not in order:
                    order.append(a)
        labels = order
        for i, rep in enumerate(reps):
            rows = _caller_rows(rep) if rep.has_callers else {}
            fig.add_trace(
                go.Bar(
                    y=labels,
                    x=[rows.get(a, {}).get(by, 0) for a in order],
                    orientation="h",
                    name=names[i],
                    marker_color=COLORS[i],
                    showlegend=c == 1 and len(reps) > 1,
                    legendgroup=names[i],
                ),
                row=1,
                col=c,
            )
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=c)
    _layout(
        fig,
        "Top callers (function and module where the trace recorded its module map, else return addresses)",
        max(FIG_HEIGHT, 140 + 22 * TOP_CALLERS),
    )
    return fig


# ------------------------------------------------------------------------------------ tables


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{_num(c)}>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _num(cell: object) -> str:
    """Numbers are right-aligned, text left."""
    t = str(cell)
    return (
        ' class="n"'
        if t[:1].isdigit() or t[:2] in ("+0", "-0", "+1", "-1") or t[:1] in "+-–"
        else ""
    )


def _pct(a: float, b: float) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "–"


def summary_rows(rep: HeapReport) -> list[tuple[str, str]]:
    pp = rep.peak_process
    held = (
        f", {fmt_bytes(rep.peak_by_process.get(pp.image, 0))} of it in pid {pp.pid} {pp.name}"
        if pp
        else ""
    )
    return [
        ("heap calls", f"{rep.events:,}"),
        ("processes (images) / threads", f"{len(rep.processes):,} / {rep.thread_count:,}"),
        ("time span", f"{rep.span_s:.3f} s"),
        (
            "peak live bytes",
            f"{fmt_bytes(rep.peak_bytes)} ({rep.peak_bytes:,} B) at +{(rep.peak_ns - rep.t0_ns) / 1e9:.3f} s{held}",
        ),
        ("allocations", f"{rep.allocations:,} blocks, {fmt_bytes(rep.allocated_bytes)}"),
        ("frees (paired)", f"{rep.frees:,}"),
        (
            f"temporaries (freed within {rep.temporary_calls} calls)",
            f"{rep.temporaries:,} blocks ({_pct(rep.temporaries, rep.allocations)} of allocations), {fmt_bytes(rep.temporary_bytes)}",
        ),
        ("leaks (never freed)", f"{rep.leaks:,} blocks, {fmt_bytes(rep.leak_bytes)}"),
        ("unpaired free() calls", f"{rep.unpaired_frees:,}"),
        ("failed allocations", f"{rep.failed_allocations:,}"),
        (
            "operations",
            ", ".join(f"{k} {v:,}" for k, v in sorted(rep.ops.items(), key=lambda kv: -kv[1])),
        ),
    ]


def _summary_table(reps: Sequence[HeapReport]) -> str:
    if len(reps) == 1:
        return _table(
            ["", reps[0].label],
            [(html.escape(k), html.escape(v)) for k, v in summary_rows(reps[0])],
            "summary",
        )
    a, b = reps
    metrics = [
        ("heap calls", lambda r: r.events, str),
        ("processes", lambda r: len(r.processes), str),
        ("threads", lambda r: r.thread_count, str),
        ("time span (s)", lambda r: r.span_s, None),
        ("peak live bytes", lambda r: r.peak_bytes, fmt_bytes),
        ("allocations", lambda r: r.allocations, str),
        ("bytes allocated", lambda r: r.allocated_bytes, fmt_bytes),
        ("frees (paired)", lambda r: r.frees, str),
        ("temporaries", lambda r: r.temporaries, str),
        ("leaks (blocks)", lambda r: r.leaks, str),
        ("leaked bytes", lambda r: r.leak_bytes, fmt_bytes),
        ("unpaired free() calls", lambda r: r.unpaired_frees, str),
        ("failed allocations", lambda r: r.failed_allocations, str),
    ]
    rows = []
    for name, get, f in metrics:
        va, vb = get(a), get(b)
        d = vb - va
        if f is None:
            sa, sb, ds = f"{va:.3f}", f"{vb:.3f}", f"{d:+.3f}"
        elif f is fmt_bytes:
            sa, sb, ds = fmt_bytes(va), fmt_bytes(vb), ("+" if d >= 0 else "") + fmt_bytes(d)
        else:
            sa, sb, ds = f"{va:,}", f"{vb:,}", f"{d:+,}"
        rows.append((html.escape(name), sa, sb, ds, _ratio(va, vb)))
    return _table(["", f"A: {a.label}", f"B: {b.label}", "B − A", "B / A"], rows, "summary")


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.3g}×" if a else "–"


def _peak_html(rep: HeapReport) -> str:
    classes = [
        (k, int(rep.peak_by_class_bytes[k]), int(rep.peak_by_class_blocks[k]))
        for k in np.argsort(-rep.peak_by_class_bytes, kind="stable")
        if rep.peak_by_class_bytes[k] > 0 or rep.peak_by_class_blocks[k] > 0
    ]
    t1 = _table(
        ["size class", "sizes", "live bytes", "live blocks", "share"],
        [
            (k, class_range(int(k)), f"{b:,}", f"{n:,}", _pct(b, rep.peak_bytes))
            for k, b, n in classes
        ],
    )
    procs = sorted(rep.peak_by_process.items(), key=lambda kv: -kv[1])[:20]
    t2 = _table(
        ["process", "command", "live bytes at the peak"],
        [
            (
                f"#{i} pid {rep.processes[i].pid}",
                html.escape(rep.processes[i].command[:160]),
                f"{v:,}",
            )
            for i, v in procs
        ],
    )
    when = (rep.peak_ns - rep.t0_ns) / 1e9
    return (
        f"<p><b>{html.escape(rep.label)}</b>: peak of {fmt_bytes(rep.peak_bytes)} ({rep.peak_bytes:,} B) live, "
        f"at +{when:.6f} s (time_ns {rep.peak_ns}).</p>"
        f'<div class="cols"><div>{t1}</div><div>{t2}</div></div>'
    )


def tree_lines(rep: HeapReport) -> list[str]:
    """The fork/exec tree as text lines (children under their parent, exec'd images too)."""
    kids: dict[int, list[Process]] = {}
    roots = []
    for p in rep.processes:
        (kids.setdefault(p.parent, []) if p.parent >= 0 else roots).append(p)

    def key(p: Process) -> tuple:
        return (p.start_ns if p.start_ns is not None else (p.first_ns or 0), p.image)

    lines: list[str] = []
    stack = [(p, 0) for p in sorted(roots, key=key, reverse=True)]
    while stack:
        p, depth = stack.pop()
        how = {"exec": "exec → ", "fork": ""}.get(p.relation, "")
        lines.append(
            f"{'    ' * depth}{how}pid {p.pid} (ppid {p.ppid}) {p.command[:150]}  "
            f"[{p.events:,} calls, {p.threads} thread(s), peak {fmt_bytes(p.peak_bytes)}, "
            f"{p.leaks:,} never freed]"
        )
        for c in sorted(kids.get(p.image, []), key=key, reverse=True):
            # an exec'd image continues its process: same depth; a forked one is a child
            stack.append((c, depth if c.relation == "exec" else depth + 1))
    return lines


def _processes_html(rep: HeapReport) -> str:
    lines = tree_lines(rep)
    shown = lines[:MAX_TABLE_PROCESSES]
    more = f"\n… {len(lines) - len(shown)} more" if len(lines) > len(shown) else ""
    return f"<pre class='tree'>{html.escape(chr(10).join(shown) + more)}</pre>"


def _callers_html(reps: Sequence[HeapReport]) -> str:
    out = []
    for rep in reps:
        if not rep.has_callers:
            out.append(f"<p>{html.escape(rep.label)}: {html.escape(NO_CALL_SITES)}.</p>")
            continue
        for by, title in (
            ("calls", "by calls"),
            ("bytes", "by bytes allocated"),
            ("leaks", "by blocks never freed"),
        ):
            rows = [
                (
                    html.escape(a),
                    f"{v['calls']:,}",
                    f"{v['allocs']:,}",
                    f"{v['bytes']:,}",
                    f"{v['temps']:,}",
                    f"{v['leaks']:,}",
                    f"{v['leak_bytes']:,}",
                    html.escape(
                        f"pid {rep.processes[v['image']].pid} {rep.processes[v['image']].name}"
                    ),
                )
                for a, v in top_callers(rep, by)
            ]
            out.append(f"<h3>{html.escape(rep.label)}: top callers {title}</h3>")
            out.append(
                _table(
                    [
                        "caller",
                        "calls",
                        "allocations",
                        "bytes",
                        "temporaries",
                        "leaks",
                        "leaked bytes",
                        "first seen in",
                    ],
                    rows,
                )
            )
    if len(reps) == 2 and all(r.has_callers for r in reps):
        a, b = (_caller_rows(r) for r in reps)
        keys = set(a) | set(b)
        diffs = sorted(
            keys, key=lambda k: -abs(b.get(k, {}).get("calls", 0) - a.get(k, {}).get("calls", 0))
        )[:TOP_CALLERS]
        rows = [
            (
                html.escape(k),
                f"{a.get(k, {}).get('calls', 0):,}",
                f"{b.get(k, {}).get('calls', 0):,}",
                f"{b.get(k, {}).get('calls', 0) - a.get(k, {}).get('calls', 0):+,}",
                f"{b.get(k, {}).get('leaks', 0) - a.get(k, {}).get('leaks', 0):+,}",
            )
            for k in diffs
        ]
        out.append(
            "<h3>Callers that differ most (B − A; raw addresses, where no module map was "
            "recorded, mean the same code only without ASLR)</h3>"
        )
        out.append(_table(["caller", "calls A", "calls B", "calls B − A", "leaks B − A"], rows))
    return "\n".join(out)


def _stacks_html(reps: Sequence[HeapReport]) -> str:
    """The flame graphs, the top-down and bottom-up trees, the functions and, for two runs,
    the stacks that changed most; a run without stacks says how to record them."""
    with_stacks = [has_stacks(r.stacks) for r in reps]
    if not any(with_stacks):
        return f"<p class='note'>Call stacks: {html.escape(NO_STACKS, quote=False)}.</p>"
    out = [
        f"<p class='note'>{html.escape(r.label)}: {html.escape(NO_STACKS, quote=False)}.</p>"
        for r, has in zip(reps, with_stacks)
        if not has
    ]
    out.append(
        "<p class='note'>Each frame's width is what the stacks through it allocated (or held "
        "live at the peak, or leaked, or their calls); the frame below it is its caller. "
        "Click a frame to zoom into it; the search highlights the frames whose name holds the "
        "text. The address can choose both: <code>#weight=leaked&amp;search=xmalloc</code>. "
        "Frames under 1/20,000 of every weight are left out (counted in their caller).</p>"
    )
    profiles = [r.stacks if has else None for r, has in zip(reps, with_stacks)]
    out += flame_graphs(profiles, [r.label for r in reps])
    for i, (r, has) in enumerate(zip(reps, with_stacks)):
        if has:
            tag = f"{'AB'[i]}: {html.escape(r.label)}: " if len(reps) > 1 else ""
            out.append(f"<h3>{tag}Stacks as trees</h3>" + stack_tables.trees_html(r.stacks))
            out.append(f"<h3>{tag}Functions</h3>" + stack_tables.functions_html(r.stacks))
    if len(reps) == 2 and all(with_stacks):
        out.append(
            "<h3>Stacks that changed (B − A; stacks matched by their frames' names)</h3>"
            + stack_tables.changes_html(reps[0].stacks, reps[1].stacks)
        )
    return "\n".join(out)


# ----------------------------------------------------------------------------------- the page

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.warn { background: #fff4e5; border: 1px solid #f0a040; padding: 8px 12px; }
.cols { display: flex; gap: 32px; flex-wrap: wrap; }
pre.tree { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 0.85em; }
.note { color: #666; font-size: 0.9em; }
.flame { margin: 12px 0 24px; }
.flame-controls { margin: 4px 0; font-size: 0.9em; }
.flame-controls label { margin-right: 10px; }
.flame-search { margin-left: 16px; width: 16em; }
.flame-total { font-weight: 600; margin: 4px 0; }
.flame-details { min-height: 1.3em; }
.stacktree { font-size: 0.85em; margin: 6px 0 16px; max-height: 640px; overflow: auto;
  border: 1px solid #ddd; }
.st-row { display: grid; grid-template-columns: minmax(320px, 1fr) repeat(5, 7.5em);
  gap: 0 8px; padding: 1px 6px; }
.st-row > .n { text-align: right; font-variant-numeric: tabular-nums; }
.st-head { font-weight: 600; background: #f3f3f3; position: sticky; top: 0; }
summary.st-row { cursor: pointer; list-style: none; }
summary.st-row::-webkit-details-marker { display: none; }
summary.st-row .st-name::before { content: "▸ "; color: #888; }
details[open] > summary.st-row .st-name::before { content: "▾ "; }
.st-leaf .st-name::before, .st-more .st-name::before { content: "  "; white-space: pre; }
.st-more { color: #777; }
.st-name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.stack-changes summary { cursor: pointer; }
.stack-functions td.n, .stack-changes td.n { white-space: nowrap; }
"""

# Called by each figure once plotly has drawn it: counts the figures drawn with their traces.
_CHECK_JS = """
window.heapcastPlotDrawn = function () {
  var divs = document.querySelectorAll('div.plotly-graph-div');
  var drawn = 0;
  divs.forEach(function (d) {
    if (d.querySelector('svg.main-svg') && d.querySelectorAll('g.trace').length > 0) drawn++;
  });
  document.title = window.heapcastTitle + ' [plots:' + drawn + ']';
  document.body.setAttribute('data-plots', String(drawn));
};
"""


def figures(reps: Sequence[HeapReport]) -> list[tuple[str, object]]:
    """(id, figure) of every plot of the page, in page order."""
    out = [
        ("peak", fig_peak_classes(reps)),
        ("live", fig_live(reps)),
        ("rate", fig_rate(reps)),
        ("classes", fig_size_classes(reps)),
        ("lifetimes", fig_lifetimes(reps)),
        ("temporaries", fig_temporaries(reps)),
        ("leaks", fig_leaks(reps)),
    ]
    # nothing to draw (a run without heap calls): the tree and the tables still say it
    if any(p.events for r in reps for p in r.processes):
        out.append(("processes", fig_processes(reps)))
    if any(r.threads for r in reps):
        out.append(("threads", fig_threads(reps)))
    if any(r.has_callers for r in reps):
        out.append(("callers", fig_callers(reps)))
    return out


def render(reps: Sequence[HeapReport], plotly_src: str | None = None) -> str:
    """The whole page for one run, or two (A, B) side by side with their differences.
    `plotly_src`: None inlines plotly.js; a relative URL (e.g. PLOTLY_JS) loads the shared copy."""
    reps = list(reps)
    title = "heapcast report: " + (
        reps[0].label if len(reps) == 1 else f"{reps[0].label} vs {reps[1].label}"
    )
    figs = figures(reps)
    divs = {
        sid: _figure_div(sid, fig, inline_plotly=plotly_src is None and i == 0)
        for i, (sid, fig) in enumerate(figs)
    }
    notes = {
        "peak": "".join(_peak_html(r) for r in reps),
        "live": "<p class='note'>Live bytes: + the size of each block allocated, − the size of each block freed, "
        "in call order per process image; the total merges the images by time, each image's remaining blocks "
        "released after its last call. Each point is the largest value in its time bin.</p>",
        "processes": "".join(
            f"<h3>{html.escape(r.label)}: fork/exec tree</h3>{_processes_html(r)}" for r in reps
        ),
        "callers": _callers_html(reps),
        "stacks": _stacks_html(reps),
    }
    warnings = [f"{r.label}: {w}" if len(reps) > 1 else w for r in reps for w in r.warnings]
    body = [f"<h1>{html.escape(title)}</h1>"]
    meta = []
    for r in reps:
        cmd = " ".join(r.command) if r.command else ""
        meta.append(
            f"<b>{html.escape(r.label)}</b>: {'raw traces, converted in-process' if r.kind == 'raw' else 'events dataset'}"
            + (f"; command <code>{html.escape(cmd)}</code>" if cmd else "")
        )
    generated = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    body.append(
        f"<p class='note'>{'<br>'.join(meta)}<br>generated {generated} by heapcast report</p>"
    )
    if warnings:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        body.append(
            f"<div class='warn'><b>Warnings</b> (the rest is reported)<ul>{items}</ul></div>"
        )
    body.append("<h2>Summary</h2>" + _summary_table(reps))
    if not any(r.has_callers for r in reps):
        body.append(f"<p class='note'>Callers: {html.escape(NO_CALL_SITES)}.</p>")
    sections = [
        ("peak", "What was live at the peak", ["note", "peak"]),
        ("live", "Live bytes over time", ["note", "live"]),
        ("rate", "Allocation rate", ["rate"]),
        ("classes", "Size classes", ["classes"]),
        ("lifetimes", "Lifetimes", ["lifetimes"]),
        ("temporaries", "Temporaries", ["temporaries"]),
        ("leaks", "Leaks", ["leaks"]),
        ("processes", "Processes and threads", ["processes", "note", "threads"]),
        ("callers", "Callers", ["callers", "note"]),
        ("stacks", "Call stacks", ["note"]),
    ]
    for sid, heading, items in sections:
        if sid == "callers" and sid not in divs:
            continue
        body.append(f"<h2 id='{sid}'>{html.escape(heading)}</h2>")
        for item in items:
            body.append(notes.get(sid, "") if item == "note" else divs.get(item, ""))
    if any(has_stacks(r.stacks) for r in reps):
        body.append(vendor_scripts())  # d3 and d3-flame-graph, inlined: the page opens offline
    return _page(title, body, plotly_src)


def html_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table in the report's style (cells are HTML; escape text before)."""
    return _table(head, rows)


def standalone_page(
    title: str,
    body: Sequence[str],
    figs: Sequence[tuple[str, object]],
    plotly_src: str | None = None,
) -> str:
    """A page in the report's style (its CSS, the `[plots:N]` check): `body` (HTML parts) then
    each (id, plotly figure). plotly.js as in `render`: inlined once unless `plotly_src`."""
    divs = [
        _figure_div(sid, fig, inline_plotly=plotly_src is None and i == 0)
        for i, (sid, fig) in enumerate(figs)
    ]
    return _page(title, [*body, *divs], plotly_src)


def plotly_js() -> str:
    """plotly.js as the pages draw with it: the content of the shared copy (PLOTLY_JS)."""

    return get_plotlyjs()


def _figure_div(sid: str, fig, inline_plotly: bool) -> str:

    return pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=inline_plotly,
        config={"displaylogo": False, "responsive": True},
        default_height=f"{fig.layout.height or FIG_HEIGHT}px",
        div_id=f"fig-{sid}",
        post_script="window.heapcastPlotDrawn();",
    )


# A shared copy that did not load (the page was moved without it): say so where the figures
# would be, rather than leave the reader with empty sections.
_MISSING_JS = """
document.addEventListener('DOMContentLoaded', function () {
  if (window.Plotly) return;
  var d = document.createElement('div');
  d.className = 'warn';
  d.id = 'plotly-missing';
  d.textContent = 'The figures need ' + window.heapcastPlotlySrc + ', which did not load: '
    + 'keep this page in its folder next to that file (the tables below are complete).';
  document.body.insertBefore(d, document.body.firstChild);
});
"""


def _page(title: str, body: Sequence[str], plotly_src: str | None) -> str:
    head = (
        f"<meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>window.heapcastTitle = {_js_string(title)};{_CHECK_JS}</script>"
    )
    if plotly_src is not None:
        # a classic (blocking) script in <head>: Plotly is defined before any figure's script
        head += (
            f"<script src='{html.escape(plotly_src)}' charset='utf-8'></script>"
            f"<script>window.heapcastPlotlySrc = {_js_string(plotly_src)};{_MISSING_JS}</script>"
        )
    return (
        f"<!DOCTYPE html>\n<html><head>{head}</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _js_string(s: str) -> str:
    return json.dumps(s).replace("</", "<\\/")
