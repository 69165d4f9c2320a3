"""The one rule of `heapcast tune` and of the allocators stage (the night's catalog and the
layer's seeds): how many rounds, which candidates run on, when the rounds stop, who wins. Pure:
arrays in, a verdict out. The rule, its statistics (tasks.allocators.decide: the rank test,
Holm's correction) and what it costs are in docs/allocators-rule.md#the-rule-of-the-rounds.

The plan, before any run (`plan_rounds`). A winner must beat the baseline by a one-sided exact
rank test (its runs lower than the baseline's), Holm-corrected over the m candidates compared,
at a look: a round at which the rule may stop. There are two looks at most, the first round that
can decide and the bound, and alpha is split evenly over them (each at alpha / looks), so that
stopping at the first look that passes is not two chances at a false winner: the false-winner
rate stays at alpha whatever the rounds do (a union bound over the looks and Holm's family). The
first look is the first round r from `planned` whose complete separation, 1 / C(2r, r), can
pass Holm's first bar alpha / (looks * m); rounds before it cannot decide. No such round up to
`bound`: the plan says so, and how many rounds it would need (`needed`), before measuring.

After each round (`after_round`):

- tune only (`eliminate`), from round 2: a candidate is dropped when every run of it is worse
  than every run of the baseline, or of the leader (the best median), by more than the runs'
  spread so far (`run_noise`): it cannot win; from round 3, also one whose median is not below
  the baseline's. The stage runs every candidate for the planned rounds (its table shows them
  all side by side);
- both, for the time objective: a candidate whose median memory is over the rule's tolerance is
  out (it cannot be recommended);
- both, from the planned rounds: the candidates narrow to those that could still win (below the
  baseline's median with an uncorrected p under `promising_p`, and the leader); the others stop
  running. A dropped candidate is out of the race: it stays in Holm's family with p = 1 and is
  never the winner;
- at a look: the rounds stop when the leader beats the baseline (`judge`); else when no
  candidate is left near the bar, or at the bound.

Separation is judged against the run-to-run noise (`run_noise`): a candidate is dropped for being
worse than the baseline or the leader only when its best run is worse than their worst by more
than the spread the arms' runs show so far, so that two unlucky runs on a loaded machine do not
drop a candidate that can win. Memory hardly varies run to run: there the spread is near zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from tasks.allocators.decide import holm, mann_whitney_p, smallest_p

ELIMINATE_FROM = 2
DECIDE_FROM = 3
MAX_ROUNDS = 60  # how far `needed` looks


class Plan(BaseModel):
    """When the rule may decide (see the module), fixed before any run."""

    candidates: int  # m: those compared with the baseline
    planned: int  # rounds every candidate runs before the rule narrows or stops
    bound: int  # rounds at most
    alpha: float
    correction: str = "holm"  # holm | none
    noise: str = "mann_whitney"  # mann_whitney | minmax (no p-value: decides from `planned`)
    first_look: int | None  # None: no round up to `bound` can pass the bar
    needed: int | None = None  # then: the fewest rounds at most that could

    @property
    def looks(self) -> int:
        """The first look and the bound: two at most (one when they are the same round)."""
        return 0 if self.first_look is None else 1 + (self.bound > self.first_look)

    @property
    def level(self) -> float:
        """Each look's family-wise level: alpha split evenly over the looks."""
        return self.alpha / max(self.looks, 1)

    @property
    def bar(self) -> float:
        """Holm's first bar at a look: the smallest p must be below it."""
        m = self.candidates if self.correction == "holm" else 1
        return self.level / max(m, 1)

    def decides_at(self, rounds: int) -> bool:
        return self.first_look is not None and rounds in (self.first_look, self.bound)

    def describe(self) -> str:
        """One line: the design and what it can reach."""
        if self.noise == "minmax":
            return f"ranges apart from {self.planned} rounds, at most {self.bound}"
        m = f"{self.candidates} candidate{'s' if self.candidates != 1 else ''}"
        if self.first_look is None:
            return self.cannot()
        looks = (
            f"round {self.first_look}"
            if self.looks == 1
            else f"rounds {self.first_look} and {self.bound}"
        )
        return (
            f"one-sided rank test, {m}, alpha {self.alpha:g} over {self.looks} look"
            f"{'s' if self.looks != 1 else ''} ({looks}): Holm's first bar {self.bar:.2g}, "
            f"{self.first_look} runs against {self.first_look} reach "
            f"{smallest_p(self.first_look, self.first_look, 'less'):.2g}"
        )

    def cannot(self) -> str:
        """Why this plan cannot decide, and what would (empty when it can)."""
        if self.first_look is not None:
            return ""
        m = f"{self.candidates} candidate{'s' if self.candidates != 1 else ''}"
        best = smallest_p(self.bound, self.bound, "less")
        more = (
            f"; it needs {self.needed} rounds ({self.needed - self.bound} more)"
            if self.needed
            else ""
        )
        return (
            f"{self.bound} round{'s' if self.bound != 1 else ''} cannot decide among {m}: "
            f"{self.bound} runs against {self.bound} reach p {best:.2g} at best, Holm's first "
            f"bar is {self.bar:.2g}{more}"
        )


