"""What-if simulator throughput, and the real `largest` layer's page faults.

    .venv/bin/python benchmarks/bench_whatif.py                  # data/ events, tiled to 20 M
    .venv/bin/python benchmarks/bench_whatif.py --root data --min-events 20000000 --reps 5

Part 1, the simulator (tasks/whatif/simulate.py): every policy kind on one big run tiled from
the real runs under <root>/events, reading, `prepare`, the compiled loop per policy, the oracle
bound and a default-grid sweep timed apart; target: the compiled loop >= 10 M events/s per core
for every policy. Part 2, the layer (tasks/whatif/layer.py `measure_layer`): minor page faults
with and without it on bigblocks and a numpy script, next to the simulated fault bytes avoided.
The details: docs/speeds-pipeline.md#the-what-if-benchmark.

Writes benchmarks/results/whatif.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks.harness import compile_c, write_result  # noqa: E402
from tasks.core.storage import Root  # noqa: E402
from tasks.whatif.events import prepare, read_events  # noqa: E402
from tasks.whatif.guided import reuse_labels, reuse_tiers  # noqa: E402
from tasks.whatif.oracle import bound_hits  # noqa: E402
from tasks.whatif.policies import (  # noqa: E402
    BeladyConfig,
    GuidedConfig,
    LargestConfig,
    LruConfig,
    NoneConfig,
    PoolsConfig,
)
from tasks.whatif.simulate import layer_metrics, run_kernel, simulate  # noqa: E402
from tasks.whatif.sweep import sweep_run  # noqa: E402

RESULTS = PROJECT / "benchmarks" / "results" / "whatif.json"
REFERENCE = "the real largest layer's page faults beside the simulator's"
TARGET = 10_000_000


def _timed(fn, reps: int) -> tuple[float, float]:
    """(best wall s, best cpu s) over reps calls."""
    walls, cpus = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def load_runs(root: Root) -> list[tuple[str, str, pa.Table]]:
    from tasks.dataset.token_runs import list_runs

    try:
        runs = list_runs(root)
    except FileNotFoundError:
        return []
    return [(w, r, read_events(root, w, r)) for w, rs in runs.items() for r in rs]


def synthetic_runs() -> list[tuple[str, str, pa.Table]]:
    from tests.tasks.whatif.reference import random_events

    return [("synthetic", f"s{i}", random_events(i, n_proc=4, n_events=50_000)) for i in range(4)]


def tiled(runs: list[tuple[str, str, pa.Table]], min_events: int) -> pa.Table:
    """The runs' rows as processes one after the other in time, repeated to min_events rows."""
    parts, n, image, t0 = [], 0, 0, 0
    while n < min_events:
        for _w, _r, t in runs:
            key = t.column("image" if "image" in t.column_names else "pid").to_numpy()
            time_ns = t.column("time_ns").to_numpy()
            shift = t0 - int(time_ns.min())
            img = np.unique(key, return_inverse=True)[1].astype(np.uint32) + np.uint32(image)
            cols = {c: t.column(c) for c in t.column_names if c != "image"}
            cols["time_ns"] = pa.array(time_ns + shift)
            cols["image"] = pa.array(img)
            parts.append(pa.table(cols))
            image += int(img.max()) - image + 1
            t0 += int(time_ns.max() - time_ns.min()) + 1
            n += t.num_rows
            if n >= min_events:
                break
    return pa.concat_tables(parts)


def bench_simulator(root: Root, min_events: int, reps: int) -> dict:
    t0 = time.perf_counter()
    runs = load_runs(root)
    source = "events" if runs else "synthetic"
    if not runs:
        runs = synthetic_runs()
    read_s = time.perf_counter() - t0
    big = tiled(runs, min_events)
    n = big.num_rows
    prepare(big.slice(0, 1000))  # compile the helpers
    w, c = _timed(lambda: prepare(big), 1)
    x = prepare(big)
    pred = reuse_labels(big, horizon=16)
    tiers = reuse_tiers(big, (16, 256, 4096))
    policies = [
        NoneConfig(),
        LargestConfig(n=4),
        LargestConfig(n=64, min_size=0),
        PoolsConfig(decay_ns=1_000_000),
        LruConfig(budget=1 << 20),
        LruConfig(budget=1 << 30),
        GuidedConfig(budget=1 << 20, ttl_calls=16, mode="admit"),
        GuidedConfig(budget=1 << 20),
        GuidedConfig(budget=1 << 14, horizons=(16, 256, 4096)),
        BeladyConfig(budget=1 << 20),
    ]
    loops = {}
    for p in policies:
        p_pred = None
        if isinstance(p, GuidedConfig):
            p_pred = tiers if p.horizons else pred
        if isinstance(p, (LargestConfig, PoolsConfig)):  # the layer's: the policy core
            loop = lambda p=p, p_pred=p_pred: layer_metrics(x, p)  # noqa: E731
        else:
            loop = lambda p=p, p_pred=p_pred: run_kernel(x, p, p_pred)  # noqa: E731
        loop()  # warm-up/compile
        wall, cpu = _timed(loop, reps)
        m = simulate(x, p, p_pred)
        name = p.label + ("_tiers" if getattr(p, "horizons", None) else "")
        loops[f"{name}({p.param:g})"] = {
            "events_per_s_wall": n / wall,
            "events_per_s_cpu": n / cpu if cpu > 0 else None,
            "wall_s": wall,
            "hit_rate": m["hit_rate"],
            "idle_bytes_mean": m["idle_bytes_mean"],
            "fault_bytes_avoided": m["fault_bytes_avoided"],
        }
    x.cache.pop("oracle", None)
    bw, bc = _timed(lambda: (x.cache.pop("oracle", None), bound_hits(x, 1e6)), reps)
    # a whole default-grid sweep of the largest real run (prepare + every config)
    w0, r0, t_big = max(runs, key=lambda r: r[2].num_rows)
    sweep_run(t_big.slice(0, 1000), workload=w0, run=r0)
    sw0 = time.perf_counter()
    df = sweep_run(t_big, workload=w0, run=r0)
    sweep_s = time.perf_counter() - sw0
    worst = min(v["events_per_s_cpu"] or v["events_per_s_wall"] for v in loops.values())
    return {
        "input": {
            "source": source,
            "runs": [f"{w}/{r} ({t.num_rows} events)" for w, r, t in runs],
            "events": n,
            "processes": x.n_proc,
            "read_s": read_s,
        },
        "prepare": {"wall_s": w, "cpu_s": c, "events_per_s_wall": n / w},
        "compiled_loop": loops,
        "oracle_bound": {"events_per_s_wall": n / bw, "events_per_s_cpu": n / bc if bc else None},
        "default_grid_sweep": {
            "run": f"{w0}/{r0}",
            "events": t_big.num_rows,
            "configs": len(df),
            "wall_s": sweep_s,
            "events_x_configs_per_s": t_big.num_rows * len(df) / sweep_s,
        },
        "target_events_per_s_per_core": TARGET,
        "slowest_policy_events_per_s_per_core": worst,
        "meets_target": worst >= TARGET,
    }


