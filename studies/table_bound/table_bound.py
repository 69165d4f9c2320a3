"""How closely can any table follow the questions' network? The best agreement a table keyed by
size class, or by call site and size class, could reach on the evaluation's frees.

For each key scheme, the table that agrees best with the network on the evaluation frees
themselves (per key, the network's majority decision there: an upper bound no table with those
keys can pass), against the agreement the registered table reached
(questions/table_agreement.json of the version's run). The network's keep decision is the
layer's question, P(reuse within 4096 calls) >= 1/2 (table.LAYER_SOON_CLASS); the result names
the horizon of each figure. Why, and the figures: studies/table_bound/README.md.

    .venv/bin/python studies/table_bound/table_bound.py --root data

Writes studies/table_bound/table_bound.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.token_runs import head_rows
from tasks.learning.labels import request_and_free_classes
from tasks.learning.questions.reuse import call_sites, read_events
from tasks.learning.table.distill import keep_soon, soon_of_reuse
from tasks.learning.table.layer_file import HEADER
from tasks.whatif.night import WhatifParams, registered_ref

PROJECT = Path(__file__).resolve().parents[2]


def best_agreement(keep: np.ndarray, key: np.ndarray) -> tuple[float, int]:
    """The share of `keep` a rule constant per key can match at best, and the number of keys."""
    _, inv = np.unique(key, return_inverse=True)
    kept = np.bincount(inv, weights=keep.astype(float))
    n = np.bincount(inv)
    return float(np.maximum(kept, n - kept).sum() / max(n.sum(), 1)), int(len(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--out", default=str(PROJECT / "studies/table_bound/table_bound.json"))
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    ref = registered_ref(WhatifParams(root=root.url), root)
    model = ref.model

    import mlflow  # deferred: start-up time

    logged = mlflow.artifacts.load_dict(f"runs:/{ref.run_id}/questions/table_agreement.json")
    registered = {r["table"]: r["keep_agreement"] for r in logged["rows"]}
    # the registered table's format says at which horizon its agreement was logged (1: 16 calls)
    head = Path(mlflow.artifacts.download_artifacts(f"runs:/{ref.run_id}/table/heapcast.hcltab"))
    table_format = HEADER.unpack_from(head.read_bytes())[1]
    from tasks.learning.questions.network import network_answers
    from tasks.registry.question_artifacts import fetch_question_network

    with tempfile.TemporaryDirectory() as tmp:
        network = fetch_question_network(ref.run_id, Path(tmp))
    out = {
        "model": f"{ref.name} v{ref.version}",
        "registered_table_format": table_format,
        "registered_agreement_within_calls": 4096 if table_format >= 2 else 16,
        "bound_within_calls": 4096,
        "tables": [],
    }
    for table, runs in model.runs_by_table.items():
        keep, cls, site = [], [], []
        for w, r in runs:
            t = head_rows(read_events(root, w, r), ref.max_eval_tokens)
            reuse = network_answers(t, network)[1]["reuse"]
            _, free = request_and_free_classes(t)
            at = free >= 0
            keep.append(keep_soon(soon_of_reuse(reuse[at])))
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
            # the base rate: agreement near it says little (a table that always keeps gets it)
            "network_keeps": float(k.mean()),
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
