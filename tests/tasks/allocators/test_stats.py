"""The recommendation rule and the checks, on hand-made tables (no program runs)."""

from __future__ import annotations

import pytest

from tasks.allocators.config import RecommendationRule, load_allocators_config
from tasks.allocators.decide import mann_whitney_p
from tasks.allocators.stats import analyse, ranges_overlap, recommend, summarize
from tests.tasks.allocators.tables import make_measurements, runs_of

CFG = load_allocators_config()
FAST = [0.80, 0.81, 0.79, 0.82, 0.80]
BASE = [1.00, 1.02, 0.98, 1.01, 0.99]


def _by(pairs, allocator):
    return next(p for p in pairs if p.allocator == allocator)


def test_mann_whitney_exact_p_values():
    # complete separation of 5 against 5: 2 of the 252 splits are as extreme
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    # one pair in the other order: U = 1, P(U <= 1) = 2/252, two-sided 4/252
    assert mann_whitney_p([1, 2, 3, 4, 6], [5, 7, 8, 9, 10]) == pytest.approx(4 / 252)
    assert mann_whitney_p([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert mann_whitney_p([], [1.0]) == 1.0
    # symmetric, and the normal approximation takes over for large samples
    assert mann_whitney_p([6, 7, 8], [1, 2, 3]) == mann_whitney_p([1, 2, 3], [6, 7, 8])
    big = mann_whitney_p(list(range(30)), [x + 100 for x in range(30)])
    assert 0 < big < 1e-9
    assert ranges_overlap([1, 3], [2, 4]) and not ranges_overlap([1, 2], [3, 4])


def test_fastest_within_ten_percent_of_the_smallest_memory_wins():
    # GIVEN tcmalloc the fastest but 30% above the smallest memory (mimalloc's 98 MB),
    # jemalloc fast and within 10% of it, glibc slow
    m = make_measurements(
        {
            "glibc": runs_of(BASE, 100.0),
            "jemalloc": runs_of(FAST, 105.0),
            "tcmalloc": runs_of([0.6] * 5, 130.0),
            "mimalloc": runs_of([0.9, 0.91, 0.89, 0.9, 0.92], 98.0),
        }
    )
    pairs, (rec,) = analyse(m, CFG)
    # THEN jemalloc is recommended, 20% faster than glibc, beyond noise on both tests
    assert rec.allocator == "jemalloc"
    assert rec.margin == pytest.approx(1 - 0.80 / 1.00)
    assert rec.memory_vs_baseline == pytest.approx(1.05)
    assert rec.p_value == pytest.approx(1 / 252) and rec.beyond_noise is True
    assert rec.ranges_overlap is False
    assert "tcmalloc over 10% more peak_rss_mb" in rec.note
    assert [p.allocator for p in pairs if p.recommended] == ["jemalloc"]
    assert all(p.status == "ok" and p.output == "same" for p in pairs)
    assert _by(pairs, "tcmalloc").time_vs_baseline == pytest.approx(0.6)
    assert _by(pairs, "glibc").stats["wall_s"].min == 0.98
    assert _by(pairs, "glibc").stats["wall_s"].max == 1.02


def test_a_margin_inside_the_noise_is_said_to_be():
    # GIVEN jemalloc's runs interleaved with glibc's: a better median, not a better allocator
    m = make_measurements(
        {
            "glibc": runs_of([1.0, 0.9, 1.1, 0.95, 1.05], 100.0),
            "jemalloc": runs_of([0.97, 0.88, 1.08, 0.93, 1.2], 100.0),
        }
    )
    _, (rec,) = analyse(m, CFG)
    # THEN glibc stays; jemalloc is named as the best challenger, its margin's interval spans 0
    assert rec.allocator == "glibc" and rec.margin == 0.0 and rec.best_challenger == "jemalloc"
    assert rec.beyond_noise is False and rec.p_value > 0.05 and rec.ranges_overlap is True
    assert rec.margin_low < 0 < rec.margin_high
    assert "no candidate beats glibc beyond the noise" in rec.note
    # the minmax rule says the same here
    pairs = summarize(m)
    (rec2,) = recommend(m, pairs, RecommendationRule(noise="minmax"))
    assert rec2.beyond_noise is False and rec2.allocator == "glibc"


def test_minmax_rule_wants_the_ranges_apart():
    # 2 of 25 pairs in the other order: the rank test passes, the ranges overlap
    m = make_measurements(
        {
            "glibc": runs_of([1.0, 1.01, 1.02, 1.03, 0.85], 100.0),
            "jemalloc": runs_of([0.80, 0.81, 0.82, 0.83, 0.86], 100.0),
        }
    )
    pairs = summarize(m)
    (mw,) = recommend(m, pairs, RecommendationRule(noise="mann_whitney"))
    (mm,) = recommend(m, summarize(m), RecommendationRule(noise="minmax"))
    assert mw.allocator == "jemalloc" and mw.beyond_noise is True
    assert mm.allocator == "glibc" and mm.best_challenger == "jemalloc"
    assert mm.beyond_noise is False


def test_glibc_stays_when_it_is_the_fastest_within_the_memory_bound():
    m = make_measurements(
        {
            "glibc": runs_of(BASE, 100.0),
            "jemalloc": runs_of([1.2] * 5, 100.0),
            "tcmalloc": runs_of(FAST, 200.0),  # faster, but twice the memory
        }
    )
    _, (rec,) = analyse(m, CFG)
    assert rec.allocator == "glibc" and rec.margin == 0.0 and rec.beyond_noise is False
    assert rec.best_challenger == "jemalloc" and "no candidate beats glibc" in rec.note


def test_a_different_output_or_exit_code_fails_the_pair_and_keeps_it_out():
    # GIVEN jemalloc the fastest but printing something else once, tcmalloc exiting 3 once
    m = make_measurements(
        {
            "glibc": runs_of(BASE, 100.0),
            "jemalloc": runs_of([0.5] * 5, 100.0),
            "tcmalloc": runs_of([0.6] * 5, 100.0),
            "mimalloc": runs_of(FAST, 100.0),
        },
        hashes={"jemalloc": ["a" * 64] * 4 + ["b" * 64]},
        exit_codes={"tcmalloc": [0, 3, 0, 0, 0]},
    )
    pairs, (rec,) = analyse(m, CFG)
    je, tc = _by(pairs, "jemalloc"), _by(pairs, "tcmalloc")
    assert je.status == "failed" and je.output == "differs"
    assert "output differs from glibc's in 1 of 5 runs" in je.reason
    assert tc.status == "failed" and "1 of 5 runs failed: exit code 3" in tc.reason
    # THEN the recommendation is among the clean ones
    assert rec.allocator == "mimalloc"


def test_output_not_reproducible_under_glibc_is_not_checked():
    m = make_measurements(
        {"glibc": runs_of(BASE, 100.0), "jemalloc": runs_of(FAST, 100.0)},
        hashes={
            "glibc": [c * 64 for c in "abcde"],
            "jemalloc": [c * 64 for c in "fghij"],
        },
    )
    pairs, (rec,) = analyse(m, CFG)
    assert all(p.status == "ok" for p in pairs)
    assert all(p.output.startswith("unchecked: glibc's own output differs") for p in pairs)
    assert rec.allocator == "jemalloc"


def test_missing_allocators_are_reported_and_the_rest_recommended():
    m = make_measurements(
        {"glibc": runs_of(BASE, 100.0), "jemalloc": runs_of(FAST, 100.0)},
        unavailable={"mimalloc": "allocator 'mimalloc': ... install libmimalloc2.0"},
    )
    pairs, (rec,) = analyse(m, CFG)
    mi = _by(pairs, "mimalloc")
    assert mi.status == "unavailable" and "libmimalloc2.0" in mi.reason
    assert [p.allocator for p in pairs] == ["glibc", "jemalloc", "mimalloc"]
    assert rec.allocator == "jemalloc"


def test_no_clean_allocator_no_recommendation():
    m = make_measurements({"glibc": runs_of(BASE, 100.0)}, exit_codes={"glibc": [1, 1, 1, 1, 1]})
    _, (rec,) = analyse(m, CFG)
    assert rec.allocator is None and "no allocator ran cleanly" in rec.note
    assert rec.margin is None and rec.rule.startswith("the lowest median wall_s")


def test_a_workload_judged_on_memory_gets_the_smallest_beyond_the_noise():
    # GIVEN a service judged on memory (the project config's kv_service): glibc-arena2 holds
    # 20% less at glibc's speed, tcmalloc 10% less; and a batch workload judged on time
    assert CFG.objectives["kv_service"] == "memory" and CFG.rule.objective == "time"
    service = {
        "glibc": [(t, 236.0 + i) for i, t in enumerate(BASE)],
        "glibc-arena2": [(t + 0.01, 189.0 + i) for i, t in enumerate(BASE)],
        "tcmalloc": [(t, 212.0 + i) for i, t in enumerate(BASE)],
    }
    batch = {"glibc": runs_of(BASE, 100.0), "tcmalloc": runs_of(FAST, 100.0)}
    m = make_measurements({}, cases={"kv_service": service, "batch": batch})
    _, recs = analyse(m, CFG)
    by_case = {r.case: r for r in recs}
    # THEN the service gets arena2, its margin in memory; the batch workload tcmalloc, in time
    kv, b = by_case["kv_service"], by_case["batch"]
    assert (kv.objective, kv.allocator) == ("memory", "glibc-arena2")
    assert kv.margin == pytest.approx(1 - 191.0 / 238.0) and kv.beyond_noise
    assert (b.objective, b.allocator) == ("time", "tcmalloc")
    assert b.margin == pytest.approx(1 - 0.80 / 1.00)
    # AND without the entry the service is judged on time: nobody is faster, glibc stays
    plain = CFG.model_copy(update={"objectives": {}})
    _, recs = analyse(m, plain)
    assert {r.case: r.allocator for r in recs}["kv_service"] == "glibc"


def test_an_objective_for_a_workload_outside_the_catalog_is_refused_by_name():
    from tasks.allocators.measure import select_cases
    from tasks.replay.workloads import load_catalog

    cfg = CFG.model_copy(update={"objectives": {"kv_servce": "memory"}})
    with pytest.raises(ValueError, match="`objectives`: kv_servce is no workload of the catalog"):
        select_cases(load_catalog(), cfg, ["kv_service"])


def test_a_recommendation_on_memory_reads_as_memory_in_the_report():
    from tasks.allocators.report import _rec_cell

    service = {
        "glibc": [(t, 236.0 + i) for i, t in enumerate(BASE)],
        "glibc-arena2": [(t + 0.01, 189.0 + i) for i, t in enumerate(BASE)],
    }
    _, (rec,) = analyse(make_measurements({}, cases={"kv_service": service}), CFG)
    cell = _rec_cell(rec)
    assert cell.startswith("**glibc-arena2**: 19.7% less memory than glibc; beyond noise")
    assert "faster" not in cell


def test_the_report_says_which_workload_is_judged_on_memory():
    from tasks.allocators.report import markdown

    service = {
        "glibc": [(t, 236.0 + i) for i, t in enumerate(BASE)],
        "glibc-arena2": [(t + 0.01, 189.0 + i) for i, t in enumerate(BASE)],
    }
    m = make_measurements({}, cases={"kv_service": service, "batch": service})
    pairs, recs = analyse(m, CFG)
    md = markdown(m, pairs, recs, {}, CFG)
    assert "kv_service, judged on memory (`objectives`): the lowest median peak_rss_mb" in md
    assert "batch, judged" not in md
