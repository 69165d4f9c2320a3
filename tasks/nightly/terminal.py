"""The night's summary as a person reads it in a terminal: one screen, even on the whole catalog.

The verdict first (tasks/nightly/verdict.py): did tonight's model win, against the online counter
and the previous champion, by how much; what the predictions bought (the what-if's pooled hit
rate, the layer's measured milliseconds); where the pages are (the heap reports, the MLflow UI,
the Prefect UI, the full summary). Then one line per stage, then narrow tables of the verdicts
and of the few rows that differ from them (the workloads where the model's verdict is not the
pooled one, the heap reports with a failure or a warning); a line says where the rest is. No
line is wider than `width`: prose is wrapped, a command is folded with shell continuations
(`\\`, still pasteable), a table cell is cut with an ellipsis. Every table in full (every
predictor, policy, workload and allocator) stays in tasks/nightly/markdown.py's page: the
Prefect artifact, the summary file and the model's MLflow run.
"""

from __future__ import annotations

import datetime as _dt
import textwrap

from tasks.allocators.seeds import SeedLine, short_case_names
from tasks.nightly.advice import advice_section
from tasks.nightly.summary_model import NightlySummary
from tasks.nightly.verdict import (
    ELLIPSIS,
    TABLE_NAMES,
    VS_COUNTER,
    VS_NONE,
    ms_text,
    one_line,
    pair_bought,
    verdict_lines,
)
from tasks.report.page import fmt_bytes


def terminal_text(s: NightlySummary, width: int = 100) -> str:
    """The whole terminal rendering of `s` (see the module)."""
    lines = [_wrap(title(s), width, "  "), ""]
    lines += [_wrap(line, width, "  ") for line in verdict_lines(s)]
    lines += ["", *pages(s, width), "", *stage_lines(s, width)]
    for block in detail_blocks(s, width):
        lines += ["", *block]
    lines += ["", *_wrap_lines(full_tables_line(s), width, "")]
    out = "\n".join(line.rstrip() for line in "\n".join(lines).splitlines())
    return out + "\n"


# ----------------------------------------------------------------------------- the verdict


def title(s: NightlySummary) -> str:
    ok = sum(st.ok for st in s.stages)
    try:
        when = _dt.datetime.fromisoformat(s.finished_at).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        when = s.finished_at
    head = f"heapcast nightly, {when}: {ok} of {len(s.stages)} stages ok"
    return head + ("" if s.trained else ", NO MODEL TRAINED")


# ----------------------------------------------------------------------------- the pages


def pages(s: NightlySummary, width: int) -> list[str]:
    """Where to look next: a label and its place on one line when it fits, else the place on
    the lines below, folded (never cut: a path or a command stays pasteable)."""
    out = ["Pages"]
    r = s.heap_reports
    if r is None:
        out.append("  heap reports: none tonight (no model to report on)")
    elif r.skipped:
        out += _wrap_lines(f"heap reports: none tonight: {r.skipped}", width, "    ", "  ")
    else:
        failed = f", {len(r.failed)} failed" if r.failed else ""
        out += _place(f"heap reports ({len(r.reports)} page(s){failed})", r.folder, width)
    if s.mlflow_ui:
        out += _place("MLflow UI, started with", s.mlflow_ui, width)
        out.append(f"    then open {_model_page(s)}")
    elif s.mlflow_ui_url:
        out += _place("MLflow UI", _model_page(s), width)
    if s.prefect_ui:
        out += _place("Prefect UI (artifact `nightly-summary`)", s.prefect_ui, width)
    else:
        # the run went to Prefect's in-process API; the server the services start reads the
        # same database (PREFECT_HOME), so it shows this run once started
        out += _place(
            "Prefect UI (http://127.0.0.1:4200 once started)",
            'eval "$(scripts/services.sh up)"',
            width,
        )
    if s.summary_file:
        out += _place("full summary (every table)", s.summary_file, width)
    return out


def _place(label: str, where: str, width: int) -> list[str]:
    """`  label: where` on one line, or the label and then `where` folded below it."""
    line = f"  {label}: {where}"
    if len(line) <= width:
        return [line]
    return [f"  {label}:", *_fold_command(where, width, "      ", "    ")]


def _model_page(s: NightlySummary) -> str:
    url = s.mlflow_ui_url.rstrip("/")
    if s.model_name and s.model_version:
        return f"{url}/#/models/{s.model_name}/versions/{s.model_version}"
    return url


