"""The questions' hedge before and after its fallback experts (issue 43: no confidently wrong
answers), on a night's evaluation rows (unseen programs, held-out workloads, unseen runs), with
the champion's question network from the night's MLflow store: log-loss per program and
question for the majority, the network, process_prior, the hedge as it was (network, site and
class counters, network_survival), with process_prior added (share 0.05 and 0.02), with the
majority too, and as the product runs it (tasks.learning.questions.hedge.EXPERTS, SHARE).

    .venv/bin/python studies/hedge/hedge.py --root data --config configs/train-quick.yaml

Writes studies/hedge/hedge_quick.md (about 2 minutes on the quick night's data).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import numpy as np
from mlflow import MlflowClient

from tasks.core.storage import Root
from tasks.dataset.token_runs import head_rows
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    REUSE_EDGES,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.hedge import EXPERTS, SHARE, hedge_keys, hedged, process_prior
from tasks.learning.questions.lifetime import NETWORK_SURVIVAL, lifetime_majority, network_survival
from tasks.learning.questions.network import network_answers
from tasks.learning.questions.reuse import MIN_PROB, QUESTION, call_sites, majority_of, read_events
from tasks.learning.split import load_split
from tasks.learning.train_config import load_train_config
from tasks.registry.question_artifacts import fetch_question_network

PROJECT = Path(__file__).resolve().parents[2]

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--root", default="data", help="the night's data root (events, mlflow)")
ap.add_argument("--config", default="configs/train-quick.yaml", help="the night's train config")
ap.add_argument("--tracking-uri", default="", help="MLflow store (default: ROOT/mlflow/mlflow.db)")
ap.add_argument("--out", default="studies/hedge/hedge_quick.md")
args = ap.parse_args()

t0 = time.time()
cfg = load_train_config(args.config)
root = Root.from_url(args.root)
split = load_split(root, cfg.data)
uri = args.tracking_uri or f"sqlite:///{Path(args.root).resolve()}/mlflow/mlflow.db"
mlflow.set_tracking_uri(uri)
mlflow.set_registry_uri(uri)
v = MlflowClient(uri, uri).get_model_version_by_alias("heapcast-next-call", "champion")
print("champion", v.version, v.run_id, flush=True)
model = fetch_question_network(v.run_id, Path(tempfile.mkdtemp()))
mr = cfg.data.max_eval_tokens


def ev(w, r):
    return head_rows(read_events(root, w, r), mr)


train = [ev(w, r) for w, r in sorted({(x.workload, x.run) for x in split.train})]
maj = majority_of(train)
lmaj = lifetime_majority(train)
del train
OLD = ("network", "site_online", "class_online", "network_survival")


def ll(p, y):
    return float(-np.log(np.clip(p[np.arange(len(y)), y], MIN_PROB, 1)).mean())


res = {}
for table, runs in (
    ("unseen_programs", split.unseen_programs),
    ("heldout", split.heldout),
    ("unseen_runs", split.evaluation),
):
    for w, r in sorted({(x.workload, x.run) for x in runs}):
        t = ev(w, r)
        answers, said = network_answers(t, model)
        order, starts = process_order(t)
        req, fre = request_and_free_classes(t)
        sites = call_sites(t)
        for q, a in answers.items():
            qm, edges = (
                (maj, len(REUSE_EDGES)) if q == QUESTION else (lmaj[q], len(LIFETIME_CALL_EDGES))
            )
            P = dict(a.probs)
            P["majority"] = np.broadcast_to(qm, (len(a.rows), len(qm)))
            P["network"] = said[q][a.rows]
            if q != QUESTION:
                P[NETWORK_SURVIVAL] = network_survival(order, starts, req, sites, a, P["network"])
            P["process_prior"] = process_prior(order, starts, a.learnt, a.rows, qm, a.labels, edges)
            keys = hedge_keys(sites, fre if q == QUESTION else req)[a.rows]

            def h(ex, sh, order=order, starts=starts, a=a, P=P, keys=keys):
                return hedged(
                    order,
                    starts,
                    a.learnt,
                    a.rows,
                    a.labels,
                    [P[e] for e in ex if e in P],
                    share=sh,
                    keys=keys,
                )

            P["hedge_before"] = h(OLD, 0.05)
            P["hedge_after_s05"] = h(OLD + ("process_prior",), 0.05)
            P["hedge_after_s02"] = h(OLD + ("process_prior",), 0.02)
            P["hedge_maj_s05"] = h(OLD + ("process_prior", "majority"), 0.05)
            P["hedge_maj_s02"] = h(OLD + ("process_prior", "majority"), 0.02)
            P["hedge_product"] = h(EXPERTS, SHARE)
            d = res.setdefault((table, w, q), {"y": [], **{k: [] for k in P}})
            d["y"].append(a.labels.astype(np.int64))
            for k in P:
                d[k].append(P[k])
    print(table, "done", round(time.time() - t0), "s", flush=True)
names = [
    "majority",
    "network",
    "process_prior",
    "hedge_before",
    "hedge_after_s05",
    "hedge_after_s02",
    "hedge_maj_s05",
    "hedge_maj_s02",
    "hedge_product",
    "class_online",
    "site_online",
]
lines = []
lines.append("| table | program | question | n | " + " | ".join(names) + " |")
for (table, w, q), d in sorted(res.items()):
    y = np.concatenate(d["y"])
    if not len(y):
        continue
    lines.append(
        f"| {table} | {w} | {q} | {len(y)} | "
        + " | ".join(f"{ll(np.concatenate(d[k]), y):.3f}" for k in names)
        + " |"
    )
print("\n".join(lines))
Path(args.out).write_text(
    "# The hedge before and after its fallback experts (issue 43), log-loss per program and question\n\n"
    f"    {' '.join(['.venv/bin/python', *sys.argv])}\n\n"
    f"champion v{v.version}; hedge_before: network, site_online, class_online, network_survival; "
    "hedge_product: tasks.learning.questions.hedge.EXPERTS (with process_prior and the majority), SHARE\n\n"
    + "\n".join(lines)
    + "\n"
)
