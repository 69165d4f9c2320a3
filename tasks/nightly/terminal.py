"""The night's summary as a person reads it in a terminal, in a minute.

First screen (well within 25 lines): the verdict. Did tonight's model win, against the online
counter and the previous champion, by how much; what the predictions bought (the what-if's
pooled hit rate, the layer's measured milliseconds); where the pages are (the heap reports, the
MLflow UI, the Prefect UI, the full summary). Then one line per stage, then narrow tables. No line
is wider than `width`: prose is wrapped, a command is folded with shell continuations (`\\`, still
pasteable), a table cell is cut with an ellipsis. The wide tables (every predictor, every policy,
every allocator) stay in `NightlySummary.markdown()`: the Prefect artifact and the summary file.

Only the rendering lives here; the figures are the summary's (tasks/nightly/night_summary.py), which
imports this module, so NightlySummary is named here for type checking only.
"""

from __future__ import annotations

import datetime as _dt
import textwrap
from typing import TYPE_CHECKING

from tasks.allocators.seeds import HEADLINE_PAIRS, SeedLine, short_case_names
from tasks.nightly.advice import advice_section
from tasks.report.page import fmt_bytes

if TYPE_CHECKING:
    from tasks.nightly.night_summary import NightlySummary

ELLIPSIS = "…"
TABLE_NAMES = {
    "unseen_runs": "unseen runs",
    "unseen_programs": "never-seen programs",
    "heldout_workloads": "held-out workloads",
}
# the layer's pairs the verdict reads (tasks/allocators/seeds.py: HEADLINE_PAIRS)
VS_COUNTER = next(pair for pair, name in HEADLINE_PAIRS.items() if name == "vs_counter")
VS_NONE = next(pair for pair, name in HEADLINE_PAIRS.items() if name == "vs_none")
P_DECIDES = 0.05  # the rank test's level for "beyond the noise" (tasks/allocators/decide.py)


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


def verdict_lines(s: NightlySummary) -> list[str]:
    """The verdict as logical lines (each wrapped by the caller): the champion, the model
    against the online counter, what the what-if and the layer bought. The markdown page
    opens with the same lines."""
    lines = [champion_line(s)]
    counter = counter_line(s)
    if counter:
        lines.append(counter)
    lines += [whatif_line(s), layer_line(s)]
    return lines


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "(none)"


def champion_line(s: NightlySummary) -> str:
    """Did tonight's model win: the champion before and after, with both scores."""
    stays = (
        f"the champion stays {_v(s.champion_after)}"
        if s.champion_after is not None
        else "no champion in the registry"
    )
    if not s.trained:
        why = s.not_registered or "the train stage did not run"
        return f"NO MODEL TRAINED: {why}. Nothing was registered; {stays}."
    p = s.promotion
    metric = "top-1" if p is None or p.metric == "top1" else p.metric
    tonight = _v(s.model_version)
    scores = ""
    if p is not None:
        scores = f"{metric} on unseen runs {p.candidate_score:.4f}"
        if p.previous_score is not None:
            gain = p.candidate_score - p.previous_score
            rescored = f"; {_v(p.previous_version)} re-scored on them" if p.reevaluated else ""
            scores += (
                f" vs {_v(p.previous_version)}'s {p.previous_score:.4f} ({gain:+.4f}{rescored})"
            )
    unread = f" (the scores could not be read: {s.promotion_unread})" if s.promotion_unread else ""
    if s.champion_changed:
        if s.champion_before is None:
            head = f"CHAMPION: {_v(s.champion_after)} is the first champion"
        else:
            head = f"CHAMPION CHANGED: {_v(s.champion_after)} replaces {_v(s.champion_before)}"
        if s.champion_after != s.model_version:  # another registration took the alias
            head += f" (tonight's model is {tonight})"
        return f"{head}: {scores}{unread}." if scores else f"{head}{unread}."
    if p is not None and p.decision == "not_comparable":
        return (
            f"Champion unchanged: {stays}; tonight's {tonight} could not be compared with it "
            f"(scored on other data and not re-scored){unread}."
        )
    head = f"Champion unchanged: tonight's {tonight} did not beat it; {stays}"
    return f"{head}: {scores}{unread}." if scores else f"{head}{unread}."


def counter_line(s: NightlySummary) -> str:
    """The model against the online counter (an allocator can always have that one), per
    evaluation table: the first in full, the others as margins."""
    if not s.tables:
        return ""
    first, *rest = s.tables
    where = f"{TABLE_NAMES.get(first.table, first.table)}, {first.positions:,} positions"
    if first.online_counter is None:
        line = f"Against the online counter: not scored tonight ({where})"
    else:
        line = (
            f"Against the online counter: top-1 {first.model:.4f} vs {first.online_counter:.4f} "
            f"({first.model - first.online_counter:+.4f}, {where})"
        )
        if first.hedged is not None:
            line += f"; mixed with it per thread {first.hedged:.4f}"
    line += (
        f"; best baseline {first.best_baseline} {first.best_baseline_top1:.4f} "
        f"({first.model - first.best_baseline_top1:+.4f})"
    )
    others = [
        f"{TABLE_NAMES.get(t.table, t.table)} {t.model - t.online_counter:+.4f}"
        for t in rest
        if t.online_counter is not None
    ]
    if others:
        line += f"; on {', '.join(others)}"
    return line + "."


