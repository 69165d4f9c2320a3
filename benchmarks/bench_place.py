"""heapcast's placement layer (native/layers/place.c) against the allocators it could replace.

Part 1 (benchmarks/programs/burstkv.c): bursts of short-lived request buffers interleaved with
long-lived entries from another call site; the resident set after each burst, peak RSS, CPU
time and minor faults under glibc, tcmalloc, mimalloc, jemalloc, jemalloc + placement (by the
online counter; by a lifetime table from a traced run of a smaller input), the layer with
placement off, and two references (a first run's sites: the bound; size alone). Every jemalloc
arm runs again with prompt purging. Part 1b: the same arms on a program the table never saw
(CPython). Part 1c: burstkv with every block through one wrapper (`wrap`), prompt purging:
jemalloc, a first run's sites keyed on one frame, and on the calling context (`depth`), beside
burstkv as is (distinct call sites). Part 2 (benchmarks/programs/pairloop.c): the cost per
malloc(64)/free pair, 1 and 2 threads, the context (depths 2, 4, 8) beside one frame, the
counter learning (learn_mb=0) beside it waiting (the defaults: pairloop stays under learn_mb). Rounds
alternate the arms. Arms, options and why: docs/speeds-layer.md#the-placement-benchmark.

    .venv/bin/python benchmarks/bench_place.py [--reps 5] [--bursts 8] [--shorts 200000]
        [--every 100] [--pairs 2000000] [--train-bursts 4] [--train-shorts 50000]
        [--unseen-shorts 100000] [--depth 4] [--parts workload,unseen,wrapper,cost] [--out PATH]

writes benchmarks/results/place.json: medians and min-max for time.
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
PLACE = NATIVE / "build" / "libheapcast_place.so"
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
JEMALLOC = LIBDIR / "libjemalloc.so.2"
TCMALLOC = LIBDIR / "libtcmalloc_minimal.so.4"
MIMALLOC = LIBDIR / "libmimalloc.so.2"
TRACER = NATIVE / "build" / "libheapcast.so"
PYTHON = Path("/usr/bin/python3.11")  # the real binary (the unseen program)
OUT = REPO / "benchmarks" / "results" / "place.json"
REFERENCE = (
    "glibc, tcmalloc, mimalloc, jemalloc and jemalloc with placement off, rounds alternating; "
    "the bound (a first run's sites) and placement by size beside it"
)
# part 1b: a program the table never saw, bursts of dying objects with every EVERY-th kept
UNSEEN = """
import sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4
bursts, shorts, every = map(int, sys.argv[1:4])
keep = []
for b in range(bursts):
    req = []
    for i in range(shorts):
        req.append(bytearray(32 + (i * 7919) % 257))
        if i % every == 0:
            keep.append(bytearray(32 + (i * 104729) % 257))
    del req
    print(f"rss_kb burst={b} {rss()}", file=sys.stderr)