def plan_rounds(
    candidates: int,
    planned: int,
    bound: int,
    alpha: float,
    correction: str = "holm",
    noise: str = "mann_whitney",
) -> Plan:
    """The plan (see the module): the first look is the earliest round r in [planned, bound]
    with 1 / C(2r, r) below alpha / (looks * m), looks 2 when r is before the bound, else 1."""
    bound = max(bound, planned)
    head = dict(
        candidates=candidates,
        planned=planned,
        bound=bound,
        alpha=alpha,
        correction=correction,
        noise=noise,
    )
    if noise == "minmax" or candidates < 1:
        return Plan(**head, first_look=planned)
    m = candidates if correction == "holm" else 1
    for r in range(max(planned, 1), bound + 1):
        if smallest_p(r, r, "less") < alpha / ((1 + (bound > r)) * m):
            return Plan(**head, first_look=r)
    needed = next(
        (
            b
            for b in range(bound + 1, MAX_ROUNDS + 1)
            if plan_rounds(candidates, planned, b, alpha, correction, noise).first_look
        ),
        None,
    )
    return Plan(**head, first_look=None, needed=needed)


def over_bound(values: dict[str, np.ndarray], metric: str, tolerance: float) -> dict[str, str]:
    """The candidates whose median `metric` (the rule's guard: memory for the time objective,
    time for memory) is over `tolerance` above the lowest median, with why; zeros (a metric not
    measured) are left aside."""
    med = {n: float(np.median(v[v > 0])) for n, v in values.items() if len(v) and (v > 0).any()}
    if not med:
        return {}
    low = min(med.values())
    return {
        n: f"its median {metric} {v / low - 1:.0%} over the lowest (tolerance {tolerance:.0%})"
        for n, v in med.items()
        if v > low * (1 + tolerance)
    }


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
class Judged:
    """The rank test at a look: every compared candidate's p, raw and adjusted, and who beats
    the baseline beyond the noise."""

    raw: dict[str, float]  # one-sided p, each candidate's runs against the baseline's
    adjusted: dict[str, float]  # Holm over the family, the out-of-race at p = 1
    beats: set[str]  # in the race, below the baseline's median, adjusted below the level


def judge(
    runs: dict[str, np.ndarray],
    baseline: str,
    plan: Plan,
    out: set[str] | frozenset[str] = frozenset(),
) -> Judged:
    """The test of the rule at a look (see the module); `out`: the candidates out of the race."""
    base = runs.get(baseline, np.array([]))
    compared = [n for n in runs if n != baseline and len(runs[n])]
    raw = {n: mann_whitney_p(runs[n], base, "less") for n in compared}
    family = {n: 1.0 if n in out else p for n, p in raw.items()}
    adjusted = holm(family) if plan.correction == "holm" else family
    if not len(base):
        return Judged(raw, adjusted, set())
    med = float(np.median(base))
    below = {n for n in compared if n not in out and float(np.median(runs[n])) < med}
    if plan.noise == "minmax":
        beats = {n for n in below if runs[n].max() < base.min()}
    else:
        beats = {n for n in below if adjusted[n] < plan.level}
    return Judged(raw, adjusted, beats)


@dataclass(frozen=True)
class RoundVerdict:
    dropped: dict[str, str] = field(default_factory=dict)  # name -> why, this round
    stop: str | None = None  # why the rounds stop here; None: another round
    winner: str | None = None  # the candidate the rounds stopped on, when one beat the baseline


@dataclass
class Race:
    """Who is still run, who is out and why, and how the rounds ended: the state the stage and
    tune keep between rounds, changed only by `apply`."""

    active: list[str]
    dropped: dict[str, str] = field(default_factory=dict)
    stop: str | None = None
    winner: str | None = None

    def apply(self, verdict: RoundVerdict) -> bool:
        """Take a round's verdict; True when the rounds stop."""
        for n, why in verdict.dropped.items():
            self.active.remove(n)
            self.dropped[n] = why
        if verdict.stop:
            self.stop, self.winner = verdict.stop, verdict.winner
        return verdict.stop is not None


