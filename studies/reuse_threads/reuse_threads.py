"""Where a per-thread predictor cannot see the allocator's question: for every large free of
every traced run, is its size class requested again soon in the PROCESS (what the layer's table
and the questions' network answer), and soon by the FREEING THREAD (all that the layer's online
counter, the freeing thread's own calls, can ever learn)?

A large free is one of at least 128 KiB (the layer's `min`); soon is within 4096 calls of the
process (table.LAYER_SOON_CLASS), in process call order (labels.process_order). "Blind" frees are
soon in the process but not in the freeing thread. The figures found: studies/reuse_threads/README.md.

    .venv/bin/python studies/reuse_threads/reuse_threads.py --root data

Writes studies/reuse_threads/reuse_threads.json (per run, and per workload summed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.token_runs import list_runs
from tasks.learning.labels import REUSE_EDGES, process_order, request_and_free_classes
from tasks.learning.questions.reuse import read_events
from tasks.learning.table.distill import LAYER_SOON_CLASS

PROJECT = Path(__file__).resolve().parents[2]

LARGE = 128 * 1024
SOON = int(REUSE_EDGES[LAYER_SOON_CLASS])  # 4096 calls


def soon_after(req_key: np.ndarray, req_pos: np.ndarray, key: np.ndarray, pos: np.ndarray):
    """For each (key, pos): is there a request with the same key at a position in
    (pos, pos + SOON]? Requests and queries in one sorted order of (key, position)."""
    big = np.int64(1) << 40  # positions stay below 2^40
    # the keys renumbered densely, so that key * 2^40 + position stays within int64
    _, dense = np.unique(np.concatenate([req_key, key]), return_inverse=True)
    req_key, key = dense[: len(req_key)].astype(np.int64), dense[len(req_key) :].astype(np.int64)
    req = np.sort(req_key * big + req_pos)
    q = key * big + pos
    i = np.searchsorted(req, q, side="right")  # the first request after the free, if its key
    nxt = np.where(i < len(req), req[np.minimum(i, len(req) - 1)], -1)
    return (nxt // big == key) & (nxt - q <= SOON)


def run_figures(table) -> dict[str, int]:
    """Counts of one run's large frees: all, soon in the process, soon in the freeing thread,
    and soon in the process only (blind to the freeing thread)."""
    order, starts = process_order(table)
    req_cls, free_cls = request_and_free_classes(table)
    req_cls, free_cls = req_cls[order], free_cls[order]
    thread = table.column("thread").to_numpy().astype(np.int64)[order]
    freed = table.column("freed_size").fill_null(0).to_numpy().astype(np.int64)[order]
    pos = np.arange(len(order), dtype=np.int64)  # process call order (processes in a row)
    proc = np.cumsum(starts) - 1
    large = (free_cls >= 0) & (freed >= LARGE)
    asks = req_cls >= 0
    by_proc = proc * 64
    by_thread = (proc * 65536 + thread) * 64
    in_proc = soon_after(
        (by_proc + req_cls)[asks], pos[asks], (by_proc + free_cls)[large], pos[large]
    )
    in_thread = soon_after(
        (by_thread + req_cls)[asks], pos[asks], (by_thread + free_cls)[large], pos[large]
    )
    return {
        "large_frees": int(large.sum()),
        "soon_in_process": int(in_proc.sum()),
        "soon_in_freeing_thread": int(in_thread.sum()),
        "blind_to_the_freeing_thread": int((in_proc & ~in_thread).sum()),
        "threads": int(len(np.unique(by_thread))),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--out", default=str(PROJECT / "studies/reuse_threads/reuse_threads.json"))
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    runs, per_workload = {}, {}
    for workload, run in ((w, r) for w, rs in sorted(list_runs(root).items()) for r in rs):
        f = run_figures(read_events(root, workload, run))
        runs[f"{workload}/{run}"] = f
        w = per_workload.setdefault(workload, dict.fromkeys(f, 0))
        for k, v in f.items():
            w[k] += v
    print("| workload | large frees | soon in the process | soon in the freeing thread | blind |")
    print("|---|---|---|---|---|")
    for w, f in sorted(per_workload.items()):
        n = max(f["large_frees"], 1)
        print(
            f"| {w} | {f['large_frees']} | {f['soon_in_process'] / n:.1%} | "
            f"{f['soon_in_freeing_thread'] / n:.1%} | {f['blind_to_the_freeing_thread'] / n:.1%} |"
        )
    out = {"root": a.root, "soon_calls": SOON, "large_bytes": LARGE}
    out |= {"workloads": per_workload, "runs": runs}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
