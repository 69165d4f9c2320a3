"""heapcast's allocator layer (native/layers/layer.c) against glibc and tcmalloc, side by side.

Part 1, cost per call: a tight loop of malloc(SIZE)/free pairs (benchmarks/programs/pairloop.c), 1
and 8 threads, the threads' own CPU time per pair, under glibc and the layer (policy off, largest,
pools, guided); plus the predictor's own cost and the floor of largest's shared lock
(benchmarks/programs/lockfloor.c). Part 2, seed 002's numpy case: wall, CPU, peak RSS and minor
faults under glibc, tcmalloc and the layer, rounds alternating the arms. The sizes, goals and arms
are in docs/speeds-layer.md#the-layer-benchmark.

    .venv/bin/python benchmarks/bench_layer.py [--reps 3] [--pairs 2000000] [--iters 60]
        [--library PATH] [--out PATH]

writes benchmarks/results/layer.json (or --out). --library measures another build of the layer
instead of native/build/libheapcast_layer.so, which is then neither built nor touched.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import compile_c, write_result  # noqa: E402

NATIVE = REPO / "native"
LAYER = NATIVE / "build" / "libheapcast_layer.so"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
CFLAGS = ("-O2", "-fno-builtin", "-pthread", f"-I{NATIVE}")
OUT = REPO / "benchmarks" / "results" / "layer.json"
REFERENCE = "glibc (no preload) and tcmalloc, rounds alternating"

NUMPY_CASE = """
import time, numpy as np
a = np.ones(10_000_000); b = np.ones(10_000_000) * 1.5
for _ in range(5):
    c = (a * b) ** 2 + 3
t0 = time.perf_counter()
c0 = time.process_time()
for _ in range({iters}):
    c = (a * b) ** 2 + 3
cpu = time.process_time() - c0
t = time.perf_counter() - t0
print(f"{{t * 1000 / {iters}:.3f}} {{cpu * 1000 / {iters}:.3f}} {{float(c[123]):.6f}}")
"""


def arm_env(arm: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env.pop("LD_PRELOAD", None)
    if arm == "tcmalloc":
        env["LD_PRELOAD"] = str(TCMALLOC)
    elif arm.startswith("layer-"):
        env["LD_PRELOAD"] = str(LAYER)
        env["HEAPCAST_LAYER"] = f"policy={arm.removeprefix('layer-')}"
    return env


def rotation(arms: list[str], rep: int) -> list[str]:
    k = rep % len(arms)
    return arms[k:] + arms[:k]


def run_wait4(argv: list[str], env: dict[str, str]) -> tuple[str, int, int]:
    """stdout, peak RSS (KiB) and minor faults of a child (os.wait4: the child alone)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{argv[0]} failed under {env.get('LD_PRELOAD')}")
        out.seek(0)
        return out.read().decode(), ru.ru_maxrss, ru.ru_minflt


