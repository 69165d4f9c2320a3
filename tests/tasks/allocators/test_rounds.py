"""tasks.allocators.rounds: which candidates tune drops between rounds, and when it stops."""

from __future__ import annotations

import numpy as np

from tasks.allocators.rounds import after_round, run_noise


def _runs(**kw):
    return {k: np.array(v, dtype=float) for k, v in kw.items()}


def test_rounds_drop_a_candidate_slower_than_every_baseline_run():
    runs = _runs(glibc=[1.0, 1.02], slow=[1.3, 1.4], near=[1.01, 0.99])
    v = after_round(runs, list(runs), "glibc", 2, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert list(v.dropped) == ["slow"] and v.stop is None
    # after 3 rounds, one not below the baseline's median goes too, and nothing is left
    runs = _runs(glibc=[1.0, 1.02, 1.01], near=[1.03, 1.0, 1.02])
    v = after_round(runs, list(runs), "glibc", 3, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert list(v.dropped) == ["near"] and "no candidate left" in v.stop


def test_rounds_stop_once_the_leader_beats_the_baseline_beyond_the_noise():
    runs = _runs(glibc=[1.0, 1.01, 1.02, 0.99, 1.0], fast=[0.8, 0.81, 0.79, 0.8, 0.82])
    for r in (3, 4):
        cut = {k: v[:r] for k, v in runs.items()}
        v = after_round(cut, list(runs), "glibc", r, decide_rounds=5, alpha=0.05, promising_p=0.25)
        assert v.stop is None  # too few runs for the rank test
    v = after_round(runs, list(runs), "glibc", 5, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert v.stop and "fast beats glibc beyond the noise" in v.stop


def test_rounds_drop_a_candidate_over_the_memory_bound_at_once():
    runs = _runs(glibc=[1.0, 1.02], fat=[0.5, 0.52], lean=[0.9, 0.92])
    v = after_round(
        runs,
        list(runs),
        "glibc",
        2,
        decide_rounds=5,
        alpha=0.05,
        promising_p=0.25,
        ineligible={"fat": "its median peak_rss_mb 30% over the lowest"},
    )
    # fat is out, and lean (the leader among the eligible) stays
    assert list(v.dropped) == ["fat"] and "30% over" in v.dropped["fat"] and v.stop is None


def test_rounds_stop_at_once_with_nothing_to_compare():
    v = after_round(
        _runs(glibc=[1.0]), ["glibc"], "glibc", 1, decide_rounds=5, alpha=0.05, promising_p=0.25
    )
    assert v.stop == "no candidate to compare with glibc"


def test_rounds_run_on_a_candidate_over_a_noisy_bound_but_never_let_it_lead():
    """Memory objective: a candidate whose time is over its tolerance so far (`unfit`) cannot
    lead (no stop on its win, no one dropped against its runs), and is not dropped: time
    varies run to run and may come back within the bound."""
    runs = _runs(
        glibc=[100.0, 101.0, 100.5, 100.2, 100.8],
        lean_but_slow=[80.0, 80.5, 80.2, 80.1, 80.3],
        ok=[95.0, 95.5, 95.2, 95.1, 95.3],
    )
    v = after_round(runs, list(runs), "glibc", 5, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert v.stop and "lean_but_slow beats glibc" in v.stop  # without the bound: it leads
    v = after_round(
        runs,
        list(runs),
        "glibc",
        5,
        decide_rounds=5,
        alpha=0.05,
        promising_p=0.25,
        unfit={"lean_but_slow"},
    )
    assert "lean_but_slow" not in v.dropped
    assert v.stop and "ok beats glibc" in v.stop  # the fit leader decides


def test_rounds_keep_a_candidate_whose_runs_are_apart_by_less_than_the_noise():
    """The TensorFlow video case on a loaded machine (docs/allocators.md): after 2 rounds
    tcmalloc's runs were all above the layer's, by less than the runs' own spread; it must stay
    (its 5 runs could still win), while one worse beyond the spread goes."""
    runs = _runs(
        glibc=[23.2, 16.0],
        layer=[17.5, 19.0],
        tcmalloc=[20.4, 25.1],
        mimalloc=[18.0, 22.0],
        jemalloc=[19.5, 23.5],
        slow=[30.0, 31.0],
    )
    noise = run_noise(runs, list(runs))
    assert 0.15 < noise < 0.25
    v = after_round(runs, list(runs), "glibc", 2, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert list(v.dropped) == ["slow"]
    assert "spread" in v.dropped["slow"] and v.stop is None
    # the same gap on a quiet machine (spread 1%) is beyond the noise: tcmalloc cannot be the best
    quiet = _runs(glibc=[23.2, 23.0], layer=[17.5, 17.6], tcmalloc=[20.4, 20.5])
    v = after_round(quiet, list(quiet), "glibc", 2, decide_rounds=5, alpha=0.05, promising_p=0.25)
    assert "tcmalloc" in v.dropped and "cannot be the best" in v.dropped["tcmalloc"]


def test_run_noise_is_the_median_spread_of_arms_with_two_runs():
    runs = _runs(a=[1.0, 1.2], b=[2.0, 2.2], c=[5.0])
    assert abs(run_noise(runs, ["a", "b", "c"]) - np.median([0.2 / 1.1, 0.2 / 2.1])) < 1e-12
    assert run_noise(runs, ["c"]) == 0.0