def full_tables_line(s: NightlySummary) -> str:
    where = f"`{s.summary_file}`, " if s.summary_file else ""
    return (
        f"Every predictor, policy, allocator and question in full: {where}the Prefect "
        "artifact `nightly-summary` and the model's MLflow run."
    )


# ----------------------------------------------------------------------------- stages, detail


def stage_lines(s: NightlySummary, width: int) -> list[str]:
    """One line per stage: its state and what ran; a stage that did not complete gets its
    error, on up to three lines."""
    if not s.stages:
        return ["Stages: none ran"]
    name_w = max(len(st.name) for st in s.stages)
    out = ["Stages"]
    for st in s.stages:
        state = "ok" if st.ok else st.state.upper()
        head = f"  {st.name:<{name_w}}  {state:<9} "
        if st.ok:
            out.append(_cut(head + one_line(st.detail), width))
            continue
        why = one_line(st.error or f"ended {st.state.lower()}")
        wrapped = _wrap_lines(why, width, " " * len(head), head)
        if len(wrapped) > 3:
            wrapped = [*wrapped[:2], _cut(wrapped[2] + " " + ELLIPSIS * 2, width)]
        out += wrapped
    return out


def detail_blocks(s: NightlySummary, width: int) -> list[list[str]]:
    blocks = []
    if s.replays_failed:
        blocks.append(
            ["Failed replays"]
            + [_cut(f"  {run}: {one_line(why)}", width) for run, why in s.replays_failed.items()]
        )
    if s.tables:
        rows = [
            [
                TABLE_NAMES.get(t.table, t.table),
                f"{t.positions:,}",
                f"{t.model:.4f}",
                "n/a" if t.hedged is None else f"{t.hedged:.4f}",
                "n/a" if t.online_counter is None else f"{t.online_counter:.4f}",
                f"{t.best_baseline} {t.best_baseline_top1:.4f}",
                f"{t.model - t.best_baseline_top1:+.4f}",
            ]
            for t in s.tables
        ]
        head = [
            "table",
            "positions",
            "model",
            "hedged",
            "online counter",
            "best baseline",
            "margin",
        ]
        title = "Top-1 on runs never trained on (all workloads; margin: over the best baseline)"
        blocks.append([title, *_table(head, rows, width, right={1, 2, 3, 4, 6})])
        if s.allocator_questions or s.program_questions:
            blocks[-1].append(
                "  (the allocator's questions, reuse and lifetime, per table and program: "
                "in the full summary)"
            )
    if s.whatif_at_budget and s.whatif_budget is not None:
        head = ["workload", "best heuristic", "model", "reuse net", "oracle"]
        rows = [_bought_cells(a.workload, a) for a in s.whatif_at_budget]
        title = f"What-if hit rates at {fmt_bytes(s.whatif_budget)} held idle"
        blocks.append([title, *_table(head, rows, width, right={1, 2, 3, 4})])
        if s.whatif_by_budget:
            head[0] = "held idle"
            rows = [_bought_cells(fmt_bytes(a.budget or 0), a) for a in s.whatif_by_budget]
            blocks[-1] += ["", "All workloads, by idle budget"]
            blocks[-1] += _table(head, rows, width, right={0, 1, 2, 3, 4})
    if s.seed_cases:
        blocks.append(layer_table(s.seed_cases, width))
    elif s.seed_lines:
        blocks.append(["What the layer bought (seeds' cases)"])
        for line in s.seed_lines:
            blocks[-1] += _wrap_lines(line, width, "    ", "  - ")
    blocks.append(advice_lines(s, width))
    if s.heap_reports is not None and s.heap_reports.reports:
        rows = [
            [
                f"{r.run}",
                f"{r.events:,}",
                fmt_bytes(r.peak_bytes),
                f"{r.leaks:,} / {fmt_bytes(r.leak_bytes)}",
                f"{len(r.warnings)}" if r.warnings else "",
            ]
            for r in s.heap_reports.reports
        ]
        head = ["heap report (run)", "heap calls", "peak live", "leaked blocks / bytes", "warn"]
        blocks.append(_table(head, rows, width, right={1, 2, 3, 4}))
    if s.heap_reports is not None and s.heap_reports.failed:
        blocks.append(
            ["Heap reports that failed"]
            + [
                _cut(f"  {run}: {one_line(why)}", width)
                for run, why in s.heap_reports.failed.items()
            ]
        )
    return blocks


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _bought_cells(first: str, a) -> list[str]:
    best = _rate(a.best_heuristic_hit_rate)
    if a.best_heuristic is not None:
        best = f"{a.best_heuristic} {best}"
    return [
        first,
        best,
        _rate(a.guided_hit_rate),
        _rate(a.questions_hit_rate),
        _rate(a.oracle_hit_rate),
    ]


