"""The layer's table with call-site keys (format 3), distilled from a registered version's
questions' network: how much of each evaluation table it answers by call site, how often it
keeps a freed block where the network does, and how often each keep decision is right.

It distills the table the way training does (question_network.distilled_table) and scores it on
the three evaluation tables' frees at the layer's horizon (table.LAYER_SOON_CLASS), against a
table keyed by size class alone and the counter alone (`class_online` standing in for the
layer's). `--table-out` writes the format 3 file for real runs under the layer. The goal and the
method: studies/table_sites/README.md.

    .venv/bin/python studies/table_sites/table_sites.py --root data [--model champion]

Writes studies/table_sites/table_sites.json (--out); the full night's figures and real runs under the
layer: studies/table_sites/table_sites_full.json, table_sites.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.sites import call_sites
from tasks.dataset.token_runs import head_rows
from tasks.learning.labels import request_and_free_classes
from tasks.learning.questions.reuse import majority_of, read_events
from tasks.learning.table.distill import LAYER_SOON_CLASS, keep_soon, soon_of_reuse
from tasks.learning.table.layer_file import write_layer_table
from tasks.whatif.night import WhatifParams, parse_runs, registered_ref

PROJECT = Path(__file__).resolve().parents[2]


def _keep(probs: np.ndarray) -> np.ndarray:
    return keep_soon(soon_of_reuse(probs))


NAMES = ("network", "table", "class", "class_online")  # the keep decisions scored
LARGE_CLASS = 18  # size classes of blocks of 128 KiB and more (bit length 18)


def _right(keep: np.ndarray, soon: np.ndarray, where: np.ndarray) -> float | None:
    """The share of the frees at `where` whose keep decision the truth bears out (soon: reused
    within 4096 calls)."""
    return float((keep[where] == soon[where]).mean()) if where.any() else None


def _scores(c: dict[str, np.ndarray], where: np.ndarray) -> dict:
    """At the frees `where`: the table's site coverage, its and the others' agreement with the
    network, and each keep decision against the truth (reused within 4096 calls)."""
    k, s, y = c["network"][where], c["at_site"][where], c["soon"][where]
    if not len(k):
        return {"frees": 0}
    every = np.ones(len(k), bool)

    def share(x: np.ndarray) -> float | None:
        return float(x.mean()) if len(x) else None

    return {
        "frees": int(len(k)),
        "network_keeps": float(k.mean()),
        # the table answers by call site where training saw (site, class), else the counter
        "site_coverage": float(s.mean()),
        "agreement": float((c["table"][where] == k).mean()),
        "agreement_at_sites": share((c["table"][where] == k)[s]),
        "agreement_by_class_alone": float((c["class"][where] == k).mean()),
        "agreement_class_online": float((c["class_online"][where] == k).mean()),
        # at sites training never saw: how often the network keeps, and the truth
        "network_keeps_at_unknown_sites": share(k[~s]),
        "truly_soon_at_sites": share(y[s]),
        "truly_soon_at_unknown_sites": share(y[~s]),
        **{f"right_{n}": _right(c[n][where], y, every) for n in NAMES},
        **{f"right_{n}_at_unknown_sites": _right(c[n][where], y, ~s) for n in NAMES},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--model", default=None, help="version or alias (default: the champion)")
    ap.add_argument("--out", default=str(PROJECT / "studies/table_sites/table_sites.json"))
    ap.add_argument("--table-out", default=None, help="write the format 3 file here")
    return ap.parse_args(argv)


def logged_training_runs(run_id: str) -> list:
    """The training runs as registration logged them (dataset.train_runs, cut at 6000
    characters): all of them, or the study stops."""
    import mlflow  # deferred: start-up time

    logged = mlflow.get_run(run_id).data.params.get("dataset.train_runs", "")
    train_runs = sorted(set(parse_runs(logged)))
    if not train_runs or len(logged) >= 6000:
        raise SystemExit(
            f"run {run_id}: its training runs are not all logged ({len(logged)} chars)"
        )
    return train_runs


def distill(train_runs: list, events, network):
    """The format 3 table distilled from the network's answers on the training runs; (table,
    seconds)."""
    from tasks.learning.questions.network import answered_inputs, distilled_table

    t0 = time.perf_counter()
    train = [events(w, r) for w, r in train_runs]
    inputs, said = [], []
    for t in train:
        _, inp, ans = answered_inputs(t, network)
        inputs.append(inp)
        said.append(ans)
    sited = distilled_table(inputs, said, majority_of(train))
    return sited, time.perf_counter() - t0


def table_columns(runs, events, network, sited) -> dict[str, list[np.ndarray]]:
    """At the labelled frees (a free of known size) of each run, where the counters answer too:
    the network's, the table's, a table by class alone's and the counter's keep decisions, where
    the table knew the site, the truth and the size class."""
    from tasks.learning.questions.network import network_answers

    cols: dict[str, list[np.ndarray]] = {}
    for w, r in runs:
        t = events(w, r)
        counters, said = network_answers(t, network)
        ra = counters["reuse"]
        _, free = request_and_free_classes(t)
        rows = ra.rows[free[ra.rows] >= 0]
        at = np.isin(ra.rows, rows)
        cls, site = free[rows], call_sites(t)[rows]
        online = ra.probs["class_online"][at]
        table_probs, by_site, _ = sited.answer(site, cls, counter=online)
        for key, v in (
            ("network", _keep(said["reuse"][rows])),
            ("table", _keep(table_probs)),
            ("class", _keep(sited.reuse_probs()[cls])),  # a table by class alone
            ("class_online", _keep(online)),
            ("at_site", by_site),
            ("soon", ra.labels[at] <= LAYER_SOON_CLASS),  # the truth
            ("cls", cls),
        ):
            cols.setdefault(key, []).append(v)
    return cols


def print_row(table: str, row: dict) -> None:
    for name, r in ((table, row), (f"{table}, blocks >= 128 KiB", row["large_blocks"])):
        if not r["frees"]:
            continue
        print(
            f"{name}: {r['frees']:,} frees, the network keeps {r['network_keeps']:.1%}; the "
            f"table answers {r['site_coverage']:.1%} by call site and keeps as the network "
            f"does on {r['agreement']:.1%} (a table by class alone "
            f"{r['agreement_by_class_alone']:.1%}); right on "
            + ", ".join(f"{r['right_' + n]:.1%} ({n})" for n in NAMES)
        )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    root = Root.from_url(a.root)
    params = WhatifParams(root=root.url, **({"model": a.model} if a.model else {}))
    ref = registered_ref(params, root)
    model = ref.model

    from tasks.registry.question_artifacts import fetch_question_network

    with tempfile.TemporaryDirectory() as tmp:
        network = fetch_question_network(ref.run_id, Path(tmp))
    train_runs = logged_training_runs(ref.run_id)

    def events(w: str, r: str):
        return head_rows(read_events(root, w, r), ref.max_eval_tokens)

    sited, distill_s = distill(train_runs, events, network)
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
    for table, runs in model.runs_by_table.items():
        cols = table_columns(sorted(set(runs)), events, network, sited)
        if not cols:
            continue
        c = {key: np.concatenate(v) for key, v in cols.items()}
        row = {"table": table, **_scores(c, np.ones(len(c["network"]), bool))}
        # the frees the layer decides on: blocks of 128 KiB and more (its `min`)
        row["large_blocks"] = _scores(c, c["cls"] >= LARGE_CLASS)
        out["tables"].append(row)
        print_row(table, row)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
