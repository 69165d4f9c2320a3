"""Which model family is the default: the variants trained and evaluated side by side on one root.

    .venv/bin/python studies/model_variants/model_variants.py --root data            # after `make run`
    .venv/bin/python studies/model_variants/model_variants.py --root data --variants online ngram

Every variant is configs/train-quick.yaml (or --config) with the overrides of VARIANTS, trained
on the same split of the same root and scored on the same positions (tasks.learning.train: train
and evaluate, no registration). Reported per table: the model's top-1, top-5 and log-loss overall
and per workload, beside the best baseline and the online counter, and the training time. Writes
studies/model_variants/model_variants.json. The variants: ngram_online, online,
crossfit_online, crossfit80_online, crossfit_copy_online, ngram, lstm (each described in
studies/model_variants/README.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

VARIANTS = {
    "ngram_online": {"model": {"ngram_features": True, "online_features": True}},
    "online": {"model": {"ngram_features": False, "online_features": True}},
    "crossfit_online": {
        "model": {"ngram_features": True, "ngram_crossfit": 0.5, "online_features": True}
    },
    "crossfit_copy_online": {
        "model": {
            "ngram_features": True,
            "ngram_crossfit": 0.5,
            "online_features": True,
            "copy_path": True,
        }
    },
    "crossfit80_online": {
        "model": {"ngram_features": True, "ngram_crossfit": 0.8, "online_features": True}
    },
    "ngram": {"model": {"ngram_features": True, "online_features": False}},
    "lstm": {"model": {"kind": "lstm", "ngram_features": False, "online_features": False}},
}


def scores(evaluation, table: str) -> dict:
    from tasks.learning.evaluate import OVERALL

    rows = {}
    slices = sorted({s.slice for s in evaluation.scores if s.table == table})
    for sl in slices:
        row = {}
        for s in evaluation.scores:
            if s.table == table and s.slice == sl:
                row[s.predictor] = {
                    "top1": round(s.top1, 4),
                    "top5": round(s.top5, 4),
                    "log_loss": round(s.log_loss, 3),
                    "positions": s.positions,
                }
        rows["all" if sl == OVERALL else sl] = row
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--config", default=None, help="default: configs/train-quick.yaml")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default=str(PROJECT / "studies/model_variants/model_variants.json"))
    a = ap.parse_args()

    from tasks.core.config import apply_embedded_defaults

    apply_embedded_defaults()
    from tasks.core.storage import Root
    from tasks.learning.evaluate import TABLES
    from tasks.learning.train import evaluate, train
    from tasks.learning.train_config import QUICK_CONFIG, load_train_config
    from tasks.replay.workloads import load_catalog

    root = Root.from_url(a.root)
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault("variants", {})
    for name in a.variants:
        cfg = load_train_config(a.config or QUICK_CONFIG, VARIANTS[name])
        t0 = time.perf_counter()
        trained = train.fn(root, cfg, load_catalog(cfg.data.catalog))
        outcome = evaluate.fn(trained)
        seconds = time.perf_counter() - t0
        results["variants"][name] = {
            "overrides": VARIANTS[name],
            "seconds": round(seconds, 1),
            "tables": {t: scores(outcome.evaluation, t) for t in TABLES},
        }
        for t in TABLES:
            all_ = results["variants"][name]["tables"][t].get("all")
            if all_:
                m, o = all_["model"], all_["ngram_online"]
                print(
                    f"{name:13s} {t:18s} model top-1 {m['top1']:.4f} log-loss {m['log_loss']:.3f}"
                    f" | online counter top-1 {o['top1']:.4f} log-loss {o['log_loss']:.3f}"
                )
        results["root"] = a.root
        out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
