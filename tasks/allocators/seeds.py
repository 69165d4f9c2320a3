"""The layer's cases measured for real (issue 21): seed 002's numpy temporaries, seed 001's
training loop, and numpy_pipeline (a reader thread's chunks freed by the main thread), each
under glibc, jemalloc, tcmalloc, mimalloc and heapcast's layer (largest, pools, guided by the
online counter, guided by the model's table) and the placement layer in front of jemalloc (the
online counter, the model's lifetime table), side by side in one measurement
(`measure.measure_cases`), written like any allocators measurement (`report.publish`), then summed
up per case in one line of ms and MB (`seed_lines`).

What the predictions bought is, per pair of `seeds.compare`, the first's median minus the
second's, with the two-sided rank test's p (decide.mann_whitney_p). With fewer than
MIN_REPETITIONS rounds the line says how many. The cases and the pairs:
docs/allocators.md#the-layers-cases.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from tasks.allocators.config import MIN_REPETITIONS, AllocatorsConfig
from tasks.allocators.decide import mann_whitney_p
from tasks.allocators.measure import Measurements, measure_cases, select_cases
from tasks.allocators.report import AllocatorsOutcome
from tasks.core.storage import Root
from tasks.registry.headline import log_table
from tasks.registry.tracking import TrackingConfig, configure
from tasks.replay.workloads import load_catalog


class AllocatorFigures(BaseModel):
    allocator: str
    ok_runs: int
    wall_ms: float | None = None  # medians of the ok runs
    peak_rss_mb: float | None = None
    minor_faults: float | None = None
    major_faults: float | None = None
    layer_hits: float | None = None  # a layer's


class Bought(BaseModel):
    """`who`'s median against `against`'s: negative ms / MB is what `who` saved."""

    who: str
    against: str
    wall_ms: float | None
    peak_rss_mb: float | None
    p_wall: float  # two-sided rank test of the two samples of wall time
    p_rss: float | None = None  # ... and of peak RSS


class SeedLine(BaseModel):
    case: str
    repetitions: int
    figures: list[AllocatorFigures]
    # each layer's and placement's: what it decides from (Allocator.predictor)
    predictors: dict[str, str]
    bought: list[Bought]
    # compared pairs a side of which was measured tonight but has no successful run (a pair
    # whose allocator tonight's list leaves out, the quick night's, is not said at all)
    missing: list[str] = []

    def text(self) -> str:
        few = (
            f", {self.repetitions} round{'s' if self.repetitions > 1 else ''} only (quick: "
            "too few for the rank test)"
            if self.repetitions < MIN_REPETITIONS
            else f", {self.repetitions} rounds"
        )
        cells = []
        for f in self.figures:
            if f.wall_ms is None:
                cells.append(f"{f.allocator} failed")
                continue
            cell = f"{f.allocator} {f.wall_ms:.0f} ms {f.peak_rss_mb:.0f} MB"
            if f.layer_hits is not None:
                cell += f" ({f.layer_hits:.0f} hits)"
            cells.append(cell)
        bought = [
            f"{self._named(b.who)} {b.wall_ms:+.0f} ms {b.peak_rss_mb:+.1f} MB vs "
            f"{self._named(b.against)} (p={b.p_wall:.2g}"
            + (f", RSS p={b.p_rss:.2g})" if b.p_rss is not None else ")")
            for b in self.bought
            if b.wall_ms is not None and b.peak_rss_mb is not None
        ]
        what = f"; bought: {', '.join(bought)}" if bought else ""
        if self.missing:
            what += (
                f"; nothing to compare for {', '.join(self.missing)} (a side had no successful run)"
            )
        return f"{self.case}{few}: " + " | ".join(cells) + what

    def _named(self, allocator: str) -> str:
        p = self.predictors.get(allocator)
        return f"{allocator} ({p})" if p else allocator


def seed_config(config: AllocatorsConfig, quick: bool = False) -> AllocatorsConfig:
    """`config` kept to the seeds' allocators and inputs (its `seeds` section; `quick`: its
    `quick_allocators` when it names them)."""
    s = config.seeds
    if s is None:
        raise ValueError(
            "configs/allocators.yaml has no `seeds` section (workloads, inputs, allocators): "
            "add it to measure the seeds' cases"
        )
    names = s.quick_allocators if quick and s.quick_allocators else s.allocators
    return config.model_copy(
        update={
            "allocators": [config.get(n) for n in names],
            "inputs": s.inputs,
            "repetitions": s.quick_repetitions if quick else s.repetitions,
            "max_repetitions": None if quick else s.max_repetitions,
        }
    )


@task(name="measure-seed-cases", cache_policy=NO_CACHE)
def measure_seed_cases(
    root: Root, config: AllocatorsConfig, quick: bool, runner: str, catalog: str | None = None
) -> Measurements:
    """The seeds' cases under the seeds' allocators (`seed_config(config, quick)`), side by
    side: `seeds.repetitions` rounds, more up to `seeds.max_repetitions` while the rule has not
    decided (tasks.allocators.rounds); `seeds.quick_repetitions` when `quick`."""
    cfg = seed_config(config, quick)
    assert config.seeds is not None  # seed_config said so otherwise
    cases = select_cases(load_catalog(catalog), cfg, config.seeds.workloads)
    return measure_cases(cases, cfg, root, runner)


def _median(values) -> float | None:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    return float(np.median(v)) if v.size else None


def seed_lines(m: Measurements, config: AllocatorsConfig) -> list[SeedLine]:
    """One line per case of `m` (see the module)."""
    s = config.seeds
    if s is None:
        raise ValueError("configs/allocators.yaml has no `seeds` section")
    names = [a.name for a in m.allocators]
    out = []
    for case in m.cases:
        ok = {
            n: [x for x in m.samples if x.case == case.label and x.allocator == n and x.ok]
            for n in names
        }
        figures = [
            AllocatorFigures(
                allocator=n,
                ok_runs=len(ok[n]),
                wall_ms=_median(x.wall_s * 1e3 for x in ok[n] if x.wall_s is not None),
                peak_rss_mb=_median(x.peak_rss_mb for x in ok[n]),
                minor_faults=_median(x.minor_faults for x in ok[n]),
                major_faults=_median(x.major_faults for x in ok[n]),
                layer_hits=_median(x.layer_hits for x in ok[n]),
            )
            for n in names
        ]
        by = {f.allocator: f for f in figures}
        bought, missing = [], []
        for who, other in s.compare:
            g, o = by.get(who), by.get(other)
            if g is None or o is None:
                continue  # not measured tonight by configuration (the quick night's list)
            if g.wall_ms is None or o.wall_ms is None:
                missing.append(f"{who} vs {other}")
                continue
            bought.append(
                Bought(
                    who=who,
                    against=other,
                    wall_ms=g.wall_ms - o.wall_ms,
                    peak_rss_mb=None
                    if g.peak_rss_mb is None or o.peak_rss_mb is None
                    else g.peak_rss_mb - o.peak_rss_mb,
                    p_wall=mann_whitney_p(
                        [x.wall_s for x in ok[who]], [x.wall_s for x in ok[other]]
                    ),
                    p_rss=mann_whitney_p(
                        [x.peak_rss_mb for x in ok[who]], [x.peak_rss_mb for x in ok[other]]
                    ),
                )
            )
        predictors = {a.name: a.predictor for a in m.allocators if a.predictor is not None}
        out.append(
            SeedLine(
                case=case.label,
                # the rounds the rule ran (more than planned while it had not decided)
                repetitions=m.rounds[case.label].rounds
                if case.label in m.rounds
                else m.repetitions,
                figures=figures,
                predictors=predictors,
                bought=bought,
                missing=missing,
            )
        )
    return out


class SeedsOutcome(BaseModel):
    lines: list[SeedLine]
    allocators: AllocatorsOutcome
    model_run_id: str | None = None  # the registered model's run the figures were logged on

    def markdown(self) -> str:
        return "\n".join(f"- {line.text()}" for line in self.lines)


LAYER_TABLE = "layer/cases.json"  # the measured cases on the model's run, one table
# The figures a night is compared by, MLflow's section `layer`: what the model's table bought
# against the online counter, and against the layer deciding without any prediction (seed 002's
# rule). Keys are short (`layer/vs_counter.pipeline`): a chart card shows ~22 characters of its
# title, and the cases share their first words (numpy_...).
HEADLINE_PAIRS = {
    ("layer-table", "layer-guided"): "vs_counter",
    ("layer-table", "layer-largest"): "vs_none",
}
LAYER_SECTION = "layer/"


def short_case_names(cases: list[str]) -> dict[str, str]:
    """Each case without the words all of `cases` begin with (numpy_temporaries, numpy_pipeline
    -> temporaries, pipeline); '/' (workload/input) becomes '.'."""
    words = [c.replace("/", ".").split("_") for c in cases]
    common = 0
    while all(len(w) > common + 1 for w in words) and len({w[common] for w in words}) == 1:
        common += 1
    if len(cases) < 2:
        common = 0
    return {c: "_".join(w[common:]) for c, w in zip(cases, words)}


def layer_cases_table(lines: list[SeedLine]) -> pd.DataFrame:
    """Every case's figures, one row per allocator (its medians; `against` empty) and one per
    compared pair (`allocator` minus `against`: negative is what it saved, with the rank test's
    p), in MLflow's table form."""
    rows = []
    for line in lines:
        for f in line.figures:
            rows.append(
                {
                    "case": line.case,
                    "allocator": f.allocator,
                    "predictor": line.predictors.get(f.allocator, ""),
                    "against": "",
                    "wall_ms": f.wall_ms,
                    "peak_mb": f.peak_rss_mb,
                    "p_wall": None,
                    "p_peak": None,
                    "rounds": line.repetitions,
                    "ok_runs": f.ok_runs,
                }
            )
        for b in line.bought:
            rows.append(
                {
                    "case": line.case,
                    "allocator": b.who,
                    "predictor": line.predictors.get(b.who, ""),
                    "against": b.against,
                    "wall_ms": b.wall_ms,
                    "peak_mb": b.peak_rss_mb,
                    "p_wall": b.p_wall,
                    "p_peak": b.p_rss,
                    "rounds": line.repetitions,
                    "ok_runs": None,
                }
            )
    return pd.DataFrame(rows)