print(f"rss_kb end {rss()}", file=sys.stderr)
print(f"entries={len(keep)} sum={sum(map(len, keep))}")
"""
PROMPT = "dirty_decay_ms:0,muzzy_decay_ms:0"
PARTS = ("workload", "unseen", "wrapper", "cost")
CONTEXT_DEPTHS = (2, 4, 8)  # part 2's arms beside the layer's default depth (1: the call site)
CFLAGS = ("-O2", "-pthread")


def lifetime_table(exe: Path, argv: list[str], work: Path) -> Path:
    """A lifetime table for `exe` from one traced run of `argv` (callers recorded): per (call
    site, size class), the share of its blocks that lived long (observed_lifetime), keyed as the
    layer keys them; model version 0 (made outside the registry). Made in a child interpreter:
    the learning modules (Keras) would grow this one by ~1 GB, which every measured child
    inherits as its ru_maxrss."""
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    out = work / "trace"
    out.mkdir()
    env = clean_env({"LD_PRELOAD": str(TRACER), "HEAPCAST_OUT": str(out), "HEAPCAST_CALLER": "1"})
    subprocess.run([str(exe), *argv], env=env, check=True, capture_output=True)
    path = work / "table.hclife"
    code = (
        "import sys; from pathlib import Path\n"
        "from tasks.dataset.convert import events_from_trace\n"
        "from tasks.format.trace_reader import read_trace\n"
        "from tasks.learning.questions.network import observed_lifetime\n"
        "from tasks.registry.table_files import write_lifetime_table\n"
        "ts = [events_from_trace(read_trace(p)) for p in sorted(Path(sys.argv[1]).glob('*.hct'))]\n"
        "write_lifetime_table(Path(sys.argv[2]), *observed_lifetime(ts), 0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(out), str(path)], check=True, cwd=REPO)
    return path


def layer_arms(
    sites_file: Path | None = None, table_file: Path | None = None
) -> dict[str, dict[str, str]]:
    """The layer in front of jemalloc, name -> environment: placement off (jemalloc as the layer
    configures it, malloc_conf), by the online counter, by size alone (no prediction), and where
    given, by the long sites of a first run (the bound) and by the lifetime table (the online
    counter where it does not know the key)."""
    place = f"{PLACE} {JEMALLOC}"
    out = {
        "jemalloc+place-off": {"LD_PRELOAD": place, "HEAPCAST_PLACE": "mode=off"},
        "jemalloc+place": {"LD_PRELOAD": place, "HEAPCAST_PLACE": "mode=predict"},
    }
    if sites_file is not None:
        out["jemalloc+place-bound"] = {
            "LD_PRELOAD": place,
            "HEAPCAST_PLACE": f"mode=sites,sites={sites_file}",
        }
    out["jemalloc+place-size"] = {"LD_PRELOAD": place, "HEAPCAST_PLACE": "mode=size"}
    if table_file is not None:
        out["jemalloc+place-table"] = {"LD_PRELOAD": place, "HEAPCAST_PLACE": f"table={table_file}"}
    return out


def learn_env(sites_file: Path, depth: int | None = None) -> dict[str, str]:
    """The bound's first run: the online counter (keyed on `depth` frames, else the layer's
    default), its long sites written to `sites_file` at exit."""
    place = f"learn={sites_file}" + (f",depth={depth}" if depth else "")
    return {"LD_PRELOAD": f"{PLACE} {JEMALLOC}", "HEAPCAST_PLACE": place}


def alternating(names: list[str], reps: int, run) -> dict[str, list]:
    """`run(name)` for every arm, `reps` rounds, each round starting one arm later, so that
    the shared machine's drift falls on every arm alike."""
    results: dict[str, list] = {n: [] for n in names}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(run(name))
    return results


def arms(sites_file: Path, table_file: Path) -> dict[str, dict[str, str]]:
    """name -> the environment that makes it (LD_PRELOAD and the layer's options); every arm
    but glibc's, tcmalloc's and mimalloc's also in jemalloc's prompt mode."""
    base = {
        "glibc": {},
        "tcmalloc": {"LD_PRELOAD": str(TCMALLOC)},
        "mimalloc": {"LD_PRELOAD": str(MIMALLOC)},
    }
    jem = {"jemalloc": {"LD_PRELOAD": str(JEMALLOC)}, **layer_arms(sites_file, table_file)}
    out = dict(base)
    for name, env in jem.items():
        out[name] = env
        out[name + " (prompt)"] = {**env, "MALLOC_CONF": PROMPT}
    return out


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    for k in ("LD_PRELOAD", "MALLOC_CONF"):
        e.pop(k, None)
    e.update(extra)
    return e


def run_measured(argv: list[str], env: dict[str, str]) -> dict:
    """One run: the program's RSS lines, its peak RSS, wall, CPU time and minor faults."""
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err.seek(0)
    lines = err.read().decode().splitlines()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} under {env.get('LD_PRELOAD')}: exit {status}: {lines[-3:]}")
    bursts = [int(x.split()[-1]) for x in lines if x.startswith("rss_kb burst=")]
    end = [int(x.split()[-1]) for x in lines if x.startswith("rss_kb end")]
    return {
        "stdout": out.decode(),
        "rss_after_bursts_kb": bursts,
        "rss_end_kb": end[0],
        "peak_rss_kb": ru.ru_maxrss,
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "minor_faults": ru.ru_minflt,
    }


def summarize(runs: list[dict]) -> dict:
    def med(key):
        return statistics.median(r[key] for r in runs)

    n = len(runs[0]["rss_after_bursts_kb"])
    return {
        "rss_after_bursts_kb": [
            statistics.median(r["rss_after_bursts_kb"][i] for r in runs) for i in range(n)
        ],
        "rss_end_kb": med("rss_end_kb"),
        "peak_rss_kb": med("peak_rss_kb"),
        "cpu_s": med("cpu_s"),
        "cpu_s_range": [min(r["cpu_s"] for r in runs), max(r["cpu_s"] for r in runs)],
        "wall_s": med("wall_s"),
        "minor_faults": med("minor_faults"),
        "runs": len(runs),
    }


