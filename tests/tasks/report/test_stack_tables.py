"""The stack tables: the trees (collapsible, small frames folded), the functions, and the
stacks that changed between two runs."""

from __future__ import annotations

import re

import numpy as np

from tasks.format.frames import Frames
from tasks.report.analysis import HeapReport
from tasks.report.calltree import COLUMNS, call_tree
from tasks.report.stack_tables import changes_html, functions_html, stack_changes, tree_html
from tasks.report.summary import stacks_line
from tasks.stacks.profile import StackProfile
from tests.tasks.report import stack_scenario as sc


def test_changes_match_stacks_by_names_and_say_new_and_gone():
    paths, a, b = stack_changes(sc.PROFILE, sc.LATER)
    byte = COLUMNS.index("bytes")
    got = {p: (int(a[i, byte]), int(b[i, byte])) for i, p in enumerate(paths)}
    assert got == {
        ("xmalloc", "parse", "main"): (1000, 0),
        ("xmalloc", "render", "main"): (500, 900),
        ("libx.so+0x44", "render", "main"): (4000, 2000),
        ("xmalloc", "eval", "eval", "main"): (64, 64),
        ("(no stack recorded)",): (8, 0),
        ("xmalloc", "main"): (0, 700),
    }
    page = changes_html(sc.PROFILE, sc.LATER)
    rows = re.findall(r"<tr><td>(.*?)</td>.*?<td class='n'>([^<]*)</td></tr>", page)
    # the bytes table first, by the size of the change: -2000, -1000, +700, +400, -8
    assert [r[0] for r in rows[:5]] == [
        "libx.so+0x44 ← render ← main",
        "xmalloc ← parse ← main",
        "xmalloc ← main",
        "xmalloc ← render ← main",
        "(no stack recorded)",
    ]
    assert [r[1] for r in rows[:5]] == ["", "gone in B", "new in B", "", "gone in B"]
    assert "-1.95 KiB" in page and "+400 B" in page
    # leaks: only libx.so's 4000 changed
    leaks = page.split("bytes leaked changed most")[1].split("<h4>")[0]
    assert leaks.count("<tr><td>") == 1 and "-3.91 KiB" in leaks


def _fan(n: int) -> StackProfile:
    """main calls n functions f0..f(n-1), f_i allocating (i + 1)² bytes once each."""
    frames = Frames(
        function=("main", *(f"f{i}" for i in range(n))),
        module=("/bin/p",) * (n + 1),
        offset=np.arange(n + 1, dtype=np.uint64),
    )
    ones = np.ones(n, np.int64)
    return StackProfile(
        frames,
        tuple(np.array([i + 1, 0], np.int32) for i in range(n)),
        calls=ones,
        bytes=np.arange(1, n + 1, dtype=np.int64) ** 2,
        peak=0 * ones,
        leaked=0 * ones,
        temporaries=0 * ones,
    )


def test_a_tree_folds_frames_under_one_percent_into_one_line():
    # GIVEN 200 callees of main, each 1 call of 200 (0.5%); 37 of them hold 1% of the bytes
    # or more (f163 on: 164² of 2,686,700)
    html = tree_html(call_tree(_fan(200)))
    shown = re.findall(r">(f\d+)</span>", html)
    # THEN only the 25 largest are rows, largest first, and the rest is one line with its sums
    assert shown == [f"f{i}" for i in range(199, 174, -1)]
    rest = sum(k * k for k in range(1, 176))
    assert re.search(
        r"… 175 more, the smallest \(25 shown at most\)</span><span class='n' title='175'>175</span>"
        rf"<span class='n' title='{rest:,}'>",
        html,
    )
    # the root and its first levels are open, each a <details>
    assert html.startswith("<details open><summary class='st-row'>")
    # GIVEN 20 callees, none with 1% of anything but their 5% of the calls: all shown; with
    # 300 (each 0.3% of the calls, the bytes as above): the rest are "each under 1%"
    assert "more," not in tree_html(call_tree(_fan(20)))
    assert re.search(r"… \d+ more, each under 1%", tree_html(call_tree(_fan(300))))


def test_functions_list_the_top_n_and_say_so():
    html = functions_html(_fan(40), n=10)
    assert "The 10 functions with the most bytes allocated under them, of 41." in html
    names = re.findall(r"<tr><td>([^<]+)</td><td>p</td>", html)
    assert names == ["main", *(f"f{i}" for i in range(39, 30, -1))]
    # all shown: no note
    assert "The " not in functions_html(sc.PROFILE).split("<table")[0]


def test_the_terminal_summary_names_the_stack_that_allocated_most():
    rep = HeapReport("run", "raw", None, 4, stacks=sc.PROFILE)
    assert stacks_line(rep) == ("5 distinct; most bytes: libx.so+0x44 <- render <- main (3.91 KiB)")
    rep.stacks = sc.without_frames(sc.PROFILE)
    assert stacks_line(rep) == "none recorded (heapcast trace --frames N records them)"