def pair_costs(work: Path, reps: int, pairs: int) -> dict:
    loop = compile_c(REPO / "benchmarks" / "programs" / "pairloop.c", work / "pairloop", *CFLAGS)
    arms = ["glibc", "layer-off", "layer-largest", "layer-pools", "layer-guided"]
    # glibc's threshold fixed at 128 KiB: every 256 KiB block is mapped, so the layer keeps it
    # (without, glibc raises its threshold at the first free and serves them from its heap)
    mapped = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    cases = {
        "1 thread, 64 B": (1, 64, pairs, {}),
        "8 threads, 64 B": (8, 64, pairs // 4, {}),
        "1 thread, 256 KiB": (1, 256 << 10, pairs // 40, {}),
        "8 threads, 256 KiB": (8, 256 << 10, pairs // 160, {}),
        "1 thread, 256 KiB kept": (1, 256 << 10, pairs // 40, mapped),
        "2 threads, 256 KiB kept": (2, 256 << 10, pairs // 80, mapped),
        "8 threads, 256 KiB kept": (8, 256 << 10, pairs // 160, mapped),
        # the process never starts a thread: glibc takes no arena lock, the layer no shard lock
        "main alone, 256 KiB kept": (0, 256 << 10, pairs // 40, mapped),
    }
    out = {}
    for name, (threads, size, iters, extra) in cases.items():
        samples: dict[str, list[float]] = {a: [] for a in arms}
        for rep in range(reps):
            for arm in rotation(arms, rep):
                # glibc at its best: its own threshold, its heap
                env = arm_env(arm) if arm == "glibc" else arm_env(arm) | extra
                text, _, _ = run_wait4([str(loop), str(threads), str(iters), str(size)], env)
                samples[arm].append(float(text.split("=")[1]))
        base = min(samples["glibc"])
        out[name] = {
            "iters_per_thread": iters,
            "ns_per_pair_min": {a: round(min(v), 2) for a, v in samples.items()},
            "ns_per_pair": {a: [round(x, 2) for x in v] for a, v in samples.items()},
            "added_ns_per_pair": {a: round(min(v) - base, 2) for a, v in samples.items()},
        }
        print(name, out[name]["ns_per_pair_min"], flush=True)
    bench = compile_c(
        REPO / "tests" / "native" / "programs" / "predict_tokens.c", work / "pt", *CFLAGS
    )
    ns = []
    for _ in range(reps):
        text = subprocess.run(
            [str(bench), "bench", str(pairs * 5)], capture_output=True, text=True, check=True
        ).stdout
        ns.append(float(text.split()[0].split("=")[1]))
    out["predictor ns per call (learn + guided question)"] = {"min": min(ns), "all": ns}
    print("predictor", min(ns), flush=True)
    out["floor: one lock for the process, two holds a pair"] = lock_floor(work, reps, pairs)
    return out


def lock_floor(work: Path, reps: int, pairs: int) -> dict:
    """ns a pair of lockfloor.c, one lock shared by all threads against one per thread (min
    over alternating rounds): the cost of largest's one lock before any of its work."""
    prog = compile_c(REPO / "benchmarks" / "programs" / "lockfloor.c", work / "lockfloor", *CFLAGS)
    out = {}
    for threads in (1, 2, 8):
        samples: dict[str, list[float]] = {"shared": [], "per thread": []}
        for rep in range(reps):
            for arm in rotation(list(samples), rep):
                text = subprocess.run(
                    [str(prog), str(threads), str(pairs), "0" if arm == "shared" else "1"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                samples[arm].append(float(text.split("=")[1]))
        out[f"{threads} thread(s)"] = {a: round(min(v), 2) for a, v in samples.items()}
        print("floor", threads, out[f"{threads} thread(s)"], flush=True)
    return out


def numpy_case(reps: int, iters: int) -> dict:
    arms = ["glibc", "tcmalloc", "layer-largest", "layer-pools", "layer-guided"]
    code = NUMPY_CASE.format(iters=iters)
    samples: dict[str, list[dict]] = {a: [] for a in arms}
    outputs = set()
    for rep in range(reps):
        for arm in rotation(arms, rep):
            text, rss, faults = run_wait4([sys.executable, "-c", code], arm_env(arm))
            ms, cpu_ms, value = text.split()
            outputs.add(value)
            samples[arm].append(
                {
                    "ms_per_iter": float(ms),
                    "cpu_ms_per_iter": float(cpu_ms),
                    "peak_rss_kib": rss,
                    "minflt": faults,
                }
            )
            print(arm, rep, ms, cpu_ms, rss, faults, flush=True)
    summary = {}
    g_ms = statistics.median(s["ms_per_iter"] for s in samples["glibc"])
    g_rss = statistics.median(s["peak_rss_kib"] for s in samples["glibc"])
    g_cpu = statistics.median(s["cpu_ms_per_iter"] for s in samples["glibc"])
    for arm, rows in samples.items():
        ms = [r["ms_per_iter"] for r in rows]
        rss = [r["peak_rss_kib"] for r in rows]
        summary[arm] = {
            "ms_per_iter_median": statistics.median(ms),
            "ms_per_iter_range": [min(ms), max(ms)],
            "wall_vs_glibc": round(statistics.median(ms) / g_ms, 3),
            "cpu_ms_per_iter_median": statistics.median(r["cpu_ms_per_iter"] for r in rows),
            "cpu_vs_glibc": round(statistics.median(r["cpu_ms_per_iter"] for r in rows) / g_cpu, 3),
            "peak_rss_mib_median": round(statistics.median(rss) / 1024, 1),
            "peak_rss_vs_glibc": round(statistics.median(rss) / g_rss, 3),
            "minor_faults_median": statistics.median(r["minflt"] for r in rows),
        }
    return {"summary": summary, "samples": samples, "same_output": len(outputs) == 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument(
        "--library", type=Path, help="the layer library to measure (default: native/build's, built)"
    )
    ap.add_argument("--out", type=Path, default=OUT, help=f"result file (default: {OUT})")
    args = ap.parse_args()
    global LAYER
    if args.library is not None:
        if not args.library.is_file():
            ap.error(f"--library {args.library}: no such file")
        LAYER = args.library.resolve()
    else:
        subprocess.run(["make", "-s", "-C", str(NATIVE), "layer"], check=True)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "reps": args.reps,
        "library": str(LAYER),
        "note": "shared machine (2 cores, other jobs running): CPU-time minima for the per-call "
        "costs, medians and ranges over few alternating rounds for the numpy case",
    }
    with tempfile.TemporaryDirectory(prefix="bench-layer-") as tmp:
        result["pairs"] = pair_costs(Path(tmp), args.reps, args.pairs)
    if not args.no_numpy:
        result["numpy_temporaries"] = numpy_case(args.reps, args.iters)
        for arm, s in result["numpy_temporaries"]["summary"].items():
            print(arm, s, flush=True)
    write_result("layer", result, reference=REFERENCE, out=args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
