"""Seed 002's case as a catalog workload (numpy_temporaries), replayed in its container under
glibc and tcmalloc by the allocators stage: both inputs run, every run verified in force, the
output the same, and the page faults that make the case: glibc maps and zero-fills each large
temporary on every iteration, tcmalloc keeps them. Faults are counted, not timed."""

from __future__ import annotations

import pytest

from tasks.allocators.measure import Case, measure_cases
from tasks.allocators.stats import analyse
from tasks.core.storage import Root
from tasks.replay.workloads import load_catalog

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def numpy_image(engine):
    from tasks.replay.images import build_all

    return build_all(["numpy"], host=engine)[-1]


def test_numpy_temporaries_in_docker_under_glibc_and_tcmalloc(numpy_image, config, tmp_path):
    w = load_catalog().get("numpy_temporaries")
    assert [i.name for i in w.inputs] == ["small", "medium"] and not any(i.quick for i in w.inputs)
    cfg = config.model_copy(
        update={"allocators": [config.get("glibc"), config.get("tcmalloc")], "warmup": 0}
    )
    m = measure_cases(
        [Case(w, w.input("small"), "numpy_temporaries")],
        cfg,
        Root.from_url(str(tmp_path)),
        "docker",
        repetitions=5,
    )
    assert len(m.samples) == 10 and all(s.ok and s.applied for s in m.samples), [
        s.error for s in m.samples
    ]
    pairs, (rec,) = analyse(m, cfg)
    faults = {p.allocator: p.stats["minor_faults"].median for p in pairs}
    # 30 iterations x 2-3 temporaries of 40 MB (above glibc's largest dynamic mmap threshold,
    # 32 MiB): ~10 k fresh pages each under glibc, kept by tcmalloc
    assert faults["tcmalloc"] < 0.5 * faults["glibc"], faults
    assert {p.output for p in pairs} == {"same"}
    assert rec.allocator in ("glibc", "tcmalloc")
