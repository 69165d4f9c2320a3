"""Heap features from a hand-made events run: every figure known in advance."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tasks.allocators.heap import features_for, heap_features
from tasks.core.storage import Root
from tasks.format.trace_reader import Op
from tests.tasks.allocators.tables import events_table

M, C, R, F = int(Op.MALLOC), int(Op.CALLOC), int(Op.REALLOC), int(Op.FREE)


@pytest.fixture
def root(tmp_path) -> Root:
    root = Root.from_url(str(tmp_path))
    # GIVEN a run of two processes: pid 10 with threads 0, 1, 2; pid 20 with thread 0
    rows = [
        (10, 0, M, 16, 1000),  # <= 64 B
        (10, 0, M, 64, 3000),  # <= 64 B (the edge)
        (10, 1, C, 65, None),  # <= 1 KiB, never freed
        (10, 2, M, 1024, 5000),  # <= 1 KiB (the edge)
        (10, 2, R, 4096, 7000),  # < 128 KiB, a realloc
        (10, 0, M, 128 * 1024, 9000),  # large (the edge)
        (20, 0, M, 1 << 20, 11000),  # large
        (20, 0, R, 0, None),  # realloc to 0: a free, not an allocation
        (20, 0, F, 0, None),
        (10, 1, F, 0, None),
    ]
    path = root.events_run("prog", "small")
    root.fs.makedirs(path, exist_ok=True)
    pq.write_table(events_table(rows[:5]), f"{path}/part-a.parquet")
    pq.write_table(events_table(rows[5:]), f"{path}/part-b.parquet")
    (tmp_path / "events" / "workload=prog" / "run=small" / "_summary.json").write_text("{}")
    return root


def test_features_of_a_known_run(root):
    # WHEN its features are read THEN each is what the rows say
    f = heap_features(root, "prog", "small")
    assert f.events == 10 and f.allocations == 7
    assert f.le64_share == pytest.approx(2 / 7)
    assert f.le1k_share == pytest.approx(2 / 7)
    assert f.lt_large_share == pytest.approx(1 / 7)
    assert f.large_share == pytest.approx(2 / 7)
    total = 16 + 64 + 65 + 1024 + 4096 + 128 * 1024 + (1 << 20)
    assert f.large_bytes_share == pytest.approx((128 * 1024 + (1 << 20)) / total)
    assert f.processes == 2 and f.threads == 3
    assert f.median_lifetime_us == pytest.approx(6.0)  # of 1, 3, 5, 7, 9, 11 µs
    assert f.realloc_share == pytest.approx(1 / 7)
    assert f.size_mix() == "29/29/14/29"


def test_another_run_stands_in_and_a_missing_workload_has_none(root):
    f = features_for(root, "prog", "medium")
    assert f is not None and f.run == "small"
    assert features_for(root, "other", "small") is None
    assert heap_features(root, "prog", "large") is None
