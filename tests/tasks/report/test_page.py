"""The report's HTML page: self-contained, and every plot drawn by a real browser (headless
Chromium, Debian's `chromium`, installed by scripts/setup.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tasks.report.analysis import analyze
from tasks.report.page import figures, render, tree_lines
from tasks.report.sources import resolve
from tasks.report.summary import make_report
from tests.tasks.report import scenario as sc
from tests.tracegen import write_trace

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "chromium is not installed: run scripts/setup.sh (it installs Debian's chromium, "
            "which this test needs to draw the report's plots)"
        )
    return path


def browse(html_path, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",  # containers' /dev/shm is often tiny
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=20000",  # let every plot's promise settle before the dump
            *args,
            html_path.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def plots_drawn(html_path, tmp_path) -> int:
    r = browse(html_path, tmp_path, "--dump-dom")
    m = re.search(r"<title>[^<]*\[plots:(\d+)\]</title>", r.stdout)
    assert m, f"the page never reported its plots drawn (rc {r.returncode}): {r.stderr[-2000:]}"
    return int(m[1])


def assert_screenshot_not_blank(html_path, tmp_path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    r = browse(html_path, tmp_path, f"--screenshot={shot}", "--window-size=1400,3000")
    assert shot.is_file(), r.stderr[-2000:]
    img = Image.open(shot).convert("L")
    hist = img.histogram()
    white = hist[255] / sum(hist)
    assert img.getextrema()[0] < 128 and white < 0.97, f"blank screenshot ({white:.1%} white)"


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return sc.write_raw(tmp_path_factory.mktemp("raw") / "run")


def test_one_run_page_draws_every_plot_in_chromium(raw, tmp_path):
    res = make_report(str(raw), tmp_path / "report.html")
    page = res.html_path.read_text()
    n = len(figures(res.reports))
    # GIVEN a page: self-contained (plotly.js inlined once, no script from the network)
    assert n == 10  # nine + callers (pid 100 recorded them)
    assert page.count('class="plotly-graph-div"') == n
    assert not re.search(r"<script[^>]+src=", page) and page.count("plotly.js v") <= 2
    # WHEN Chromium opens it THEN every figure is drawn, with its traces
    assert plots_drawn(res.html_path, tmp_path) == n
    assert_screenshot_not_blank(res.html_path, tmp_path)


def test_diff_page_draws_every_plot_in_chromium(raw, tmp_path):
    other = tmp_path / "other"
    write_trace(other / "100-1.hct", sc.PARENT[:6], pid=100)  # no callers in B
    res = make_report(str(raw), tmp_path / "diff.html", diff=str(other))
    n = len(figures(res.reports))
    assert n == 10 and res.html_path.read_text().count('class="plotly-graph-div"') == n
    assert plots_drawn(res.html_path, tmp_path) == n


def test_page_shows_the_numbers_and_the_tree(raw, tmp_path):
    rep = analyze(resolve(str(raw)))
    page = render([rep])
    for text in ("6.57 KiB (6,724 B)", "4 blocks, 2.38 KiB", "0xa", "first seen in", "pid 100"):
        assert text in page, text
    assert tree_lines(rep) == [
        "pid 100 (ppid 1) prog run  [9 calls, 1 thread(s), peak 5.88 KiB, 2 never freed]",
        "    pid 101 (ppid 100) prog child  [3 calls, 2 thread(s), peak 700 B, 1 never freed]",
        "    exec → pid 101 (ppid 100) /bin/true  [1 calls, 1 thread(s), peak 16 B, 1 never freed]",
    ]


def test_warnings_are_on_the_page(raw, tmp_path):
    shutil.copytree(raw, tmp_path / "run")
    (tmp_path / "run" / "9-9.hct").write_bytes(b"junk")
    res = make_report(str(tmp_path / "run"), tmp_path / "w.html")
    page = res.html_path.read_text()
    assert "Warnings" in page and "9-9.hct: does not look like a heapcast trace" in page


def test_a_run_without_heap_calls_is_a_page_too(tmp_path):
    from tests.tracegen import thread_start

    write_trace(tmp_path / "run" / "5-1.hct", [thread_start(0, 5)], pid=5, cmdline=("idle",))
    res = make_report(str(tmp_path / "run"), tmp_path / "empty.html")
    assert res.reports[0].events == 0 and "0 heap calls, 1 process(es)" in res.text
    n = len(figures(res.reports))
    assert plots_drawn(res.html_path, tmp_path) == n == 7
    assert "pid 5 (ppid 1) idle" in res.html_path.read_text()


def test_a_trace_without_call_sites_says_so_on_the_page_and_in_the_summary(raw, tmp_path):
    # GIVEN a trace recorded without callers (heapcast trace --no-caller)
    write_trace(tmp_path / "bare" / "100-1.hct", sc.PARENT[:6], pid=100)
    res = make_report(str(tmp_path / "bare"), tmp_path / "bare.html")
    said = "this trace has no call sites (recorded with --no-caller)"
    # THEN the summary and the page say so plainly
    assert f"  callers     none: {said}: no callers to show; trace it again without" in res.text
    assert f"<p class='note'>Callers: {said}: no callers to show;" in res.html_path.read_text()
    # and beside a run that has them, that run's callers section names the one without
    res = make_report(str(raw), tmp_path / "diff.html", diff=str(tmp_path / "bare"))
    page = res.html_path.read_text()
    assert f"{res.reports[1].label}: {said}" in page and "Callers: " not in page
    # a trace with callers says none of it
    res = make_report(str(raw), tmp_path / "one.html")
    assert said not in res.text and said not in res.html_path.read_text()
