"""Can the allocator advice say yes, and never a wrong yes? The rule of the rounds
(tasks/allocators/rounds.py: the plan, after_round, judge) run many times on draws from measured
run times, beside the rule it replaced, for each design the project runs.

Designs (candidates against glibc, planned rounds, bound), as configs/allocators.yaml sets them:
the seeds' full night (11, 5, 8), the catalog's stage (16, 5, 8), tune (4, 5, 7), the quick
seeds (6, 3, 3). Scenarios per design:

  aa        every arm drawn from the baseline's own runs: any winner is a false one (the rate
            the rule states: alpha, 5%);
  twins     two candidates drawn from one faster arm's runs, the others from the baseline's:
            how often a twin wins, and the split between the twins (a fair rule: about even);
  measured  every arm from its own measured runs (the seeds' numpy temporaries): how often each
            is named, and after how many rounds.

A draw is a measured run plus a Gaussian jitter of half the arm's standard deviation (a smoothed
bootstrap: no two draws tie, as no two timed runs do). Each trial runs the rounds as the stage
(or tune: --tune-mode) does: every candidate for the planned rounds, then after_round narrowing
and stopping. The old rule (two-sided rank test, Holm at alpha at every look, rounds added while
a faster candidate had an uncorrected p under 0.25, up to the bound it had: the seeds' 5 rounds)
runs on the same draws.

    .venv/bin/python studies/advice_rule/advice_rule.py [--runs PATH] [--trials 2000]
        [--seed 0] [--out studies/advice_rule/advice_rule.json]

--runs: a JSON {allocator: [wall seconds, ...]} of one case (default: the seeds' numpy
temporaries as measured into studies/advice_rule/seeds_numpy_temporaries.json, baseline
glibc). About a minute for every design at 2,000 trials.

--real: one real A/A round on the catalog instead: the stage's own measurement
(tasks.allocators.measure.measure_cases, docker) of the quick inputs under three identical glibc
candidates and the recommendation of each (any winner is a false one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tasks.allocators.decide import holm, mann_whitney_p  # noqa: E402
from tasks.allocators.rounds import after_round, plan_rounds  # noqa: E402

OUT = REPO / "studies" / "advice_rule" / "advice_rule.json"
RUNS = REPO / "studies" / "advice_rule" / "seeds_numpy_temporaries.json"
BASELINE = "glibc"
ALPHA = 0.05
PROMISING_P = 0.25
# (name, candidates against the baseline, planned rounds, bound, tune's elimination, the old
# rule's bound: the seeds ran their 5 rounds and no more)
DESIGNS = (
    ("seeds", 11, 5, 8, False, 5),
    ("stage", 16, 5, 8, False, 8),
    ("tune", 4, 5, 7, True, 7),
    ("quick seeds", 6, 3, 3, False, 3),
)
JITTER = 0.5  # of the arm's standard deviation


class Arms:
    """Each arm's measured runs, drawn from with a jitter (see the module)."""

    def __init__(self, runs: dict[str, list[float]]):
        self.runs = {k: np.asarray(v, float) for k, v in runs.items() if len(v)}
        self.sd = {k: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for k, v in self.runs.items()}

    def draw(self, arm: str, rng: np.random.Generator, n: int = 1) -> np.ndarray:
        v = self.runs[arm]
        return rng.choice(v, n) + rng.normal(0, JITTER * self.sd[arm] + 1e-12, n)


def race(
    sources: dict[str, str],
    arms: Arms,
    planned: int,
    bound: int,
    eliminate: bool,
    rng: np.random.Generator,
) -> tuple[str | None, int]:
    """One trial of the rule (tasks.allocators.rounds) as the stage (or tune) runs it: the
    candidates `sources` {name: the arm it draws from}; (winner or None, rounds run)."""
    names = list(sources)
    plan = plan_rounds(len(names) - 1, planned, bound, ALPHA)
    runs: dict[str, list[float]] = {n: [] for n in names}
    active, out = list(names), set()
    for r in range(1, bound + 1):
        for n in active:
            runs[n].append(float(arms.draw(sources[n], rng)[0]))
        if not eliminate and r < planned:
            continue
        v = after_round(
            {k: np.asarray(x) for k, x in runs.items()},
            active,
            BASELINE,
            r,
            plan=plan,
            promising_p=PROMISING_P,
            eliminate=eliminate,
            out=out,
        )
        for n in v.dropped:
            active.remove(n)
            out.add(n)
        if v.stop:
            return v.winner, r
    return None, bound


def old_race(
    sources: dict[str, str], arms: Arms, planned: int, bound: int, rng: np.random.Generator
) -> tuple[str | None, int]:
    """The rule it replaced, on the same kind of draws: every candidate every round; from the
    planned rounds, the fastest with a two-sided Holm-adjusted p under alpha wins; while none
    does and a faster one has an uncorrected p under PROMISING_P, another round, up to bound."""
    names = list(sources)
    runs = {n: list(arms.draw(sources[n], rng, planned)) for n in names}
    r = planned
    while True:
        base = np.asarray(runs[BASELINE])
        raw = {n: mann_whitney_p(runs[n], base) for n in names if n != BASELINE}
        adjusted = holm(raw)
        faster = [n for n in raw if np.median(runs[n]) < np.median(base)]
        won = [n for n in faster if adjusted[n] < ALPHA]
        if won:
            return min(won, key=lambda n: np.median(runs[n])), r
        if r >= bound or not any(raw[n] < PROMISING_P for n in faster):
            return None, r
        for n in names:
            runs[n].append(float(arms.draw(sources[n], rng)[0]))
        r += 1


