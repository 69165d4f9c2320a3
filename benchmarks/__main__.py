"""Run the maintained speed benchmarks into benchmarks/results/.

    python -m benchmarks                 # every one, cheapest first (what `make bench` runs)
    python -m benchmarks cli online      # the ones named
    python -m benchmarks --list          # what would run, and the studies, without running

Each runs as its own process from the repository root (`python benchmarks/bench_X.py ARGS`);
it writes its file through the harness (benchmarks/harness.py), in the one shape with the command
that reproduces it. A benchmark whose data is missing is skipped with the reason; a failed one is named at the
end and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.harness import REPO, RESULTS, is_envelope
from benchmarks.suite import STUDIES, Benchmark, by_name


def plan(benchmarks: list[Benchmark]) -> str:
    """What runs, one line each: name, about how long, the command, the file it writes."""
    lines = [f"{len(benchmarks)} speed benchmark(s), into benchmarks/results/:"]
    for b in benchmarks:
        skip = f"  [skipped: no {', '.join(b.missing())}]" if b.missing() else ""
        lines.append(
            f"  {b.name:<14} {f'~{b.minutes:g} min':>9}  {' '.join(b.command())}  -> {b.result_file}{skip}"
        )
    return "\n".join(lines)


def studies() -> str:
    lines = ["studies (not run here; each folder's README.md has its commands, studies/README.md):"]
    lines += [f"  {s.name:<14} {s.script or s.folder + '/'}  ({s.why})" for s in STUDIES]
    return "\n".join(lines)


def run(b: Benchmark) -> tuple[str, float]:
    """Run one benchmark and check that its file has the one shape; (outcome, seconds)."""
    if b.missing():
        return f"skipped: no {', '.join(b.missing())} (`make run` makes it)", 0.0
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, b.script, *b.args], cwd=REPO, env=env)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        return f"failed (exit {done.returncode})", seconds
    path = RESULTS / b.result_file
    if not path.is_file():
        return f"failed: it wrote no {path.relative_to(REPO)}", seconds
    if not is_envelope(json.loads(path.read_text())):
        return (
            f"failed: {path.relative_to(REPO)} is not in the harness's shape (write_result)",
            seconds,
        )
    return "ok", seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print what would run, and the studies")
    a = ap.parse_args(argv)
    chosen = by_name(a.names)
    print(plan(chosen), flush=True)
    if a.list:
        print(studies())
        return 0
    outcomes = []
    for b in chosen:
        print(f"\n== {b.name}: {' '.join(b.command())}", flush=True)
        outcomes.append((b, *run(b)))
    print("\nbenchmark       seconds  outcome")
    for b, outcome, seconds in outcomes:
        print(f"  {b.name:<14} {seconds:7.0f}  {outcome}")
    return 1 if any(o.startswith("failed") for _, o, _ in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
