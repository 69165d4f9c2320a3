"""The seeds' cases in their containers under chosen allocators and heapcast's layer, side by
side (the allocators stage's measurement: balanced rounds, every run verified by the probe, the
layer's counters read), one table of medians [min-max] and the rank test's p against glibc.

    .venv/bin/python studies/layer_seeds/layer_seeds.py numpy_temporaries small \
        --allocators glibc,tcmalloc,layer-largest --reps 5 --out studies/layer_seeds/layer_seeds.json

Needs the engine (scripts/engine.sh up) and the numpy image. Faults and hits are counts, not
timings; the times are as loaded as the machine was (the JSON keeps the load average).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from tasks.allocators.config import load_allocators_config
from tasks.allocators.decide import mann_whitney_p
from tasks.allocators.measure import Case, measure_cases
from tasks.core.storage import Root
from tasks.replay.workloads import load_catalog

PROJECT = Path(__file__).resolve().parents[2]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("input")
    ap.add_argument("--allocators", default="glibc,tcmalloc,layer-largest")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--root", default="/tmp/heapcast-bench-layer-seeds")
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def _spread(ok: list, key: str, scale: float = 1.0):
    """(median, min, max) of `key` over the runs that went well, or None where none has it."""
    v = np.array([getattr(s, key) for s in ok if getattr(s, key) is not None], float)
    return (
        (float(np.median(v)) * scale, float(v.min()) * scale, float(v.max()) * scale)
        if v.size
        else None
    )


def _cell(t, fmt: str) -> str:
    return "n/a" if t is None else f"{t[0]:{fmt}} ({t[1]:{fmt}}-{t[2]:{fmt}})"


def allocator_row(n: str, m, base: list[float]) -> dict:
    """One allocator's runs: counts, spreads, the rank test's p against glibc; its table line
    printed."""
    ss = [s for s in m.samples if s.allocator == n]
    ok = [s for s in ss if s.ok]
    wall, rss, minor, major, hits = (
        _spread(ok, "wall_s", 1e3),
        _spread(ok, "peak_rss_mb"),
        _spread(ok, "minor_faults"),
        _spread(ok, "major_faults"),
        _spread(ok, "layer_hits"),
    )
    p = mann_whitney_p([s.wall_s for s in ok], base) if n != "glibc" else None
    row = dict(
        runs=len(ss),
        ok=len(ok),
        applied=sum(bool(s.applied) for s in ss),
        wall_ms=wall,
        peak_rss_mb=rss,
        minor_faults=minor,
        major_faults=major,
        layer_hits=hits,
        p_wall_vs_glibc=p,
        errors=[s.error for s in ss if s.error],
    )
    print(
        f"| {n} | {len(ok)}/{row['applied']} of {len(ss)} | {_cell(wall, '.0f')} | "
        f"{_cell(rss, '.1f')} | {_cell(minor, '.0f')} | {_cell(major, '.0f')} | "
        f"{'-' if hits is None else f'{hits[0]:.0f}'} | {'-' if p is None else f'{p:.3f}'} |"
    )
    return row


def main() -> None:
    a = parse_args()
    cfg = load_allocators_config()
    names = a.allocators.split(",")
    cfg = cfg.model_copy(
        update={"allocators": [cfg.get(n) for n in names], "warmup": 1, "max_repetitions": None}
    )
    w = load_catalog().get(a.workload)
    load_before = os.getloadavg()
    m = measure_cases(
        [Case(w, w.input(a.input), f"{a.workload}/{a.input}")],
        cfg,
        Root.from_url(a.root),
        "docker",
        repetitions=a.reps,
    )
    base = [s.wall_s for s in m.samples if s.allocator == "glibc" and s.ok]
    print(f"{a.workload}/{a.input}, {a.reps} rounds, load before {load_before[0]:.1f}")
    print(
        "| allocator | ok/applied | wall ms | peak MB (cgroup) | minor faults | major | hits | p vs glibc |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = {n: allocator_row(n, m, base) for n in names}
    if a.out:
        a.out.write_text(
            json.dumps(
                dict(
                    case=f"{a.workload}/{a.input}",
                    reps=a.reps,
                    load_before=load_before,
                    load_after=os.getloadavg(),
                    elapsed_s=m.elapsed_s,
                    allocators=rows,
                ),
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