def scenario(
    sources: dict[str, str],
    arms: Arms,
    planned: int,
    bound: int,
    eliminate: bool,
    trials: int,
    seed: int,
    old_bound: int,
) -> dict[str, Any]:
    """`trials` of the rule and of the old one on the same seed: how often each candidate won,
    and the rounds run (median, max)."""
    out: dict[str, Any] = {}
    for which in ("rule", "old rule"):
        rng = np.random.default_rng(seed)
        wins: dict[str, int] = {}
        rounds = []
        for _ in range(trials):
            if which == "rule":
                w, r = race(sources, arms, planned, bound, eliminate, rng)
            else:
                w, r = old_race(sources, arms, planned, old_bound, rng)
            rounds.append(r)
            if w is not None:
                wins[w] = wins.get(w, 0) + 1
        out[which] = {
            "winner_rate": sum(wins.values()) / trials,
            "wins": dict(sorted(wins.items(), key=lambda kv: -kv[1])),
            "rounds_median": float(np.median(rounds)),
            "rounds_max": int(max(rounds)),
        }
    return out


def study(runs: dict[str, list[float]], trials: int, seed: int, fast: str) -> dict[str, Any]:
    """Every design, every scenario (see the module)."""
    arms = Arms(runs)
    others = [n for n in arms.runs if n != BASELINE]
    result: dict[str, Any] = {"trials": trials, "alpha": ALPHA, "jitter": JITTER, "designs": {}}
    for name, m, planned, bound, eliminate, old_bound in DESIGNS:
        plan = plan_rounds(m, planned, bound, ALPHA)
        aa = {BASELINE: BASELINE} | {f"aa{i}": BASELINE for i in range(m)}
        twins = {BASELINE: BASELINE, "twin-a": fast, "twin-b": fast}
        twins |= {f"aa{i}": BASELINE for i in range(m - 2)}
        row: dict[str, Any] = {
            "candidates": m,
            "planned": planned,
            "bound": bound,
            "plan": plan.describe(),
            "aa": scenario(aa, arms, planned, bound, eliminate, trials, seed, old_bound),
            "twins": scenario(twins, arms, planned, bound, eliminate, trials, seed, old_bound),
        }
        if len(others) >= m:  # the measured arms themselves, the first m of them
            measured = {BASELINE: BASELINE} | {n: n for n in others[:m]}
            row["measured"] = scenario(
                measured, arms, planned, bound, eliminate, trials, seed, old_bound
            )
        result["designs"][name] = row
    return result


def real_round(quick: bool = True, root: str | None = None) -> dict[str, Any]:
    """One real A/A round on the catalog (see the module)."""
    import tempfile

    from tasks.allocators.config import load_allocators_config
    from tasks.allocators.measure import images_for, measure_cases, select_cases
    from tasks.allocators.stats import analyse
    from tasks.core.storage import Root
    from tasks.replay.images import build_images
    from tasks.replay.workloads import load_catalog

    cfg = load_allocators_config()
    glibc = cfg.get(BASELINE)
    same = [glibc] + [glibc.model_copy(update={"name": f"glibc-aa{i}"}) for i in (1, 2)]
    cfg = cfg.model_copy(update={"allocators": same, "inputs": None})
    cases = select_cases(load_catalog(), cfg, None, quick=quick)
    build_images(images_for(cfg, None, quick))
    folder = root or tempfile.mkdtemp(prefix="heapcast-aa-")
    m = measure_cases(cases, cfg, Root.from_url(folder), "docker")
    _, recs = analyse(m, cfg)
    rows = [
        {
            "case": r.case,
            "winner": r.allocator,
            "rounds": r.rounds,
            "stop": r.stop,
            "p_adjusted": r.p_adjusted,
            "best_challenger": r.best_challenger,
        }
        for r in recs
    ]
    false = [r for r in rows if r["winner"] not in (BASELINE, None)]
    return {
        "cases": len(rows),
        "false_winners": len(false),
        "runs": len(m.samples),
        "elapsed_s": m.elapsed_s,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=RUNS, help="{allocator: [wall s, ...]} JSON")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fast", default=None, help="the twins' arm (default: the fastest)")
    ap.add_argument("--real", action="store_true", help="one real A/A round on the catalog")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if a.real:
        result = real_round()
    else:
        if not a.runs.is_file():
            ap.error(
                f"--runs {a.runs}: no such file; give a JSON of {{allocator: [wall s, ...]}} "
                "(measure one with studies/layer_seeds/layer_seeds.py)"
            )
        try:
            runs = json.loads(a.runs.read_text())
            runs = runs.get("runs", runs)
            if BASELINE not in runs:
                raise ValueError(f"no {BASELINE!r} runs")
        except (ValueError, AttributeError) as err:
            ap.error(f"--runs {a.runs}: {err}; it must be {{allocator: [wall s, ...]}}")
        fast = a.fast or min(
            (n for n in runs if n != BASELINE and runs[n]), key=lambda n: np.median(runs[n])
        )
        result = study(runs, a.trials, a.seed, fast)
        result["runs_file"] = str(a.runs)
        result["twins_arm"] = fast
    from benchmarks.harness import portable

    result = portable(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
