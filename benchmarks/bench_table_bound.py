"""How closely can any table follow the questions' network? The best agreement a table keyed by
size class, or by call site and size class, could reach on the evaluation's frees.

The layer's table answers the reuse question per size class (tasks/learning/table.py), distilled
from the network; the goal is that it keeps a freed block as the network does on >= 95% of the
evaluation's frees. The network reads the call site and the process's history, so a table whose
keys do not can only follow it on average. This script measures the ceiling: for each key
scheme, the table that agrees best with the network on the evaluation frees THEMSELVES (per key,
the network's majority decision there: an upper bound no table with those keys, distilled from
training runs, can pass), against the agreement the registered table reached
(questions/table_agreement.json of the version's run).

The network's answers are the ones the evaluation logged with the version (answers/, the reuse
answer at each free: tasks/learning/answers.py), on the evaluation's own calls.

    .venv/bin/python benchmarks/bench_table_bound.py --root data

Writes benchmarks/results/table_bound.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from tasks.core.storage import Root  # noqa: E402
from tasks.learning.labels import request_and_free_classes  # noqa: E402
from tasks.learning.reuse import call_sites, read_events  # noqa: E402
from tasks.learning.sequences import head_rows  # noqa: E402
from tasks.learning.table import keep_soon  # noqa: E402
from tasks.registry.answers import fetch_answers  # noqa: E402
from tasks.whatif.night import WhatifParams, registered_ref  # noqa: E402

TABLES = (
    ("unseen_runs", "eval_runs"),
    ("unseen_programs", "unseen_program_runs"),
    ("heldout_workloads", "heldout_runs"),
)


def best_agreement(keep: np.ndarray, key: np.ndarray) -> tuple[float, int]:
    """The share of `keep` a rule constant per key can match at best, and the number of keys."""
    _, inv = np.unique(key, return_inverse=True)
    kept = np.bincount(inv, weights=keep.astype(float))
    n = np.bincount(inv)
    return float(np.maximum(kept, n - kept).sum() / max(n.sum(), 1)), int(len(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--out", default=str(PROJECT / "benchmarks/results/table_bound.json"))
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    ref = registered_ref(WhatifParams(root=root.url))
    model = ref.model

    import mlflow  # deferred: start-up time

    logged = mlflow.artifacts.load_dict(f"runs:/{ref.run_id}/questions/table_agreement.json")
    registered = {r["table"]: r["keep_agreement"] for r in logged["rows"]}
    out = {"model": f"{ref.name} v{ref.version}", "tables": []}
    for table, field in TABLES:
        keep, cls, site = [], [], []
        for w, r in getattr(model, field):
            answers, why = fetch_answers(ref.run_id, w, r)
            t = head_rows(read_events(root, w, r), ref.max_eval_tokens)
            soon = answers.soon_for(t) if answers is not None else None
            if soon is None:
                raise SystemExit(f"{w}/{r}: no answers on the evaluation's calls ({why})")
            _, free = request_and_free_classes(t)
            at = free >= 0
            keep.append(keep_soon(soon[at]))
            cls.append(free[at])
            site.append(call_sites(t)[at] + 1)
        if not keep:
            continue
        k, c, s = (np.concatenate(x) for x in (keep, cls, site))
        by_class, n_class = best_agreement(k, c)
        by_site, n_site = best_agreement(k, s * 32 + c)
        row = {
            "table": table,
            "frees": int(len(k)),
            "registered_table": registered.get(table),
            "best_by_class": by_class,
            "class_keys": n_class,
            "best_by_site_and_class": by_site,
            "site_keys": n_site,
        }
        out["tables"].append(row)
        print(
            f"{table}: {len(k):,} frees; the registered table keeps as the network does on "
            f"{row['registered_table']:.1%}; at best by class {by_class:.1%} ({n_class} keys), "
            f"by call site and class {by_site:.1%} ({n_site} keys)"
        )
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
