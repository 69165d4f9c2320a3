"""The report's tables of call stacks, as heaptrack's GUI shows them: the top-down tree (from
the outermost frame to the allocating function), the bottom-up tree (from the allocating
function out to its callers), the functions (inclusive: every stack through the function;
own: the stacks it allocates in), and for two runs the stacks whose figures changed most.

Trees are collapsible (<details>); a node shows its children that hold at least SHOWN_SHARE of
the run's bytes, calls, peak or leaks, MAX_CHILDREN at most (the rest are summed on one line);
lists show their top N, with a note saying so.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence

import numpy as np

from tasks.report.calltree import (
    COLUMNS,
    CallTree,
    call_tree,
    column,
    function_sums,
    ranked,
    stack_paths,
    stack_values,
)
from tasks.report.formats import fmt_bytes
from tasks.stacks.profile import StackProfile

SHOWN_SHARE = 0.01
MAX_CHILDREN = 25
OPEN_DEPTH = 3  # tree levels open when the page loads
TOP_FUNCTIONS = 30
TOP_CHANGES = 20
PATH_FRAMES = 4  # frames of a stack named in a table row before "…"
HEADS = ("calls", "bytes", "live at the peak", "leaked", "temporaries")


def _cells(v: Sequence[int]) -> str:
    """A row's figures in COLUMNS order: counts as counts, bytes as bytes."""
    out = []
    for c, x in zip(COLUMNS, v):
        x = int(x)
        text = f"{x:,}" if c in ("calls", "temporaries") else fmt_bytes(x)
        out.append(f"<span class='n' title='{x:,}'>{text}</span>")
    return "".join(out)


def _tree_head(first: str) -> str:
    return (
        f"<div class='st-row st-head'><span>{html.escape(first)}</span>"
        + "".join(f"<span class='n'>{h}</span>" for h in HEADS)
        + "</div>"
    )


def tree_html(tree: CallTree) -> str:
    """The tree as nested <details>: each node a row (name, figures), its children below."""
    kids = tree.children()
    shown_cols = [column(c) for c in ("calls", "bytes", "peak", "leaked")]
    floor = np.maximum(tree.values[0, shown_cols], 1) * SHOWN_SHARE
    big = np.any(tree.values[:, shown_cols] >= floor, axis=1)
    by_bytes = column("bytes")

    def node(k: int, depth: int) -> str:
        name = html.escape(tree.label(k))
        module = tree.modules[tree.name[k]] if k else ""
        title = f" title='{html.escape(module)}'" if module else ""
        label = (
            f"<span class='st-name' style='padding-left:{depth * 1.1:.1f}em'{title}>{name}</span>"
        )
        row = label + _cells(tree.values[k])
        order = sorted(kids[k], key=lambda c: (-tree.values[c, by_bytes], c))
        shown = [c for c in order if big[c]][:MAX_CHILDREN]
        # `order` is by bytes: a child shown for its leaks or calls alone may come after one
        # folded; put the shown ones first so the rest are what was folded
        order = shown + [c for c in order if not big[c] or c not in shown]
        if not order:
            return f"<div class='st-row st-leaf'>{row}</div>"
        rest = len(order) - len(shown)
        inner = "".join(node(c, depth + 1) for c in shown)
        if rest:
            folded = order[len(shown) :]
            why = (
                f"the smallest ({MAX_CHILDREN} shown at most)"
                if big[folded].any()
                else f"each under {SHOWN_SHARE:.0%}"
            )
            inner += (
                f"<div class='st-row st-more'><span class='st-name' "
                f"style='padding-left:{(depth + 1) * 1.1:.1f}em'>… {rest} more, {why}</span>"
                f"{_cells(tree.values[folded].sum(axis=0))}</div>"
            )
        is_open = " open" if depth < OPEN_DEPTH else ""
        return f"<details{is_open}><summary class='st-row'>{row}</summary>{inner}</details>"

    return node(0, 0)


