"""When `heapcast tune` stops measuring: candidates dropped between rounds, rounds stopped once
the choice is decided. A sequential rule over the existing statistics (tasks.allocators.decide:
the rank test, Holm's correction), pure: arrays in, a verdict out.

After each round, from ELIMINATE_FROM rounds on (each arm's runs: its metric, lower is better):

- a candidate is dropped when every one of its runs is worse than every run of the baseline (it
  cannot beat it), or than every run of the leader (the best median among those still run: it
  cannot be the best): complete separation, the `minmax` test of the rule. From DECIDE_FROM
  rounds on, also when its median is not below the baseline's (a winner's must be);
- the rounds stop when no challenger is left; and from `decide_rounds` rounds on (the config's
  repetitions, the rank test's least) when the leader beats the baseline beyond the noise after
  Holm's correction over every candidate compared (dropped ones included: the family is every
  candidate that was run), or when no challenger better by median has an uncorrected p under
  `promising_p`.

A candidate the rule's other bound leaves out (for time: its memory over the tolerance; memory
hardly varies run to run) is dropped at once: it cannot be recommended. For memory the other
bound is time, which does vary: a candidate whose median time is over the tolerance so far is
`unfit`: it goes on being run, but cannot lead (it neither stops the rounds nor has others
dropped against its runs) until its time comes back within the bound.

What the stop costs: a candidate within the noise of the leader runs until the end; one that is
truly better by less than the noise of 3 rounds can be missed (the answer then keeps the
baseline, never names a worse one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.allocators.decide import holm, mann_whitney_p

ELIMINATE_FROM = 2
DECIDE_FROM = 3


@dataclass(frozen=True)
class RoundVerdict:
    dropped: dict[str, str] = field(default_factory=dict)  # name -> why, this round
    stop: str | None = None  # why the rounds stop here; None: another round


def after_round(
    runs: dict[str, np.ndarray],
    active: list[str],
    baseline: str,
    rounds: int,
    *,
    decide_rounds: int,
    alpha: float,
    promising_p: float,
    metric: str = "time",
    ineligible: dict[str, str] | None = None,
    unfit: set[str] | frozenset[str] = frozenset(),
) -> RoundVerdict:
    """The verdict after `rounds` rounds (see the module): `runs` holds every candidate run so far
    (dropped ones too), `active` those still run (the baseline among them); `ineligible`: those
    the rule's other bound leaves out (memory over its tolerance), with why: dropped, and never
    the leader; `unfit`: those over a noisy bound (time) so far: run on, but never the leader."""
    if not [n for n in active if n != baseline]:
        return RoundVerdict(stop=f"no candidate to compare with {baseline}")
    if rounds < ELIMINATE_FROM or baseline not in runs or len(runs[baseline]) == 0:
        return RoundVerdict()
    out = {n: why for n, why in (ineligible or {}).items() if n in active and n != baseline}
    med = {n: float(np.median(runs[n])) for n in active if len(runs.get(n, ())) and n not in out}
    base = runs[baseline]
    fit = [n for n in med if n == baseline or n not in unfit]
    leader = min(fit, key=lambda n: (med[n], n != baseline))
    dropped: dict[str, str] = {n: f"{why}, after {rounds} rounds" for n, why in out.items()}
    for n in active:
        if n in (baseline, leader) or n not in med:
            continue
        x = runs[n]
        if x.min() > base.max():
            dropped[n] = f"every run's {metric} above every {baseline} run's, after {rounds} rounds"
        elif x.min() > runs[leader].max():
            dropped[n] = (
                f"every run's {metric} above every {leader} run's, after {rounds} rounds: it "
                "cannot be the best"
            )
        elif rounds >= DECIDE_FROM and med[n] >= med[baseline]:
            dropped[n] = (
                f"its median {metric} not below {baseline}'s after {rounds} rounds: a winner "
                "must be"
            )
    left = [n for n in active if n != baseline and n not in dropped and n in med]
    if not left:
        return RoundVerdict(dropped, f"no candidate left that could beat {baseline}")
    better = [n for n in left if med[n] < med[baseline]]
    if rounds < decide_rounds:
        return RoundVerdict(dropped)
    compared = [n for n in runs if n != baseline and len(runs[n])]
    raw = {n: mann_whitney_p(runs[n], base) for n in compared}
    adjusted = holm(raw)
    if leader != baseline and adjusted[leader] < alpha:
        return RoundVerdict(
            dropped,
            f"{leader} beats {baseline} beyond the noise (Holm-adjusted p "
            f"{adjusted[leader]:.4f} over {len(compared)} compared) after {rounds} rounds",
        )
    if not any(raw[n] < promising_p for n in better):
        return RoundVerdict(
            dropped,
            f"no candidate better than {baseline} comes near the noise bar after {rounds} "
            f"rounds (every uncorrected p >= {promising_p})",
        )
    return RoundVerdict(dropped)
