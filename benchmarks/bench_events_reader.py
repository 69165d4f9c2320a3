"""Reading the events dataset: the one reader (tasks.dataset.events_reader) against the readers
each stage had before it, side by side on the same runs, in one process.

    .venv/bin/python benchmarks/bench_events_reader.py --root data --reps 3

Per run and per use, the best wall time of `--reps` alternating repetitions (the page cache is
warm after the first): whatif's table (its columns + the part number), learning's tokens (pid,
thread, seq, token, through a pyarrow dataset of the whole events folder filtered to the run),
allocators' heap features (five columns in record batches) and the dataset's `read_events` of
one run (every column, the dataset schema). The references below are the code those stages ran
(as of commit f75ad4a), written here so that the ratio is measured, not remembered. Ratio
new / reference: 1.0 is the same cost. Results go to benchmarks/results/events_reader.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.dataset as pads  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402
from tasks.core.storage import Root  # noqa: E402
from tasks.dataset import events_reader  # noqa: E402
from tasks.dataset.partitions import events_dataset_schema, read_events  # noqa: E402
from tasks.whatif.events import COLUMNS as WHATIF_COLUMNS  # noqa: E402

LEARNING_COLUMNS = ["pid", "thread", "seq", "token"]
HEAP_COLUMNS = ["pid", "thread", "op", "size", "lifetime_ns"]
HIVE = pads.partitioning(
    pa.schema([("workload", pa.string()), ("run", pa.string())]), flavor="hive"
)


# ------------------------------------------------------------------ the readers before (f75ad4a)


def whatif_before(root: Root, w: str, r: str) -> pa.Table:
    fs = root.fs
    files = sorted(
        p
        for p in fs.find(root.events_run(w, r))
        if p.endswith(".parquet") and not p.rsplit("/", 1)[-1].startswith(("_", "."))
    )
    tables = []
    for i, frag in enumerate(pads.dataset(files, filesystem=fs, format="parquet").get_fragments()):
        t = frag.to_table(columns=list(WHATIF_COLUMNS))
        tables.append(t.append_column("image", pa.array(np.full(t.num_rows, i, np.uint32))))
    return pa.concat_tables(tables)


def learning_before(root: Root, w: str, r: str) -> pa.Table:
    dataset = pads.dataset(
        root.join("events"), filesystem=root.fs, format="parquet", partitioning=HIVE
    )
    flt = (pc.field("workload") == w) & (pc.field("run") == r)
    return dataset.to_table(columns=LEARNING_COLUMNS, filter=flt)


def heap_before(root: Root, w: str, r: str) -> int:
    dataset = pads.dataset(
        root.events_run(w, r), filesystem=root.fs, format="parquet", ignore_prefixes=[".", "_"]
    )
    return sum(int(b.column("size").to_numpy().sum()) for b in dataset.to_batches(HEAP_COLUMNS))


def read_events_before(root: Root, w: str, r: str) -> pa.Table:
    dataset = pads.dataset(
        root.join("events"),
        filesystem=root.fs,
        format="parquet",
        partitioning=pads.partitioning(
            pa.schema([(c, pa.string()) for c in ("workload", "run")]), flavor="hive"
        ),
        schema=events_dataset_schema(),
        ignore_prefixes=[".", "_"],
    )
    flt = pads.field("workload").isin([w]) & pads.field("run").isin([r])
    return dataset.to_table(filter=flt)


# ---------------------------------------------------------------------------- the one reader


def whatif_now(root: Root, w: str, r: str) -> pa.Table:
    return events_reader.read_run(root, w, r, WHATIF_COLUMNS, part_column="image")


def learning_now(root: Root, w: str, r: str) -> pa.Table:
    return events_reader.read_run(root, w, r, LEARNING_COLUMNS)


def heap_now(root: Root, w: str, r: str) -> int:
    batches = events_reader.iter_batches(root, w, r, HEAP_COLUMNS)
    return sum(int(b.column("size").to_numpy().sum()) for b in batches)


def read_events_now(root: Root, w: str, r: str) -> pa.Table:
    return read_events(root, [w], [r])


USES = {
    "whatif": (whatif_before, whatif_now),
    "learning": (learning_before, learning_now),
    "heap": (heap_before, heap_now),
    "read_events": (read_events_before, read_events_now),
}


def _rows(x) -> int:
    return x.num_rows if isinstance(x, pa.Table) else int(x)


def bench(root: Root, w: str, r: str, reps: int) -> dict:
    out = {}
    for use, (before, now) in USES.items():
        best = {"before": float("inf"), "now": float("inf")}
        for _ in range(reps):
            for label, fn in (("before", before), ("now", now)):
                t0 = time.perf_counter()
                got = fn(root, w, r)
                best[label] = min(best[label], time.perf_counter() - t0)
                if label == "before":
                    want = got
            if isinstance(got, pa.Table):  # the same rows, in the same order
                assert got.select(want.column_names).equals(want), f"{use} {w}/{r} differs"
            else:
                assert got == want, f"{use} {w}/{r} differs"
        out[use] = {
            "before_s": round(best["before"], 4),
            "now_s": round(best["now"], 4),
            "ratio": round(best["now"] / best["before"], 3),
            "rows": _rows(want) if isinstance(want, pa.Table) else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="data", help="data root holding converted runs")
    ap.add_argument("--runs", nargs="*", help="WORKLOAD/RUN (default: every run)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, default=PROJECT / "benchmarks" / "results" / "events_reader.json"
    )
    args = ap.parse_args()
    root = Root.from_url(args.root)
    runs = [tuple(s.split("/", 1)) for s in args.runs] if args.runs else None
    runs = runs or [(x.workload, x.run) for x in events_reader.list_runs(root)]
    results = {}
    for w, r in runs:
        results[f"{w}/{r}"] = res = bench(root, w, r, args.reps)
        parts = len(events_reader.RunParts.of_run(root, w, r).names)
        print(
            f"{w}/{r} ({parts} parts): "
            + ", ".join(
                f"{u} {v['now_s']:.3f}/{v['before_s']:.3f}s={v['ratio']}" for u, v in res.items()
            ),
            flush=True,
        )
    geo = {
        u: round(float(np.exp(np.mean([np.log(res[u]["ratio"]) for res in results.values()]))), 3)
        for u in USES
    }
    print("geometric mean ratio now/before:", geo)
    write_result(
        "events_reader",
        {"reps": args.reps, "geomean_ratio": geo, "runs": results},
        reference="the readers each stage had before the one reader (as of commit f75ad4a), "
        "written in this script, on the same runs",
        out=args.out,
        roots=(args.root,),
    )


if __name__ == "__main__":
    main()
