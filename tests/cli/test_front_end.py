"""The front end itself, run as a user runs it (the installed `heapcast`): start-up imports,
a closed output pipe, --version, --help with a worked example per command, and `report`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.tasks.report import scenario as sc

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

HEAPCAST = Path(sys.executable).with_name("heapcast")
HEAVY = ("prefect", "tensorflow", "pyarrow", "mlflow", "dask", "plotly")


def heapcast(*args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(HEAPCAST), *args], cwd=cwd, capture_output=True, text=True, timeout=300, **kw
    )


def imported(*args: str, cwd: Path) -> set[str]:
    """Top-level packages the command imports (python -X importtime)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", str(HEAPCAST), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    mods = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", r.stderr, re.M)
    assert mods, r.stderr[-2000:]
    return {m.split(".")[0] for m in mods}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return sc.write_raw(tmp_path_factory.mktemp("cli") / "run")


@pytest.fixture(scope="module")
def tracer() -> None:
    from tasks.format.build import build_tracer

    build_tracer.fn()  # up to date: `trace` must not need tasks.format.build (Prefect)


def test_inspect_and_trace_start_without_heavy_imports(raw, tmp_path, tracer):
    files = [str(p) for p in sorted(raw.glob("*.hct"))]
    assert not imported("inspect", *files, cwd=tmp_path) & set(HEAVY)
    assert not imported("trace", "-o", "out", "--", "true", cwd=tmp_path) & set(HEAVY)
    assert not imported("--version", cwd=tmp_path) & {*HEAVY, "numpy"}
    assert not imported("--help", cwd=tmp_path) & {*HEAVY, "numpy"}


def test_output_into_a_closed_pipe_ends_quietly(raw, tmp_path):
    files = [str(p) for p in sorted(raw.glob("*.hct"))] * 50  # more than a pipe's buffer
    # GIVEN a pipe whose reader is gone before heapcast writes a byte
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        p = subprocess.run(
            [str(HEAPCAST), "inspect", *files],
            stdout=w_fd,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(w_fd)
    # THEN no traceback, and a failure status (as the Python docs' recipe: 1)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.returncode == 1
    # AND as a user meets it: `heapcast inspect ... | head -1`, for inspect and report
    for cmd in (
        ["inspect", *files],
        ["report", str(raw), "-o", str(tmp_path / "r.html")],
    ):
        line = " ".join(f"'{a}'" for a in [str(HEAPCAST), *cmd])
        sh = subprocess.run(
            ["bash", "-c", f"{line} | head -1; exit ${{PIPESTATUS[0]}}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in sh.stderr and "BrokenPipe" not in sh.stderr, sh.stderr
        assert len(sh.stdout.splitlines()) == 1 and sh.returncode in (0, 1)


def test_version():
    r = heapcast("--version")
    assert r.returncode == 0 and r.stdout == f"heapcast {version('heapcast')}\n"


def test_help_has_a_worked_example_per_command():
    r = heapcast("--help")
    assert r.returncode == 0
    for example in (
        "heapcast trace -o traces -- ",
        "heapcast inspect traces/",
        "heapcast report traces/",
        "--diff",
        "heapcast run --quick",
    ):
        assert example in r.stdout, example
    for cmd, example in (
        ("trace", "heapcast trace -o traces -- sqlite3"),
        ("inspect", "heapcast inspect traces/*/*.hct"),
        ("report", "heapcast report git/medium --diff git/small"),
    ):
        h = heapcast(cmd, "--help")
        assert h.returncode == 0 and "example" in h.stdout and example in h.stdout, cmd


def test_report_writes_the_page_and_prints_a_summary(raw, tmp_path):
    r = heapcast("report", str(raw), "-o", "out/report.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    page = tmp_path / "out" / "report.html"
    assert page.is_file() and page.stat().st_size > 1_000_000  # plotly.js is inside
    lines = r.stdout.splitlines()
    assert lines[0].endswith(": 13 heap calls, 3 process(es), 4 thread(s), 0.000 s")
    assert "peak live   6.57 KiB at +0.000 s, 5.88 KiB in pid 100 prog" in lines[1]
    assert "size classes 13 [4 KiB, 8 KiB): 4.88 KiB" in lines[1]
    assert "leaked      4 blocks, 2.38 KiB never freed" in r.stdout
    assert "temporary   3 blocks (38%) freed within 4 calls" in r.stdout
    assert "callers     0x0 3 calls, 0xa 2 calls, 0xb 2 calls (4 distinct)" in r.stdout
    assert f"report      out{os.sep}report.html" in r.stdout


def test_report_by_workload_and_run_under_a_root_and_a_diff(raw, tmp_path):
    sc.write_events(raw, tmp_path / "root", workload="hand", run="r1")
    sc.write_raw(tmp_path / "root" / "raw" / "hand" / "r2")
    r = heapcast(
        "report", "hand/r1", "--diff", "hand/r2", "--root", str(tmp_path / "root"), cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "difference (A = hand/r1, B = hand/r2):" in r.stdout
    assert "peak live   6.57 KiB -> 6.57 KiB (+0%)" in r.stdout
    assert (tmp_path / "report.html").is_file()


def test_report_names_bad_input_and_says_why(raw, tmp_path):
    (tmp_path / "empty").mkdir()
    r = heapcast("report", str(tmp_path / "empty"), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{tmp_path / 'empty'}: no heapcast traces" in r.stderr
    r = heapcast("report", "nosuch/run", "--root", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 1 and "nosuch/run: no such run under the data root" in r.stderr
    # a corrupt file among good ones: a warning naming it, the rest reported
    import shutil

    shutil.copytree(raw, tmp_path / "run")
    (tmp_path / "run" / "3-3.hct").write_bytes(b"junk" * 30)
    r = heapcast("report", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 0 and "13 heap calls" in r.stdout
    assert re.search(r"heapcast report: warning: .*3-3\.hct: does not look like", r.stderr)
    assert not (tmp_path / "empty" / "report.html").exists()
