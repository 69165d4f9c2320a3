"""Conversion cost: the article's text-log loop vs heapcast's raw -> Parquet, in one run.

    .venv/bin/python benchmarks/bench_convert.py                 # traces sqlite3 (450k rows)
    .venv/bin/python benchmarks/bench_convert.py --trace X.hct   # any trace of >= 20 M events

Reference (the article's approach, written here): the tracer's output kept as a gzip'ed text log,
one line per call (`<time_us> <op> <size> <addr> [<old addr>]`), parsed line by line in Python
with a dict of live pointers that gives each free its size, each block its lifetime and each
row its token. It writes nothing. heapcast: `tasks.dataset.convert_run` on a Dask local cluster
of one single-threaded worker (one core), from the raw file to Parquet on disk.

Reported: events per second (wall, and per CPU-second of the process doing the work: the
machine may be shared), bytes per event on disk for the raw trace, the Parquet events, and the
gzip'ed text log. Results go to benchmarks/results/convert.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from tasks.trace_reader import Op, read_trace  # noqa: E402

OP_NAMES = {int(o): o.name.lower() for o in Op}


def sqlite_sql(rows: int, path: Path) -> None:
    """Bulk insert, two indexes, mixed queries, update, delete (deterministic)."""
    rnd = random.Random(2)
    with open(path, "w") as f:
        f.write("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL, k INTEGER);\nBEGIN;\n")
        for _ in range(rows):
            f.write(f"INSERT INTO t(name,v,k) VALUES('n{rnd.randrange(10**8):08d}x"
                    f"{'y' * rnd.randrange(40)}',{rnd.random()},{rnd.randrange(1000)});\n")
        f.write("COMMIT;\nCREATE INDEX ik ON t(k);\nCREATE INDEX iname ON t(name);\n")
        for _ in range(rows // 100):
            f.write(f"SELECT count(*), avg(v) FROM t WHERE k={rnd.randrange(1000)};\n")
            f.write(f"SELECT name FROM t WHERE name > 'n{rnd.randrange(10**8):08d}' "
                    "ORDER BY name LIMIT 20;\n")
        f.write("UPDATE t SET v=v*2 WHERE k<100;\nDELETE FROM t WHERE k>900;\n"
                "SELECT k, count(*) FROM t GROUP BY k ORDER BY 2 DESC LIMIT 5;\n")


def trace_sqlite(rows: int, work: Path) -> Path:
    lib = PROJECT / "native" / "build" / "libheapcast.so"
    if not lib.exists():
        subprocess.run(["make", "-C", str(PROJECT / "native")], check=True)
    sql = work / "bench.sql"
    sqlite_sql(rows, sql)
    out = work / "trace"
    out.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(lib), HEAPCAST_OUT=str(out))
    with open(sql, "rb") as stdin:
        subprocess.run(["sqlite3", str(work / "bench.db")], stdin=stdin, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    (work / "bench.db").unlink()
    return max(out.glob("*.hct"), key=lambda p: p.stat().st_size)


def write_text_log(trace_path: Path, out: Path) -> int:
    """The article's log of the same calls, gzip'ed (its writing is not what is measured)."""
    tr = read_trace(trace_path)
    keep = tr.op != Op.THREAD_START
    t_us = (tr.time_ns[keep] // 1000).tolist()
    op, size = tr.op[keep].tolist(), tr.size[keep].tolist()
    addr, arg = tr.addr[keep].tolist(), tr.arg[keep].tolist()
    names = [OP_NAMES.get(o, str(o)) for o in range(256)]
    with gzip.open(out, "wt", compresslevel=6) as f:
        step = 1 << 20
        for s in range(0, len(op), step):
            lines = []
            for t, o, n, a, g in zip(t_us[s:s + step], op[s:s + step], size[s:s + step],
                                     addr[s:s + step], arg[s:s + step]):
                if o == Op.FREE:
                    lines.append(f"{t} free {a:x}\n")
                elif o == Op.REALLOC or o == Op.REALLOCARRAY:
                    lines.append(f"{t} {names[o]} {n} {a:x} {g:x}\n")
                else:
                    lines.append(f"{t} {names[o]} {n} {a:x}\n")
            f.write("".join(lines))
    return int(np.count_nonzero(keep))


def reference_line_loop(log: Path, limit: int | None) -> dict:
    """The article's conversion: line by line, a dict of live pointers; writes nothing."""
    live: dict[str, tuple[int, int, int]] = {}
    tokens = lifetimes = unpaired = 0
    i = 0
    c0, w0 = time.process_time(), time.perf_counter()
    with gzip.open(log, "rt") as f:
        for line in f:
            parts = line.split()
            t = int(parts[0])
            op = parts[1]
            if op == "free":
                blk = live.pop(parts[2], None)
                if blk is None:
                    unpaired += 1
                    tok = 32
                else:
                    tok = 32 + min(blk[0].bit_length(), 31)
                    lifetimes += (t - blk[1]) + (i - blk[2])
            else:
                size = int(parts[2])
                if op in ("realloc", "reallocarray"):
                    blk = live.pop(parts[4], None)
                    if blk is not None:
                        lifetimes += (t - blk[1]) + (i - blk[2])
                if parts[3] != "0":
                    live[parts[3]] = (size, t, i)
                tok = min(size.bit_length(), 31)
            tokens += tok
            i += 1
            if limit and i >= limit:
                break
    return {"lines": i, "wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
            "checksum": [tokens, lifetimes, unpaired]}


