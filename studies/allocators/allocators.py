"""Allocators: the quick catalog under glibc, jemalloc, tcmalloc and mimalloc, side by side.

    .venv/bin/python studies/allocators/allocators.py                 # every quick input, 5 rounds
    .venv/bin/python studies/allocators/allocators.py --reps 5 --runner docker --workloads sqlite3
    .venv/bin/python studies/allocators/allocators.py --workloads redis gcc freeciv --inputs small         --out studies/allocators/allocators_more.json     # workloads without quick inputs

The allocators stage itself (tasks/allocators, configs/allocators.yaml) on every quick input of the
catalog: per case a warm-up run, then 5 rounds in a balanced order, each run untraced and measured
by the runner. Reported per case and allocator: medians and their ratios to glibc's, the
recommendation, the heap features, and whether the measurement adds idle waits. The details:
studies/allocators/README.md.

Writes studies/allocators/allocators.json, and the stage's own outputs under
<root>/allocators/ (`--root`, default the project's data root; `--mlflow` to log the run too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tasks.allocators.config import load_allocators_config  # noqa: E402
from tasks.allocators.measure import measure_cases, select_cases  # noqa: E402
from tasks.allocators.report import write_outcome  # noqa: E402
from tasks.core.config import default_root  # noqa: E402
from tasks.core.storage import Root  # noqa: E402
from tasks.replay.runners.select import resolve_runner_kind  # noqa: E402
from tasks.replay.workloads import load_catalog  # noqa: E402


class SleepCounter:
    """Counts time.sleep calls (and their seconds) in this process while active."""

    def __init__(self):
        self.calls = 0
        self.seconds = 0.0
        self._real = time.sleep

    def __enter__(self):
        def counting(s):
            self.calls += 1
            self.seconds += float(s)
            self._real(s)

        time.sleep = counting
        return self

    def __exit__(self, *exc):
        time.sleep = self._real


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runner", choices=["auto", "docker", "local"], default="auto")
    ap.add_argument("--workloads", nargs="*", default=None, help="default: the quick ones")
    ap.add_argument(
        "--inputs",
        nargs="*",
        default=None,
        help="input names to measure (e.g. small), quick or not; default: every quick input",
    )
    ap.add_argument("--root", default=default_root())
    ap.add_argument("--mlflow", action="store_true", help="log the MLflow run too")
    ap.add_argument("--out", type=Path, default=REPO / "studies" / "allocators" / "allocators.json")
    return ap.parse_args()


def case_figures(m, out) -> dict[str, dict]:
    """Per case: the recommendation, the heap's features, and every allocator's medians and
    ranges with its ratios to glibc's."""
    cases_out = {}
    for c in m.cases:
        rec = next(r for r in out.recommendations if r.case == c.label)
        f = out.features.get(c.label)
        cases_out[c.label] = {
            "recommendation": rec.allocator,
            "margin_vs_glibc": rec.margin,
            "p_value": rec.p_value,
            "ranges_overlap": rec.ranges_overlap,
            "beyond_noise": rec.beyond_noise,
            "note": rec.note,
            "heap": f.model_dump() if f else None,
            "allocators": {
                p.allocator: {
                    "status": p.status,
                    "reason": p.reason,
                    "output": p.output,
                    "runs": p.runs,
                    **{
                        f"{metric}_{k}": getattr(p.stats[metric], k)
                        for metric in ("wall_s", "cpu_s", "peak_rss_mb", "max_process_rss_mb")
                        if metric in p.stats
                        for k in ("median", "min", "max")
                    },
                    "minor_faults_median": p.median("minor_faults"),
                    "major_faults_median": p.median("major_faults"),
                    "time_vs_glibc": p.time_vs_baseline,
                    "memory_vs_glibc": p.memory_vs_baseline,
                }
                for p in out.pairs
                if p.case == c.label
            },
        }
    return cases_out


