"""Two builds of the allocator layer side by side: instructions and CPU time per malloc/free pair.

A change to the layer's paths is judged on the same pairs under both builds
(benchmarks/programs/pairloop.c, THREADS threads of malloc(256 KiB)/free, "kept" and "heap"):
instructions per pair by valgrind's callgrind, and CPU ns per pair over rounds that alternate
the two builds. In full: studies/layer_core_ab/README.md.

    gcc -O2 -fno-builtin -pthread -o /tmp/pl benchmarks/programs/pairloop.c
    git show BASE:native/... (build the old layer: make -C native layer, copy the .so aside)
    .venv/bin/python studies/layer_core_ab/layer_ab.py --old OLD.so --new native/build/libheapcast_layer.so

Writes studies/layer_core_ab/layer_core_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from benchmarks.harness import write_result  # noqa: E402

CASES = [  # policy, threads, mode
    ("largest", 1, "kept"),
    ("pools", 1, "kept"),
    ("guided", 1, "kept"),
    ("largest", 8, "kept"),
    ("pools", 8, "kept"),
    ("guided", 8, "kept"),
    ("largest", 1, "heap"),
    ("pools", 1, "heap"),
    ("guided", 1, "heap"),
]
SIZE = 262144


def _env(lib: Path, policy: str, mode: str) -> dict[str, str]:
    env = dict(os.environ, LD_PRELOAD=str(lib), HEAPCAST_LAYER=f"policy={policy}")
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mode == "kept":
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    return env


def _pairloop(pl: Path, lib: Path, policy: str, threads: int, mode: str, pairs: int, *before: str):
    """pairloop's `pairs` malloc/free pairs on `threads` threads under the layer (after the
    command `before`, valgrind's); it must exit 0."""
    return subprocess.run(
        [*before, str(pl), str(threads), str(pairs), str(SIZE)],
        env=_env(lib, policy, mode),
        capture_output=True,
        text=True,
        check=True,
    )


def instructions(pl: Path, lib: Path, policy: str, threads: int, mode: str, pairs: int) -> int:
    valgrind = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")
    out = _pairloop(pl, lib, policy, threads, mode, pairs, *valgrind).stderr
    return int(out.split("Collected : ")[1].split()[0])


def ns_per_pair(pl: Path, lib: Path, policy: str, threads: int, mode: str) -> float:
    iters = 20000 if threads > 1 else 200000
    out = _pairloop(pl, lib, policy, threads, mode, iters).stdout
    return float(out.split("ns_per_pair=")[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the layer library before the change")
    ap.add_argument("--new", type=Path, required=True, help="the layer library after it")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--pairs", type=int, default=20000, help="pairs a thread under callgrind")
    ap.add_argument("--out", default="studies/layer_core_ab/layer_core_ab.json")
    a = ap.parse_args()
    for lib in (a.old, a.new):
        if not lib.is_file():
            ap.error(f"{lib}: no such layer library (build one with `make -C native layer`)")
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            ap.error(f"`{tool}` is not on PATH (apt-get install {tool})")
    with tempfile.TemporaryDirectory() as d:
        pl = Path(d) / "pairloop"
        subprocess.run(
            ["gcc", "-O2", "-fno-builtin", "-pthread", "-o", str(pl)]
            + [str(PROJECT / "benchmarks" / "programs" / "pairloop.c")],
            check=True,
        )
        rows = []
        for policy, threads, mode in CASES:
            ir = {
                k: instructions(pl, lib, policy, threads, mode, a.pairs)
                for k, lib in (("old", a.old), ("new", a.new))
            }
            rows.append(
                {
                    "policy": policy,
                    "threads": threads,
                    "mode": mode,
                    "instructions_per_pair_new_minus_old": (ir["new"] - ir["old"])
                    / (a.pairs * threads),
                    "instructions": ir,
                }
            )
        times: dict[tuple[int, str], list[float]] = {}
        for r in range(a.rounds):
            for i, (policy, threads, mode) in enumerate(CASES):
                for k in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    lib = a.old if k == "old" else a.new
                    times.setdefault((i, k), []).append(ns_per_pair(pl, lib, policy, threads, mode))
        for i, row in enumerate(rows):
            for k in ("old", "new"):
                row[f"ns_min_{k}"] = min(times[(i, k)])
                row[f"ns_median_{k}"] = statistics.median(times[(i, k)])
    for row in rows:
        print(
            f"{row['policy']:8} threads={row['threads']} {row['mode']:5} "
            f"instructions/pair {row['instructions_per_pair_new_minus_old']:+6.1f}  "
            f"ns min {row['ns_min_old']:6.1f} -> {row['ns_min_new']:6.1f}  "
            f"median {row['ns_median_old']:6.1f} -> {row['ns_median_new']:6.1f}"
        )
    write_result(
        "layer_core_ab",
        {"rounds": a.rounds, "pairs_under_callgrind": a.pairs, "size": SIZE, "cases": rows},
        reference="the same pairs under the old build, rounds alternating",
        out=a.out,
    )
    print(json.dumps({"wrote": a.out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