def layer_headline(lines: list[SeedLine], cases: list[str] | None = None) -> dict[str, float]:
    """`layer/<pair>.<case>` (HEADLINE_PAIRS, short_case_names over `cases`, by default the
    lines'): median wall ms of the model's table minus the other's, negative where it saved."""
    short = short_case_names(cases or [line.case for line in lines])
    out: dict[str, float] = {}
    for line in lines:
        for b in line.bought:
            name = HEADLINE_PAIRS.get((b.who, b.against))
            if name is not None and b.wall_ms is not None:
                out[f"{LAYER_SECTION}{name}.{short.get(line.case, line.case)}"] = b.wall_ms
    return out


@task(name="summarize-seed-cases", cache_policy=NO_CACHE)
def summarize_seed_cases(
    m: Measurements, config: AllocatorsConfig, published: AllocatorsOutcome
) -> SeedsOutcome:
    """The per-case lines of `m` beside what `report.publish` wrote."""
    return SeedsOutcome(lines=seed_lines(m, config), allocators=published)


@task(name="seed-cases-to-model-run", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10)
def log_on_model_run(lines: list[SeedLine], tracking: TrackingConfig, run_id: str) -> None:
    """The figures on an MLflow run, the registered model's or the measurement's own: the table
    `layer/cases.json` (every case, allocator and compared pair), a few metrics in the section
    `layer` (layer_headline), and the lines, each layer named with what it decides from, as the tag
    `heapcast.layer.bought`."""

    configure(tracking)
    from mlflow.tracking import MlflowClient  # deferred: mlflow's import is slow

    client = MlflowClient()
    log_table(client, run_id, layer_cases_table(lines), LAYER_TABLE)
    for key, value in layer_headline(lines).items():
        client.log_metric(run_id, key, value)
    client.set_tag(
        run_id,
        "heapcast.layer.bought",
        "measured: " + " || ".join(line.text() for line in lines),
    )
