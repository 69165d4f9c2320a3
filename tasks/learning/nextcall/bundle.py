"""A training bundle: everything the next-call network trains and is scored on, in one file.

A machine lent for its GPU has no network, no data root, no Prefect or MLflow, and takes 64 MiB a
call. A bundle carries exactly what `fitting.fit_inputs` and the unseen-runs table need: the
training and validation tokens with their feature columns (n-gram leave-one-out and cross-fitted,
online counter), the training runs' n-gram table, the evaluation runs' tokens, and the config.
`heapcast bundle export` writes one from a night's data; `heapcast bundle train` (or
scripts/gpu_check.sh on the lent machine) trains it anywhere, on any backend, and writes the model,
the unseen-runs scores and the throughput. The same bundle trained on two machines is the
side-by-side the GPU's figures are read against.

Format: a numpy .npz, compressed, no pickles; `meta` is a JSON document naming the format version,
the config, the runs and which arrays are present.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.learning.evaluate import log_loss, top1_accuracy, top5_accuracy
from tasks.learning.nextcall.fitting import TrainingInputs, fit_inputs, placement_facts
from tasks.learning.predictions import Predictions
from tasks.learning.scores import OVERALL
from tasks.learning.train_config import TrainConfig, merged_settings

FORMAT = "heapcast-training-bundle"
VERSION = 1
MAX_BYTES = 48 << 20  # what a device call carries (64 MiB) less the wheels and the code


class BundleError(ValueError):
    """A file that is not a bundle this version reads, or one too large to carry."""


@dataclass
class TrainingBundle:
    config: TrainConfig
    inputs: TrainingInputs
    evaluation: list[TokenRun]  # the unseen-runs table's runs
    source: str  # where it was exported from (a data root)


def _run_arrays(prefix: str, run: TokenRun) -> dict[str, np.ndarray]:
    return {f"{prefix}_tokens": run.tokens, f"{prefix}_offsets": run.offsets}


def write_bundle(bundle: TrainingBundle, path: Path, max_bytes: int = MAX_BYTES) -> int:
    """Write `bundle` to `path` (compressed); returns its size in bytes. A bundle over
    `max_bytes` is removed and refused with what to lower."""
    inp = bundle.inputs
    arrays = {**_run_arrays("train", inp.train_run), **_run_arrays("val", inp.val_run)}
    if inp.train_feats is not None:
        arrays["train_feats"], arrays["val_feats"] = inp.train_feats, inp.val_feats
    table = None
    if inp.table is not None:
        t = inp.table
        for name in ("keys", "top1", "count1", "total", "top2", "count2"):
            arrays[f"table_{name}"] = getattr(t, name)
        table = {"max_order": t.max_order}
    for i, run in enumerate(bundle.evaluation):
        arrays.update(_run_arrays(f"eval{i}", run))
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "config": bundle.config.model_dump(mode="json"),
        "source": bundle.source,
        "train_names": inp.train_names,
        "table": table,
        "evaluation": [[r.workload, r.run] for r in bundle.evaluation],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez_compressed(f, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    size = path.stat().st_size
    if size > max_bytes:
        path.unlink()
        raise BundleError(
            f"{path}: the bundle is {size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB "
            "a device call carries: lower data.max_train_tokens (--set data.max_train_tokens=N)"
        )
    return size


def read_bundle(path: Path) -> TrainingBundle:
    """The bundle at `path`; BundleError naming the file when it is not one this version reads."""
    # deferred: the model module imports Keras at its top
    from tasks.learning.nextcall.model import NGramTable

    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
        meta = json.loads(bytes(z["meta"]).decode())
    except FileNotFoundError:
        raise BundleError(
            f"{path}: no such file; write one with `heapcast bundle export`"
        ) from None
    except (OSError, ValueError, KeyError) as e:
        raise BundleError(
            f"{path}: does not look like a training bundle ({e}); write one with "
            "`heapcast bundle export`"
        ) from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise BundleError(
            f"{path}: a {meta.get('format')} version {meta.get('version')}, this heapcast reads "
            f"{FORMAT} version {VERSION}: export it again with this version"
        )
    cfg = TrainConfig.model_validate(meta["config"])

    def run(prefix: str, workload: str, name: str) -> TokenRun:
        return TokenRun(workload, name, z[f"{prefix}_tokens"], z[f"{prefix}_offsets"])

    table = None
    if meta["table"] is not None:
        cols = ("keys", "top1", "count1", "total", "top2", "count2")
        table = NGramTable(*(z[f"table_{c}"] for c in cols), max_order=meta["table"]["max_order"])
    feats = "train_feats" in z.files
    inputs = TrainingInputs(
        train_run=run("train", "train", "all"),
        val_run=run("val", "validation", "all"),
        train_feats=z["train_feats"] if feats else None,
        val_feats=z["val_feats"] if feats else None,
        table=table,
        train_names=list(meta["train_names"]),
    )
    evaluation = [run(f"eval{i}", w, r) for i, (w, r) in enumerate(meta["evaluation"])]
    return TrainingBundle(cfg, inputs, evaluation, meta["source"])


def train_bundle(
    bundle: TrainingBundle, out: Path, overrides: dict[str, Any] | None = None, verbose: int = 2
) -> dict[str, Any]:
    """Train `bundle` here (fresh: no checkpoint is resumed), score it on its evaluation runs,
    save the model to out/model.keras and the facts to out/result.json; returns the facts."""
    # deferred: the model module imports Keras at its top
    from tasks.learning.nextcall.model import as_sequence_model, predict_positions

    cfg = bundle.config
    if overrides:
        cfg = TrainConfig.model_validate(merged_settings(cfg.model_dump(), overrides))
    out = Path(out)
    ckpt = out / "checkpoints"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    t0 = time.perf_counter()
    model, facts = fit_inputs(cfg, bundle.inputs, ckpt, verbose=verbose)
    train_s = time.perf_counter() - t0
    seq = as_sequence_model(model, cfg)
    t0 = time.perf_counter()
    scores, ys, preds = {}, [], []
    for run in bundle.evaluation:
        pos = eval_positions(run)
        if not len(pos):
            continue
        p = predict_positions(seq, run, cfg.context, cfg.eval_batch_size)
        y = run.tokens[pos]
        scores[f"{run.workload}/{run.run}"] = _scores(y, p, top1_accuracy, top5_accuracy, log_loss)
        ys.append(y)
        preds.append(p)
    eval_s = time.perf_counter() - t0
    if ys:
        pooled = Predictions(
            np.concatenate([p.top for p in preds]), np.concatenate([p.p_true for p in preds])
        )
        scores[OVERALL] = _scores(
            np.concatenate(ys), pooled, top1_accuracy, top5_accuracy, log_loss
        )
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    result = {
        "placement": placement_facts(facts["placement"], facts["batch_size"]),
        "positions_per_second": facts["predictions_per_second"],
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "epochs": len(next(iter(facts["history"].values()), [])),
        "steps_per_epoch": facts["steps_per_epoch"],
        "history": facts["history"],
        "unseen_runs": scores,
        "config": cfg.model_dump(mode="json"),
        "source": bundle.source,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _scores(y, p, top1, top5, loss) -> dict[str, float]:
    return {"positions": int(len(y)), "top1": top1(y, p), "top5": top5(y, p), "log_loss": loss(p)}