def heapcast_convert(trace_path: Path, work: Path) -> dict:
    """tasks.dataset.convert_run on a one-worker, one-thread Dask local cluster."""
    from distributed import Client, LocalCluster

    from tasks.dataset import RunRef, convert_run
    from tasks.storage import Root

    raw = work / "root" / "raw" / "sqlite" / "bench"
    raw.mkdir(parents=True)
    os.link(trace_path, raw / trace_path.name) if trace_path.stat().st_dev == raw.stat().st_dev \
        else shutil.copy(trace_path, raw / trace_path.name)
    root = Root.from_url(str(work / "root"))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=40) as cluster, Client(cluster) as c:
        c.run(lambda: __import__("tasks.dataset"))  # imports are not conversion work
        cpu0 = sum(c.run(time.process_time).values())
        w0 = time.perf_counter()
        summary = convert_run(root, RunRef("sqlite", "bench"), client=c)
        wall = time.perf_counter() - w0
        cpu = sum(c.run(time.process_time).values()) - cpu0
    part_dir = work / "root" / "events" / "workload=sqlite" / "run=bench"
    parquet = sum(p.stat().st_size for p in part_dir.glob("part-*.parquet"))
    return {"rows": summary["rows"], "wall_s": wall, "worker_cpu_s": cpu,
            "parquet_bytes": parquet, "summary": {k: summary[k] for k in (
                "ops", "unpaired_frees", "never_freed", "peak_live_bytes", "threads")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="a raw trace (.hct); default: trace sqlite3")
    ap.add_argument("--rows", type=int, default=450_000, help="sqlite3 rows (default 450k)")
    ap.add_argument("--ref-lines", type=int, default=0,
                    help="stop the reference loop after N lines (0: all)")
    ap.add_argument("--out", type=Path, default=PROJECT / "benchmarks" / "results" /
                    "convert.json")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temp folder)")
    args = ap.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="heapcast-bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        trace = args.trace or trace_sqlite(args.rows, work)
        raw_bytes = trace.stat().st_size
        log = work / "trace.log.gz"
        events = write_text_log(trace, log)
        print(f"trace {trace.name}: {events:,} events; text log written", flush=True)

        hc = heapcast_convert(trace, work)
        print(f"heapcast: {hc['rows']:,} rows in {hc['wall_s']:.1f} s wall, "
              f"{hc['worker_cpu_s']:.1f} CPU-s", flush=True)
        ref = reference_line_loop(log, args.ref_lines or None)
        print(f"line loop: {ref['lines']:,} lines in {ref['wall_s']:.1f} s", flush=True)

        ref_rate = ref["lines"] / ref["cpu_s"]
        hc_rate = hc["rows"] / hc["worker_cpu_s"]
        result = {
            "what": "raw trace -> events Parquet (heapcast) vs gzip text log line loop (article)",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_avg_at_end": os.getloadavg()},
            "trace": {"file": trace.name, "events": events, "raw_bytes": raw_bytes},
            "bytes_per_event": {
                "raw": raw_bytes / events,
                "parquet": hc["parquet_bytes"] / hc["rows"],
                "gzip_text_log": log.stat().st_size / events,
            },
            "events_per_s": {
                "heapcast_per_cpu_s": hc_rate,
                "heapcast_wall_one_worker": hc["rows"] / hc["wall_s"],
                "line_loop_per_cpu_s": ref_rate,
                "line_loop_wall": ref["lines"] / ref["wall_s"],
            },
            "ratios": {
                "heapcast_vs_line_loop_per_core": hc_rate / ref_rate,
                "parquet_vs_gzip_text_bytes": hc["parquet_bytes"] / hc["rows"]
                / (log.stat().st_size / events),
            },
            "targets": {"events_per_s_per_core": 5e6, "vs_line_loop": 20,
                        "parquet_over_gzip_text_at_most": 0.5},
            "heapcast": hc,
            "line_loop": ref,
        }
        result["targets_met"] = {
            "events_per_s_per_core": hc_rate >= 5e6,
            "vs_line_loop": hc_rate / ref_rate > 20,
            "parquet_over_gzip_text": result["ratios"]["parquet_vs_gzip_text_bytes"] <= 0.5,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("bytes_per_event", "events_per_s", "ratios",
                                                 "targets_met")}, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
