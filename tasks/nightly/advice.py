"""The allocator advice of a night's summary: the last recommendation per workload, the line to
paste, where the full table lives (read by tasks/allocators/report.py: `last_advice`). Rendered
as markdown lines; the terminal summary (tasks/nightly/terminal.py) wraps the same lines.
"""

from __future__ import annotations

import datetime as _dt

from tasks.allocators.report import Advice, LastAdvice

HOW_TO_MEASURE = (
    "`prefect deployment run 'allocators/allocators'` (weekly) or `python -m flows.allocators`"
)


def _when(night: str) -> str:
    """A night stamp (20261124T035200Z) as a date a reader takes in."""
    try:
        return _dt.datetime.strptime(night, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return night


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def advice_line(a: Advice, last_night: str | None = None) -> str:
    """One case's recommendation: the candidate (or the baseline), its margin with interval,
    the line to paste."""
    when = "" if a.night == last_night else f" (measured {_when(a.night)})"
    if not a.can_decide:
        more = (
            f"; the rule needs {a.rounds_needed}, {a.rounds_needed - a.rounds} more"
            if a.rounds_needed and a.rounds
            else ""
        )
        when += f" ({a.rounds} rounds only: too few to decide{more})"
    interval = (
        f" (interval {_pct(a.margin_low)} to {_pct(a.margin_high)})"
        if a.margin_low is not None and a.margin_high is not None
        else ""
    )
    if a.recommendation is None:
        return f"{a.case}{when}: no allocator ran cleanly; see the table"
    if a.recommendation == a.baseline or a.margin is None:
        best = f"; best challenger {a.best_challenger}{interval}" if a.best_challenger else ""
        return f"{a.case}{when}: {a.baseline}: nothing beyond the noise{best}"
    what = {"time": "less time", "memory": "less peak memory"}.get(a.objective or "", "margin")
    noise = {True: ", beyond the noise", False: ", within the noise"}.get(a.beyond_noise, "")
    if a.line is None:
        paste = "; the line to paste is not in this older table"
    elif a.line:
        paste = f"; paste: `{a.line} PROGRAM`"
    else:
        paste = ""
    return (
        f"{a.case}{when}: **{a.recommendation}**, {_pct(a.margin)} {what} than {a.baseline}"
        f"{interval}{noise}{paste}"
    )


def advice_section(last: LastAdvice) -> list[str]:
    """The summary's allocator section: one line per case, where the full table lives, each
    unreadable table; without measurements, how to get them."""
    night = last.last_night
    if night is None:
        lines = ["## Allocator advice", ""]
        lines.append(f"- No allocator measurements under this root yet: run {HOW_TO_MEASURE}.")
    else:
        lines = [f"## Allocator advice (last measured {_when(night)})", ""]
        lines += [f"- {advice_line(a, night)}" for a in last.advice]
        newest = next(a for a in last.advice if a.night == night)
        where = f"Full table: `{newest.report}`"
        if newest.experiment:
            where += f"; MLflow experiment `{newest.experiment}`"
        lines += ["", where + "."]
    lines += [f"- could not read {p}" for p in last.problems]
    return lines