def layer_table(cases: list[SeedLine], width: int) -> list[str]:
    """Per case: the model's table against the counter and against no prediction (median ms,
    the rank test's p), and the table's own and glibc's medians."""
    short = short_case_names([c.case for c in cases])
    rows = []
    for c in cases:
        by = {f.allocator: f for f in c.figures}
        own = by.get(VS_COUNTER[0])
        glibc = by.get("glibc")
        rows.append(
            [
                short[c.case],
                str(c.repetitions),
                ms_text(pair_bought(c, VS_COUNTER)),
                ms_text(pair_bought(c, VS_NONE)),
                _figure(own),
                _figure(glibc),
            ]
        )
    head = ["layer case", "rounds", "vs counter", "vs no prediction", "table ms/MB", "glibc"]
    title = "What the layer bought, measured (the model's table; medians, negative: saved)"
    return [title, *_table(head, rows, width, right={1, 2, 3, 4, 5})]


def _figure(f) -> str:
    if f is None:
        return "n/a"
    if f.wall_ms is None or f.peak_rss_mb is None:
        return "failed"
    return f"{f.wall_ms:.0f}/{f.peak_rss_mb:.0f}"


def advice_lines(s: NightlySummary, width: int) -> list[str]:
    """The allocator advice section of the markdown, as wrapped text (no emphasis marks)."""
    out = []
    for i, line in enumerate(advice_section(s.allocator_advice)):
        text = line.replace("**", "")
        if i == 0:
            out.append(text.removeprefix("## "))
        elif text.startswith("- "):
            out += _wrap_lines(text[2:], width, "    ", "  - ")
        elif text:
            out += _wrap_lines(text, width, "  ", "  ")
    return out


# ----------------------------------------------------------------------------- text helpers


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + ELLIPSIS


def _wrap_lines(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    """`text` on lines of at most `width`: the first starts with `first` (default `indent`),
    the rest with `indent`; a word longer than a line is broken."""
    return textwrap.wrap(
        one_line(text),
        width=width,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=True,
    ) or [(indent if first is None else first).rstrip()]


def _wrap(text: str, width: int, indent: str) -> str:
    return "\n".join(_wrap_lines(text, width, indent, ""))


def _fold_command(cmd: str, width: int, indent: str, first: str) -> list[str]:
    """A shell command on lines of at most `width`, folded between words with ` \\` (pasted,
    the shell joins them back); a word longer than a line is split with a bare `\\`, which the
    shell also joins."""
    out: list[str] = []
    line = first
    for word in cmd.split():
        if line.strip():
            if len(line) + 1 + len(word) + 2 <= width:
                line += " " + word
                continue
            out.append(line + " \\")
            line = indent
        while len(line) + len(word) + 2 > width:  # too long for a line and its continuation
            room = min(width - len(line) - 1, len(word) - 1)  # leave a part for the next line
            out.append(line + word[:room] + "\\")
            word, line = word[room:], ""
        line += word
    out.append(line)
    return out


def _table(head: list[str], rows: list[list[str]], width: int, right: set[int]) -> list[str]:
    """Aligned columns under `head`, two spaces apart, indented by two; columns in `right`
    right-aligned. Wider than `width`: the widest column is cut (ellipsis) until it fits."""
    cols = len(head)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(cols)]
    while 2 + sum(widths) + 2 * (cols - 1) > width and max(widths) > 4:
        widest = widths.index(max(widths))
        widths[widest] -= 1

    def fit(cell: str, i: int) -> str:
        cell = cell if len(cell) <= widths[i] else cell[: widths[i] - 1] + ELLIPSIS
        return cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])

    return ["  " + "  ".join(fit(c, i) for i, c in enumerate(r)).rstrip() for r in [head, *rows]]
