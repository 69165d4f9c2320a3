"""When `heapcast tune` stops measuring: which candidates are dropped between rounds and when the
rounds stop, over each arm's runs of the rule's metric (lower is better). Pure: arrays in, a
verdict out. The rule, its statistics (tasks.allocators.decide: the rank test, Holm's correction)
and what it costs are in docs/allocators.md#when-tune-stops.

Separation is judged against the run-to-run noise (`run_noise`): a candidate is dropped for being
worse than the baseline or the leader only when its best run is worse than their worst by more
than the spread the arms' runs show so far, so that two unlucky runs on a loaded machine do not
drop a candidate that can win. Memory hardly varies run to run: there the spread is near zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.allocators.decide import holm, mann_whitney_p

ELIMINATE_FROM = 2
DECIDE_FROM = 3


def run_noise(runs: dict[str, np.ndarray], arms: list[str]) -> float:
    """The run-to-run spread seen so far: the median over `arms` with two runs or more of
    (max - min) / median; 0 before any arm has two."""
    spreads = [
        float(np.ptp(x) / np.median(x))
        for n in arms
        if len(x := runs.get(n, ())) >= 2 and np.median(x) > 0
    ]
    return float(np.median(spreads)) if spreads else 0.0


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
    noise = run_noise(runs, list(med))
    beyond = f" by more than the runs' spread ({noise:.1%})" if noise > 0 else ""

    def worse(x: np.ndarray, ref: np.ndarray) -> bool:  # every run worse, beyond the noise
        return bool(x.min() > ref.max() + noise * float(np.median(ref)))

    for n in active:
        if n in (baseline, leader) or n not in med:
            continue
        x = runs[n]
        if worse(x, base):
            dropped[n] = (
                f"every run's {metric} above every {baseline} run's{beyond}, after {rounds} rounds"
            )
        elif worse(x, runs[leader]):
            dropped[n] = (
                f"every run's {metric} above every {leader} run's{beyond}, after {rounds} "
                "rounds: it cannot be the best"
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
