"""The layer's table with call-site keys (format 3), distilled from a registered version's
questions' network: how much of each evaluation table it answers by call site, and how often it
keeps a freed block where the network does, against the table keyed by size class alone.

The issue's goal: the table agrees with the network on >= 95% of the evaluation positions it
covers, and covers >= 90% of them. A (site, class) key answers only where a training free had
it; the rest of the frees answer by their class (TABLE.md). This script distills both tables the
way training does (question_network.distilled_table over the version's training runs, the
network's answers there), from the version's logged network, and scores them on the three
evaluation tables' frees at the layer's horizon (reuse within 4096 calls: table.LAYER_SOON_CLASS).
It also writes the format 3 file for the version (`--table-out`), for real runs under the layer
(`heapcast layer --predictor table:FILE`, or the allocators stage).

    .venv/bin/python benchmarks/bench_table_sites.py --root data [--model champion]

Writes benchmarks/results/table_sites.json (--out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from tasks.core.storage import Root  # noqa: E402
from tasks.learning.labels import NO_LABEL, allocator_labels, request_and_free_classes  # noqa: E402
from tasks.learning.reuse import majority_of, read_events  # noqa: E402
from tasks.learning.sequences import head_rows  # noqa: E402
from tasks.learning.sites import call_sites  # noqa: E402
from tasks.learning.table import (  # noqa: E402
    LAYER_SOON_CLASS,
    ClassTable,
    keep_soon,
    write_layer_table,
)
from tasks.whatif.night import WhatifParams, parse_runs, registered_ref  # noqa: E402

TABLES = (
    ("unseen_runs", "eval_runs"),
    ("unseen_programs", "unseen_program_runs"),
    ("heldout_workloads", "heldout_runs"),
)


def _keep(probs: np.ndarray) -> np.ndarray:
    return keep_soon(probs[:, : LAYER_SOON_CLASS + 1].sum(axis=1))


def _right(keep: np.ndarray, soon: np.ndarray, where: np.ndarray) -> float | None:
    """The share of the frees at `where` (labelled ones) whose keep decision the truth bears out
    (soon: 1 reused within 4096 calls, 0 not)."""
    return float((keep[where] == (soon[where] == 1)).mean()) if where.any() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--model", default=None, help="version or alias (default: the champion)")
    ap.add_argument("--out", default=str(PROJECT / "benchmarks/results/table_sites.json"))
    ap.add_argument("--table-out", default=None, help="write the format 3 file here")
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    params = WhatifParams(root=root.url, **({"model": a.model} if a.model else {}))
    ref = registered_ref(params)
    model = ref.model

    import mlflow  # deferred: start-up time

    from tasks.learning.question_network import (
        answered_inputs,
        distilled_table,
        load_question_network,
    )

    network = load_question_network(
        mlflow.artifacts.download_artifacts(f"runs:/{ref.run_id}/questions/network.keras")
    )

    # the training runs as registration logged them (dataset.train_runs, cut at 6000 characters)
    logged = mlflow.get_run(ref.run_id).data.params.get("dataset.train_runs", "")
    train_runs = sorted(set(parse_runs(logged)))
    if not train_runs or len(logged) >= 6000:
        raise SystemExit(
            f"run {ref.run_id}: its training runs are not all logged ({len(logged)} chars)"
        )

    def events(w: str, r: str):
        return head_rows(read_events(root, w, r), ref.max_eval_tokens)

    t0 = time.perf_counter()
    train = [events(w, r) for w, r in train_runs]
    inputs, said = [], []
    for t in train:
        _, inp, ans = answered_inputs(t, network)
        inputs.append(inp)
        said.append(ans)
    sited = distilled_table(inputs, said, majority_of(train))
    by_class = ClassTable(sited.reuse_counts, sited.majority)  # the same, without sites
    distill_s = time.perf_counter() - t0
    del inputs, said, train
    if a.table_out:
        write_layer_table(Path(a.table_out), sited, int(ref.version))
    out = {
        "model": f"{ref.name} v{ref.version}",
        "training_runs": len(train_runs),
        "site_keys_known": int(sited.site_known().sum()),
        "distill_seconds": round(distill_s, 1),
        "within_calls": 4096,
        "tables": [],
    }
    from tasks.learning.question_network import network_answers

    for table, field in TABLES:
        net_keep, t_keep, c_keep, at_site, covered, soon, o_keep = [], [], [], [], [], [], []
        for w, r in sorted(set(getattr(model, field))):
            t = events(w, r)
            counters, said = network_answers(t, network)
            reuse = said["reuse"]
            # the per-process class counter (the online counter of the reuse question), at the
            # labelled frees it answers
            ra = counters["reuse"]
            online = np.zeros(t.num_rows, bool)
            online[ra.rows] = _keep(ra.probs["class_online"])
            _, free = request_and_free_classes(t)
            at = free >= 0
            cls, site = free[at], call_sites(t)[at]
            net_keep.append(_keep(reuse[at]))
            probs, s = sited.answer(site, cls)
            t_keep.append(_keep(probs))
            at_site.append(s)
            c_keep.append(_keep(by_class.answer(site, cls)[0]))
            o_keep.append(online[at])
            covered.append(sited.covered()[cls])
            label = allocator_labels(t).reuse[at]  # the truth, where the free has a label
            soon.append(np.where(label == NO_LABEL, -1, label <= LAYER_SOON_CLASS))
        if not net_keep:
            continue
        k, tk, ck, s, cov, y, ok = (
            np.concatenate(x) for x in (net_keep, t_keep, c_keep, at_site, covered, soon, o_keep)
        )
        lab = y >= 0
        hybrid = np.where(s, tk, ok)  # the table where it knows the site, the counter elsewhere

        row = {
            "table": table,
            "frees": int(len(k)),
            "network_keeps": float(k.mean()),
            "coverage": float(cov.mean()),
            "site_coverage": float(s.mean()),
            "agreement_by_site_then_class": float((tk == k)[cov].mean()),
            "agreement_at_sites": float((tk == k)[s].mean()) if s.any() else None,
            "agreement_by_class_alone": float((ck == k)[cov].mean()),
            # the frees answered by class (a site training never saw): the network's keeps there
            "network_keeps_at_unknown_sites": float(k[~s].mean()) if (~s).any() else None,
            "truly_soon_at_sites": float((y[s & lab] == 1).mean()) if (s & lab).any() else None,
            "truly_soon_at_unknown_sites": float((y[~s & lab] == 1).mean())
            if (~s & lab).any()
            else None,
            # the keep decision against the truth (reused within 4096 calls), labelled frees
            "right_network": _right(k, y, lab),
            "right_table": _right(tk, y, lab),
            "right_class_alone": _right(ck, y, lab),
            "right_network_at_unknown_sites": _right(k, y, lab & ~s),
            "right_table_at_unknown_sites": _right(tk, y, lab & ~s),
            "right_class_online": _right(ok, y, lab),
            "right_sites_then_class_online": _right(hybrid, y, lab),
            "agreement_sites_then_class_online": float((hybrid == k)[lab].mean()),
        }
        out["tables"].append(row)
        print(
            f"{table}: {len(k):,} frees, the network keeps {row['network_keeps']:.1%}; the table "
            f"answers {row['site_coverage']:.1%} by call site; keeps as the network does on "
            f"{row['agreement_by_site_then_class']:.1%} (by class alone "
            f"{row['agreement_by_class_alone']:.1%}; at sites {row['agreement_at_sites']})"
        )
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
