"""The report's HTML page: self-contained, and every plot drawn by a real browser (headless
Chromium, Debian's `chromium`, installed by scripts/setup.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from tasks.report.analysis import analyze
from tasks.report.page import figures, render, tree_lines
from tasks.report.sources import resolve
from tasks.report.summary import make_report
from tests.native.tracer_harness import NATIVE, tracer_env
from tests.tasks.report import scenario as sc
from tests.tasks.stacks import known_stacks as known
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


# ------------------------------------------------------------------------ the stacks' section


class _FlameDom(HTMLParser):
    """What a dumped page's flame graphs show: per `div.flame`, its attributes and its drawn
    frames (name, width, fill)."""

    def __init__(self) -> None:
        super().__init__()
        self.graphs: dict[str, dict] = {}
        self._in: str | None = None
        self._frame: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "flame" in (a.get("class") or "").split():
            self._in = a["id"]
            self.graphs[self._in] = {"attrs": a, "frames": []}
        elif tag == "g" and self._in and a.get("class", "").startswith("frame"):
            self._frame = {"name": a["name"], "width": float(a["width"])}
            self.graphs[self._in]["frames"].append(self._frame)
        elif tag == "rect" and self._frame is not None:
            self._frame["fill"] = a.get("fill")


def flame_dom(html_path, tmp_path, address: str = "") -> dict[str, dict]:
    r = browse(html_path, tmp_path, "--dump-dom", "--window-size=1400,1000")
    if address:  # browse() opens the file's URI: open it again with the address's fragment
        r = subprocess.run(
            [a if not a.startswith("file:") else a + address for a in r.args],
            capture_output=True,
            text=True,
            timeout=180,
        )
    dom = _FlameDom()
    dom.feed(r.stdout)
    assert dom.graphs, f"no flame graph in the page (rc {r.returncode}): {r.stderr[-2000:]}"
    return dom.graphs


def _widths(graph) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for f in graph["frames"]:
        out.setdefault(f["name"], []).append(f["width"])
    return out


@pytest.fixture(scope="module")
def stack_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stacks") / "run"
    known.write_run(folder)
    return folder


def test_flame_graph_draws_the_stacks_in_chromium(stack_run, tmp_path):
    # GIVEN the page of a run recorded with stacks (two processes of /bin/prog, not on this
    # machine: frames are named prog+0x...)
    res = make_report(str(stack_run), tmp_path / "stacks.html")
    page = res.html_path.read_text()
    assert "d3-flame-graph 5.0.0" in page and not re.search(r"<script[^>]+src=", page)
    # WHEN Chromium draws it THEN the graph is weighed by bytes: each frame's width is its
    # share of the 2,658 bytes allocated (A and B under 0x1200: 1,650; C: 1,000; D: 8)
    g = flame_dom(res.html_path, tmp_path)["flame-a"]
    assert g["attrs"]["data-drawn"] == "1" and g["attrs"]["data-total"] == "2658"
    w = _widths(g)
    full = w["all"][0]
    assert full >= 600
    for name, share in (("prog+0x1200", 1650), ("prog+0x1300", 1000), ("prog+0x1020", 1000)):
        assert w[name] == [pytest.approx(full * share / 2658)], name
    assert sorted(w["prog+0x1010"]) == pytest.approx([full * 650 / 2658, full * 1000 / 2658])


def test_flame_graph_weight_and_search_from_the_address(stack_run, tmp_path):
    res = make_report(str(stack_run), tmp_path / "stacks.html")
    # WHEN weighed by what leaked: only C's 1,000 bytes (0x1010 under 0x1300) are drawn
    g = flame_dom(res.html_path, tmp_path, "#weight=leaked")["flame-a"]
    assert g["attrs"]["data-weight"] == "leaked" and g["attrs"]["data-total"] == "1000"
    assert _widths(g) == {
        n: [pytest.approx(_widths(g)["all"][0])] for n in ("all", "prog+0x1300", "prog+0x1010")
    }
    # and by the peak: B's 1,000 and C's 1,000
    g = flame_dom(res.html_path, tmp_path, "#weight=peak")["flame-a"]
    assert g["attrs"]["data-total"] == "2000"
    # WHEN searching a frame THEN its frames are highlighted, and their bytes summed
    g = flame_dom(res.html_path, tmp_path, "#search=0x1010")["flame-a"]
    lit = {f["name"] for f in g["frames"] if f["fill"] == "#E600E6"}
    assert lit == {"prog+0x1010"} and g["attrs"]["data-search-matches"] == "2"
    assert g["attrs"]["data-search-value"] == "1650"  # A's 650 and C's 1,000


# What a user does, as events: weigh by the peak, click a frame, type in the search box.
_USER = """<script>window.addEventListener('load', function () { setTimeout(function () {
  var div = document.getElementById('flame-a');
  div.querySelector("input[value='peak']").click();
  setTimeout(function () {
    var g = Array.from(div.querySelectorAll('g.frame'))
      .find(function (g) { return g.getAttribute('name') === 'prog+0x1300'; });
    g.dispatchEvent(new MouseEvent('click', {bubbles: true}));
    var s = div.querySelector('.flame-search');
    s.value = '0x1020';
    s.dispatchEvent(new Event('input'));
  }, 1000);
}, 500); });</script>"""


def test_clicks_switch_the_weight_zoom_and_search(stack_run, tmp_path):
    res = make_report(str(stack_run), tmp_path / "stacks.html")
    clicked = tmp_path / "clicked.html"
    clicked.write_text(res.html_path.read_text().replace("</body>", _USER + "</body>"))
    g = flame_dom(clicked, tmp_path)["flame-a"]
    # THEN the switch weighs by the peak (B's 1,000 and C's 1,000 bytes)
    assert g["attrs"]["data-weight"] == "peak" and g["attrs"]["data-total"] == "2000"
    # the click zoomed into C's frame: it spans the graph, its sibling is gone
    w = _widths(g)
    assert w["prog+0x1300"] == [pytest.approx(w["all"][0])] and "prog+0x1200" not in w
    # and the search found B's frame (outside the zoom: highlighted, its bytes not shown)
    assert g["attrs"]["data-search-matches"] == "1"


def test_two_runs_draw_a_differential_graph_and_the_changed_stacks(stack_run, tmp_path):
    # GIVEN B: the same run without its second process (pid 11: A's 500 and B's 800)
    one = tmp_path / "one"
    one.mkdir()
    first = sorted(stack_run.glob("10-*.hct"))[0]
    (one / first.name).write_bytes(first.read_bytes())
    res = make_report(str(stack_run), tmp_path / "diff.html", diff=str(one))
    graphs = flame_dom(res.html_path, tmp_path)
    assert {k: v["attrs"]["data-total"] for k, v in graphs.items()} == {
        "flame-a": "2658",
        "flame-b": "1358",
        "flame-diff": "1358",
    }
    # B allocated less under 0x1200 (-500 in A's stack, -800 in B's): blue frames
    fills = {f["name"]: f["fill"] for f in graphs["flame-diff"]["frames"]}
    assert fills["prog+0x1020"].startswith("rgb(") and fills["prog+0x1020"].endswith(",255)")
    assert fills["prog+0x1300"] == "rgb(220,220,220)"  # C: unchanged
    page = res.html_path.read_text()
    assert "Stacks whose bytes allocated changed most (B − A)" in page


def test_a_run_without_stacks_says_how_to_record_them(raw, tmp_path):
    res = make_report(str(raw), tmp_path / "nostacks.html")
    page = res.html_path.read_text()
    assert res.reports[0].stacks is None
    assert "<p class='note'>Call stacks: this run's traces hold no call stacks" in page
    assert "trace it again with `heapcast trace --frames N`" in page
    assert "class='flame'" not in page and "d3-flame-graph" not in page


# A program with a known call tree: parse allocates 10 x 100 bytes through xalloc, each freed;
# render allocates 4,000 bytes through xalloc, never freed.
KNOWN_TREE_C = r"""
#include <stdlib.h>
__attribute__((noinline)) void *xalloc(size_t n) { void *p = malloc(n); if (!p) abort(); return p; }
__attribute__((noinline)) void parse(void) { for (int i = 0; i < 10; i++) free(xalloc(100)); }
__attribute__((noinline)) void *render(void) { return xalloc(4000); }
int main(void) { parse(); void *volatile kept = render(); (void)kept; return 0; }
"""


@pytest.mark.integration
def test_a_real_programs_stacks_in_the_flame_graph(tmp_path):
    # GIVEN the tracer, and a program built with its symbols, traced 16 frames deep
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    src = tmp_path / "tree.c"
    src.write_text(KNOWN_TREE_C)
    exe = tmp_path / "tree"
    subprocess.run(["gcc", "-O1", "-g", "-fno-builtin", "-o", str(exe), str(src)], check=True)
    out = tmp_path / "run"
    out.mkdir()
    lib = NATIVE / "build" / "libheapcast.so"
    env = tracer_env(lib, out, HEAPCAST_FRAMES="16")
    assert subprocess.run([str(exe)], env=env, timeout=60).returncode == 0
    # WHEN reported and drawn by Chromium
    res = make_report(str(out), tmp_path / "tree.html")
    assert "most bytes: xalloc <- render <- main <- ..." in res.text
    w = _widths(flame_dom(res.html_path, tmp_path)["flame-a"])
    # THEN the known frames are there, by name, and render's width is 4x parse's
    assert {"main", "parse", "render", "xalloc"} <= set(w)
    assert w["render"][0] / w["parse"][0] == pytest.approx(4000 / 1000)
    assert len(w["xalloc"]) == 2  # one under each caller
    # and by what leaked: render's block, not parse's
    leaked = _widths(flame_dom(res.html_path, tmp_path, "#weight=leaked")["flame-a"])
    assert "render" in leaked and "parse" not in leaked