def idle_waits(m, sleeps, elapsed: float, ticks: tuple, times: tuple) -> dict:
    """Whether the measurement adds idle waits: this process's sleeps while measuring, what each
    run costs on top of its program, what lies between runs; `ticks` the machine's (busy, total)
    CPU ticks before and after, `times` this process's os.times() before and after."""
    (busy0, total0), (busy1, total1) = ticks
    own0, own1 = times
    samples = [s for s in m.samples if s.wall_s is not None]
    program_s = sum(s.wall_s for s in samples)
    run_s = sum(s.run_s for s in m.samples)
    per_run = [s.run_s - s.wall_s for s in samples]
    return {
        "sleep_calls_while_measuring": sleeps.calls,
        "sleep_seconds_while_measuring": sleeps.seconds,
        "measuring_elapsed_s": elapsed,
        "runs": len(m.samples),
        "programs_wall_s": program_s,
        "runs_total_s": run_s,
        "per_run_overhead_s_median": statistics.median(per_run) if per_run else None,
        "per_run_overhead_s_min": min(per_run) if per_run else None,
        "per_run_overhead_s_max": max(per_run) if per_run else None,
        "between_runs_s": elapsed - run_s,
        "programs_share_of_elapsed": program_s / elapsed if elapsed else None,
        "machine_cpu_busy_share": (busy1 - busy0) / (total1 - total0),
        "this_process_cpu_s": (own1.user - own0.user) + (own1.system - own0.system),
        "verdict": (
            "no idle waits added: nothing sleeps or polls while measuring; runs wait on the "
            "program (container.wait, waitpid) and the rest is the runner's work"
            if sleeps.calls == 0
            else f"{sleeps.calls} sleep calls ({sleeps.seconds:.3f} s) while measuring"
        ),
    }


def main() -> int:
    args = parse_args()
    cfg = load_allocators_config().model_copy(update={"inputs": args.inputs})
    catalog = load_catalog()
    cases = select_cases(catalog, cfg, args.workloads, quick=args.inputs is None)
    kind, why = resolve_runner_kind(args.runner)
    print(
        f"bench_allocators: {len(cases)} cases x {len(cfg.allocators)} allocators x "
        f"{args.reps} rounds; {why}",
        file=sys.stderr,
    )
    if kind == "docker":
        from tasks.replay.images import build_all

        build_all(list(dict.fromkeys(c.workload.image for c in cases)))
    root = Root.from_url(args.root)
    busy0, total0 = cpu_ticks()
    own0 = os.times()
    t0 = time.monotonic()
    with SleepCounter() as sleeps:
        m = measure_cases(cases, cfg, root, kind, repetitions=args.reps, warmup=args.warmup)
    elapsed = time.monotonic() - t0
    own1 = os.times()
    busy1, total1 = cpu_ticks()
    out = write_outcome(root, m, cfg, to_mlflow=args.mlflow)
    print(out.markdown)

    ticks = ((busy0, total0), (busy1, total1))
    waits = idle_waits(m, sleeps, elapsed, ticks, (own0, own1))
    samples = [s for s in m.samples if s.wall_s is not None]
    result = {
        "what": "the quick catalog under glibc/jemalloc/tcmalloc/mimalloc (LD_PRELOAD, untraced), "
        "rounds in a balanced order; medians, spreads, recommendation by configs/allocators.yaml's rule",
        "command": "python studies/allocators/allocators.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_avg_at_end": list(os.getloadavg()),
        },
        "runner": m.runner,
        "runner_detail": m.runner_detail,
        "peak_sources": sorted({s.peak_source for s in samples if s.peak_source}),
        "repetitions": m.repetitions,
        "warmup": m.warmup,
        "rule": cfg.rule.describe(),
        "night": m.night,
        "outputs": {"summary": out.summary_path, "report": out.report_dir},
        "cases": case_figures(m, out),
        "failed": out.failed,
        "idle_waits": waits,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    iw = result["idle_waits"]
    print(
        f"{len(m.samples)} runs in {elapsed:.1f} s: programs {iw['programs_wall_s']:.1f} s "
        f"({iw['programs_share_of_elapsed']:.0%}), per-run overhead median "
        f"{iw['per_run_overhead_s_median']:.3f} s, between runs {iw['between_runs_s']:.1f} s, "
        f"sleeps {sleeps.calls}; machine CPU busy {iw['machine_cpu_busy_share']:.0%}; "
        f"-> {args.out}",
        file=sys.stderr,
    )
    return 0  # a pair that fails is a result (in "failed"), not a failure of the benchmark


if __name__ == "__main__":
    raise SystemExit(main())
