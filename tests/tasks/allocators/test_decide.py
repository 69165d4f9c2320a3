"""The honest choice on synthetic samples: Holm's correction, the margin's interval, the exact
rank test against scipy's, the balanced order of the rounds, a zero memory named."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.decide import holm, mann_whitney_p, margin_interval, smallest_p
from tasks.allocators.measure import round_orders
from tasks.allocators.stats import analyse
from tests.tasks.allocators.tables import make_measurements, runs_of

BASE = [1.00, 1.02, 0.98, 1.01, 0.99]
SEED = 1  # draws where three of the 8 look-alikes pass p < 0.05 uncorrected


def test_holm_adjusts_step_down():
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adj == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({}) == {}


def test_a_clear_winner_is_picked_with_its_interval():
    m = make_measurements(
        {
            "glibc": runs_of(BASE, 100.0),
            "jemalloc": runs_of([0.80, 0.81, 0.79, 0.82, 0.80], 100.0),
            "tcmalloc": runs_of([0.99, 1.0, 1.01, 0.98, 1.02], 100.0),
        }
    )
    _, (rec,) = analyse(m, load_allocators_config())
    assert rec.allocator == "jemalloc" and rec.compared == 2
    # one-sided: complete separation is 1 of the 252 splits; Holm over the 2 compared
    assert rec.p_value == pytest.approx(1 / 252) and rec.p_adjusted == pytest.approx(2 / 252)
    assert rec.beyond_noise is True and rec.rounds == 5
    assert rec.margin == pytest.approx(0.20)
    assert 0.15 < rec.margin_low <= rec.margin <= rec.margin_high < 0.25


def test_a_tie_keeps_glibc():
    m = make_measurements(
        {"glibc": runs_of(BASE, 100.0), "jemalloc": runs_of(list(reversed(BASE)), 100.0)}
    )
    _, (rec,) = analyse(m, load_allocators_config())
    assert rec.allocator == "glibc" and rec.beyond_noise is False


def test_many_candidates_an_uncorrected_pick_would_be_a_false_positive():
    # GIVEN 8 candidates drawn from glibc's own distribution (no real difference), 6 runs each
    rng = np.random.default_rng(SEED)
    names = [f"c{i}" for i in range(8)]
    cfg = load_allocators_config()
    allocators = [cfg.get("glibc")] + [
        Allocator(name=n, library=f"/usr/lib/{n}.so", package="x") for n in names
    ]
    cfg = cfg.model_copy(update={"allocators": allocators, "max_repetitions": None})
    runs = {"glibc": rng.normal(1.0, 0.05, 6)}
    runs.update({n: rng.normal(1.0, 0.05, 6) for n in names})
    base = runs["glibc"]
    raw = {n: mann_whitney_p(runs[n], base, "less") for n in names}
    # the seed is chosen so that one candidate passes p < 0.05 uncorrected
    lucky = [n for n, p in raw.items() if p < 0.05 and np.median(runs[n]) < np.median(base)]
    assert lucky, raw
    m = make_measurements({n: runs_of(list(v), 100.0) for n, v in runs.items()}, config=cfg)
    _, (rec,) = analyse(m, cfg)
    # THEN after Holm's correction nothing beats glibc
    assert rec.allocator == "glibc" and rec.compared == 8
    assert rec.best_challenger is not None and rec.p_adjusted >= 0.05


def test_margin_interval_is_seeded():
    a = margin_interval([0.8, 0.82, 0.79], [1.0, 1.01, 0.99])
    assert a == margin_interval([0.8, 0.82, 0.79], [1.0, 1.01, 0.99])
    assert a[1] <= a[0] <= a[2]


def test_the_exact_rank_test_is_scipy_s_exact_test_both_ways():
    from scipy import stats as scipy  # in the lock (through scikit-learn's chain)

    rng = np.random.default_rng(7)
    for n, m in [(5, 5), (3, 4), (6, 8), (8, 8), (2, 9)]:
        for _ in range(10):
            x, y = rng.normal(0, 1, n), rng.normal(0.4, 1, m)
            for alt in ("two-sided", "less"):
                want = scipy.mannwhitneyu(x, y, alternative=alt, method="exact").pvalue
                assert mann_whitney_p(x, y, alt) == pytest.approx(want, abs=1e-12)
    # complete separation is the smallest p: what the rounds are planned for
    assert mann_whitney_p(range(5), range(5, 10), "less") == pytest.approx(smallest_p(5, 5, "less"))
    assert smallest_p(5, 5) == pytest.approx(2 / 252) and smallest_p(6, 6, "less") == 1 / 924
    # the wrong direction is no evidence at all
    assert mann_whitney_p(range(5, 10), range(5), "less") == 1.0
    with pytest.raises(ValueError, match="alternative"):
        mann_whitney_p([1.0], [2.0], "greater")


def test_round_orders_are_balanced_and_round_five_is_not_round_one():
    names = ["glibc", "jemalloc", "tcmalloc", "mimalloc"]
    orders = round_orders(names, 5, seed=0)
    # the old rotation repeated round one's order at round five
    assert orders[4] != orders[0]
    first_square = orders[:4]
    for place in range(4):  # each allocator once in each place
        assert sorted(o[place] for o in first_square) == sorted(names)
    follows = {(o[i], o[i + 1]) for o in first_square for i in range(3)}
    assert len(follows) == 12  # each after each other exactly once (Williams)
    assert round_orders(names, 5, seed=0) == orders
    assert all(sorted(o) == sorted(names[:3]) for o in round_orders(names[:3], 7, seed=1))


def test_an_allocator_whose_memory_reads_zero_is_named():
    m = make_measurements(
        {
            "glibc": runs_of(BASE, 100.0),
            "jemalloc": runs_of([0.5] * 5, 0.0),
        }
    )
    _, (rec,) = analyse(m, load_allocators_config())
    assert rec.allocator == "glibc"
    assert "jemalloc: median peak_rss_mb reads 0, left out" in rec.note


def test_the_memory_objective_picks_the_smaller_footprint_beyond_the_noise():
    # GIVEN tcmalloc: the same time as glibc, 30% less peak memory, every run
    m = make_measurements(
        {
            "glibc": [(1.0 + i * 0.01, 100.0 + i) for i in range(5)],
            "jemalloc": [(0.95 + i * 0.01, 103.0 + i) for i in range(5)],
            "tcmalloc": [(1.0 + i * 0.01, 70.0 + i) for i in range(5)],
        }
    )
    cfg = load_allocators_config()
    by_time = analyse(m, cfg)[1][0]
    by_memory = analyse(
        m, cfg.model_copy(update={"rule": cfg.rule.model_copy(update={"objective": "memory"})})
    )[1][0]
    # THEN by time glibc stays (jemalloc is faster but 45% above the lowest memory, tcmalloc
    # is not faster); by memory tcmalloc wins, its margin ~30%, Holm-corrected over the 2
    assert by_time.allocator == "glibc"
    assert by_memory.allocator == "tcmalloc" and by_memory.objective == "memory"
    assert by_memory.margin == pytest.approx(1 - 72 / 102)
    assert by_memory.p_adjusted == pytest.approx(2 / 252)