def bench_workload(
    argv: list[str], args: argparse.Namespace, work: Path, table_file: Path, base=None
) -> dict:
    """Every arm on `argv` (`base`: more environment for every run; with it only jemalloc's
    arms, the ones the layer stands in front of)."""
    base = base or {}
    sites = work / f"sites-{Path(argv[0]).name}.txt"
    run_measured(argv, clean_env({**base, **learn_env(sites)}))  # the same input
    table = {
        n: {**base, **e}
        for n, e in arms(sites, table_file).items()
        if not base or n.startswith("jemalloc")
    }
    names = list(table)
    results = alternating(names, args.reps, lambda n: run_measured(argv, clean_env(table[n])))
    outputs = {n: {x["stdout"] for x in results[n]} for n in names}
    same = len(set().union(*outputs.values())) == 1
    return {
        "argv": argv[1:] if not base else [Path(argv[0]).name, *argv[-3:]],
        "bound_sites": sites.read_text().splitlines(),
        "output_identical_across_arms": same,
        "arms": {n: summarize(results[n]) for n in names},
    }


def wrapper_arms(
    argv: list[str], wrap: list[str], work: Path, depth: int
) -> tuple[dict[str, tuple], dict[str, Path]]:
    """Part 1c's arms, name -> (argv, environment), every one with prompt purging: burstkv with
    every block through one wrapper (`wrap`) under jemalloc, a first run's sites keyed on one
    frame and on `depth` frames, the online counter at `depth`; burstkv as is (distinct call
    sites) under jemalloc and its one-frame sites. The first runs are made here; their sites
    files beside."""
    sites = {}
    for name, args, d in (
        ("wrap-1", wrap, 1),
        (f"wrap-{depth}", wrap, depth),
        ("as-is-1", argv, 1),
    ):
        sites[name] = work / f"sites-{name}.txt"
        run_measured(args, clean_env(learn_env(sites[name], d)))
    place = f"{PLACE} {JEMALLOC}"

    def env(setting: str | None) -> dict[str, str]:
        e = (
            {"LD_PRELOAD": place, "HEAPCAST_PLACE": setting}
            if setting
            else {"LD_PRELOAD": str(JEMALLOC)}
        )
        return {**e, "MALLOC_CONF": PROMPT}

    arms = {
        "wrapper: jemalloc": (wrap, env(None)),
        "wrapper: one frame's sites": (wrap, env(f"mode=sites,sites={sites['wrap-1']}")),
        f"wrapper: context's sites (depth {depth})": (
            wrap,
            env(f"mode=sites,sites={sites[f'wrap-{depth}']}"),
        ),
        f"wrapper: online counter (depth {depth})": (wrap, env(f"mode=predict,depth={depth}")),
        "distinct call sites: jemalloc": (argv, env(None)),
        "distinct call sites: one frame's sites": (
            argv,
            env(f"mode=sites,sites={sites['as-is-1']}"),
        ),
    }
    return arms, sites


def bench_wrapper(argv: list[str], args: argparse.Namespace, work: Path) -> dict:
    """Part 1c: placement by context where one wrapper makes every block; the end RSS of each
    arm against jemalloc's on the same program (medians of alternating rounds)."""
    table, sites = wrapper_arms(argv, [*argv, "wrap"], work, args.depth)
    names = list(table)
    results = alternating(
        names, args.reps, lambda n: run_measured(table[n][0], clean_env(table[n][1]))
    )
    arms = {n: summarize(results[n]) for n in names}
    vs = {
        n: "wrapper: jemalloc" if n.startswith("wrapper") else "distinct call sites: jemalloc"
        for n in names
    }
    outputs = {n: {x["stdout"] for x in results[n]} for n in names}
    return {
        "argv": [*argv[1:], "wrap"],
        "depth": args.depth,
        "sites": {name: path.read_text().splitlines() for name, path in sites.items()},
        "output_identical_across_arms": len(set().union(*outputs.values())) == 1,
        "rss_end_vs_jemalloc": {
            n: arms[n]["rss_end_kb"] / arms[vs[n]]["rss_end_kb"] for n in names
        },
        "arms": arms,
    }


