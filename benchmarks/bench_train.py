"""Training throughput (the article's windows vs heapcast's sequence chunks) and accuracy.

Part 1, side by side in one process, on the same training tokens, network and batch size:
predictions per second while training, `windows` (one label per window, the article's) against
`sequence` (a label at every position), `--steps` timed steps after a warm-up. Target: sequence
>= 50x windows on the CPU. Part 2: the configured training (train + evaluate tasks) on the
root's events, and the model's accuracy against the baselines per workload, on runs never seen
in training. The details: docs/speeds-pipeline.md#the-training-benchmark.

    .venv/bin/python benchmarks/bench_train.py --root data --config configs/train-quick.yaml

Without an events dataset under the root, a synthetic one is written to a temporary folder
(and the result says so). Writes benchmarks/results/train.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import numpy as np  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402
from tasks.core.config import default_root  # noqa: E402
from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.token_runs import concat_runs  # noqa: E402
from tasks.learning.split import load_split
from tasks.learning.train_config import QUICK_CONFIG, load_train_config  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train.json"


def measure(mode: str, cfg, run, steps: int, warmup: int) -> dict:
    import keras

    from tasks.learning.nextcall.fitting import _throughput_meter
    from tasks.learning.nextcall.model import build_model
    from tasks.learning.nextcall.token_data import sequence_dataset, windows_dataset

    keras.utils.set_random_seed(cfg.seed)
    # the network alone: the hybrid's n-gram lookup and online counter are measured by part 2's
    # training (build_model builds the plain network only)
    plain = {"ngram_features": False, "online_features": False}
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update=plain)})
    c, b = cfg.context, cfg.batch_size
    if mode == "sequence":
        ds, n = sequence_dataset(run, c, b, seed=cfg.seed)
        per_batch = b * c
    else:
        ds, n = windows_dataset(run, c, b, seed=cfg.seed)
        per_batch = b
    model = build_model(cfg, mode=mode)
    ds.steps = warmup
    model.fit(ds, epochs=1, verbose=0)  # trace + compile
    meter = _throughput_meter(per_batch)
    ds.steps = steps + 2
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0, callbacks=[meter])
    wall = time.perf_counter() - t0
    return {
        "mode": mode,
        "batch_size": b,
        "context": c,
        "predictions_per_step": per_batch,
        "timed_steps": meter.batches,
        "seconds": meter.seconds,
        "seconds_per_step": meter.seconds / max(meter.batches, 1),
        "predictions_per_second": meter.rate(),
        "samples_available": int(n),
        "wall_seconds": wall,
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=default_root(), help="data root holding events/")
    ap.add_argument("--config", default=str(QUICK_CONFIG))
    ap.add_argument("--override", default="{}", help="JSON merged over the config")
    ap.add_argument("--steps", type=int, default=30, help="timed training steps per mode")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    return ap.parse_args()


def the_data(a: argparse.Namespace):
    """The root and config trained on: --root's events, or a synthetic dataset where it has none
    (then `gamma` held out); (root, config, synthetic)."""
    cfg = load_train_config(a.config, json.loads(a.override))
    root = Root.from_url(a.root)
    synthetic = not root.fs.exists(root.join("events"))
    if synthetic:
        from tasks.dataset.synthetic_events import write_synthetic_events

        root = Root.from_url(tempfile.mkdtemp(prefix="heapcast-bench-"))
        write_synthetic_events(root, {"alpha": 3, "beta": 3, "gamma": 2}, tokens_per_run=400_000)
        cfg = load_train_config(
            a.config, {**json.loads(a.override), "data": {"heldout_workloads": ["gamma"]}}
        )
        print(f"no events under {a.root}: synthetic dataset in {root.url}", file=sys.stderr)
    return root, cfg, synthetic


def throughput(cfg, run, a: argparse.Namespace) -> dict:
    """Part 1: windows then sequence, the same data, network and batch; printed."""
    rows = [measure(m, cfg, run, a.steps, a.warmup) for m in ("windows", "sequence")]
    ratio = rows[1]["predictions_per_second"] / rows[0]["predictions_per_second"]
    for r in rows:
        print(
            f"{r['mode']:>8}: {r['predictions_per_second']:>12,.0f} predictions/s "
            f"({r['seconds_per_step'] * 1000:.1f} ms/step, {r['predictions_per_step']} per step)"
        )
    print(f"sequence / windows: {ratio:.1f}x (target >= 50x)")
    return {
        "windows": rows[0],
        "sequence": rows[1],
        "sequence_over_windows": ratio,
        "target_ratio": 50.0,
    }


def accuracy(root, cfg) -> dict:
    """Part 2: the configured training and its honest evaluation, the model beside every
    baseline per table and slice; the markdown printed."""
    from tasks.learning.evaluate import evaluation_markdown
    from tasks.learning.scores import BASELINES, MODEL
    from tasks.learning.train import evaluate, train
    from tasks.replay.workloads import load_catalog

    t0 = time.perf_counter()
    trained = train.fn(root, cfg, load_catalog(cfg.data.catalog))
    outcome = evaluate.fn(trained)
    ev = outcome.evaluation
    table = []
    for s in ev.scores:
        if s.predictor == MODEL:
            best = max(BASELINES, key=lambda b: ev.get(b, s.slice, s.table).top1)
            table.append(
                {
                    "table": s.table,
                    "slice": s.slice,
                    "positions": s.positions,
                    **{
                        f"{p}_{m}": getattr(ev.get(p, s.slice, s.table), m)
                        for p in (MODEL, *BASELINES)
                        for m in ("top1", "top5", "log_loss")
                    },
                    "best_baseline": best,
                    "margin_top1": ev.margin_over_best_baseline(s.slice, s.table),
                }
            )
    md = evaluation_markdown(ev, outcome.notes)
    print(md)
    return {
        "seconds": time.perf_counter() - t0,
        "train_seconds": outcome.seconds,
        "train_predictions_per_second": outcome.predictions_per_second,
        "epochs": len(outcome.history.get("loss", [])),
        "history": outcome.history,
        "ngram_order": ev.get("ngram").detail.get("order"),
        "eval_runs": [f"{w}/{r}" for w, r in outcome.dataset.eval_runs],
        "heldout_runs": [f"{w}/{r}" for w, r in outcome.dataset.heldout_runs],
        "table": table,
        "markdown": md,
        "notes": outcome.notes,
    }


def main() -> int:
    a = parse_args()
    root, cfg, synthetic = the_data(a)

    from tasks.learning.nextcall.backend import placement

    where = placement()
    split = load_split(root, cfg.data)
    run = concat_runs(split.train)
    result: dict = {
        "placement": {
            "backend": where.backend,
            "device": where.device,
            "precision": where.precision,
        },
        "root": root.url,
        "synthetic_data": synthetic,
        "config": cfg.model_dump(mode="json"),
        "train_runs": [r.name for r in split.train],
        "train_tokens": split.train_tokens,
    }

    # Part 1: throughput, windows then sequence, same data/network/batch.
    result["throughput"] = throughput(cfg, run, a)
    _write(a.out, result)
    # Part 2: the configured training and its honest evaluation.
    if not a.skip_accuracy:
        result["accuracy"] = accuracy(root, cfg)
        _write(a.out, result)
    return 0


def _write(path: str, result: dict) -> None:
    write_result(
        "train",
        json.loads(json.dumps(result, default=_jsonable)),
        reference="the article's windows (one label a sample) on the same tokens, network and "
        "batch size",
        out=path,
        roots=(result["root"],),
    )


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


if __name__ == "__main__":
    raise SystemExit(main())
