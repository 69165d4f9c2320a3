"""hc-measure, built from native/measure/hc_measure.c: a static binary that runs a program and
reports what it cost."""

from __future__ import annotations

import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from tasks.replay.runners import measure_tool
from tasks.replay.runners.measure_tool import (
    MeasureToolError,
    build_measure_tool,
    measured_command,
    usage_from_report,
)
from tests.conftest import need_tool


def test_hc_measure_builds_static_from_native_and_measures_a_program(tmp_path):
    # GIVEN the helper's source in native/measure/ and gcc
    need_tool("gcc", "gcc")
    assert measure_tool.SOURCE.parts[-3:] == ("native", "measure", "hc_measure.c")

    # WHEN it is built (twice: the second build is the cached binary) and runs `echo`
    tool = build_measure_tool(tmp_path / "cache")
    assert build_measure_tool(tmp_path / "cache") == tool
    out = tmp_path / "m"
    out.mkdir()
    argv = measured_command(str(tool), str(out), ["/bin/echo", "hello"], cgroup=False)
    proc = subprocess.run(argv, capture_output=True, text=True)

    # THEN it is static (LD_PRELOAD never loads into it), the program's output is in the file,
    # and the report reads back as a ResourceUsage
    assert proc.returncode == 0, proc.stderr
    with open(tool, "rb") as f:
        assert not [s for s in ELFFile(f).iter_segments() if s["p_type"] == "PT_INTERP"]
    assert (out / "stdout").read_text() == "hello\n"
    usage = usage_from_report((out / "usage").read_text())
    assert usage.peak_source == "ru_maxrss" and usage.max_process_rss_bytes > 0


def test_a_missing_source_is_named(tmp_path, monkeypatch):
    # GIVEN an installation without the repository's native/ folder
    monkeypatch.setattr(measure_tool, "SOURCE", tmp_path / "native" / "measure" / "hc_measure.c")
    # WHEN hc-measure is built THEN the error names the missing file
    with pytest.raises(MeasureToolError, match=r"native/measure/hc_measure\.c is missing"):
        build_measure_tool(tmp_path / "cache")


def test_hc_measure_averages_the_programs_memory_over_its_run(tmp_path):
    """GIVEN a program that holds 96 MB for 200 ms, then next to nothing for 600 ms, WHEN
    hc-measure runs it on the host (no cgroup of its own), THEN the report has the program
    process's resident set averaged over the run, sampled every 10 ms: about a quarter of its
    peak (96 * 0.2 / 0.8 = 24 MB), where ru_maxrss says 96."""
    need_tool("gcc", "gcc")
    tool = build_measure_tool(tmp_path / "cache")
    shape = tmp_path / "mem_shape"
    src = measure_tool.PROJECT_DIR / "tests" / "tasks" / "allocators" / "programs" / "mem_shape.c"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(shape), str(src)], check=True)
    out = tmp_path / "m"
    out.mkdir()
    argv = measured_command(str(tool), str(out), [str(shape), "96", "200", "600"], cgroup=False)
    assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
    report = (out / "usage").read_text()
    usage = usage_from_report(report)
    mb = 1 << 20
    assert usage.max_process_rss_bytes >= 96 * mb, report
    assert "process_mean_samples=" in report and usage.mean_memory_bytes is not None, report
    assert 12 * mb < usage.mean_memory_bytes < 0.5 * usage.max_process_rss_bytes, report
