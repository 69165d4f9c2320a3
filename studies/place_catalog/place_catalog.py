"""The placement layer on every catalog workload: does it stay within +2% of the same jemalloc
without it, in peak memory and time, or stand aside (place nothing long)?

The allocators stage's own measurement (balanced rounds in each workload's container, every run
verified, its output compared with the first arm's, the layer's stats line read) under two
arms: jemalloc alone, and jemalloc with placement by the online counter (`jemalloc-place`, as
the stage runs it); with --off a third, the layer loaded with placement off (`mode=off`: its
loading and the jemalloc option it sets, no routing), which tells what placement itself moved
from what the layer's jemalloc option did. Per workload: medians [min-max] of wall time, CPU time,
the container's peak memory (cgroup) and the largest process's peak RSS; placement's ratios to
jemalloc alone with the rank test's p; what the layer placed (allocations placed long, sites
long and stepped aside, its sampled long placements judged right or wrong); and a verdict:

  within     both ratios at most 1 + --tolerance;
  noise      a ratio above it, but not beyond the rounds' noise (p >= 0.05);
  over       a ratio above it, beyond the noise;
  failed     a run of an arm failed or its output differed;
  not applied  the layer was not in force in the processes doing most of the work (the stage's
             probe: a child started with a cleared environment, or a static one).

    .venv/bin/python studies/place_catalog/place_catalog.py [WORKLOAD ...] [--input medium]
        [--reps 5] [--tolerance 0.02] [--off] [--out PATH]

Needs the engine (scripts/engine.sh up); builds the workload images it lacks. Writes
studies/place_catalog/place_catalog.json. A study, not a speed benchmark: containers, about
40 minutes for the whole catalog on two cores (the Keras workloads take most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
OUT = REPO / "studies" / "place_catalog" / "place_catalog.json"
JEMALLOC = "jemalloc"
PLACE = "jemalloc-place"
OFF = "jemalloc-place-off"
ARMS = (JEMALLOC, PLACE)
# what is kept per arm and judged: wall and CPU s, the cgroup's peak and the largest process's
METRICS = ("wall_s", "cpu_s", "peak_rss_mb", "max_process_rss_mb")
ALPHA = 0.05
PLACED = (
    "place_long",
    "place_sites_long",
    "place_sites_aside",
    "place_long_young",
    "place_long_old",
)


def arms_config(config, off: bool = False):
    """`config` with the arms only (with `off`, the layer with placement off too), jemalloc the
    baseline, no rounds added."""
    from tasks.allocators.config import Allocator

    arms = [config.get(a) for a in ARMS]
    if off:
        place = config.get(PLACE)
        env = {"HEAPCAST_PLACE": "mode=off"}
        arms.append(
            Allocator(name=OFF, kind="place", library=place.library, package=place.package, env=env)
        )
    return config.model_copy(
        update={
            "allocators": arms,
            "baseline": JEMALLOC,
            "max_repetitions": None,
            "warmup": 1,
        }
    )


def summarise(samples: list[Any], case: str, tolerance: float) -> dict[str, Any]:
    """One case's row: each arm's medians, placement's ratios and p against jemalloc alone, what
    the layer placed, and the verdict (module doc); where the samples have the layer with
    placement off, placement's ratios against it too (`ratio_off`: what placement itself moved).
    `samples`: the stage's Samples of the case."""
    from tasks.allocators.decide import mann_whitney_p
    from tasks.allocators.stats import Spread

    mine = [s for s in samples if s.case == case]
    arms = [*ARMS, OFF] if any(s.allocator == OFF for s in mine) else list(ARMS)
    runs = {arm: [s for s in mine if s.allocator == arm] for arm in arms}
    failed = sorted(
        {
            f"{arm}: {s.error or f'exit {s.exit_code}'}"
            for arm in arms
            for s in runs[arm]
            if not s.ok
        }
    )
    row: dict[str, Any] = {
        "case": case,
        "runs": {arm: len(runs[arm]) for arm in arms},
        "applied": {arm: sum(bool(s.applied) for s in runs[arm]) for arm in arms},
    }

    def values(arm: str, m: str) -> list[float]:
        return [getattr(s, m) for s in runs[arm] if s.ok and getattr(s, m) is not None]

    for arm in arms:
        row[arm] = {m: Spread.bounds_of(values(arm, m)) for m in METRICS}
    for against, key in ((JEMALLOC, "ratio"), (OFF, "ratio_off")):
        if against not in runs:
            continue
        ratios, p = {}, {}
        for m in METRICS:
            here, base = values(PLACE, m), values(against, m)
            if here and base and np.median(base) > 0:
                ratios[m] = float(np.median(here) / np.median(base))
                p[m] = mann_whitney_p(here, base)
        row[key], row[key.replace("ratio", "p")] = ratios, p
    ratios, p = row["ratio"], row["p"]
    placed = [s for s in runs[PLACE] if s.ok]
    row["placed"] = {
        k: float(np.median([getattr(s, k) or 0 for s in placed])) if placed else None
        for k in PLACED
    }
    above = [m for m, r in ratios.items() if r > 1 + tolerance]
    if failed or not all(runs.values()) or len(ratios) < len(METRICS):
        row["verdict"] = "failed"
    elif row["applied"][PLACE] < len(runs[PLACE]):
        row["verdict"] = "not applied"
    elif not above:
        row["verdict"] = "within"
    elif all(p[m] >= ALPHA for m in above):
        row["verdict"] = "noise"
    else:
        row["verdict"] = "over"
    row["above"] = above
    row["errors"] = failed[:5]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table the docs quote: placement against jemalloc alone, per workload (and its peak
    against the layer with placement off, where that arm ran)."""

    def pct(r: dict[str, Any], m: str, key: str = "ratio") -> str:
        if m not in r.get(key, {}):
            return "n/a"
        p = r[key.replace("ratio", "p")][m]
        return f"{(r[key][m] - 1) * 100:+.1f}% (p {p:.2f})"

    off = any("ratio_off" in r for r in rows)
    lines = [
        "| workload | jemalloc wall s | peak MB | placement: wall | CPU | peak (cgroup) "
        "| process peak | placed long | sites long / aside | verdict |"
        + (" peak against placement off |" if off else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if off else ""),
    ]
    for r in rows:
        base, placed = r[JEMALLOC], r["placed"]
        wall = "n/a" if base["wall_s"] is None else f"{base['wall_s'][0]:.2f}"
        peak = "n/a" if base["peak_rss_mb"] is None else f"{base['peak_rss_mb'][0]:.1f}"
        long = "n/a" if placed["place_long"] is None else f"{placed['place_long']:.0f}"
        sites = (
            "n/a"
            if placed["place_sites_long"] is None
            else f"{placed['place_sites_long']:.0f} / {placed['place_sites_aside']:.0f}"
        )
        lines.append(
            f"| {r['case']} | {wall} | {peak} | {pct(r, 'wall_s')} | {pct(r, 'cpu_s')} | "
            f"{pct(r, 'peak_rss_mb')} | {pct(r, 'max_process_rss_mb')} | {long} | {sites} | "
            f"{r['verdict']} |" + (f" {pct(r, 'peak_rss_mb', 'ratio_off')} |" if off else "")
        )
    verdicts = ("within", "noise", "over", "failed", "not applied")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in verdicts}
    lines.append("")
    lines.append(", ".join(f"{v}: {n}" for v, n in counts.items()) + f" (of {len(rows)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs scripts/engine.sh up and the workload images; see the module's text.",
    )
    ap.add_argument("workloads", nargs="*", help="catalog workloads (default: every one)")
    ap.add_argument("--input", default="medium", help="the input of each (default medium)")
    ap.add_argument("--reps", type=int, default=5, help="rounds (default 5; 5 for a p < 0.05)")
    ap.add_argument("--tolerance", type=float, default=0.02, help="the goal's margin (0.02)")
    ap.add_argument("--off", action="store_true", help="the layer with placement off as well")
    ap.add_argument("--root", default="/tmp/heapcast-bench-place-catalog")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)

    # deferred: the stage's modules load Prefect and pandas; --help must not wait for them
    from tasks.allocators.config import load_allocators_config
    from tasks.allocators.measure import measure_cases, select_cases
    from tasks.core.storage import Root
    from tasks.replay.images import build_images
    from tasks.replay.workloads import load_catalog

    catalog = load_catalog()
    names = a.workloads or catalog.names()
    unknown = sorted(set(names) - set(catalog.names()))
    if unknown:
        ap.error(f"no catalog workload named {', '.join(unknown)} (configs/workloads.yaml)")
    # the stage's own selection, kept to the one input (a workload without it is left out)
    stage = load_allocators_config().model_copy(update={"inputs": [a.input]})
    try:
        cases = select_cases(catalog, stage, names)
    except ValueError as err:
        ap.error(str(err))
    left = [n for n in names if n not in {c.workload.name for c in cases}]
    if left:
        print(f"no input {a.input!r}: {', '.join(left)}; left out", file=sys.stderr)
    config = arms_config(stage, off=a.off)
    build_images(list(dict.fromkeys(c.workload.image for c in cases)))
    load_before = os.getloadavg()
    m = measure_cases(cases, config, Root.from_url(a.root), "docker", repetitions=a.reps)
    rows = [summarise(m.samples, c.label, a.tolerance) for c in cases]
    table = markdown(rows)
    print(table)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            dict(
                input=a.input,
                reps=a.reps,
                tolerance=a.tolerance,
                load_before=load_before,
                load_after=os.getloadavg(),
                elapsed_s=m.elapsed_s,
                unavailable=[u.model_dump() for u in m.unavailable],
                rows=rows,
                table=table,
            ),
            indent=1,
        )
    )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
