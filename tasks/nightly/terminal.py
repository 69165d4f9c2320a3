"""The night's summary as a person reads it in a terminal: one screen, even on the whole catalog.

The verdict first (tasks/nightly/verdict.py): did tonight's model win, against the online counter
and the previous champion, by how much; what the predictions bought (the what-if's pooled hit
rate, the layer's measured milliseconds); where the pages are (the heap reports, the MLflow UI,
the Prefect UI, the full summary). Then one line per stage, then the few rows that differ
from the verdict: the replays and heap reports that failed, the what-if's workloads whose
verdict is not the pooled one (a count of each side, the widest margins first), and the
allocator advice; a last line says where the rest is. It does not grow with the catalog. No
line is wider than `width`: prose is wrapped, a command is folded with shell continuations
(`\\`, still pasteable), a table cell is cut with an ellipsis. Every table in full (every
predictor, policy, workload and allocator) stays in tasks/nightly/markdown.py's page: the
Prefect artifact, the summary file and the model's MLflow run.
"""

from __future__ import annotations

import datetime as _dt
import textwrap

from tasks.nightly.advice import advice_section
from tasks.nightly.summary_model import NightlySummary
from tasks.nightly.verdict import (
    ELLIPSIS,
    one_line,
    verdict_lines,
)
from tasks.report.page import fmt_bytes
from tasks.whatif.night import AtBudget


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
        # the command after the label, folded with shell continuations: pasteable from `.venv`
        out += _fold_command(s.mlflow_ui, width, "      ", "  MLflow UI:")
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
    """Where every row is: the full summary (under Pages), the artifact, MLflow."""
    where = "the full summary, " if s.summary_file else ""
    return f"Every table in full: {where}the artifact `nightly-summary`, the model's MLflow run."


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
    """What failed, the what-if's workloads off the pooled verdict, the allocator advice: each
    block only when it has something to say. (The evaluation per table, the layer per case and
    the heap reports' figures are in the verdict and the pages; their tables in full.)"""
    blocks = [failed_lines(s, width), whatif_rows(s, width), advice_lines(s, width)]
    return [block for block in blocks if block]


SHOWN = 3  # rows of a kind the terminal shows; the rest are counted, and in the full summary


def failed_lines(s: NightlySummary, width: int) -> list[str]:
    """A line per failed replay and failed heap report (the first SHOWN), the reason cut."""
    failed = [(f"replay {run}", why) for run, why in s.replays_failed.items()]
    if s.heap_reports is not None:
        failed += [(f"heap report {run}", why) for run, why in s.heap_reports.failed.items()]
    if not failed:
        return []
    out = ["Failed"] + [_cut(f"  {what}: {one_line(why)}", width) for what, why in failed[:SHOWN]]
    if len(failed) > SHOWN:
        out.append(f"  and {len(failed) - SHOWN} more")
    return out


EVEN = 0.005  # hit rates closer than this: the model and the best heuristic are even


def _lead(a: AtBudget) -> float | None:
    """The model's hit rate over the best heuristic's (None: either is missing)."""
    if a.guided_hit_rate is None or a.best_heuristic_hit_rate is None:
        return None
    return a.guided_hit_rate - a.best_heuristic_hit_rate


def _side(lead: float | None) -> str | None:
    if lead is None:
        return None
    return "even" if abs(lead) < EVEN else "ahead" if lead > 0 else "behind"


def whatif_rows(s: NightlySummary, width: int) -> list[str]:
    """What-if at the idle budget: how many workloads the model leads, is even with or trails
    the best heuristic on; the pooled row and the workloads whose verdict is not the pooled
    one (the widest margins first); the pooled margin at each idle budget."""
    if not s.whatif_at_budget or s.whatif_budget is None:
        return []
    pooled = next((a for a in s.whatif_at_budget if a.workload == "all"), None)
    each = [a for a in s.whatif_at_budget if a.workload != "all"]
    sides = [_side(_lead(a)) for a in each]
    counts = ", ".join(f"{k} {sides.count(k)}" for k in ("ahead", "even", "behind"))
    verdict = _side(_lead(pooled)) if pooled is not None else None
    differ = sorted(
        (a for a, side in zip(each, sides, strict=True) if side not in (None, "even", verdict)),
        key=lambda a: -abs(_lead(a) or 0.0),
    )
    if not any(sides):
        counts = "the model's hit rates n/a"
    title = (
        f"What-if at {fmt_bytes(s.whatif_budget)} held idle, model vs best heuristic on "
        f"{len(each)} workloads: {counts}"
    )
    out = _wrap_lines(title, width, "  ", "")
    if pooled is not None or differ:
        shown = [a for a in [pooled, *differ[:SHOWN]] if a is not None]
        head = ["workload", "best heuristic", "model", "reuse net", "oracle", "model - best"]
        rows = [[*_bought_cells(a.workload, a), _margin(_lead(a))] for a in shown]
        out += _table(head, rows, width, right={1, 2, 3, 4, 5})
    if len(differ) > SHOWN:
        out.append(f"  and {len(differ) - SHOWN} more off the pooled verdict")
    by_budget = [
        f"{fmt_bytes(a.budget or 0)} {_margin(_lead(a))} ({a.best_heuristic or 'n/a'})"
        for a in s.whatif_by_budget
    ]
    if by_budget:
        line = "All workloads by idle budget, model - best heuristic: " + ", ".join(by_budget)
        out += _wrap_lines(line, width, "  ", "")
    return out


def _margin(lead: float | None) -> str:
    return "n/a" if lead is None else f"{lead:+.4f}"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _bought_cells(first: str, a: AtBudget) -> list[str]:
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


def advice_lines(s: NightlySummary, width: int) -> list[str]:
    """The allocator advice section of the markdown as wrapped text (no emphasis marks), a
    line per case; where its full table lives is in the full summary."""
    out = []
    for i, line in enumerate(advice_section(s.allocator_advice)):
        text = line.replace("**", "")
        if i == 0:
            out.append(text.removeprefix("## "))
        elif text.startswith("- "):
            out += _wrap_lines(text[2:], width, "    ", "  - ")
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
