"""`heapcast tune` end to end on a program of about a second: how long tune takes, as a ratio
to the program's own time (glibc's median wall in the same run), and the answer.

    .venv/bin/python benchmarks/bench_tune.py                       # seed 002's case, 10 M
    .venv/bin/python benchmarks/bench_tune.py --iterations 4 --out benchmarks/results/tune.json

The program is seed 002's numpy case, `(a * b) ** 2 + 3` on two 10 M-element float arrays,
`--iterations` times (about a second on an idle core). tune runs with the config's defaults
(configs/allocators.yaml `tune`: the candidates, 5 rounds, up to 7 while undecided), so the
figure is what a user meets: the goal is under a minute for a 1-second program, i.e. a ratio
under 60. Writes the table, the ratio and the recommendation as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tasks.allocators.config import load_allocators_config
from tasks.allocators.tune import tune

PROGRAM = (
    "import numpy as np\n"
    "n = 10_000_000\n"
    "a = np.arange(n, dtype=np.float64); b = np.ones(n)\n"
    "for _ in range({iterations}):\n    c = (a * b) ** 2 + 3\n"
    "print(float(c[12345]))\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/tune.json")
    ap.add_argument("--html", default="benchmarks/results/tune.html")
    a = ap.parse_args()
    argv = [sys.executable, "-c", PROGRAM.format(iterations=a.iterations)]
    t0 = time.monotonic()
    out = tune(argv, load_allocators_config(), html_out=Path(a.html))
    total = time.monotonic() - t0
    base = [s.wall_s for s in out.measurements.samples if s.allocator == "glibc" and s.ok]
    base.sort()
    median = base[len(base) // 2]
    # what tune adds around the programs: total minus every measured run's own wall time
    # (the check run is not a sample: counted in the overhead)
    walls = sum(s.wall_s or 0.0 for s in out.measurements.samples)
    print(out.table)
    print(
        f"\ntune took {total:.1f} s for a program of {median:.2f} s (glibc median wall): "
        f"{total / median:.1f}x its time; {len(out.measurements.samples)} measured runs; "
        f"load average {os.getloadavg()[0]:.1f}; the programs' own wall time {walls:.1f} s, "
        f"tune's overhead {total - walls:.1f} s"
    )
    Path(a.out).write_text(
        json.dumps(
            {
                "tune_s": total,
                "program_median_wall_s": median,
                "ratio": total / median,
                "runs": len(out.measurements.samples),
                "programs_wall_s": walls,
                "rounds": max(s.rep for s in out.measurements.samples),
                "recommendation": out.recommendation.model_dump(),
                "table": out.table,
                "load_average_1min": os.getloadavg()[0],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
