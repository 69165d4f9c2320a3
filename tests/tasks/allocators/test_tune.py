"""`heapcast tune` on real programs of this host (tasks.allocators.tune): seed 002's numpy case
shortened, and each bad input: a program failing under glibc, a missing candidate library, an
output that differs run to run, a static program, a program that does not exist.
No timing assertions: which candidate wins on a shared machine is not asserted, the answer's
shape and its checks are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.tune import TuneError, tune

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

# seed 002's case, shortened: (a * b) ** 2 + 3 on 1 M-element arrays (8 MB temporaries, each
# above glibc's mmap threshold), a few iterations
NUMPY_002 = [
    sys.executable,
    "-c",
    "import numpy as np\n"
    "a = np.arange(1_000_000, dtype=np.float64); b = np.ones(1_000_000)\n"
    "for _ in range(5):\n    c = (a * b) ** 2 + 3\n"
    "print(float(c[12345]))",
]


@pytest.fixture(scope="module")
def config():
    return load_allocators_config()


def test_tune_on_seed_002_numpy(config, tmp_path):
    calls = []
    out = tune(
        NUMPY_002,
        config,
        candidates=["glibc", "glibc-fixed", "tcmalloc"],
        repetitions=5,
        max_repetitions=5,
        warmup=0,
        html_out=tmp_path / "tune.html",
        progress=lambda done, total, what: calls.append((done, total, what)),
    )
    m = out.measurements
    assert [a.name for a in m.allocators] == ["glibc", "glibc-fixed", "tcmalloc"]
    # every run measured, verified in force, with glibc's output
    assert len(m.samples) == 15 and all(s.ok and s.applied for s in m.samples)
    assert {p.status for p in out.pairs} == {"ok"} and {p.output for p in out.pairs} == {"same"}
    assert out.output_note is None
    assert out.recommendation.compared == 2
    assert out.recommendation.allocator in ("glibc", "glibc-fixed", "tcmalloc")
    # the table: each candidate relative to glibc, the verdict, the line to paste
    for name in ("glibc", "glibc-fixed", "tcmalloc"):
        assert name in out.table
    assert "×" in out.table and out.line.endswith(NUMPY_002[-1].splitlines()[-1] + "'")
    if out.recommendation.allocator == "tcmalloc":
        assert out.line.startswith("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal")
    if out.recommendation.allocator == "glibc-fixed":
        assert out.line.startswith("GLIBC_TUNABLES=glibc.malloc.arena_max=2:")
    page = (tmp_path / "tune.html").read_text()
    assert "heapcast tune" in page and "fig-tune" in page and "heapcastPlotDrawn" in page
    # the progress bar saw every run, then the end
    assert calls[-1][0] == calls[-1][1] == 1 + 15


def test_a_program_failing_under_glibc_is_a_clear_error(config):
    with pytest.raises(TuneError, match=r"exits 3 under glibc .*fix the command first"):
        tune([sys.executable, "-c", "import sys; sys.exit(3)"], config, candidates=["glibc"])


def test_a_missing_library_is_named_with_its_package_and_the_others_measured(config, tmp_path):
    nosuch = Allocator(name="nosuch", library="/nonexistent/libnosuch.so.1", package="libnosuch1")
    cfg = config.model_copy(update={"allocators": [*config.allocators, nosuch]})
    out = tune(
        ["/bin/true"], cfg, candidates=["glibc", "jemalloc", "nosuch"], repetitions=5, warmup=0
    )
    (u,) = out.measurements.unavailable
    assert u.allocator == "nosuch" and "apt-get install libnosuch1" in u.message
    assert "not measured: candidate 'nosuch'" in out.table
    assert {s.allocator for s in out.measurements.samples} == {"glibc", "jemalloc"}


def test_an_output_that_differs_run_to_run_compares_exit_codes_only(config):
    out = tune(
        [sys.executable, "-c", "import time; print(time.time_ns())"],
        config,
        candidates=["glibc", "jemalloc"],
        repetitions=5,
        warmup=0,
    )
    assert out.output_note is not None and "only exit codes are" in out.output_note
    assert all(p.status == "ok" for p in out.pairs)
    assert "note: " in out.table


def test_a_static_program_cannot_be_tuned(config, tmp_path):
    prog = tmp_path / "static"
    src = b'#include <stdio.h>\nint main(void){puts("hi");return 0;}\n'
    subprocess.run(["gcc", "-static", "-o", str(prog), "-x", "c", "-"], input=src, check=True)
    with pytest.raises(TuneError, match="LD_PRELOAD cannot reach .*statically linked"):
        tune([str(prog)], config, candidates=["glibc", "jemalloc"])


def test_a_program_that_does_not_exist(config):
    with pytest.raises(TuneError, match="program not found: no-such-program"):
        tune(["no-such-program"], config)
    with pytest.raises(TuneError, match="no candidate hoard"):
        tune(["/bin/true"], config, candidates=["glibc", "hoard"])
