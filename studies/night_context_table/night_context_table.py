"""The night's layer table with and without its allocation-context keys (issue 65), on a data root.

The questions' evaluation as the train stage runs it (question_evaluation: the network trained on
the split's training runs, the table distilled from it, format 4 since the contexts), then, at
every evaluation free of the three tables, the table's answer two ways: as the night's format 4
file answers (allocation context, then call site, then the layer's online counter;
ClassTable.answer) and as the same table without its context keys (format 3, what registration
wrote before), and with the keys of at least 1, 2, 8 (the night's MIN_CONTEXT_FREES), 32 and
128 training frees. Each: top-1 and log-loss of the reuse question, the share of frees a context
or a site answered, and the keep decision's agreement with the network it was distilled from;
each file's size and entry counts.

    .venv/bin/python studies/night_context_table/night_context_table.py --root data \
        [--config configs/train-quick.yaml]

writes studies/night_context_table/night_context_table.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.frame_tokens import read_run_stacks  # noqa: E402
from tasks.dataset.sites import call_sites  # noqa: E402
from tasks.learning.evaluate import HELDOUT_WORKLOADS, UNSEEN_PROGRAMS, UNSEEN_RUNS  # noqa: E402
from tasks.learning.labels import REUSE_CLASSES, request_and_free_classes  # noqa: E402
from tasks.learning.split import load_split, question_events  # noqa: E402
from tasks.learning.table.distill import (  # noqa: E402
    CONTEXT_DEPTH,
    MAX_TABLE_CONTEXTS,
    MIN_CONTEXT_FREES,
    allocation_contexts,
    keep_soon,
    soon_of_reuse,
)
from tasks.learning.table.layer_file import HEADER, layer_entries, write_layer_table  # noqa: E402
from tasks.learning.train_config import load_train_config  # noqa: E402

MIN_PROB = 1e-7  # the log-loss clip of tasks.learning.evaluate
MIN_FREES = (1, 2, MIN_CONTEXT_FREES, 32, 128)  # the night's: MIN_CONTEXT_FREES
# The classes the layer asks at all: blocks of min / 2 and up at its default min of 128 KiB
# (layers/layer/table.c cmin = hcp_class(min / 2), the bit length of 65536)
LAYER_MIN_CLASS = 17


def _file(table, path: Path) -> dict:
    raw = write_layer_table(path, table, 1).read_bytes()
    fmt = HEADER.unpack_from(raw)[1]
    got = layer_entries(fmt, raw[HEADER.size :])
    return {
        "format": fmt,
        "bytes": len(raw),
        "site_entries": len(got.sites),
        "context_entries": len(got.contexts),
        "context_depth": got.depth,
        # the entries the layer loads and asks (its default min)
        "site_entries_layer_classes": int(((got.sites >> 8) % 32 >= LAYER_MIN_CLASS).sum()),
        "context_entries_layer_classes": int((got.contexts["word"] >> 8 >= LAYER_MIN_CLASS).sum()),
    }


def _scores(y, probs, net_probs, at_site, at_ctx) -> dict:
    n = len(y)
    if n == 0:
        return {}
    p_true = probs[np.arange(n), y]
    keep = keep_soon(soon_of_reuse(probs)) == keep_soon(soon_of_reuse(net_probs))
    return {
        "top1": float((probs.argmax(axis=1) == y).mean()),
        "log_loss": float(-np.log(np.clip(p_true, MIN_PROB, 1.0)).mean()),
        "site_share": float(at_site.mean()),
        "context_share": float(at_ctx.mean()),
        "keep_agreement_with_network": float(keep.mean()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--config", default=str(PROJECT / "configs/train-quick.yaml"))
    ap.add_argument(
        "--out", default=str(PROJECT / "studies/night_context_table/night_context_table.json")
    )
    ap.add_argument(
        "--tables-out",
        default=None,
        help="write the night's two files there (format_3.hcltab, format_4.hcltab: MIN_CONTEXT_"
        "FREES), model version 1, for the allocators stage's --table-file",
    )
    a = ap.parse_args(argv)

    # deferred: Keras' start-up
    from tasks.learning.questions.context import run_contexts
    from tasks.learning.questions.evaluation import question_evaluation
    from tasks.learning.questions.lifetime import lifetime_answers, lifetime_majority
    from tasks.learning.questions.network import question_inputs
    from tasks.learning.questions.reuse import majority_of, reuse_answers

    cfg = load_train_config(a.config)
    root = Root.from_url(a.root)
    split = load_split(root, cfg.data)
    t0 = time.perf_counter()
    events = question_events(root, split.question_runs(), cfg.data.max_eval_tokens)
    frames = read_run_stacks(root, split.question_runs(), cfg.data.frame_depth)
    # every (allocation context, class) key the training frees had; the night's keeps those
    # with MIN_CONTEXT_FREES (its table rows below), the others are tried here
    q = question_evaluation(
        split, events, cfg.questions, cfg.seed, frames=frames, min_context_frees=1
    )
    seconds = time.perf_counter() - t0
    every = q.table
    variants = {
        "format_3": replace(every, context_counts=None),
        **{
            f"format_4_min{m}": replace(every, context_counts=every.context_counts.bounded(m))
            for m in MIN_FREES
        },
    }
    train = [events[k] for k in sorted({(r.workload, r.run) for r in split.train})]
    majority, life_maj = majority_of(train), lifetime_majority(train)
    del train
    rows = []
    for table, runs in (
        (UNSEEN_RUNS, split.evaluation),
        (UNSEEN_PROGRAMS, split.unseen_programs),
        (HELDOUT_WORKLOADS, split.heldout),
    ):
        got: dict[str, list] = {"y": [], "net": [], "cls": []}
        for w, r in sorted({(x.workload, x.run) for x in runs}):
            t, stack = events[(w, r)], frames[(w, r)]
            ctx = run_contexts(stack.frames, t)
            ans = reuse_answers(t, majority)
            said = q.network.answer(
                question_inputs(t, {"reuse": ans, **lifetime_answers(t, life_maj)}, stack)
            )
            _, free_cls = request_and_free_classes(t)
            rows_, cls = ans.rows, free_cls[ans.rows]
            site = call_sites(t)[rows_]
            alloc = allocation_contexts(t, ctx[CONTEXT_DEPTH])[rows_]
            got["y"].append(ans.labels.astype(np.int64))
            got["cls"].append(cls)
            got["net"].append(said["reuse"][rows_])
            for name, v in variants.items():
                # as the evaluation answers (reuse_answers): the layer's order of keys
                got.setdefault(name, []).append(
                    v.answer(site, cls, 0.1, ans.probs["class_online"], alloc)
                )
        if not got["y"]:
            continue
        y, net = np.concatenate(got["y"]), np.concatenate(got["net"])
        big = np.concatenate(got["cls"]) >= LAYER_MIN_CLASS
        none = np.zeros(len(y), bool)
        row = {
            "table": table,
            "frees": len(y),
            "frees_layer_classes": int(big.sum()),
            "network": _scores(y, net, net, none, none),
            "network_layer_classes": _scores(y[big], net[big], net[big], none[big], none[big]),
        }
        for name in variants:
            p, at_site, at_ctx = (np.concatenate(x) for x in zip(*got[name], strict=True))
            row[name] = _scores(y, p, net, at_site, at_ctx)
            # the frees the layer asks about (large blocks)
            row[f"{name}_layer_classes"] = _scores(
                y[big], p[big], net[big], at_site[big], at_ctx[big]
            )
        rows.append(row)
    if a.tables_out:
        for name in ("format_3", f"format_4_min{MIN_CONTEXT_FREES}"):
            write_layer_table(Path(a.tables_out) / f"{name[:8]}.hcltab", variants[name], 1)
    # the evaluation's own table row (format 4), to check this script's answers against
    night = {  # (its table: every key, format_4_min1)
        s.table: {"top1": s.top1, "log_loss": s.log_loss}
        for s in q.scores
        if s.question == "reuse" and s.predictor == "table" and s.slice == "all"
    }
    with tempfile.TemporaryDirectory(prefix="heapcast-ctx-") as tmp:
        files = {name: _file(v, Path(tmp) / f"{name}.hcltab") for name, v in variants.items()}
    out = {
        # (without --tables-out: where the files went is this machine's)
        "command": "studies/night_context_table/night_context_table.py --root "
        + f"{a.root} --config configs/{Path(a.config).name}",
        "machine": platform.node(),
        "config": Path(a.config).name,
        "seconds": round(seconds, 1),
        "reuse_classes": REUSE_CLASSES,
        "min_context_frees": MIN_CONTEXT_FREES,
        "max_table_contexts": MAX_TABLE_CONTEXTS,
        "files": files,
        "tables": rows,
        "night_table_rows": night,
        "agreement": [
            {
                k: getattr(x, k)
                for k in (
                    "table",
                    "positions",
                    "site_coverage",
                    "context_coverage",
                    "keep_agreement",
                    "keep_agreement_at_contexts",
                )
            }
            for x in q.agreement
        ],
    }
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    for r in rows:
        print(f"{r['table']} ({r['frees']:,} frees), top-1 (log-loss), answered by context, site:")
        for name in ("network", *variants):
            for sub, key in (("", name), (" (large)", f"{name}_layer_classes")):
                x = r[key]
                if not r["frees_layer_classes"] and sub:
                    continue
                print(
                    f"  {name}{sub}: {x['top1']:.4f} ({x['log_loss']:.3f}), "
                    f"{x['context_share']:.1%}, {x['site_share']:.1%}; keeps as the network "
                    f"{x['keep_agreement_with_network']:.1%}"
                )
        print(f"  ({r['frees_layer_classes']:,} frees of blocks >= 64 KiB, the layer's)")
    print(f"files: {files}")
    print(f"the night's table rows: {night}")
    print(f"{seconds:.0f} s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
