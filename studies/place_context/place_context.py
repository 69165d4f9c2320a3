"""Placement by the calling context on catalog workloads: does keying the placement layer's
online counter on the allocation's first frames (`depth=4`, the layer's default) save memory
where keying it on the call site alone (`depth=1`) saves nothing?

The allocators stage's own measurement (balanced rounds in each workload's container, every run
verified, its output compared with the first arm's), three arms: jemalloc alone, jemalloc with
placement keyed on the call site (HEAPCAST_PLACE=mode=predict,depth=1) and on the context
(depth=4); with --prompt every arm has jemalloc return freed pages at once
(MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0), so that pages a burst frees leave the peak of
the next. Per workload and arm: medians [min-max] of wall time, the container's peak memory
(cgroup), the largest process's peak RSS and the container's memory averaged over the run, each
placement arm's ratios to jemalloc alone with the rank test's p, what the layer placed long; a
verdict per placement arm on memory:

  saves    a memory ratio below 1 - --tolerance, beyond the noise (p < 0.05);
  worse    a memory ratio above 1 + --tolerance, beyond the noise;
  even     neither;
  failed   a run failed, its output differed, or the layer was not in force.

    .venv/bin/python studies/place_context/place_context.py [WORKLOAD ...] [--input medium]
        [--reps 5] [--tolerance 0.02] [--prompt] [--out PATH]

Needs the engine (scripts/engine.sh up); builds the workload images it lacks.
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

OUT = REPO / "studies" / "place_context" / "place_context.json"
JEMALLOC = "jemalloc"
DEPTHS = (1, 4)
ARMS = (JEMALLOC, *(f"place-d{d}" for d in DEPTHS))
# the container's peak, the largest process's, and the container's memory averaged over the run
# (what a burst's returned pages lower where the peak stays)
MEMORY = ("peak_rss_mb", "max_process_rss_mb", "mean_rss_mb")
METRICS = ("wall_s", *MEMORY)
ALPHA = 0.05
PROMPT = "dirty_decay_ms:0,muzzy_decay_ms:0"


def arms_config(config, prompt: bool):
    """`config` with the three arms only, jemalloc the baseline, no rounds added."""
    from tasks.allocators.config import Allocator

    jem, place = config.get(JEMALLOC), config.get("jemalloc-place")
    conf = {"MALLOC_CONF": PROMPT} if prompt else {}
    arms = [Allocator.model_validate({**jem.model_dump(exclude={"model_table"}), "env": conf})]
    for d, name in zip(DEPTHS, ARMS[1:], strict=True):
        env = {"HEAPCAST_PLACE": f"mode=predict,depth={d}", **conf}
        arms.append(
            Allocator(
                name=name, kind="place", library=place.library, package=place.package, env=env
            )
        )
    return config.model_copy(
        update={"allocators": arms, "baseline": JEMALLOC, "max_repetitions": None, "warmup": 1}
    )


def summarise(samples: list[Any], case: str, tolerance: float) -> dict[str, Any]:
    """One case's row: each arm's medians, each placement arm's ratios, p and verdict."""
    from tasks.allocators.decide import mann_whitney_p
    from tasks.allocators.stats import Spread

    mine = [s for s in samples if s.case == case]
    runs = {arm: [s for s in mine if s.allocator == arm] for arm in ARMS}

    def values(arm: str, m: str) -> list[float]:
        return [getattr(s, m) for s in runs[arm] if s.ok and getattr(s, m) is not None]

    row: dict[str, Any] = {"case": case, "runs": {a: len(r) for a, r in runs.items()}}
    for arm in ARMS:
        row[arm] = {m: Spread.bounds_of(values(arm, m)) for m in METRICS}
    bad = any(not s.ok or not s.applied for arm in ARMS for s in runs[arm]) or not all(
        runs.values()
    )
    for arm in ARMS[1:]:
        ratio, p = {}, {}
        for m in METRICS:
            here, base = values(arm, m), values(JEMALLOC, m)
            if here and base and np.median(base) > 0:
                ratio[m] = float(np.median(here) / np.median(base))
                p[m] = mann_whitney_p(here, base)  # two-sided
        long = [s.place_long or 0 for s in runs[arm] if s.ok]
        saves = [m for m in MEMORY if m in ratio and ratio[m] < 1 - tolerance and p[m] < ALPHA]
        worse = [m for m in MEMORY if m in ratio and ratio[m] > 1 + tolerance and p[m] < ALPHA]
        verdict = "failed" if bad or len(ratio) < len(METRICS) else "even"
        if verdict != "failed":
            verdict = "worse" if worse else "saves" if saves else "even"
        row[arm] = {
            **row[arm],
            "ratio": ratio,
            "p": p,
            "placed_long": float(np.median(long)) if long else None,
            "verdict": verdict,
        }
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per workload: jemalloc's figures, each placement arm's peak ratios and verdict."""

    def cell(r: dict[str, Any], arm: str) -> str:
        a = r[arm]
        ratios = " / ".join(
            f"{(a['ratio'][m] - 1) * 100:+.1f}% (p {a['p'][m]:.2f})" if m in a["ratio"] else "n/a"
            for m in MEMORY
        )
        long = "n/a" if a["placed_long"] is None else f"{a['placed_long']:,.0f}"
        return f"{ratios} | {long} | {a['verdict']}"

    head = " | ".join(
        f"depth {d}: peak / process peak / mean | placed long | verdict" for d in DEPTHS
    )
    lines = [
        f"| workload | jemalloc peak MB | {head} |",
        "|---|---|" + "---|---|---|" * len(DEPTHS),
    ]
    for r in rows:
        peak = r[JEMALLOC]["peak_rss_mb"]
        base = "n/a" if peak is None else f"{peak[0]:.1f}"
        lines.append(f"| {r['case']} | {base} | " + " | ".join(cell(r, a) for a in ARMS[1:]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs scripts/engine.sh up and the workload images; see the module's text.",
    )
    ap.add_argument("workloads", nargs="*", help="catalog workloads (default: every one)")
    ap.add_argument("--input", default="medium", help="the input of each (default medium)")
    ap.add_argument("--reps", type=int, default=5, help="rounds (default 5; 5 for a p < 0.05)")
    ap.add_argument("--tolerance", type=float, default=0.02, help="the margin (0.02)")
    ap.add_argument("--prompt", action="store_true", help=f"every arm with MALLOC_CONF={PROMPT}")
    ap.add_argument("--root", default="/tmp/heapcast-study-place-context")
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
    config = arms_config(stage, a.prompt)
    build_images(list(dict.fromkeys(c.workload.image for c in cases)))
    load_before = os.getloadavg()
    m = measure_cases(cases, config, Root.from_url(a.root), "docker", repetitions=a.reps)
    rows = [summarise(m.samples, c.label, a.tolerance) for c in cases]
    table = markdown(rows)
    print(table)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        input=a.input,
        reps=a.reps,
        prompt=a.prompt,
        tolerance=a.tolerance,
        load_before=load_before,
        load_after=os.getloadavg(),
        elapsed_s=m.elapsed_s,
        unavailable=[u.model_dump() for u in m.unavailable],
        rows=rows,
        table=table,
    )
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