def functions_html(profile: StackProfile, n: int = TOP_FUNCTIONS) -> str:
    """The functions with the most bytes allocated under them (inclusive), with what they
    allocate themselves."""
    f = function_sums(profile)
    top = ranked(f.inclusive, ("bytes", "leaked", "calls"), n)
    rows = []
    for i in top.tolist():
        module = os.path.basename(f.modules[i]) if f.modules[i] else ""
        rows.append(
            f"<tr><td>{html.escape(f.names[i])}</td><td>{html.escape(module)}</td>"
            + "".join(f"<td class='n'>{c}</td>" for c in _plain(f.inclusive[i]))
            + "".join(
                f"<td class='n'>{c}</td>"
                for c in _plain(
                    f.self_[i][[column("calls"), column("bytes"), column("leaked")]],
                    ("calls", "bytes", "leaked"),
                )
            )
            + "</tr>"
        )
    head = (
        "<tr><th rowspan=2>function</th><th rowspan=2>module</th>"
        "<th colspan=5>inclusive (every stack through it)</th>"
        "<th colspan=3>own (it called malloc)</th></tr><tr>"
        + "".join(f"<th>{h}</th>" for h in HEADS)
        + "<th>calls</th><th>bytes</th><th>leaked</th></tr>"
    )
    note = _top_note(
        len(top),
        int(np.count_nonzero(f.inclusive.any(axis=1))),
        "functions",
        "bytes allocated under them",
    )
    return f"{note}<table class='stack-functions'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _plain(v: Sequence[int], cols: Sequence[str] = COLUMNS) -> list[str]:
    return [
        f"{int(x):,}" if c in ("calls", "temporaries") else fmt_bytes(int(x))
        for c, x in zip(cols, v)
    ]


def _top_note(shown: int, of: int, what: str, by: str) -> str:
    if shown >= of:
        return ""
    return f"<p class='note'>The {shown} {what} with the most {by}, of {of:,}.</p>"


def _path_html(path: tuple[str, ...]) -> str:
    """A stack, innermost first: its first frames, the whole of it on opening."""
    head = " ← ".join(html.escape(p) for p in path[:PATH_FRAMES])
    if len(path) <= PATH_FRAMES:
        return head
    whole = "<br>".join(html.escape(p) for p in path)
    return f"<details><summary>{head} ← … ({len(path)} frames)</summary>{whole}</details>"


def stack_changes(
    a: StackProfile, b: StackProfile
) -> tuple[list[tuple[str, ...]], np.ndarray, np.ndarray]:
    """The stacks of either run matched by their frames' names: (paths, A's figures, B's
    figures), figures in COLUMNS order, 0 where a run lacks the stack."""
    index: dict[tuple[str, ...], int] = {}
    rows = []
    for prof in (a, b):
        rows.append([index.setdefault(p, len(index)) for p in stack_paths(prof)])
    out = []
    for prof, r in zip((a, b), rows):
        v = np.zeros((len(index), len(COLUMNS)), dtype=np.int64)
        np.add.at(v, np.array(r, dtype=np.int64), stack_values(prof))
        out.append(v)
    return list(index), out[0], out[1]


def changes_html(a: StackProfile, b: StackProfile, n: int = TOP_CHANGES) -> str:
    """The stacks whose bytes allocated changed most from A to B, and those whose leaks did."""
    paths, va, vb = stack_changes(a, b)
    out = []
    for by, what in (("bytes", "bytes allocated"), ("leaked", "bytes leaked"), ("calls", "calls")):
        j = column(by)
        d = vb[:, j] - va[:, j]
        changed = np.flatnonzero(d)
        if not len(changed):
            out.append(f"<p class='note'>No stack's {what} changed.</p>")
            continue
        order = changed[np.lexsort((changed, -np.abs(d[changed])))][:n]
        rows = "".join(
            f"<tr><td>{_path_html(paths[i])}</td>"
            f"<td class='n'>{_fmt(by, va[i, j])}</td><td class='n'>{_fmt(by, vb[i, j])}</td>"
            f"<td class='n'>{_fmt(by, d[i], signed=True)}</td>"
            f"<td class='n'>{'new in B' if va[i].sum() == 0 else 'gone in B' if vb[i].sum() == 0 else ''}</td></tr>"
            for i in order.tolist()
        )
        out.append(
            f"<h4>Stacks whose {what} changed most (B − A)</h4>"
            + _top_note(len(order), len(changed), "stacks", f"change in {what}")
            + f"<table class='stack-changes stack-changes-{by}'><thead><tr><th>stack (innermost first)</th>"
            f"<th>A</th><th>B</th><th>B − A</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
        )
    return "\n".join(out)


def _fmt(by: str, x: int, signed: bool = False) -> str:
    x = int(x)
    if by == "calls":
        return f"{x:+,}" if signed else f"{x:,}"
    return ("+" if signed and x >= 0 else "") + fmt_bytes(x)


def trees_html(profile: StackProfile) -> str:
    """The top-down and bottom-up trees of one run."""
    return (
        "<h4>Top-down: from the outermost frame to the function that called malloc</h4>"
        f"<div class='stacktree'>{_tree_head('frame')}{tree_html(call_tree(profile))}</div>"
        "<h4>Bottom-up: from the function that called malloc out to its callers</h4>"
        f"<div class='stacktree'>{_tree_head('frame')}"
        f"{tree_html(call_tree(profile, inverted=True))}</div>"
    )