def _stage(s: NightlySummary, name: str):
    return next((st for st in s.stages if st.name == name), None)


def _not_run(s: NightlySummary, name: str, off: str) -> str:
    """Why a stage gave no figures: it failed (its error), was skipped (why), or was off."""
    st = _stage(s, name)
    if st is None:
        return off
    if not st.ok:
        return f"the {name} stage {st.state.lower()}: {_one_line(st.error or '', 160)}"
    return "no figures"


def whatif_line(s: NightlySummary) -> str:
    """What the predictions bought in simulation: the pooled hit rate at the idle budget."""
    pooled = next((a for a in s.whatif_at_budget if a.workload == "all"), None)
    if pooled is None and s.whatif_at_budget:
        pooled = s.whatif_at_budget[-1]
    if pooled is None or s.whatif_budget is None:
        return f"What-if: {_not_run(s, 'whatif', 'not run tonight')}."
    kind = "causal"
    if any(k.startswith("headline/whatif_optimistic.") for k in s.headline):
        kind = "optimistic: later predictions read, a bound"
    where = f"{pooled.workload} workloads" if pooled.workload == "all" else pooled.workload
    guided = pooled.guided_hit_rate
    best = pooled.best_heuristic_hit_rate
    line = f"What-if ({fmt_bytes(s.whatif_budget)} held idle, {where}, {kind}): hit rate "
    if guided is None:
        line += "guided by the model n/a (the model could not load)"
    else:
        line += f"guided by the model {guided:.4f}"
    if best is not None:
        line += f" vs best heuristic {pooled.best_heuristic or ''} {best:.4f}".replace("  ", " ")
        if guided is not None:
            line += f" ({guided - best:+.4f})"
    if pooled.oracle_hit_rate is not None:
        line += f"; oracle {pooled.oracle_hit_rate:.4f}"
    return line + "."


def _bought(line: SeedLine, pair: tuple[str, str]):
    return next((b for b in line.bought if (b.who, b.against) == pair), None)


def _ms(b) -> str:
    if b is None or b.wall_ms is None:
        return "n/a"
    return f"{b.wall_ms:+.0f} ms (p={b.p_wall:.2g})"


def layer_line(s: NightlySummary) -> str:
    """What the layer bought, measured: the model's table against the online counter, per case
    (median wall ms; negative: time saved)."""
    if not s.seed_cases:
        if s.seed_lines:  # a summary made before the figures were kept: the text lines
            return f"Layer: measured on {len(s.seed_lines)} case(s): see the table below."
        off = "not measured tonight (the `seeds` option is off)"
        return f"Layer: {_not_run(s, 'seeds', off)}."
    short = short_case_names([c.case for c in s.seed_cases])
    cells = [f"{short[c.case]} {_ms(_bought(c, VS_COUNTER))}" for c in s.seed_cases]
    rounds = min(c.repetitions for c in s.seed_cases)
    decided = [
        b
        for c in s.seed_cases
        if (b := _bought(c, VS_COUNTER)) is not None and b.p_wall < P_DECIDES
    ]
    if rounds < 5:
        noise = f"{rounds} rounds: too few for the rank test"
    else:
        noise = f"{rounds} rounds, {len(decided)} of {len(s.seed_cases)} beyond the noise"
    return f"Layer, the model's table vs the online counter ({noise}): " + ", ".join(cells) + "."


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
            out.append(_cut(head + _one_line(st.detail), width))
            continue
        why = _one_line(st.error or f"ended {st.state.lower()}")
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
            + [_cut(f"  {run}: {_one_line(why)}", width) for run, why in s.replays_failed.items()]
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
                _cut(f"  {run}: {_one_line(why)}", width)
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
                _ms(_bought(c, VS_COUNTER)),
                _ms(_bought(c, VS_NONE)),
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


def _one_line(text: str, limit: int | None = None) -> str:
    flat = " ".join(str(text).split())
    if limit is not None and len(flat) > limit:
        return flat[: limit - 1] + ELLIPSIS
    return flat


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + ELLIPSIS


def _wrap_lines(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    """`text` on lines of at most `width`: the first starts with `first` (default `indent`),
    the rest with `indent`; a word longer than a line is broken."""
    return textwrap.wrap(
        _one_line(text),
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
