"""A data root cut to what the next-call network reads, small enough to carry to a lent GPU.

    .venv/bin/python -m tasks.learning.nextcall.slim_root --root S --out .gpu/scaling-root \
        --max-tokens-per-run 400000

Writes OUT/events/workload=W/run=R/ with one part per run holding only the columns the
next-call study reads (pid, thread, seq, token: tasks/learning/sequences.COLUMNS), the run's
first --max-tokens-per-run tokens in thread order (`head_rows`, the rows the evaluation's own
cap keeps), and the run's summary with the manifest naming that part. The allocator's
questions read addresses and sizes: they are not in it (bench_scaling.py --no-questions).
A point of the scaling study (studies/scaling/scaling.py) trained on the slim root
sees the same tokens as on S wherever its caps are at or under the cut (the held-out programs'
--eval-tokens above all).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq

from tasks.core.storage import Root
from tasks.dataset.events_reader import EVENTS_DIR, PARTS_KEY, SUMMARY_NAME, list_runs
from tasks.dataset.events_reader import read_run as read_events_run
from tasks.dataset.token_runs import COLUMNS, head_rows


def slim(src: Root, out: Path, max_tokens: int | None) -> dict[str, int]:
    """Write the slim root of `src`; {"runs", "rows", "bytes"} of what it holds."""
    runs = list_runs(src)
    if not runs:
        raise SystemExit(
            f"slim_root: {src.url}: no events dataset (<root>/events/workload=*/run=*/)"
        )
    totals = {"runs": 0, "rows": 0, "bytes": 0}
    for r in runs:
        table = head_rows(read_events_run(src, r.workload, r.run, COLUMNS), max_tokens)
        folder = out / EVENTS_DIR / f"workload={r.workload}" / f"run={r.run}"
        folder.mkdir(parents=True, exist_ok=True)
        part = "part-0.parquet"
        # seq climbs within a process: delta-packed it costs a few bits a row
        pq.write_table(
            table,
            folder / part,
            compression="zstd",
            compression_level=9,
            use_dictionary=["pid", "thread", "token"],
            column_encoding={"seq": "DELTA_BINARY_PACKED"},
        )
        summary = dict(r.summary or {}, rows=table.num_rows, files=[], slim_of=src.url)
        summary[PARTS_KEY] = [part]
        (folder / SUMMARY_NAME).write_text(json.dumps(summary))
        totals["runs"] += 1
        totals["rows"] += table.num_rows
        totals["bytes"] += (folder / part).stat().st_size
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="the data root with an events dataset")
    ap.add_argument("--out", required=True, help="the slim root to write (a new folder)")
    ap.add_argument(
        "--max-tokens-per-run",
        type=int,
        default=400_000,
        help="each run's first N tokens (0: all; default %(default)s)",
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out}: not empty; name a new folder (nothing in it is overwritten)")
    totals = slim(Root.from_url(a.root), out, a.max_tokens_per_run or None)
    print(
        f"slim_root: {totals['runs']} runs, {totals['rows']:,} rows, "
        f"{totals['bytes'] / 2**20:.1f} MiB in {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