def bench_layer() -> dict:
    from tasks.whatif.layer import build_layer, measure_layer, traced_events

    lib = build_layer()
    subprocess.run(["make", "-s", "-C", str(PROJECT / "native")], check=True)
    tracer = PROJECT / "native" / "build" / "libheapcast.so"
    out: dict = {"layer": str(lib.relative_to(PROJECT))}
    with tempfile.TemporaryDirectory() as tmp:
        src = PROJECT / "tests" / "native" / "programs" / "bigblocks.c"
        exe = compile_c(src, Path(tmp) / "bigblocks", "-O1", "-fno-builtin", "-pthread")
        numpy_code = (
            "import numpy as np\n"
            "a = np.arange(1_000_000, dtype=np.float64)\n"
            "s = 0.0\n"
            "for i in range(100):\n"
            "    s += float(((a * i) ** 2 + 3).sum())\n"
            "print(s)\n"
        )
        cases = {
            "bigblocks 40 rounds, 1 thread, 300000 1000000 2500000 B": (
                [str(exe), "40", "1", "300000", "1000000", "2500000"], True),
            "bigblocks 15 rounds, 4 threads, 300000 1000000 2500000 4000000 B": (
                [str(exe), "15", "4", "300000", "1000000", "2500000", "4000000"], True),
            "bigblocks 6 rounds, 34 MiB blocks, glibc default (dynamic) threshold": (
                [str(exe), "6", "1", str(34 << 20)], False),
            "numpy: 100 x ((a*i)**2+3).sum(), a = 8 MB": (
                [sys.executable, "-c", numpy_code], True),
            "numpy, glibc default (dynamic) threshold": ([sys.executable, "-c", numpy_code], False),
        }  # fmt: skip
        for name, (argv, static) in cases.items():
            m = measure_layer(argv, layer=lib, static_threshold=static)
            out[name] = {
                "argv": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv)),
                "static_threshold": static,
                "same_output": m["same_output"],
                "minor_faults_without": m["minor_faults_without"],
                "minor_faults_with": m["minor_faults_with"],
                "fault_reduction": 1 - m["minor_faults_with"] / max(m["minor_faults_without"], 1),
                "fault_bytes_avoided_measured": m["fault_bytes_avoided"],
                "hits": m["hits"],
                "misses": m["misses"],
                "wall_s_without": m["without"]["wall_s"],
                "wall_s_with": m["with"]["wall_s"],
            }
        # simulated vs measured, bigblocks single-threaded
        argv = cases["bigblocks 40 rounds, 1 thread, 300000 1000000 2500000 B"][0]
        table, _ = traced_events(argv, tracer, Path(tmp) / "trace")
        sim = simulate(table, LargestConfig(n=4))
        measured = out["bigblocks 40 rounds, 1 thread, 300000 1000000 2500000 B"]
        out["simulated_vs_measured_bigblocks"] = {
            "simulated_hits": sim["hits"],
            "measured_hits": measured["hits"],
            "simulated_fault_bytes_avoided": sim["fault_bytes_avoided"],
            "measured_fault_bytes_avoided": measured["fault_bytes_avoided_measured"],
            "ratio": sim["fault_bytes_avoided"] / max(measured["fault_bytes_avoided_measured"], 1),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(PROJECT / "data"))
    ap.add_argument("--min-events", type=int, default=20_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-layer", action="store_true")
    ap.add_argument("--out", default=str(RESULTS), help="the JSON written")
    args = ap.parse_args()
    result = {
        "what": "whatif: compiled allocator-cache simulator throughput; largest layer faults",
        "command": "python benchmarks/bench_whatif.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": list(os.getloadavg()),
        },
    }
    if not args.no_layer:  # first, while this process is small (its children fork from it)
        result["layer"] = bench_layer()
    result["simulator"] = bench_simulator(Root.from_url(args.root), args.min_events, args.reps)
    result["machine"]["load_avg_at_end"] = list(os.getloadavg())
    write_result("whatif", result, reference=REFERENCE, out=args.out)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
