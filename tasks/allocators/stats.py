"""From samples to answers: each (case, allocator) summarized, checked, and one recommended.

A pair is `unavailable`, `not applied` (by the probe), `failed` (exit code, timeout, or output
unlike the baseline's) or `ok`; each metric gets its median and spread. The recommendation
(configs/allocators.yaml `rule`): the fastest eligible candidate that beats the baseline beyond
the noise, Holm-adjusted, with a bootstrap margin; else the baseline stays.

The states and the rule: docs/allocators-rule.md#from-samples-to-a-recommendation
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from pydantic import BaseModel

from tasks.allocators.config import AllocatorsConfig, RecommendationRule
from tasks.allocators.decide import margin_interval
from tasks.allocators.measure import NOT_APPLIED, CaseInfo, CaseRounds, Measurements, Sample
from tasks.allocators.rounds import Judged, judge, plan_rounds

METRICS = (
    "wall_s",
    "cpu_s",
    "peak_rss_mb",
    "max_process_rss_mb",
    "mean_rss_mb",
    "minor_faults",
    "major_faults",
)


class Spread(BaseModel):
    median: float
    min: float
    max: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values) -> Spread | None:
        v = np.asarray([x for x in values if x is not None and not pd.isna(x)], dtype=float)
        if v.size == 0:
            return None
        q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
        return cls(median=float(med), min=float(v.min()), max=float(v.max()), q1=q1, q3=q3)

    @classmethod
    def bounds_of(cls, values) -> list[float] | None:
        """[median, min, max] of `values`, or None without one (the studies' JSON cells)."""
        s = cls.of(values)
        return None if s is None else [s.median, s.min, s.max]


class PairSummary(BaseModel):
    case: str
    workload: str
    input: str
    allocator: str
    status: str  # ok | failed | not applied | unavailable
    reason: str | None = None
    runs: int = 0
    ok_runs: int = 0
    output: str  # same | differs | unchecked (and why)
    stats: dict[str, Spread] = {}
    time_vs_baseline: float | None = None  # median time / the baseline's
    memory_vs_baseline: float | None = None  # median memory / the baseline's
    recommended: bool = False

    def median(self, metric: str) -> float | None:
        s = self.stats.get(metric)
        return s.median if s else None


class Recommendation(BaseModel):
    case: str
    workload: str
    input: str
    allocator: str | None  # None: no allocator ran cleanly
    baseline: str
    rule: str
    time_metric: str
    memory_metric: str
    objective: str = "time"  # what the margin is of: time, or memory
    # 1 - objective / the baseline's (time or memory): 0.12 = 12% less than the baseline
    margin: float | None = None
    memory_vs_baseline: float | None = None
    time_vs_baseline: float | None = None  # the winner's median time / the baseline's
    p_value: float | None = None  # one-sided exact Mann-Whitney, winner below the baseline
    p_adjusted: float | None = None  # the same, Holm-corrected for the candidates compared
    compared: int = 0  # candidates compared with the baseline (the correction's m)
    # the rule of the rounds (tasks.allocators.rounds): the rounds run, the level a look's
    # adjusted p must be under (alpha over the looks), why the rounds stopped, and, where the
    # rounds could not reach the bar, how many they would need
    rounds: int | None = None
    level: float | None = None
    stop: str = ""
    needed_rounds: int | None = None
    margin_low: float | None = None  # the margin's bootstrap interval (rule.confidence)
    margin_high: float | None = None
    best_challenger: str | None = None  # the fastest other candidate when the baseline stays
    ranges_overlap: bool | None = None  # [min, max] of the two overlap
    beyond_noise: bool | None = None  # by the rule's noise test; None when nothing to compare
    note: str = ""


def samples_frame(m: Measurements) -> pd.DataFrame:
    return pd.DataFrame([s.model_dump() for s in m.samples], columns=list(Sample.model_fields))


def ranges_overlap(x, y) -> bool:
    return bool(min(x) <= max(y) and min(y) <= max(x))


def summarize(m: Measurements) -> list[PairSummary]:
    """One PairSummary per (case, allocator), status and output checked (see the module)."""
    df = samples_frame(m)
    missing = {(u.case, u.allocator): u for u in m.unavailable}
    out: list[PairSummary] = []
    for case in m.cases:
        cdf = df[df["case"] == case.label] if len(df) else df
        base = cdf[(cdf["allocator"] == m.baseline) & cdf["ok"]] if len(cdf) else cdf
        base_hashes = set(base["stdout_sha256"].dropna()) if len(base) else set()
        if len(base_hashes) == 1:
            reference = next(iter(base_hashes))
            unchecked = None
        elif not base_hashes:
            reference = None
            unchecked = f"unchecked: no clean {m.baseline} run to compare with"
        else:
            reference = None
            unchecked = (
                f"unchecked: {m.baseline}'s own output differs between runs "
                f"({len(base_hashes)} distinct), so it cannot be compared"
            )
        for a in m.allocators:
            key = dict(case=case.label, workload=case.workload, input=case.input, allocator=a.name)
            if (case.label, a.name) in missing:
                out.append(
                    PairSummary(
                        **key,
                        status="unavailable",
                        reason=missing[(case.label, a.name)].message,
                        output="unchecked: not run",
                    )
                )
                continue
            adf = cdf[cdf["allocator"] == a.name] if len(cdf) else cdf
            stats = {}
            for metric in METRICS:
                s = Spread.of(adf[metric]) if len(adf) else None
                if s is not None:
                    stats[metric] = s
            bad = adf[~adf["ok"].astype(bool)] if len(adf) else adf
            reasons = []
            if len(adf) == 0:
                reasons.append("no run measured")
            if len(bad):
                first = bad.iloc[0]
                reasons.append(f"{len(bad)} of {len(adf)} runs failed: {first['error']}")
            output = unchecked or "same"
            if reference is not None and len(adf):
                good = adf[adf["ok"].astype(bool)]
                differ = int((good["stdout_sha256"] != reference).sum())
                if differ:
                    other = good.loc[good["stdout_sha256"] != reference, "stdout_sha256"].iloc[0]
                    output = "differs"
                    reasons.append(
                        f"output differs from {m.baseline}'s in {differ} of {len(good)} runs "
                        f"(stdout sha256 {str(other)[:12]} vs {reference[:12]})"
                    )
            not_applied = len(bad) and bad["error"].astype(str).str.startswith(NOT_APPLIED).any()
            status = "not applied" if not_applied else "failed" if reasons else "ok"
            out.append(
                PairSummary(
                    **key,
                    status=status,
                    reason="; ".join(reasons) or None,
                    runs=len(adf),
                    ok_runs=int(adf["ok"].astype(bool).sum()) if len(adf) else 0,
                    output=output,
                    stats=stats,
                )
            )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def recommend(
    m: Measurements,
    pairs: list[PairSummary],
    rule: RecommendationRule,
    objectives: dict[str, str] | None = None,
) -> list[Recommendation]:
    """One recommendation per case by `rule` (see the module), on the objective `objectives`
    names for its workload (AllocatorsConfig.objectives) where it names one; marks the pairs'
    `recommended` and fills their ratios to the baseline."""
    df = samples_frame(m)
    order = {a.name: i for i, a in enumerate(m.allocators)}
    recs = []
    for case in m.cases:
        case_rule = rule.for_objective((objectives or {}).get(case.workload))
        cpairs = [p for p in pairs if p.case == case.label]
        cdf = df[(df["case"] == case.label) & df["ok"].astype(bool)]
        recs.append(_recommend_case(m, case, case_rule, cpairs, cdf, order))
    return recs


def _fill_ratios(cpairs: list[PairSummary], base: PairSummary, rule: RecommendationRule) -> None:
    """Each available pair's median time and memory over the baseline's."""
    for p in cpairs:
        if p.status != "unavailable":
            p.time_vs_baseline = _ratio(p.median(rule.time), base.median(rule.time))
            p.memory_vs_baseline = _ratio(p.median(rule.memory), base.median(rule.memory))


def _recommend_case(
    m: Measurements,
    case: CaseInfo,
    rule: RecommendationRule,
    cpairs: list[PairSummary],
    cdf: pd.DataFrame,
    order: dict[str, int],
) -> Recommendation:
    """One case's recommendation: the fastest eligible candidate that beats the baseline at a
    look that decides, else the baseline (else, without a clean baseline, the fastest)."""
    primary, (guard, tolerance) = rule.primary, rule.guard
    base = next((p for p in cpairs if p.allocator == m.baseline), None)
    base_ok = base is not None and base.status == "ok"
    if base_ok:
        _fill_ratios(cpairs, base, rule)
    head = dict(
        case=case.label,
        workload=case.workload,
        input=case.input,
        baseline=m.baseline,
        rule=rule.describe(),
        time_metric=rule.time,
        memory_metric=rule.memory,
        objective=rule.objective,
    )
    timed = [p for p in cpairs if p.status == "ok" and p.median(rule.time) is not None]
    # an allocator whose memory reads 0 was not measured (a probe-less peak): named, not
    # dropped without a word
    no_memory = sorted(p.allocator for p in timed if not p.median(rule.memory))
    notes = [f"{', '.join(no_memory)}: median {rule.memory} reads 0, left out"] if no_memory else []
    cands = [p for p in timed if p.median(rule.memory)]
    if not cands:
        note = "; ".join(["no allocator ran cleanly on this case", *notes])
        return Recommendation(**head, allocator=None, note=note)

    def runs(name: str) -> np.ndarray:
        return cdf.loc[cdf["allocator"] == name, primary].to_numpy(float)

    smallest = min(p.median(guard) for p in cands)
    eligible = [p for p in cands if p.median(guard) <= smallest * (1 + tolerance)]
    rounds, judged = _judge_case(m, case.label, rule, cpairs, runs, base_ok)
    decides = rounds.plan.decides_at(rounds.rounds)
    beaten = set(judged.beats) if judged and decides else set()
    key = lambda p: (p.median(primary), p.allocator != m.baseline, order[p.allocator])  # noqa: E731
    winners = [p for p in eligible if p.allocator != m.baseline and p.allocator in beaten]
    if winners:
        winner = min(winners, key=key)
    elif base_ok:
        winner = base
    else:
        winner = min(eligible, key=key)
    winner.recommended = True
    rec = Recommendation(
        **head,
        allocator=winner.allocator,
        compared=len(judged.raw) if judged else 0,
        rounds=rounds.rounds,
        level=rounds.plan.level if rounds.plan.first_look else None,
        stop=rounds.stop,
        needed_rounds=rounds.plan.needed,
    )
    excluded = sorted({p.allocator for p in cands} - {p.allocator for p in eligible})
    if excluded:
        notes.append(f"{', '.join(excluded)} over {tolerance:.0%} more {guard} than the lowest")
    shown = winner
    if not base_ok:
        notes.append(f"{m.baseline} did not run cleanly: no margin")
    elif winner.allocator == m.baseline:
        rec.margin = 0.0
        rec.memory_vs_baseline = 1.0
        rec.time_vs_baseline = 1.0
        others = [p for p in eligible if p.allocator != m.baseline]
        shown = min(others, key=key) if others else winner
        notes.append(_why_baseline_stays(m.baseline, rule, rounds, decides, shown))
        if others:
            rec.best_challenger = shown.allocator
    if base_ok and shown.allocator != m.baseline:
        _fill_margin(rec, shown, shown is winner, base, runs, rule, judged, beaten)
    rec.note = "; ".join(notes)
    return rec


def _judge_case(
    m: Measurements,
    case: str,
    rule: RecommendationRule,
    cpairs: list[PairSummary],
    runs: Callable[[str], np.ndarray],
    base_ok: bool,
) -> tuple[CaseRounds, Judged | None]:
    """How the case's rounds went, and the family judged as the rounds' last look
    (tasks.allocators.rounds.judge; None without a clean baseline): every candidate with a
    clean run (a failed pair's runs count, out of the race)."""
    family = {p.allocator: runs(p.allocator) for p in cpairs if p.status in ("ok", "failed")}
    family = {k: v for k, v in family.items() if len(v)}
    rounds = _rounds_of(m, case, rule, len(family) - (m.baseline in family))
    out = set(rounds.dropped) | {p.allocator for p in cpairs if p.status != "ok"}
    return rounds, (judge(family, m.baseline, rounds.plan, out) if base_ok else None)


def _why_baseline_stays(
    baseline: str,
    rule: RecommendationRule,
    rounds: CaseRounds,
    decides: bool,
    fastest: PairSummary,
) -> str:
    """The note when the baseline stays: no look could decide, or none beat it beyond the
    noise (naming the fastest challenger), or it is itself the fastest."""
    if fastest.allocator == baseline:
        return f"{baseline} itself is the fastest of those within the memory bound"
    if rounds.plan.first_look is None:
        return f"{rounds.plan.cannot()} (fastest: {fastest.allocator})"
    if not decides:
        return (
            f"the rounds stopped before a look (round {rounds.plan.first_look} or "
            f"{rounds.plan.bound}) could decide (fastest: {fastest.allocator})"
        )
    return (
        f"no candidate beats {baseline} beyond the noise"
        + (" after Holm's correction" if rule.correction == "holm" else "")
        + f" (fastest: {fastest.allocator})"
    )


def _fill_margin(
    rec: Recommendation,
    shown: PairSummary,
    is_winner: bool,
    base: PairSummary,
    runs: Callable[[str], np.ndarray],
    rule: RecommendationRule,
    judged: Judged,
    beaten: set[str],
) -> None:
    """The shown challenger's margin over the baseline with its interval, p-values and
    whether it is beyond the noise (its margin and memory ratio are the recommendation's
    where it won)."""
    x, y = runs(shown.allocator), runs(rec.baseline)
    margin, low, high = margin_interval(x, y, rule.confidence)
    if is_winner:
        rec.margin = margin
        rec.memory_vs_baseline = _ratio(shown.median(rule.memory), base.median(rule.memory))
        rec.time_vs_baseline = _ratio(shown.median(rule.time), base.median(rule.time))
    rec.margin_low, rec.margin_high = low, high
    rec.p_value = judged.raw[shown.allocator]
    rec.p_adjusted = judged.adjusted.get(shown.allocator)
    rec.ranges_overlap = ranges_overlap(x, y)
    rec.beyond_noise = shown.allocator in beaten


def _rounds_of(m: Measurements, case: str, rule: RecommendationRule, candidates: int) -> CaseRounds:
    """How the case's rounds went (Measurements.rounds); a measurement that did not keep it
    (made with fixed rounds, or before the rule kept them) is judged as one look at the rounds
    its baseline ran."""
    kept = m.rounds.get(case)
    if kept is not None:
        return kept
    n = sum(1 for s in m.samples if s.case == case and s.allocator == m.baseline and s.ok)
    n = n or m.repetitions
    plan = plan_rounds(candidates, n, n, rule.alpha, rule.correction, rule.noise)
    return CaseRounds(plan=plan, rounds=n, stop=plan.cannot())


def analyse(
    m: Measurements, config: AllocatorsConfig
) -> tuple[list[PairSummary], list[Recommendation]]:
    """summarize then recommend, by the config's rule."""
    pairs = summarize(m)
    return pairs, recommend(m, pairs, config.rule, config.objectives)
