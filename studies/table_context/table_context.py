"""Could a table keyed by the process's recent calls, not by call site, carry the questions'
network into the layer on programs never trained on? Coverage and agreement of such tables.

For k = 0..4, a table keyed by the freed class and the process's last k calls, built from the
network's keep decisions at the training runs' frees (table.LAYER_SOON_CLASS, as distilled_table
does per site), scored at each evaluation table's frees: coverage, agreement with the network,
and the ceiling of any table with those keys. Why: studies/table_context/README.md.

    .venv/bin/python studies/questions/questions.py --root R --network-out NET.keras
    .venv/bin/python studies/table_context/table_context.py --root R --network NET.keras         [--config configs/train.yaml] [--out studies/table_context/table_context.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.token_runs import head_rows
from tasks.learning.labels import process_order, request_and_free_classes
from tasks.learning.questions.reuse import read_events
from tasks.learning.split import load_split
from tasks.learning.table.distill import keep_soon, soon_of_reuse
from tasks.learning.train_config import load_train_config

PROJECT = Path(__file__).resolve().parents[2]

ORDERS = (0, 1, 2, 3, 4)
OTHER, BEFORE = 64, 65  # a call with no known class; no call (before the process's first)


def context_keys(table, rows: np.ndarray) -> dict[int, np.ndarray]:
    """{k: int64 per row of `rows` (table order)} for every k of ORDERS: its freed class and
    the k calls before it in its process (BEFORE where the process has fewer), as one number."""
    order, starts = process_order(table)
    req, free = request_and_free_classes(table)
    tok = np.where(req >= 0, req, np.where(free >= 0, 32 + free, OTHER))[order]
    n = len(order)
    idx = np.arange(n)
    first = np.maximum.accumulate(np.where(starts, idx, 0))  # each row's process's first row
    where = np.empty(n, np.int64)
    where[order] = idx
    at = where[rows]
    out, key = {}, np.zeros(n, np.int64)
    for k in range(max(ORDERS) + 1):  # each order's key extends the one before it
        if k:
            key = key * 67 + np.where(idx - first >= k, np.roll(tok, k), BEFORE)
        if k in ORDERS:
            out[k] = key[at] * 32 + free[rows]
    return out


def keeps(table, model) -> tuple[np.ndarray, np.ndarray]:
    """(the labelled frees' rows, the network's keep decision at each)."""
    from tasks.learning.questions.network import network_answers

    counters, said = network_answers(table, model)
    rows = counters["reuse"].rows
    return rows, keep_soon(soon_of_reuse(said["reuse"][rows]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--config", default=str(PROJECT / "configs/train.yaml"))
    ap.add_argument("--network", required=True, help="a questions' network (.keras)")
    ap.add_argument("--out", default=str(PROJECT / "studies/table_context/table_context.json"))
    a = ap.parse_args(argv)

    from tasks.learning.questions.network import load_question_network  # deferred: Keras

    cfg = load_train_config(a.config)
    root = Root.from_url(a.root)
    split = load_split(root, cfg.data)
    model = load_question_network(a.network)

    def answered(runs) -> list[tuple[str, dict[int, np.ndarray], np.ndarray]]:
        out = []
        for w, r in sorted({(x.workload, x.run) for x in runs}):
            t = head_rows(read_events(root, w, r), cfg.data.max_eval_tokens)
            rows, keep = keeps(t, model)
            out.append((w, context_keys(t, rows), keep))
        return out

    train = answered(split.train)
    tables = {
        "unseen_runs": answered(split.evaluation),
        "unseen_programs": answered(split.unseen_programs),
        "heldout_workloads": answered(split.heldout),
    }
    result = {"network": a.network, "config": a.config, "orders": list(ORDERS), "rows": []}
    for k in ORDERS:
        known, inv = np.unique(np.concatenate([x[1][k] for x in train]), return_inverse=True)
        votes = np.concatenate([x[2] for x in train])
        table_keep = np.bincount(inv, weights=votes) / np.bincount(inv) >= 0.5
        for name, runs in tables.items():
            for program in sorted({w for w, _, _ in runs}) + ["all"]:
                got = [x for x in runs if program in ("all", x[0])]
                key = np.concatenate([x[1][k] for x in got])
                keep = np.concatenate([x[2] for x in got])
                at = np.minimum(np.searchsorted(known, key), len(known) - 1)
                covered = known[at] == key
                agree = table_keep[at] == keep
                u, back = np.unique(key, return_inverse=True)
                best = np.bincount(back, weights=keep) / np.bincount(back) >= 0.5
                row = {
                    "context_calls": k,
                    "table": name,
                    "program": program,
                    "frees": int(len(key)),
                    "network_keeps": float(keep.mean()),
                    "coverage": float(covered.mean()),
                    "agreement_where_covered": float(agree[covered].mean())
                    if covered.any()
                    else None,
                    "ceiling": float((best[back] == keep).mean()),
                    "keys": int(len(u)),
                }
                result["rows"].append(row)
                if name == "unseen_programs" or program == "all":
                    print(
                        f"k={k} {name}/{program}: {row['frees']:,} frees, covered "
                        f"{row['coverage']:.1%}, agreement there "
                        f"{(row['agreement_where_covered'] or 0):.1%}, ceiling {row['ceiling']:.1%}",
                        flush=True,
                    )
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
