"""studies/place_catalog/place_catalog.py: placement against jemalloc alone on every catalog workload,
each judged within the goal's margin, in the noise, over it, failed or not applied."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import REPO
from studies.place_catalog import place_catalog as bench
from tasks.allocators.measure import Sample
from tests.studies.study_script import run_writing_nothing

BENCH = REPO / "studies" / "place_catalog" / "place_catalog.py"


def test_help_runs_nothing(tmp_path):
    p = run_writing_nothing(BENCH, tmp_path, "--help")
    assert p.returncode == 0 and "--tolerance" in p.stdout


def test_an_unknown_workload_is_named_before_anything_runs(tmp_path):
    p = run_writing_nothing(BENCH, tmp_path, "no_such_program")
    assert p.returncode == 2 and "no_such_program" in p.stderr


def runs(allocator, walls, rss, *, ok=True, applied=True, long=0):
    return [
        Sample(
            case="w",
            workload="w",
            input="medium",
            allocator=allocator,
            rep=i + 1,
            position=1,
            traced=False,
            ok=ok,
            exit_code=0,
            timed_out=False,
            wall_s=wall,
            cpu_s=wall,
            peak_rss_mb=mb,
            max_process_rss_mb=mb,
            run_s=wall,
            applied=applied,
            started_at="",
            place_long=long if allocator == bench.PLACE else None,
            place_sites_long=1 if long else 0,
            place_sites_aside=0,
        )
        for i, (wall, mb) in enumerate(zip(walls, rss, strict=True))
    ]


BASE = runs(bench.JEMALLOC, [1.00, 1.01, 0.99, 1.02, 1.00], [10.0, 10.1, 9.9, 10.0, 10.0])


@pytest.mark.parametrize(
    ("walls", "rss", "verdict", "above"),
    [
        ([1.00, 1.01, 1.00, 0.99, 1.01], [10.1, 10.0, 10.1, 10.0, 10.1], "within", []),
        # +4% on memory, beyond the noise: every placed run above every jemalloc run
        ([1.00, 1.01, 1.00, 0.99, 1.01], [10.4, 10.4, 10.5, 10.4, 10.4], "over", ["peak_rss_mb"]),
        # +3% on the median time, the rounds overlapping
        ([1.03, 0.95, 1.05, 1.03, 0.90], [10.0, 10.0, 10.0, 10.0, 10.0], "noise", ["wall_s"]),
    ],
)
def test_each_workload_is_judged_against_jemalloc_alone(walls, rss, verdict, above):
    row = bench.summarise(BASE + runs(bench.PLACE, walls, rss, long=75), "w", 0.02)
    assert row["verdict"] == verdict
    assert [m for m in row["above"] if m in ("wall_s", "peak_rss_mb")] == above
    assert row["placed"]["place_long"] == 75
    assert row["ratio"]["peak_rss_mb"] == pytest.approx(sorted(rss)[2] / 10.0)


def test_a_failed_run_or_a_layer_not_in_force_is_never_within():
    same = [1.0] * 5, [10.0] * 5
    failed = bench.summarise(BASE + runs(bench.PLACE, *same, ok=False), "w", 0.02)
    assert failed["verdict"] == "failed"
    absent = bench.summarise(BASE + runs(bench.PLACE, *same, applied=False), "w", 0.02)
    assert absent["verdict"] == "not applied"
    missing = bench.summarise(BASE, "w", 0.02)
    assert missing["verdict"] == "failed"


def test_the_table_says_each_verdict_and_counts_them():
    rows = [
        bench.summarise(BASE + runs(bench.PLACE, [1.0] * 5, [10.0] * 5), "w", 0.02),
        bench.summarise(BASE + runs(bench.PLACE, [1.0] * 5, [10.5] * 5, long=9), "w", 0.02),
    ]
    table = bench.markdown(rows)
    assert "| w | 1.00 | 10.0 | +0.0% (p 0.72) |" in table
    assert "+5.0% (p 0.01)" in table and "| 9 | 1 / 0 | over |" in table
    assert table.endswith("within: 1, noise: 0, over: 1, failed: 0, not applied: 0 (of 2)")


def test_the_layer_with_placement_off_tells_placement_from_the_layers_jemalloc_option():
    """GIVEN the layer loaded with placement off as a third arm, THEN placement is also compared
    with it: a saving the off arm has too is the layer's jemalloc option, not placement."""
    off = runs(bench.OFF, [1.0] * 5, [8.0] * 5)
    row = bench.summarise(BASE + off + runs(bench.PLACE, [1.0] * 5, [8.0] * 5, long=9), "w", 0.02)
    assert row["verdict"] == "within"
    assert row["ratio"]["peak_rss_mb"] == pytest.approx(0.8)
    assert row["ratio_off"]["peak_rss_mb"] == pytest.approx(1.0)
    assert row["runs"] == {bench.JEMALLOC: 5, bench.PLACE: 5, bench.OFF: 5}
    table = bench.markdown([row])
    assert table.splitlines()[2].endswith("| within | +0.0% (p 1.00) |")
    # the off arm is configured as the stage runs a place candidate, in mode off
    from tasks.allocators.config import load_allocators_config

    config = bench.arms_config(load_allocators_config(), off=True)
    assert [a.name for a in config.allocators] == [bench.JEMALLOC, bench.PLACE, bench.OFF]
    assert config.allocators[-1].env == {"HEAPCAST_PLACE": "mode=off"}
    assert config.baseline == bench.JEMALLOC


@pytest.mark.slow
@pytest.mark.integration
def test_a_real_workload_in_its_container_gets_a_verdict_from_real_runs(
    engine, prefect_harness, tmp_path
):
    """GIVEN the engine and the catalog's sqlite3 on its small input, WHEN the study runs it for
    real (2 rounds of jemalloc alone and jemalloc-place in its container), THEN its row has every
    run of both arms, the layer in force in each placed run with its stats line read, ratios to
    jemalloc alone, a verdict from the module's list, and the file the docs quote."""
    out = tmp_path / "place_catalog.json"
    argv = ["sqlite3", "--input", "small", "--reps", "2", "--root", str(tmp_path / "root")]
    assert bench.main([*argv, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["case"] == "sqlite3" and doc["reps"] == 2
    assert row["runs"] == {bench.JEMALLOC: 2, bench.PLACE: 2}, row
    assert row["applied"][bench.PLACE] == 2 and not row["errors"], row
    assert row["verdict"] in ("within", "noise", "over"), row
    assert set(row["ratio"]) == set(bench.METRICS) and all(v > 0 for v in row["ratio"].values())
    assert set(row["placed"]) == set(bench.PLACED)
    assert "sqlite3" in doc["table"]
