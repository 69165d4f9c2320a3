"""tasks.allocators.rounds: the plan made before any run, which candidates drop between rounds,
when the rounds stop (tune's and the stage's one rule)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.allocators.decide import smallest_p
from tasks.allocators.rounds import after_round, judge, plan_rounds, run_noise


def _runs(**kw):
    return {k: np.array(v, dtype=float) for k, v in kw.items()}


def _after(runs, active, rounds, planned=5, bound=5, **kw):
    """after_round as tune calls it, its plan over the candidates of `runs`."""
    plan = plan_rounds(len(runs) - 1, planned, bound, 0.05)
    return after_round(runs, active, "glibc", rounds, plan=plan, promising_p=0.25, **kw)


def test_rounds_drop_a_candidate_slower_than_every_baseline_run():
    runs = _runs(glibc=[1.0, 1.02], slow=[1.3, 1.4], near=[1.01, 0.99])
    v = _after(runs, list(runs), 2)
    assert list(v.dropped) == ["slow"] and v.stop is None
    # after 3 rounds, one not below the baseline's median goes too, and nothing is left
    runs = _runs(glibc=[1.0, 1.02, 1.01], near=[1.03, 1.0, 1.02])
    v = _after(runs, list(runs), 3)
    assert list(v.dropped) == ["near"] and "no candidate left" in v.stop


def test_rounds_stop_once_the_leader_beats_the_baseline_beyond_the_noise():
    runs = _runs(glibc=[1.0, 1.01, 1.02, 0.99, 1.0], fast=[0.8, 0.81, 0.79, 0.8, 0.82])
    for r in (3, 4):
        cut = {k: v[:r] for k, v in runs.items()}
        v = _after(cut, list(runs), r)
        assert v.stop is None  # too few runs for the rank test
    v = _after(runs, list(runs), 5)
    assert v.stop and "fast beats glibc beyond the noise" in v.stop


def test_rounds_drop_a_candidate_over_the_memory_bound_at_once():
    runs = _runs(glibc=[1.0, 1.02], fat=[0.5, 0.52], lean=[0.9, 0.92])
    v = _after(
        runs, list(runs), 2, ineligible={"fat": "its median peak_rss_mb 30% over the lowest"}
    )
    # fat is out, and lean (the leader among the eligible) stays
    assert list(v.dropped) == ["fat"] and "30% over" in v.dropped["fat"] and v.stop is None


def test_rounds_stop_at_once_with_nothing_to_compare():
    v = _after(_runs(glibc=[1.0]), ["glibc"], 1)
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
    v = _after(runs, list(runs), 5)
    assert v.stop and "lean_but_slow beats glibc" in v.stop  # without the bound: it leads
    v = _after(runs, list(runs), 5, unfit={"lean_but_slow"})
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
    v = _after(runs, list(runs), 2)
    assert list(v.dropped) == ["slow"]
    assert "spread" in v.dropped["slow"] and v.stop is None
    # the same gap on a quiet machine (spread 1%) is beyond the noise: tcmalloc cannot be the best
    quiet = _runs(glibc=[23.2, 23.0], layer=[17.5, 17.6], tcmalloc=[20.4, 20.5])
    v = _after(quiet, list(quiet), 2)
    assert "tcmalloc" in v.dropped and "cannot be the best" in v.dropped["tcmalloc"]


def test_run_noise_is_the_median_spread_of_arms_with_two_runs():
    runs = _runs(a=[1.0, 1.2], b=[2.0, 2.2], c=[5.0])
    assert abs(run_noise(runs, ["a", "b", "c"]) - np.median([0.2 / 1.1, 0.2 / 2.1])) < 1e-12
    assert run_noise(runs, ["c"]) == 0.0


@pytest.mark.parametrize(
    ("m", "planned", "bound", "first", "needed"),
    [
        (11, 5, 8, 6, None),  # the seeds' full night: looks 6 and 8
        (16, 5, 8, 6, None),  # the catalog's stage: looks 6 and 8
        (4, 5, 7, 5, None),  # tune's five: looks 5 and 7
        (11, 5, 5, 5, None),  # one look: 5 runs against 5 reach 1/252 < 0.05/11
        (6, 3, 3, None, 5),  # the quick seeds: 3 rounds cannot, 5 would
        (1, 3, 3, None, 4),
    ],
)
def test_the_plan_looks_only_where_a_separation_can_pass_the_bar(m, planned, bound, first, needed):
    plan = plan_rounds(m, planned, bound, 0.05)
    assert (plan.first_look, plan.needed) == (first, needed)
    if first is None:
        assert f"it needs {needed} rounds ({needed - bound} more)" in plan.cannot()
        return
    # alpha split over the looks; complete separation at the first look passes Holm's first bar
    looks = 1 if first == bound else 2
    assert plan.looks == looks and plan.level == pytest.approx(0.05 / looks)
    assert [r for r in range(1, bound + 1) if plan.decides_at(r)] == sorted({first, bound})
    assert plan.bar == pytest.approx(plan.level / m)
    runs = {"glibc": np.arange(first) + 10.0}
    runs |= {f"c{i}": np.arange(first) + 0.5 * i for i in range(m)}
    assert "c0" in judge(runs, "glibc", plan).beats
    # ...and the round before could not, with one look more to share alpha: it is not a look
    if first > planned:
        assert smallest_p(first - 1, first - 1, "less") >= 0.05 / (2 * m)


def test_the_stage_runs_everyone_for_the_planned_rounds_then_narrows_then_decides():
    """eliminate=False (the stage): nothing dropped before the planned rounds; at them, those
    not near the bar stop running; the winner is declared only at a look."""
    rng = np.random.default_rng(3)
    base = 1.0 + rng.normal(0, 0.01, 8)
    runs = _runs(
        glibc=base,
        fast=0.6 + rng.normal(0, 0.01, 8),  # every run below every glibc run
        same=1.0 + rng.normal(0, 0.01, 8),
        slow=1.5 + rng.normal(0, 0.01, 8),
    )
    plan = plan_rounds(3, 5, 8, 0.05)  # 3 candidates: looks 5 and 8, bar 0.05/2/3
    assert plan.first_look == 5 and plan.looks == 2

    def at(r, active, out=frozenset()):
        cut = {k: v[:r] for k, v in runs.items()}
        return after_round(
            cut, active, "glibc", r, plan=plan, promising_p=0.25, eliminate=False, out=out
        )

    assert at(2, list(runs)) == at(4, list(runs)) == type(at(2, list(runs)))()  # no verdict
    v = at(5, list(runs))
    assert v.winner == "fast" and "fast beats glibc beyond the noise" in v.stop
    assert "alpha 0.05 over 2 looks" in v.stop
    # without the fast one: `slow` and `same` are narrowed out, and nothing is near: stop
    v = at(5, ["glibc", "same", "slow"], out={"fast"})
    assert v.winner is None and "slow" in v.dropped
    assert v.stop is not None and "comes near the bar" in v.stop


def test_a_candidate_out_of_the_race_never_wins_and_counts_in_holm_s_family():
    runs = _runs(glibc=[1.0, 1.01, 1.02, 0.99, 1.0], gone=[0.5, 0.51, 0.49, 0.5, 0.52])
    plan = plan_rounds(1, 5, 5, 0.05)
    assert "gone" in judge(runs, "glibc", plan).beats
    j = judge(runs, "glibc", plan, out={"gone"})
    assert j.beats == set() and j.adjusted["gone"] == 1.0 and j.raw["gone"] < 0.01
