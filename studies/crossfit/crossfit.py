"""Cross-fitted n-gram features (tasks/learning/train.py crossfit_features) against the way they
were made before 4e2a04a, side by side on the same training runs: one table fitted on the other
workloads for every workload, against one pass over all of them for every table
(train.training_tables, NGramTable.fit_leaving_out); then the training positions' features, the
old leave-one-out-then-overwrite (`loo_then_overwrite`, kept here as the reference) against one
lookup per row (train.training_features). Both must give the same features.

    .venv/bin/python studies/crossfit/crossfit.py --root data --config configs/train-quick.yaml

Writes studies/crossfit/crossfit.json. The figures found: studies/crossfit/README.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.token_runs import concat_runs
from tasks.learning.nextcall.model import NGramTable
from tasks.learning.nextcall.training import (
    crossfit_features,
    crossfit_rows,
    training_features,
    training_tables,
)
from tasks.learning.split import load_split
from tasks.learning.train_config import load_train_config

PROJECT = Path(__file__).resolve().parents[2]


def refit_per_workload(feats: np.ndarray, runs: list, cfg) -> int:
    """The reference: the training table, then crossfit_features as it was, a table fitted on
    the others per workload."""
    whole = concat_runs(runs)
    NGramTable.fit(whole.tokens, whole.position_in_thread(), cfg.model.ngram_order)
    workloads = sorted({r.workload for r in runs})
    if len(workloads) < 2:
        return 0
    rng = np.random.default_rng(cfg.seed)
    block = 10 * cfg.context
    starts = np.cumsum([0] + [r.n_tokens for r in runs])
    replaced = 0
    for w in workloads:
        others = concat_runs([r for r in runs if r.workload != w])
        table = NGramTable.fit(others.tokens, others.position_in_thread(), cfg.model.ngram_order)
        for i in (i for i, r in enumerate(runs) if r.workload == w):
            r, s0 = runs[i], int(starts[i])
            chosen = np.flatnonzero(rng.random(-(-r.n_tokens // block)) < cfg.model.ngram_crossfit)
            if not len(chosen):
                continue
            out = table.features(r.tokens, r.position_in_thread(), leave_one_out=False)
            rows = (chosen[:, None] * block + np.arange(block)[None, :]).ravel()
            rows = rows[rows < r.n_tokens]
            feats[s0 + rows] = out[rows]
            replaced += len(rows)
    return replaced


def loo_then_overwrite(table, others, runs, whole, pos, cfg) -> np.ndarray:
    """The reference: fit_model's features before training_features, every row looked up in
    both tables (the whole runs), half of each thrown away."""
    feats = table.features(whole.tokens, pos, leave_one_out=True)
    starts = np.cumsum([0] + [r.n_tokens for r in runs])
    for i, rows in (crossfit_rows(runs, cfg, others) if others else {}).items():
        r = runs[i]
        out = others[r.workload].features(r.tokens, r.position_in_thread(), leave_one_out=False)
        feats[starts[i] + rows] = out[rows]
    return feats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--config", default=str(PROJECT / "configs/train-quick.yaml"))
    ap.add_argument("--out", default=str(PROJECT / "studies/crossfit/crossfit.json"))
    ap.add_argument(
        "--features-only",
        action="store_true",
        help="only the training features' comparison (the full config's refit takes ~8 min)",
    )
    a = ap.parse_args(argv)
    cfg = load_train_config(a.config)
    runs = load_split(Root.from_url(a.root), cfg.data).train
    n = sum(r.n_tokens for r in runs)
    start = np.zeros((n, 4), np.uint8)  # the features both overwrite, in the same blocks
    row = {"root": a.root, "config": a.config, "runs": len(runs), "tokens": n}
    row["workloads"] = len({r.workload for r in runs})
    got = {}

    def one_pass(feats: np.ndarray, runs: list, cfg) -> int:
        whole = concat_runs(runs)
        _, others = training_tables(runs, whole, whole.position_in_thread(), cfg)
        return crossfit_features(feats, runs, cfg, others) if others is not None else 0

    both = (("refit_per_workload", refit_per_workload), ("one_pass", one_pass))
    for name, fn in () if a.features_only else both:
        feats = start.copy()
        t0 = time.perf_counter()
        row[f"{name}_replaced"] = fn(feats, runs, cfg)
        row[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        got[name] = feats
        print(name, row[f"{name}_s"], "s", flush=True)
    if not a.features_only:
        row["same_features"] = bool(np.array_equal(got["refit_per_workload"], got["one_pass"]))
        row["speedup"] = round(row["refit_per_workload_s"] / max(row["one_pass_s"], 1e-9), 2)
    whole = concat_runs(runs)
    pos = whole.position_in_thread()
    table, others = training_tables(runs, whole, pos, cfg)
    feats = {}
    for name, fn in (
        ("loo_then_overwrite", loo_then_overwrite),
        ("each_row_once", training_features),
    ):
        t0 = time.perf_counter()
        feats[name] = fn(table, others, runs, whole, pos, cfg)
        row[f"training_features_{name}_s"] = round(time.perf_counter() - t0, 2)
        print(name, row[f"training_features_{name}_s"], "s", flush=True)
    row["training_features_same"] = bool(
        np.array_equal(feats["loo_then_overwrite"], feats["each_row_once"])
    )
    row["same_features"] = row.get("same_features", True) and row["training_features_same"]
    print(json.dumps(row, indent=1))
    Path(a.out).write_text(json.dumps(row, indent=2) + "\n")
    return 0 if row["same_features"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
