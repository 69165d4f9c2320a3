"""The cache layer's table by call site (format 3) against by allocation context (format 4), on a
program whose large blocks all pass one allocation wrapper and one free wrapper
(tests/native/programs/ctxwrap.c): scratch blocks its caller asks for again at once, and records
freed before a long stretch of small calls. Both tables are counted from one traced run of the
program (tasks/learning/table/distill.py class_table: the frees' true reuse classes, the frees
joined to their allocations' contexts at depth 4), then the program runs under the guided layer
with each table, alternating, `--repeat` times each, and once with the online counter alone.

    .venv/bin/python studies/layer_context_table/layer_context_table.py [--repeat 7]

Writes studies/layer_context_table/layer_context_table.json (--out): per arm, the layer's stats
(hits, kept, misses, table_sites, table_contexts, bytes_kept_peak) and the wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from tasks.dataset.contexts import event_contexts  # noqa: E402
from tasks.dataset.convert import convert_groups  # noqa: E402
from tasks.dataset.events_reader import StackFrames  # noqa: E402
from tasks.dataset.stacks_table import ProcessStacks, run_stacks  # noqa: E402
from tasks.format.trace_reader import read_trace  # noqa: E402
from tasks.learning.labels import REUSE_CLASSES  # noqa: E402
from tasks.learning.table.distill import CONTEXT_DEPTH, ClassTable, class_table  # noqa: E402
from tasks.learning.table.layer_file import write_layer_table  # noqa: E402

NATIVE = PROJECT / "native"
PROGRAM = PROJECT / "tests" / "native" / "programs" / "ctxwrap.c"
# 400 rounds: 2 scratch blocks (freed at once, asked again), 3 records (freed, then 3000 small
# pairs: 6000 calls before the next large request), 300 kB each (size class 19)
ARGS = ["400", "2", "3", "300000", "3000"]
STATS = ("hits", "misses", "kept", "table_sites", "table_contexts", "bytes_kept_peak", "heap")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env.pop("LD_PRELOAD", None)
    env.update(extra)
    return env


def tables(exe: Path, work: Path) -> dict[str, Path]:
    """The format 3 and format 4 files, counted from one traced run of the program."""
    out = work / "trace"
    out.mkdir()
    env = _env(
        {
            "LD_PRELOAD": str(NATIVE / "build" / "libheapcast.so"),
            "HEAPCAST_OUT": str(out),
            "HEAPCAST_CALLER": "1",
            "HEAPCAST_FRAMES": "32",
        }
    )
    subprocess.run([exe, *ARGS], env=env, check=True, capture_output=True)
    (path,) = sorted(out.glob("*.hct"))
    trace = read_trace(path)
    ps = ProcessStacks.of_trace(trace)
    events = pa.concat_tables(list(convert_groups(trace, ps)[0]))
    frames = StackFrames.of_table(run_stacks([ps.table()]).table)
    ctx = event_contexts(frames, events.column("stack"), (CONTEXT_DEPTH,))[CONTEXT_DEPTH]
    majority = np.full(REUSE_CLASSES, 1.0 / REUSE_CLASSES)
    both = class_table([events], majority, [ctx])
    sites = ClassTable(both.reuse_counts, both.majority, both.site_counts)
    return {
        "site (format 3)": write_layer_table(work / "site.hcltab", sites, 1),
        "context (format 4)": write_layer_table(work / "context.hcltab", both, 1),
    }


def run(exe: Path, setting: str, stats: Path) -> tuple[float, dict[str, int], str]:
    stats.unlink(missing_ok=True)
    env = _env(
        {
            "LD_PRELOAD": str(NATIVE / "build" / "libheapcast_layer.so"),
            "HEAPCAST_LAYER": f"{setting},stats={stats}",
        }
    )
    t = time.perf_counter()
    r = subprocess.run([exe, *ARGS], env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    (line,) = stats.read_text().splitlines()
    row = {k: int(v) for k, v in (f.split("=", 1) for f in line.split())}
    return wall, {k: row[k] for k in STATS}, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--out", default=str(PROJECT / "studies/layer_context_table/layer_context_table.json")
    )
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(NATIVE), "all", "layer"], check=True)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        exe = work / "ctxwrap"
        subprocess.run(
            ["gcc", "-O1", "-g", "-fno-builtin", "-Wall", "-o", str(exe), str(PROGRAM)], check=True
        )
        plain = subprocess.run([exe, *ARGS], check=True, capture_output=True, text=True).stdout
        files = tables(exe, work)
        arms = {name: f"policy=guided,predictor=table:{p},model=1" for name, p in files.items()}
        arms["online counter"] = "policy=guided"
        walls: dict[str, list[float]] = {k: [] for k in arms}
        counters: dict[str, dict[str, int]] = {}
        for _ in range(a.repeat):  # alternating: the arms side by side in every round
            for name, setting in arms.items():
                wall, row, out = run(exe, setting, work / "stats")
                assert out == plain, f"{name}: output differs"
                assert counters.setdefault(name, row) == row, f"{name}: counters differ"
                walls[name].append(wall)
    result = {
        "program": f"ctxwrap {' '.join(ARGS)}",
        "repeat": a.repeat,
        "arms": {
            k: {**counters[k], "wall_s_median": round(statistics.median(w), 4),
                "wall_s": [round(x, 4) for x in w]}
            for k, w in walls.items()
        },
    }  # fmt: skip
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result["arms"].items():
        print(k, {x: v[x] for x in (*STATS, "wall_s_median")})


if __name__ == "__main__":
    main()
