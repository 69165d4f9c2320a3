"""The same measurement on the host (the local runner, no engine): the allocators that
scripts/setup.sh installs on the host, the peak from ru_maxrss, a missing library named."""

from __future__ import annotations

import os

import pytest

from tasks.allocators.config import Allocator
from tasks.allocators.measure import Case, check_allocators, measure_cases, select_cases
from tasks.allocators.stats import analyse
from tasks.core.storage import Root
from tasks.replay.runners.local_runner import LocalRunner
from tasks.replay.workloads import parse_catalog
from tests.conftest import in_ci
from tests.tasks.allocators.programs_build import alloc_mix_workloads, measure_alloc_mix

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def host_allocators(config):
    missing = [a.library for a in config.allocators if a.library and not os.path.exists(a.library)]
    if missing:
        msg = f"allocators missing on this host: {missing} (scripts/setup.sh installs them)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return config


def test_local_measurement_of_the_four_allocators(host_allocators, alloc_catalog, tmp_path):
    cfg = host_allocators
    w = alloc_catalog.get("alloc_mix")
    nosuch = Allocator(name="nosuch", library="/nonexistent/libnosuch.so.1", package="libnosuch1")
    cfg = cfg.model_copy(update={"allocators": [*cfg.allocators, nosuch]})
    m = measure_alloc_mix(w, cfg, tmp_path, "local", repetitions=2, warmup=0)
    assert m.runner == "local"
    assert [u.allocator for u in m.unavailable] == ["nosuch"]
    assert "missing on this host" in m.unavailable[0].message
    assert "apt-get install libnosuch1" in m.unavailable[0].message
    assert len(m.samples) == 2 * 4 and all(s.ok for s in m.samples)
    assert len({s.stdout_sha256 for s in m.samples}) == 1
    for s in m.samples:
        # the program's own ru_maxrss (hc-measure's wait4), not the Python runner's RSS
        assert s.peak_source == "ru_maxrss" and s.peak_rss_mb == s.max_process_rss_mb
        assert 1 < s.peak_rss_mb < 200 and s.cpu_s > 0 and s.minor_faults > 0
    pairs, (rec,) = analyse(m, cfg)
    assert {p.allocator: p.status for p in pairs} == {
        "glibc": "ok",
        "jemalloc": "ok",
        "tcmalloc": "ok",
        "mimalloc": "ok",
        "nosuch": "unavailable",
    }
    assert rec.allocator in cfg.names()
    # the check alone, as a flow would call it
    assert list(check_allocators(LocalRunner(), "local", w, cfg.allocators)) == ["nosuch"]


def test_cases_are_named_by_workload_or_workload_and_input(config):
    from tasks.replay.workloads import load_catalog

    catalog = load_catalog()
    one = select_cases(catalog, config.model_copy(update={"inputs": ["medium"]}), quick=True)
    assert [c.label for c in one] == [c.workload.name for c in one]
    assert all(c.input.name == "medium" for c in one)
    both = select_cases(catalog, config, ["sqlite3"], quick=True)
    assert [c.label for c in both] == ["sqlite3/small", "sqlite3/medium"]
    with pytest.raises(ValueError, match="nothing to measure"):
        select_cases(catalog, config.model_copy(update={"inputs": ["huge"]}), ["sqlite3"])


def test_a_library_the_loader_refuses_fails_its_pair_instead_of_measuring_glibc(
    host_allocators, alloc_catalog, tmp_path
):
    # GIVEN a "library" that exists but is no shared object: ld.so warns and runs on without it
    broken = Allocator(name="broken", library="/etc/hostname", package="base-files")
    cfg = host_allocators.model_copy(update={"allocators": [host_allocators.get("glibc"), broken]})
    w = alloc_catalog.get("alloc_mix")
    m = measure_alloc_mix(w, cfg, tmp_path, "local", repetitions=1, warmup=0)
    # THEN its run is a failure naming the loader's complaint, not a glibc measurement
    (bad,) = [s for s in m.samples if s.allocator == "broken"]
    assert not bad.ok and bad.error.startswith("not applied: LD_PRELOAD refused: ")
    assert bad.applied is False
    assert "/etc/hostname" in bad.error
    pairs, (rec,) = analyse(m, cfg)
    assert {p.allocator: p.status for p in pairs} == {"glibc": "ok", "broken": "not applied"}
    assert rec.allocator == "glibc"


def test_a_workload_that_clears_its_environment_is_not_applied(
    host_allocators, alloc_catalog, tmp_path
):
    # GIVEN the test program started by `env -i`: env loads the allocator, alloc_mix (all the
    # work) starts with an empty environment, so with glibc's malloc whatever was asked
    base = alloc_catalog.get("alloc_mix")
    longer = base.inputs[0].model_copy(update={"size": 20000})  # past the probe's CPU floor
    w = base.model_copy(
        update={
            "command": ["/usr/bin/env", "-i", "{input}/alloc_mix", "{size}"],
            "inputs": [longer],
        }
    )
    cfg = host_allocators.model_copy(
        update={"allocators": [host_allocators.get("glibc"), host_allocators.get("jemalloc")]}
    )
    m = measure_alloc_mix(w, cfg, tmp_path, "local", repetitions=1, warmup=0)
    # THEN no run is measured under a name: each is "not applied", saying why
    assert all(s.applied is False and not s.ok for s in m.samples)
    assert all("CPU time ran in processes that loaded it" in s.error for s in m.samples)
    pairs, (rec,) = analyse(m, cfg)
    assert {p.status for p in pairs} == {"not applied"}
    assert rec.allocator is None


def test_a_workload_whose_mount_is_missing_fails_alone(config, alloc_catalog, tmp_path):
    """A catalog workload whose `mounts` source is not on this host fails its own case, named
    with the error; the other workloads are still measured."""
    data = alloc_mix_workloads()
    broken = data["workloads"][1]
    broken["mounts"] = [{"source": str(tmp_path / "gone"), "target": "/heapcast/gone"}]
    catalog = parse_catalog(data, "test (a missing mount)")
    glibc = config.model_copy(update={"allocators": [config.get(config.baseline)]})
    m = measure_cases(
        [
            Case(w, w.inputs[0], w.name)
            for w in (alloc_catalog.get("alloc_mix"), catalog.get(broken["name"]))
        ],
        glibc,
        Root.from_url(str(tmp_path)),
        "local",
        repetitions=1,
        warmup=0,
    )
    pairs, _ = analyse(m, glibc)
    by_case = {p.case: p for p in pairs}
    assert by_case["alloc_mix"].status == "ok"
    failed = by_case[broken["name"]]
    assert failed.status == "failed"
    assert "mount source" in failed.reason and str(tmp_path / "gone") in failed.reason
