"""Integration: the test program under the four allocators, measured through the real engine.

Needs an engine (`scripts/engine.sh up`); with CI=true a missing engine is a failure, elsewhere
these tests skip. The program (programs/alloc_mix.c) runs in the sqlite3 image, which has the
allocators installed; its stdout depends only on its seeds, so it must be the same under every
allocator, untraced and traced. No test here depends on how fast anything is.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tasks.allocators.config import Allocator
from tasks.allocators.measure import (
    AllocatorMissing,
    Case,
    check_allocators,
    measure_cases,
    round_orders,
)
from tasks.allocators.stats import analyse
from tasks.core.storage import Root
from tasks.replay.runners.docker_runner import DockerRunner
from tests.tasks.replay.replay_checks import tracer_path

pytestmark = pytest.mark.integration

NOSUCH = Allocator(
    name="nosuch", library="/usr/lib/x86_64-linux-gnu/libnosuch.so.1", package="libnosuch1"
)


def _case(catalog, name: str) -> Case:
    w = catalog.get(name)
    return Case(w, w.inputs[0], name)


@pytest.fixture(scope="module")
def measured(sqlite3_image, alloc_catalog, config, tmp_path_factory):
    """alloc_mix under the four allocators: 5 rounds after a warm-up, through docker."""
    root = Root.from_url(str(tmp_path_factory.mktemp("root")))
    return measure_cases([_case(alloc_catalog, "alloc_mix")], config, root, runner="docker")


def test_every_round_runs_each_allocator_once_in_balanced_order(measured, config):
    names = config.names()
    assert measured.runner == "docker" and measured.repetitions == 5 and measured.warmup == 1
    assert len(measured.samples) == 5 * len(names)
    for rep in range(1, 6):
        in_round = sorted((s for s in measured.samples if s.rep == rep), key=lambda s: s.position)
        assert [s.allocator for s in in_round] == round_orders(names, 5)[rep - 1]
    assert Counter(s.allocator for s in measured.samples) == {n: 5 for n in names}
    # every run verified in force inside the container (the probe, mounted read-only)
    assert all(s.applied for s in measured.samples)


def test_the_output_is_the_same_under_every_allocator_and_usage_is_measured(measured):
    assert all(s.ok and s.exit_code == 0 and not s.timed_out for s in measured.samples)
    assert len({s.stdout_sha256 for s in measured.samples}) == 1
    for s in measured.samples:
        assert s.stdout_bytes > 0 and s.wall_s > 0 and s.cpu_s > 0
        assert s.user_s >= 0 and s.sys_s >= 0 and s.minor_faults > 0 and s.major_faults >= 0
        # the container's cgroup peak (v2 memory.peak or v1 max_usage_in_bytes)
        assert s.peak_source.startswith("cgroup") and s.peak_rss_mb > 0
        assert s.max_process_rss_mb > 0
        # and its memory averaged over the run, sampled: never above its peak
        assert 0 < s.mean_rss_mb <= s.peak_rss_mb
        assert s.run_s >= s.wall_s  # the container's start and removal come on top


def test_analysis_finds_every_pair_clean_and_recommends_one(measured, config):
    pairs, (rec,) = analyse(measured, config)
    assert {p.allocator: (p.status, p.output) for p in pairs} == {
        n: ("ok", "same") for n in config.names()
    }
    assert rec.allocator in config.names()
    assert all(p.stats["wall_s"].min <= p.stats["wall_s"].median for p in pairs)


def test_each_allocator_is_really_loaded_in_the_container(
    sqlite3_image, alloc_catalog, config, tmp_path
):
    # the program names, on stderr, the allocator whose malloc it got
    from tasks.replay.inputs import generate_input
    from tasks.replay.runners.base import RunRequest

    case = _case(alloc_catalog, "alloc_mix")
    inp = tmp_path / "input"
    inp.mkdir()
    generate_input(case.workload.generator, 1, 100, inp)
    for p in (tmp_path, inp):
        p.chmod(0o755)
    for a in config.allocators:
        run = tmp_path / a.name
        dirs = {d: run / d for d in ("trace", "work", "measure")}
        for d in dirs.values():
            d.mkdir(parents=True)
        res = DockerRunner().run(
            RunRequest(
                workload=case.workload,
                input=case.input,
                tracer=None,
                input_dir=inp,
                trace_dir=dirs["trace"],
                work_dir=dirs["work"],
                preload=a.preload,
                measure_dir=dirs["measure"],
            )
        )
        assert res.exit_code == 0, res.log_tail
        assert f"alloc_mix: allocator={a.name}" in res.log_tail
        assert res.env.get("LD_PRELOAD") == (a.library or None)
        assert "HEAPCAST_OUT" not in res.env  # untraced


def test_a_missing_library_is_named_with_its_package_and_the_rest_measured(
    sqlite3_image, alloc_catalog, config, tmp_path
):
    case = _case(alloc_catalog, "alloc_mix")
    # GIVEN an allocator whose library the image does not have
    missing = check_allocators(
        DockerRunner(), "docker", case.workload, [*config.allocators, NOSUCH]
    )
    assert list(missing) == ["nosuch"]
    err = missing["nosuch"]
    assert isinstance(err, AllocatorMissing)
    assert "allocator 'nosuch'" in str(err) and "apt-get install libnosuch1" in str(err)
    assert "heapcast/sqlite3:bookworm" in str(err)
    # WHEN the case is measured with it THEN it is reported and the others are measured
    cfg = config.model_copy(update={"allocators": [*config.allocators, NOSUCH]})
    m = measure_cases([case], cfg, Root.from_url(str(tmp_path)), "docker", repetitions=1, warmup=0)
    assert [(u.allocator, u.package) for u in m.unavailable] == [("nosuch", "libnosuch1")]
    assert "libnosuch1" in m.unavailable[0].message
    assert sorted(s.allocator for s in m.samples) == sorted(config.names())
    pairs, _ = analyse(m, cfg)
    assert {p.allocator: p.status for p in pairs}["nosuch"] == "unavailable"


def test_a_failure_under_one_allocator_fails_only_that_pair(
    sqlite3_image, alloc_catalog, config, tmp_path
):
    # GIVEN a workload that exits 3 under tcmalloc only
    case = _case(alloc_catalog, "alloc_mix_failing")
    m = measure_cases(
        [case], config, Root.from_url(str(tmp_path)), "docker", repetitions=2, warmup=0
    )
    pairs, (rec,) = analyse(m, config)
    status = {p.allocator: p.status for p in pairs}
    assert status == {"glibc": "ok", "jemalloc": "ok", "tcmalloc": "failed", "mimalloc": "ok"}
    tc = next(p for p in pairs if p.allocator == "tcmalloc")
    assert "2 of 2 runs failed: exit code 3, expected 0" in tc.reason
    assert "failing on purpose under tcmalloc" in tc.reason
    assert rec.allocator in ("glibc", "jemalloc", "mimalloc")


def test_the_tracer_works_on_top_of_each_allocator(
    sqlite3_image, alloc_catalog, config, measured, tmp_path
):
    # GIVEN LD_PRELOAD=libheapcast.so:<allocator> WHEN the program runs once per allocator
    case = _case(alloc_catalog, "alloc_mix")
    m = measure_cases(
        [case],
        config,
        Root.from_url(str(tmp_path)),
        "docker",
        repetitions=1,
        warmup=0,
        tracer=tracer_path(),
    )
    # THEN every run is clean, traced, and prints what the untraced runs printed
    assert m.traced and sorted(s.allocator for s in m.samples) == sorted(config.names())
    untraced = {s.stdout_sha256 for s in measured.samples}
    for s in m.samples:
        assert s.ok and s.traced, s.error
        assert s.events > 3 * 4000  # three threads, each making thousands of calls
        assert {s.stdout_sha256} == untraced
    events = {s.events for s in m.samples}
    assert max(events) - min(events) < 0.01 * max(events)  # the same calls, whoever serves them


def test_a_catalog_workload_quick_input_under_every_allocator(sqlite3_image, config, tmp_path):
    # the real sqlite3 shell on its small quick input: same output under every allocator
    from tasks.allocators.measure import select_cases
    from tasks.replay.workloads import load_catalog

    cfg = config.model_copy(update={"inputs": ["small"]})
    cases = select_cases(load_catalog(), cfg, ["sqlite3"], quick=True)
    assert [c.label for c in cases] == ["sqlite3"]
    m = measure_cases(cases, cfg, Root.from_url(str(tmp_path)), "docker", repetitions=1, warmup=0)
    pairs, _ = analyse(m, cfg)
    assert {p.allocator: (p.status, p.output) for p in pairs} == {
        n: ("ok", "same") for n in cfg.names()
    }


def test_the_containers_memory_averaged_over_the_run_falls_with_what_the_program_frees(
    sqlite3_image, engine, tmp_path
):
    """GIVEN a program that holds 160 MB for 300 ms, then next to nothing for 900 ms, WHEN
    hc-measure runs it in a container (--cgroup), THEN the report has the cgroup's peak (at least
    the 160 MB) and its memory averaged over the run, sampled every 10 ms: about a quarter of
    the peak (160 * 0.3 / 1.2 = 40 MB, plus the container's own), not the peak."""
    import os
    import subprocess

    from tasks.replay.runners.measure_tool import build_measure_tool, usage_from_report

    tool = build_measure_tool()
    shape = tmp_path / "mem_shape"
    src = os.path.join(os.path.dirname(__file__), "programs", "mem_shape.c")
    subprocess.run(["gcc", "-O2", "-static", "-o", str(shape), src], check=True)
    out = tmp_path / "m"
    out.mkdir(mode=0o777)
    argv = ["docker", "run", "--rm", "-v", f"{tool}:/hc-measure:ro", "-v", f"{shape}:/shape:ro"]
    argv += ["-v", f"{out}:/m", sqlite3_image.tag, "/hc-measure", "--cgroup", "/m/usage"]
    argv += ["/m/stdout"]
    argv += ["--", "/shape", "160", "300", "900"]
    run = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": engine}
    )
    assert run.returncode == 0, run.stderr
    assert (out / "stdout").read_text() == "held 160 MB\n"
    report = (out / "usage").read_text()
    usage = usage_from_report(report)
    mb = 1 << 20
    assert usage.peak_memory_bytes >= 160 * mb, report
    assert usage.mean_memory_bytes is not None, report
    assert 30 * mb < usage.mean_memory_bytes < 0.45 * usage.peak_memory_bytes, report
    samples = int(
        next(x for x in report.splitlines() if x.startswith("cgroup_mean_samples=")).split("=")[1]
    )
    assert samples >= 20, report  # 1.2 s at one every 10 ms, less the waits for a core
    assert usage.wall_s >= 1.2, report
