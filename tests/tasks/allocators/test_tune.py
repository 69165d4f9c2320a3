"""`heapcast tune` on real programs of this host (tasks.allocators.tune): seed 002's numpy case
shortened, a C program freeing 40 MiB blocks (the trace's derived candidate run, in force, its
output unchanged), and each bad input: a program failing under glibc, a missing candidate
library, an output that differs run to run, a static program, a program that does not exist.
No timing assertions: which candidate wins on a shared machine is not asserted, the answer's
shape and its checks are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.tune import TuneError, tune
from tasks.core.config import PROJECT_DIR
from tests.native.tracer_harness import PROGRAMS

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
    # candidates asked for: exactly those measured, nothing derived or ruled out
    assert [a.name for a in m.allocators] == ["glibc", "glibc-fixed", "tcmalloc"]
    assert out.advice is not None and not out.advice.ruled_out and not out.advice.derived
    # the traced run read: 8 MB temporaries freed again and again
    assert out.facts is not None and out.facts.large_churn
    assert out.facts.largest_churned >= 8_000_000
    # every run measured, verified in force, with glibc's output; glibc ran every round, a
    # candidate dropped early ran at least 2
    rounds = max(s.rep for s in m.samples)
    assert all(s.ok and s.applied for s in m.samples)
    assert sum(s.allocator == "glibc" for s in m.samples) == rounds
    assert all(sum(s.allocator == n for s in m.samples) >= 2 for n in ("glibc-fixed", "tcmalloc"))
    assert {p.status for p in out.pairs} == {"ok"} and {p.output for p in out.pairs} == {"same"}
    assert out.output_note is None and out.stopped
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
    # the progress bar saw every run (the traced one first, the check run last), then the end
    assert calls[0][2] == "traced run"
    assert calls[-1][0] == calls[-1][1] == 1 + len(m.samples) + (out.check is not None)
    assert "What the traced run showed" in out.table and "stopped: " in out.table


def test_tune_derives_glibc_settings_from_the_trace_and_runs_them_in_force(config, tmp_path):
    # GIVEN a small C program that allocates, touches and frees a 40 MiB block, 12 times
    # (-fno-builtin: gcc may otherwise drop the malloc/free pair)
    prog = tmp_path / "big_blocks"
    subprocess.run(
        ["cc", "-O1", "-fno-builtin", "-o", str(prog), str(PROGRAMS / "large_churn.c")],
        check=True,
    )
    # WHEN tune runs it with the config's list
    out = tune([str(prog)], config, html_out=tmp_path / "tune.html", cpus=2)
    # THEN the trace showed the 40 MiB blocks, and glibc-derived was derived from them
    assert [(c.size, c.count) for c in out.facts.large_churn] == [(40 << 20, 12)]
    derived = next(a for a in out.measurements.allocators if a.name == "glibc-derived")
    tunables = derived.env["GLIBC_TUNABLES"]
    assert "glibc.malloc.mmap_threshold=" in tunables and "trim_threshold=" in tunables
    threshold = int(tunables.split("mmap_threshold=")[1].split(":")[0])
    assert threshold > 40 << 20
    # the fixed glibc settings were ruled out by the trace, and said so
    assert "glibc-fixed" in out.advice.ruled_out
    assert "glibc-fixed" not in {a.name for a in out.measurements.allocators}
    # it ran, verified in force, with glibc's output
    runs = [s for s in out.measurements.samples if s.allocator == "glibc-derived"]
    assert len(runs) >= 2 and all(s.ok and s.applied for s in runs)
    pair = next(p for p in out.pairs if p.allocator == "glibc-derived")
    assert pair.status == "ok" and pair.output == "same"
    # fewer page faults than glibc's: the freed blocks stay in the heap
    assert (
        pair.stats["minor_faults"].median
        < 0.5 * next(p for p in out.pairs if p.allocator == "glibc").stats["minor_faults"].median
    )
    # the answer: the facts, the reasons, the check run of the choice alone
    assert "40.0 MiB x12" in out.table and "glibc-derived (GLIBC_TUNABLES=" in out.table
    if out.recommendation.allocator != "glibc":
        assert out.check is not None and out.check.error is None and out.check.output_same
        assert "check run of " in out.table
    page = (tmp_path / "tune.html").read_text()
    assert "What the traced run showed" in page and "Not run" in page


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


def test_a_program_failing_only_when_traced_is_measured_without_advice(config):
    # the program refuses to run traced (it sees the tracer's variable), and works alone
    prog = [
        sys.executable,
        "-c",
        "import os, sys; sys.exit(5 if 'HEAPCAST_OUT' in os.environ else 0)",
    ]
    out = tune(prog, config, candidates=["glibc", "jemalloc"], repetitions=5, warmup=0)
    assert out.facts is None and out.advice is None
    assert "the traced run failed (exit 5" in out.table and "no advice from the trace" in out.table
    assert {s.allocator for s in out.measurements.samples} == {"glibc", "jemalloc"}


@pytest.fixture(scope="module")
def burstkv(tmp_path_factory):
    exe = tmp_path_factory.mktemp("burstkv") / "burstkv"
    src = PROJECT_DIR / "benchmarks" / "programs" / "burstkv.c"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(src)], check=True)
    return exe


def test_tune_for_memory_proposes_placement_on_a_real_bursty_program(config, burstkv, tmp_path):
    """GIVEN a real program whose small requests come and go in bursts while entries from a call
    site of their own stay (benchmarks/programs/burstkv.c, 6 bursts of 100 k: the last bursts'
    entries are freed young at exit, the others outlive the layer's horizon), WHEN it is tuned
    for memory averaged over the run (what placement lowers where the peak stays), THEN its
    trace shows the long blocks' own site, jemalloc-place is derived with the reason, and it is
    measured for real: in force, with the program's output, every run's mean memory sampled."""
    out = tune(
        [str(burstkv), "6", "100000", "100"],
        config,
        objective="memory",
        memory="mean_rss_mb",
        repetitions=2,
        max_repetitions=2,
        warmup=0,
        html_out=tmp_path / "tune.html",
    )
    assert out.facts is not None
    small = out.facts.small
    # the entries' site is long; a couple of the C library's own blocks outlive the bursts too
    assert small.long_sites >= 1 and small.long_from_long_sites >= 0.99 * small.long_blocks > 0
    assert out.advice is not None and "jemalloc-place" in [a.name for a in out.advice.derived]
    assert out.advice.place.startswith("proposed: small blocks came and went"), out.advice.place
    # with and without jemalloc returning freed pages at once, each in force
    for name in ("jemalloc-place", "jemalloc-place-prompt", "jemalloc-prompt"):
        placed = [s for s in out.measurements.samples if s.allocator == name]
        assert placed and all(s.ok and s.applied for s in placed), (name, placed)
    # the memory it judges: averaged over each run (the program process's, sampled), under the
    # peak, shown beside it
    assert all(0 < s.mean_rss_mb <= s.peak_rss_mb for s in out.measurements.samples if s.ok)
    assert out.recommendation.memory_metric == "mean_rss_mb" and "mean RSS MB" in out.table
    # a memory recommendation says what it costs in time
    rec = out.recommendation
    if rec.allocator not in (None, rec.baseline):
        assert "its time" in out.table, out.table
    assert {p.output for p in out.pairs} == {"same"}
    assert "jemalloc-place" in out.table


def test_tune_names_the_memory_it_can_judge(config):
    """A memory metric heapcast does not measure is refused by name, before anything runs."""
    with pytest.raises(
        TuneError,
        match="memory must be one of peak_rss_mb, max_process_rss_mb, mean_rss_mb, not 'rss'",
    ):
        tune(["/bin/true"], config, objective="memory", memory="rss")