def bench_pairs(exe: Path, args: argparse.Namespace, table_file: Path) -> dict:
    table = {"jemalloc": {"LD_PRELOAD": str(JEMALLOC)}}
    table |= {
        n: e
        for n, e in layer_arms(table_file=table_file).items()
        if n in ("jemalloc+place-off", "jemalloc+place", "jemalloc+place-table")
    }
    # the counter keyed on the calling context's frames beside the default (the call site alone):
    # what the context's walk costs
    for depth in CONTEXT_DEPTHS:
        table[f"jemalloc+place-depth{depth}"] = {
            **table["jemalloc+place"],
            "HEAPCAST_PLACE": f"depth={depth}",
        }
    # pairloop stays at a few MB, under learn_mb (16): the counter's arms learn from the start, as
    # in a process past it (what its learning costs a pair); the defaults beside them (waiting:
    # no samples, free straight to jemalloc's)
    table["jemalloc+place-waiting"] = dict(table["jemalloc+place"])
    for name, e in table.items():
        if name not in ("jemalloc", "jemalloc+place-off", "jemalloc+place-waiting"):
            table[name] = {**e, "HEAPCAST_PLACE": e["HEAPCAST_PLACE"] + ",learn_mb=0"}

    def pair_ns(threads: int, name: str) -> float:
        argv = [str(exe), str(threads), str(args.pairs), "64"]
        p = subprocess.run(argv, env=clean_env(table[name]), capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{' '.join(argv)} under {name} failed ({p.returncode}): {p.stderr[-500:]}")
        return float(p.stdout.split("=")[1])

    out = {}
    for threads in (0, 2):
        ns = alternating(list(table), args.reps * 2, lambda n, t=threads: pair_ns(t, n))
        mins = {n: min(v) for n, v in ns.items()}
        out[f"threads={threads}"] = {
            "ns_per_pair_min": mins,
            "ns_per_pair_median": {n: statistics.median(v) for n, v in ns.items()},
            "added_ns_min": mins["jemalloc+place"] - mins["jemalloc"],
            "ratio_min": mins["jemalloc+place"] / mins["jemalloc"],
            "table_added_ns_min": mins["jemalloc+place-table"] - mins["jemalloc"],
            "context_added_ns_min": mins["jemalloc+place-depth4"] - mins["jemalloc+place"],
            "waiting_added_ns_min": mins["jemalloc+place-waiting"] - mins["jemalloc"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bursts", type=int, default=8)
    ap.add_argument("--shorts", type=int, default=200_000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--train-bursts", type=int, default=4, help="the table's traced run")
    ap.add_argument("--train-shorts", type=int, default=50_000, help="the table's traced run")
    ap.add_argument("--unseen-shorts", type=int, default=100_000, help="part 1b's bursts")
    ap.add_argument("--depth", type=int, default=4, help="part 1c's context depth")
    ap.add_argument(
        "--parts", default=",".join(PARTS), help="a comma-separated subset of " + ",".join(PARTS)
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    parts = args.parts.split(",")
    if not set(parts) <= set(PARTS):
        ap.error(f"--parts: {args.parts!r} names a part not among {', '.join(PARTS)}")
    subprocess.run(["make", "-s", "-C", str(NATIVE), "place"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        burstkv = compile_c(
            REPO / "benchmarks" / "programs" / "burstkv.c", work / "burstkv", *CFLAGS, compiler="cc"
        )
        pairloop = compile_c(
            REPO / "benchmarks" / "programs" / "pairloop.c",
            work / "pairloop",
            *CFLAGS,
            compiler="cc",
        )
        train = [str(args.train_bursts), str(args.train_shorts), str(args.every)]
        table_file = lifetime_table(burstkv, train, work)
        argv = [str(burstkv), str(args.bursts), str(args.shorts), str(args.every)]
        script = work / "unseen.py"
        script.write_text(UNSEEN)
        unseen = [str(PYTHON), str(script), str(args.bursts), str(args.unseen_shorts)]
        unseen.append(str(args.every))
        result = {
            "command": "python benchmarks/bench_place.py "
            + " ".join(
                f"--{k.replace('_', '-')} {v}"
                for k, v in vars(args).items()
                if k != "out" and v is not None
            ),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "table": {
                "trained_on": ["burstkv", *train],
                "entries": (table_file.stat().st_size - 32) // 4,
            },
        }
        if "workload" in parts:
            result["workload"] = bench_workload(argv, args, work, table_file)
        if "unseen" in parts:
            result["unseen"] = bench_workload(
                unseen, args, work, table_file, base={"PYTHONMALLOC": "malloc"}
            )
        if "wrapper" in parts:
            result["wrapper"] = bench_wrapper(argv, args, work)
        if "cost" in parts:
            result["cost"] = bench_pairs(pairloop, args, table_file)
    write_result("place", result, reference=REFERENCE, out=args.out)
    for part in ("workload", "unseen", "wrapper"):
        if part not in result:
            continue
        print(part, result[part]["argv"])
        for name, a in result[part]["arms"].items():
            print(
                f"{name:44s} end {a['rss_end_kb'] / 1024:6.1f} MB  peak "
                f"{a['peak_rss_kb'] / 1024:6.1f} MB  cpu {a['cpu_s']:.3f} s  wall "
                f"{a['wall_s']:.3f} s  faults {a['minor_faults']:.0f}"
            )
    for name, r in result.get("wrapper", {}).get("rss_end_vs_jemalloc", {}).items():
        print(f"{name:44s} end RSS {r:.2f}x jemalloc's")
    for k, v in result.get("cost", {}).items():
        print(k, {n: round(x, 2) for n, x in v["ns_per_pair_min"].items()})


if __name__ == "__main__":
    main()