def after_round(
    runs: dict[str, np.ndarray],
    active: list[str],
    baseline: str,
    rounds: int,
    *,
    plan: Plan,
    promising_p: float,
    metric: str = "time",
    eliminate: bool = True,
    out: set[str] | frozenset[str] = frozenset(),
    ineligible: dict[str, str] | None = None,
    unfit: set[str] | frozenset[str] = frozenset(),
) -> RoundVerdict:
    """The verdict after `rounds` rounds (see the module): `runs` holds every candidate run so far
    (dropped ones too), `active` those still run (the baseline among them), `out` those dropped
    before; `eliminate`: tune's drops before the planned rounds; `ineligible`: those the rule's
    other bound leaves out (memory over its tolerance), with why: dropped, and never the leader;
    `unfit`: those over a noisy bound (time) so far: run on, but never the leader."""
    if not [n for n in active if n != baseline]:
        return RoundVerdict(stop=f"no candidate to compare with {baseline}")
    if baseline not in runs or len(runs[baseline]) == 0:
        return RoundVerdict()
    if rounds < ELIMINATE_FROM and rounds < plan.planned:
        return RoundVerdict()
    gone = {n: why for n, why in (ineligible or {}).items() if n in active and n != baseline}
    med = {n: float(np.median(runs[n])) for n in active if len(runs.get(n, ())) and n not in gone}
    fit = [n for n in med if n == baseline or n not in unfit]
    leader = min(fit, key=lambda n: (med[n], n != baseline))
    dropped: dict[str, str] = {n: f"{why}, after {rounds} rounds" for n, why in gone.items()}
    if eliminate:
        dropped |= _clearly_worse(runs, active, baseline, leader, med, rounds, metric)
    left = [n for n in active if n != baseline and n not in dropped and n in med]
    if not left:
        return RoundVerdict(dropped, f"no candidate left that could beat {baseline}")
    if rounds < plan.planned:
        return RoundVerdict(dropped)
    if plan.first_look is None:
        return RoundVerdict(dropped, plan.cannot())
    j = judge(runs, baseline, plan, set(out) | set(dropped))
    decided = _decided(j, plan, rounds, baseline, leader, fit, med, dropped)
    if decided is not None:
        return decided
    # narrow to those that could still win: below the baseline, near the bar, or the leader
    for n in left:
        if n == leader:
            continue
        if med[n] >= med[baseline]:
            dropped[n] = f"its median {metric} not below {baseline}'s after {rounds} rounds"
        elif j.raw[n] >= promising_p:
            dropped[n] = (
                f"not near the bar after {rounds} rounds (uncorrected p {j.raw[n]:.2g} >= "
                f"{promising_p:g})"
            )
    near = [
        n for n in left if n not in dropped and med[n] < med[baseline] and j.raw[n] < promising_p
    ]
    if not near:
        best = min(left, key=lambda n: j.raw[n])
        return RoundVerdict(
            dropped,
            f"no candidate better than {baseline} comes near the bar after {rounds} rounds "
            f"(every uncorrected p >= {promising_p:g}; the lowest {best}'s {j.raw[best]:.2g})",
        )
    if rounds >= plan.bound:
        return RoundVerdict(
            dropped,
            f"the bound of {plan.bound} rounds: {', '.join(near)} near the bar, not beyond it",
        )
    return RoundVerdict(dropped)


def _clearly_worse(
    runs: dict[str, np.ndarray],
    active: list[str],
    baseline: str,
    leader: str,
    med: dict[str, float],
    rounds: int,
    metric: str,
) -> dict[str, str]:
    """tune's drops before the planned rounds, with why: a candidate every run of which is
    worse than every run of the baseline or of the leader beyond the runs' noise, or (from
    DECIDE_FROM rounds) whose median is not below the baseline's."""
    noise = run_noise(runs, list(med))
    beyond = f" by more than the runs' spread ({noise:.1%})" if noise > 0 else ""

    def worse(x: np.ndarray, ref: np.ndarray) -> bool:  # every run worse, beyond the noise
        return bool(x.min() > ref.max() + noise * float(np.median(ref)))

    dropped = {}
    for n in active:
        if n in (baseline, leader) or n not in med:
            continue
        x = runs[n]
        if worse(x, runs[baseline]):
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
    return dropped


def _decided(
    j: Judged,
    plan: Plan,
    rounds: int,
    baseline: str,
    leader: str,
    fit: list[str],
    med: dict[str, float],
    dropped: dict[str, str],
) -> RoundVerdict | None:
    """The winner, at a look that decides: the leader where it beats the baseline beyond the
    noise; at the bound, the fastest fit one that does (None: no winner yet)."""
    if plan.decides_at(rounds) and leader in j.beats:
        family = len(j.raw)
        how = (
            "every run below every one of its runs"
            if plan.noise == "minmax"
            else f"one-sided rank test, Holm-adjusted p {j.adjusted[leader]:.2g} < "
            f"{plan.level:.2g}: alpha {plan.alpha:g} over {plan.looks} look"
            f"{'s' if plan.looks != 1 else ''}, {family} compared"
        )
        return RoundVerdict(
            dropped,
            f"{leader} beats {baseline} beyond the noise after {rounds} rounds ({how})",
            winner=leader,
        )
    if plan.decides_at(rounds) and rounds >= plan.bound and (won := j.beats & set(fit)):
        winner = min(won, key=lambda n: med[n])
        return RoundVerdict(
            dropped,
            f"the bound of {plan.bound} rounds: {winner} beats {baseline} beyond the noise "
            f"(Holm-adjusted p {j.adjusted[winner]:.2g} < {plan.level:.2g}), the leader "
            f"{leader} does not",
            winner=winner,
        )
    return None
