"""What call stacks cost the catalog's replays: each run replayed in its container with the
caller only (frames 0, as the night traced before stacks) and with stacks (frames N), in turn,
and what bringing the image's modules home (sysroot/) adds.

    .venv/bin/python studies/replay_stacks/replay_stacks.py --frames 32 --reps 3 \
        --out studies/replay_stacks/replay_stacks.json

Needs the engine (scripts/engine.sh up) and the workloads' images. Per run and mode: the
program's time in its container (the manifest's duration_s), the replay's whole time (input,
run, counting, sysroot copy, publishing: what the night's trace stage spends on the run), the
trace bytes, and the sysroot's modules, bytes and seconds. "before stacks" is the caller-only
replay less its sysroot copy: the trace stage as it was. Medians over the reps; the modes
alternate (caller, stacks, caller, ...) so a drift of the machine's speed hits both alike. The
image cache (runners/sysroot.py) starts empty: `sysroot_cold_s` is a run's first copy (from the
engine, unless an earlier run of the same image filled the cache), the medians are from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from tasks.core.storage import Root
from tasks.replay.replays import replay_input
from tasks.replay.workloads import load_catalog

PROJECT = Path(__file__).resolve().parents[2]
# quick inputs of images built for the quick night, a program of each shape: a library
# (sqlite3), two interpreters, many processes (make), a numeric stack with many modules
DEFAULT_RUNS = (
    "sqlite3/small",
    "sqlite3/medium",
    "cpython/small",
    "perl/small",
    "make_build/small",
    "numpy_stack/small",
    "git/small",
)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", default=list(DEFAULT_RUNS), help="WORKLOAD/INPUT ...")
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/heapcast-study-replay-stacks"))
    ap.add_argument("--tracer", default=str(PROJECT / "native" / "build" / "libheapcast.so"))
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def replay_once(w, inp, frames: int, root: Path, tracer: str) -> dict:
    """One replay in its container; its figures."""
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.monotonic()
    m = replay_input(
        w, inp, tracer, root=Root.from_url(str(root)), runner="docker", caller=True, frames=frames
    )
    wall = time.monotonic() - t0
    run_dir = root / "raw" / w.name / inp.name
    return {
        "run_s": m.duration_s,
        "replay_s": wall,
        "events": m.events,
        "trace_mb": sum((run_dir / f).stat().st_size for f in m.files) / 1e6,
        "sysroot_modules": len(m.sysroot),
        "sysroot_mb": m.sysroot_bytes / 1e6,
        "sysroot_s": m.sysroot_s,
    }


def medians(samples: list[dict]) -> dict:
    return {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}


def main() -> int:
    args = parse_args()
    cache = args.root.with_name(args.root.name + "-cache")
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["HEAPCAST_SYSROOT_CACHE"] = str(cache)  # empty: the first copies are the engine's
    catalog = load_catalog()
    rows = []
    for spec in args.runs:  # a loop over a handful of runs
        name, inp_name = spec.split("/")
        w = catalog.get(name)
        inp = w.input(inp_name)
        got: dict[str, list[dict]] = {"caller": [], "stacks": []}
        for _ in range(args.reps):
            for mode, frames in (("caller", 0), ("stacks", args.frames)):
                got[mode].append(replay_once(w, inp, frames, args.root, args.tracer))
        c, s = medians(got["caller"]), medians(got["stacks"])
        before = c["replay_s"] - c["sysroot_s"]
        row = {
            "run": spec,
            "sysroot_cold_s": got["caller"][0]["sysroot_s"],
            "caller": c,
            "stacks": s,
            "before_stacks_replay_s": round(before, 3),
            "run_ratio": round(s["run_s"] / c["run_s"], 3),
            "replay_ratio_vs_before": round(s["replay_s"] / before, 3),
        }
        rows.append(row)
        print(
            f"{spec:<20} events {s['events']:>10,}  run {c['run_s']:6.2f} -> {s['run_s']:6.2f} s "
            f"(x{row['run_ratio']:.2f})  replay {before:6.2f} -> {s['replay_s']:6.2f} s "
            f"(x{row['replay_ratio_vs_before']:.2f})  trace {c['trace_mb']:7.1f} -> "
            f"{s['trace_mb']:7.1f} MB  sysroot {s['sysroot_modules']:>3} modules "
            f"{s['sysroot_mb']:6.1f} MB {s['sysroot_s']:5.2f} s (first {row['sysroot_cold_s']:.2f} s)",
            flush=True,
        )
    total = {"before_stacks_replay_s": round(sum(r["before_stacks_replay_s"] for r in rows), 2)}
    total["caller_run_s"] = round(sum(r["caller"]["run_s"] for r in rows), 2)
    total["stacks_run_s"] = round(sum(r["stacks"]["run_s"] for r in rows), 2)
    total["stacks_replay_s"] = round(sum(r["stacks"]["replay_s"] for r in rows), 2)
    total["stacks_replay_ratio_vs_before"] = round(
        total["stacks_replay_s"] / total["before_stacks_replay_s"], 3
    )
    total["sysroot_mb"] = round(sum(r["stacks"]["sysroot_mb"] for r in rows), 1)
    total["sysroot_s"] = round(sum(r["stacks"]["sysroot_s"] for r in rows), 2)
    total["sysroot_cold_s"] = round(sum(r["sysroot_cold_s"] for r in rows), 2)
    print(
        f"{'all':<20} run {total['caller_run_s']:.2f} -> {total['stacks_run_s']:.2f} s; replays "
        f"{total['before_stacks_replay_s']:.2f} -> {total['stacks_replay_s']:.2f} s "
        f"(x{total['stacks_replay_ratio_vs_before']:.2f}); sysroot {total['sysroot_mb']} MB in "
        f"{total['sysroot_s']} s (first copies {total['sysroot_cold_s']} s)"
    )
    if args.out:
        out = {
            "command": "python studies/replay_stacks/replay_stacks.py "
            + " ".join([*args.runs, "--frames", str(args.frames), "--reps", str(args.reps)]),
            "frames": args.frames,
            "reps": args.reps,
            "runs": rows,
            "total": total,
        }
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
