"""Start-up time of the command line: `heapcast --version`, `--help`, `inspect` on a small trace
and `trace -- true`, side by side with `python -c pass` (the interpreter alone), min and median
of --runs runs each (wall clock, each a fresh process).

    .venv/bin/python benchmarks/bench_cli.py            # 20 runs each
    .venv/bin/python benchmarks/bench_cli.py --runs 50

Also the time from starting `heapcast trace` to the traced program running, and what
`inspect` spends importing (python -X importtime, cumulative ms). Results go to
benchmarks/results/cli.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from benchmarks.harness import write_result  # noqa: E402

PYTHON = Path(sys.executable)
HEAPCAST = PYTHON.with_name("heapcast")


def timed(cases: dict[str, list[str]], runs: int, cwd: Path) -> dict[str, dict]:
    """Wall time of each case, the cases taken in turn (a change of load hits them alike)."""
    walls: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, cmd in cases.items():
            t = time.perf_counter()
            r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            walls[name].append(time.perf_counter() - t)
            if r.returncode != 0:
                raise SystemExit(f"{name} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return {
        name: {
            "min_ms": 1000 * min(w),
            "median_ms": 1000 * statistics.median(w),
            "runs": runs,
        }
        for name, w in walls.items()
    }


def trace_latency(runs: int, cwd: Path) -> dict:
    """From starting `heapcast trace` to the traced program running (`date +%s%N` under the
    tracer prints the realtime ns it started at)."""
    lat = []
    for _ in range(runs):
        t0 = time.time_ns()
        r = subprocess.run(
            [str(HEAPCAST), "trace", "-o", str(cwd / "lat"), "--", "date", "+%s%N"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        lat.append((int(r.stdout.strip()) - t0) / 1e6)
    return {"min_ms": min(lat), "median_ms": statistics.median(lat), "runs": runs}


MODULES = ("tasks.format.trace_reader", "tasks", "tasks.core.config", "pydantic", "yaml", "numpy")


def import_profile(cmd: list[str], cwd: Path) -> dict[str, float]:
    """Cumulative import ms of MODULES for `cmd` (python -X importtime)."""
    r = subprocess.run(
        [str(PYTHON), "-X", "importtime", *cmd], cwd=cwd, capture_output=True, text=True
    )
    rows = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \| \s*(\S+)", r.stderr, re.M)
    cum = {name: int(c) / 1000 for c, name in rows}
    return {m: cum[m] for m in MODULES if m in cum}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)

    from tasks.format.build import build_tracer
    from tests.tracegen import synthetic_records, write_trace

    build_tracer.fn()  # up to date before timing `trace` (it builds only when missing)
    with tempfile.TemporaryDirectory(prefix="heapcast-bench-cli-") as tmp:
        work = Path(tmp)
        trace = write_trace(work / "4242-1.hct", synthetic_records(2000, seed=1), pid=4242)
        heapcast = str(HEAPCAST)
        cases = {
            "python -c pass": [str(PYTHON), "-c", "pass"],
            "heapcast --version": [heapcast, "--version"],
            "heapcast --help": [heapcast, "--help"],
            "heapcast inspect (2k-call trace)": [heapcast, "inspect", str(trace)],
            "heapcast trace -- true": [heapcast, "trace", "-o", str(work / "out"), "--", "true"],
        }
        results = timed(cases, args.runs, work)
        base = results["python -c pass"]["min_ms"]
        for r in results.values():
            r["over_python_min_ms"] = r["min_ms"] - base
        latency = trace_latency(args.runs, work)
        profile = import_profile([heapcast, "inspect", str(trace)], work)

    out = write_result(
        "cli",
        {
            "what": "heapcast start-up: wall ms per fresh process, min and median",
            "start_up": results,
            "trace_until_the_program_runs_ms": latency,
            "inspect_imports_cumulative_ms": profile,
        },
        reference="`python -c pass`: the interpreter's own start-up, timed in turn with each "
        "command",
        argv=argv,
    )
    width = max(len(k) for k in results)
    print(f"{'':{width}}  {'min ms':>8}  {'median ms':>9}  {'over python':>11}")
    for name, r in results.items():
        print(
            f"{name:{width}}  {r['min_ms']:8.1f}  {r['median_ms']:9.1f}  {r['over_python_min_ms']:11.1f}"
        )
    print(
        f"heapcast trace: until the program runs: min {latency['min_ms']:.1f} ms, "
        f"median {latency['median_ms']:.1f} ms"
    )
    print("inspect's imports (cumulative ms):")
    for m, ms in profile.items():
        print(f"  {m:<28} {ms:8.1f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
