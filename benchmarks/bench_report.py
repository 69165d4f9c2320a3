"""Report cost: `heapcast report` on a synthetic run of 40 M heap calls, from the events dataset
and from the raw traces (converted in-process), in events per second.

    .venv/bin/python benchmarks/bench_report.py                     # 40 M calls, in a temp folder
    .venv/bin/python benchmarks/bench_report.py --events 4000000 --work /tmp/rb --keep

The run: three process images written as raw traces and converted with the dataset's own
per-file conversion (tasks.dataset.partitions.convert_file). Each measurement (`analyze`,
`render`, the whole `heapcast report` command line, on the events run and on the raw folder)
runs in a fresh process, --repeat times, the fastest kept; wall and CPU seconds both. The run
and the measurements in full: docs/speeds-pipeline.md#the-report-benchmark. Results go to
benchmarks/results/report.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402

T0_REALTIME = 1_790_000_000_000_000_000


def image_records(n: int, *, seed: int, threads: int, t0: int, addr_base: int) -> np.ndarray:
    """About n records of one process image (THREAD_START records first), in time order."""
    from tasks.format.trace_reader import OP_SHIFT, RECORD_DTYPE_CALLER, THREAD_SHIFT, Op

    rng = np.random.default_rng(seed)
    k = int(n / 1.98)  # allocations: 98% of them freed
    freed = rng.random(k) >= 0.02
    # lifetimes log-uniform in calls: 1 .. the whole image
    life = np.exp(rng.uniform(0, np.log(2 * k), k)).astype(np.int64)
    a_key = 2 * np.arange(k, dtype=np.int64)
    f_key = a_key[freed] + 2 * life[freed] - 1
    keys = np.concatenate([a_key, f_key])
    block = np.concatenate([np.arange(k), np.flatnonzero(freed)])
    is_free = np.concatenate([np.zeros(k, bool), np.ones(len(f_key), bool)])
    order = np.argsort(keys, kind="stable")
    block, is_free = block[order], is_free[order]
    m = len(block)

    size = np.clip(np.exp(rng.normal(4.0, 1.6, k)), 1, 1 << 22).astype(np.uint64)
    ranks = np.arange(1, 2001)
    p = 1.0 / ranks
    callers = np.uint64(0x5555_5555_0000) + np.arange(2000, dtype=np.uint64) * np.uint64(48)
    alloc_caller = rng.choice(callers[:1500], k, p=p[:1500] / p[:1500].sum())
    free_caller = rng.choice(callers[1500:], m, p=p[:500] / p[:500].sum())
    thread = (np.arange(k) % threads).astype(np.uint64)

    recs = np.zeros(threads + m, dtype=RECORD_DTYPE_CALLER)
    for t in range(threads):
        recs["arg"][t] = 10_000 + seed * 10 + t
        recs["packed"][t] = (np.uint64(Op.THREAD_START) << np.uint64(OP_SHIFT)) | (
            np.uint64(t) << np.uint64(THREAD_SHIFT)
        )
    body = recs[threads:]
    body["addr"] = np.uint64(addr_base) + block.astype(np.uint64) * np.uint64(64)
    op = np.where(is_free, np.uint64(Op.FREE), np.uint64(Op.MALLOC))
    body["packed"] = (
        np.where(is_free, np.uint64(0), size[block])
        | (op << np.uint64(OP_SHIFT))
        | (thread[block] << np.uint64(THREAD_SHIFT))
    )
    body["caller"] = np.where(is_free, free_caller, alloc_caller[block])
    recs["time"][:threads] = t0
    recs["time"][threads:] = t0 + np.cumsum(rng.integers(20, 120, m)).astype(np.uint64)
    return recs


def write_run(work: Path, events: int) -> tuple[Path, Path]:
    """The raw run and its events run folder under `work` (a data root)."""
    from tasks.core.storage import Root
    from tasks.dataset.partitions import convert_file
    from tests.tracegen import write_trace

    raw = work / "raw" / "bench" / "synthetic"
    ev = work / "events" / "workload=bench" / "run=synthetic"
    if (ev / "_summary.json").is_file():
        return raw, ev
    shutil.rmtree(raw, ignore_errors=True)
    shutil.rmtree(ev, ignore_errors=True)
    raw.mkdir(parents=True)
    ev.mkdir(parents=True)
    images = [  # (pid, ppid, share, threads, cmdline, start offset ns)
        (100, 1, 0.5, 1, ("bench", "parent"), 0),
        (101, 100, 0.3, 2, ("bench", "child"), 2_000_000),
        (101, 100, 0.2, 1, ("bench", "exec'd"), 900_000_000),
    ]
    for i, (pid, ppid, share, threads, cmd, off) in enumerate(images):
        t = time.perf_counter()
        recs = image_records(
            int(events * share),
            seed=i,
            threads=threads,
            t0=1_000_000_000 + off,
            addr_base=0x7F00_0000_0000 + i * 0x10_0000_0000,
        )
        write_trace(
            raw / f"{pid}-{T0_REALTIME + off}.hct",
            recs,
            caller=True,
            pid=pid,
            ppid=ppid,
            cmdline=cmd,
            start_realtime_ns=T0_REALTIME + off,
        )
        print(f"wrote {len(recs):,} records in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    files = []
    for p in sorted(raw.glob("*.hct")):
        t = time.perf_counter()
        files.append(convert_file(str(p), Root.from_url(str(work)), str(ev)))
        print(f"converted {p.name} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    rows = sum(f["rows"] for f in files)
    summary = {"workload": "bench", "run": "synthetic", "rows": rows, "files": files}
    (ev / "_summary.json").write_text(json.dumps(summary))
    return raw, ev


def measure_one(spec: str, out: str) -> dict:
    """In this (fresh) process: analyze, then render; times, CPU and peak RSS."""
    t_import = time.perf_counter()
    from tasks.report.analysis import analyze
    from tasks.report.page import render
    from tasks.report.sources import resolve

    imports = time.perf_counter() - t_import
    c0, t0 = time.process_time(), time.perf_counter()
    rep = analyze(resolve(spec))
    c1, t1 = time.process_time(), time.perf_counter()
    page = render([rep])
    Path(out).write_text(page)
    c2, t2 = time.process_time(), time.perf_counter()
    return {
        "events": rep.events,
        "peak_bytes": rep.peak_bytes,
        "imports_s": imports,
        "analyze_s": t1 - t0,
        "analyze_cpu_s": c1 - c0,
        "render_s": t2 - t1,
        "render_cpu_s": c2 - c1,
        "html_bytes": len(page.encode()),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_measure(spec: Path, out: Path) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--measure", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout)


def run_cli(spec: Path, out: Path) -> dict:
    heapcast = Path(sys.executable).with_name("heapcast")
    t = time.perf_counter()
    r = subprocess.run(
        [str(heapcast), "report", str(spec), "-o", str(out)], capture_output=True, text=True
    )
    wall = time.perf_counter() - t
    assert r.returncode == 0, r.stderr
    return {"wall_s": wall, "summary": r.stdout.splitlines()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=40_000_000)
    ap.add_argument("--work", help="folder for the synthetic run (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (min kept)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_one(args.measure, args.out)))
        return 0

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="heapcast-bench-report-"))
    try:
        t = time.perf_counter()
        raw, ev = write_run(work, args.events)
        setup_s = time.perf_counter() - t
        events = json.loads((ev / "_summary.json").read_text())["rows"]
        # each measurement --repeat times, the fastest kept (the machine may be shared)
        runs = [
            (
                run_measure(ev, work / "events.html"),
                run_cli(ev, work / "cli-events.html"),
                run_measure(raw, work / "raw.html"),
                run_cli(raw, work / "cli-raw.html"),
            )
            for _ in range(args.repeat)
        ]
        res_events = min((r[0] for r in runs), key=lambda m: m["analyze_s"])
        cli_events = min((r[1] for r in runs), key=lambda m: m["wall_s"])
        res_raw = min((r[2] for r in runs), key=lambda m: m["analyze_s"])
        cli_raw = min((r[3] for r in runs), key=lambda m: m["wall_s"])
        assert res_events["peak_bytes"] == res_raw["peak_bytes"]
        result = {
            "what": "heapcast report on a synthetic run: events dataset and raw traces",
            "run": {
                "events": events,
                "processes": 3,
                "threads": 4,
                "raw_bytes": sum(p.stat().st_size for p in raw.glob("*.hct")),
                "parquet_bytes": sum(p.stat().st_size for p in ev.glob("*.parquet")),
                "setup_s": setup_s,
            },
            "repeat": args.repeat,
            "events_dataset": {
                **res_events,
                "events_per_s_analyze": events / res_events["analyze_s"],
                "events_per_cpu_s_analyze": events / res_events["analyze_cpu_s"],
                "cli_wall_s": cli_events["wall_s"],
                "events_per_s_cli": events / cli_events["wall_s"],
            },
            "raw_traces": {
                **res_raw,
                "events_per_s_analyze": events / res_raw["analyze_s"],
                "events_per_cpu_s_analyze": events / res_raw["analyze_cpu_s"],
                "cli_wall_s": cli_raw["wall_s"],
                "events_per_s_cli": events / cli_raw["wall_s"],
            },
            "summary": cli_events["summary"],
        }
        print(json.dumps(result, indent=1))
        write_result(
            "report",
            result,
            reference="the same run read from its raw traces (converted in-process) beside "
            "the events dataset",
            argv=argv,
        )
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
