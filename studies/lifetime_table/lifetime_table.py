"""Would a lifetime table be worth carrying in the layer's file? What a table keyed by size class,
or by call site and size class, distilled from the questions' network, says of a block's lifetime
at the evaluation's allocations, against the network itself and the counters.

Per key: distilled (the mean of the registered network's lifetime answers over the training
runs' allocations, scored at the evaluation's: top-1, log-loss, agreement with the network) and
the ceiling (the network's most frequent top-1 on the evaluation's allocations themselves). The
network is the version's logged questions/network.keras. In full: studies/lifetime_table/README.md.

    .venv/bin/python studies/lifetime_table/lifetime_table.py --root data

Writes studies/lifetime_table/lifetime_table.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.token_runs import head_rows
from tasks.learning.labels import LIFETIME_CLASSES, request_and_free_classes
from tasks.learning.questions.lifetime import QUESTIONS
from tasks.learning.questions.reuse import MIN_PROB, call_sites, read_events
from tasks.whatif.night import WhatifParams, parse_runs, registered_ref

PROJECT = Path(__file__).resolve().parents[2]

KEYS = ("class", "site_and_class")
COUNTERS = ("class_online", "site_online", "site_survival")


def answered(root: Root, network, w: str, r: str, cap: int | None) -> dict:
    """One run's allocations: their keys, true classes, the network's and the counters' answers."""
    from tasks.learning.questions.network import network_answers  # deferred: Keras' start-up

    t = head_rows(read_events(root, w, r), cap)
    answers, said = network_answers(t, network)
    req, _ = request_and_free_classes(t)
    site = call_sites(t) + 1
    out = {}
    for q in QUESTIONS:
        a = answers[q]
        cls = req[a.rows]
        out[q] = {
            "class": cls,
            "site_and_class": site[a.rows] * 32 + cls,
            "labels": a.labels.astype(np.int64),
            "network": said[q][a.rows],
            **{c: a.probs[c] for c in COUNTERS},
        }
    return out


def scores(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(top-1, log-loss) of answers p at true classes y."""
    n = len(y)
    return float((p.argmax(1) == y).mean()), float(
        -np.log(np.clip(p[np.arange(n), y], MIN_PROB, 1.0)).mean()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--out", default=str(PROJECT / "studies/lifetime_table/lifetime_table.json"))
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    ref = registered_ref(WhatifParams(root=root.url), root)
    model = ref.model

    import mlflow  # deferred: start-up time

    from tasks.registry.question_artifacts import fetch_question_network  # deferred: Keras

    with tempfile.TemporaryDirectory() as tmp:
        network = fetch_question_network(ref.run_id, Path(tmp))
    logged = mlflow.MlflowClient().get_run(ref.run_id).data.params
    train = parse_runs(logged.get("dataset.train_runs", ""))
    cap = ref.max_eval_tokens
    trained = [answered(root, network, w, r, cap) for w, r in train]
    evaluated = {
        table: [answered(root, network, w, r, cap) for w, r in runs]
        for table, runs in model.runs_by_table.items()
    }
    out: dict = {"model": f"{ref.name} v{ref.version}", "train_runs": len(train), "rows": []}
    for q in QUESTIONS:
        for keys in KEYS:
            key = np.concatenate([x[q][keys] for x in trained])
            net = np.concatenate([x[q]["network"] for x in trained])
            uniq, inv = np.unique(key, return_inverse=True)
            sums = np.zeros((len(uniq), LIFETIME_CLASSES))
            np.add.at(sums, inv, net)
            mean = sums / np.bincount(inv, minlength=len(uniq))[:, None]
            overall = net.mean(axis=0)
            for table, runs in evaluated.items():
                if not runs:
                    continue
                k = np.concatenate([x[q][keys] for x in runs])
                y = np.concatenate([x[q]["labels"] for x in runs])
                p_net = np.concatenate([x[q]["network"] for x in runs])
                at = np.searchsorted(uniq, k).clip(0, max(len(uniq) - 1, 0))
                covered = uniq[at] == k if len(uniq) else np.zeros(len(k), bool)
                p_tab = np.where(covered[:, None], mean[at], overall[None, :])
                top_net = p_net.argmax(1)
                _, kinv = np.unique(k, return_inverse=True)
                best = np.zeros((kinv.max(initial=-1) + 1, LIFETIME_CLASSES))
                np.add.at(best, (kinv, top_net), 1.0)
                row = {
                    "question": q,
                    "keys": keys,
                    "table": table,
                    "allocations": int(len(y)),
                    "coverage": float(covered.mean()),
                    "agreement": float((p_tab.argmax(1) == top_net)[covered].mean()),
                    "ceiling": float(best.max(axis=1).sum() / max(len(y), 1)),
                    "table_scores": scores(p_tab, y),
                    "network_scores": scores(p_net, y),
                    **{
                        f"{c}_scores": scores(np.concatenate([x[q][c] for x in runs]), y)
                        for c in COUNTERS
                    },
                }
                out["rows"].append(row)
                print(
                    f"{q} {table} by {keys}: {len(y):,} allocations, coverage "
                    f"{row['coverage']:.1%}, agreement with the network where covered "
                    f"{row['agreement']:.1%} "
                    f"(ceiling {row['ceiling']:.1%}); top-1 (log-loss) table "
                    "{:.3f} ({:.3f}), network {:.3f} ({:.3f}), ".format(
                        *row["table_scores"], *row["network_scores"]
                    )
                    + ", ".join(
                        "{} {:.3f} ({:.3f})".format(c, *row[f"{c}_scores"]) for c in COUNTERS
                    )
                )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
