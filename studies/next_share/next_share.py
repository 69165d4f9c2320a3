"""The next-call hedge's fixed share on a night's evaluation tables and champion.

The network alone, the online counter, and the mix of the network, the counter and the majority
at each share (tasks/learning/nextcall/hedge.py: NEXT_SHARE); top-1, top-5 and log-loss per table,
every answer made as the night makes it (evaluate_model's inputs, one pass of the network and of
the counter per run).

    .venv/bin/python studies/next_share/next_share.py --root data \
        --config configs/train-quick.yaml --shares 0.05 0.02 0.01 0.005 0.002

Writes studies/next_share/next_share_quick.md (about 2 minutes on the quick night's data).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parents[2]


def _scores(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> str:
    """'top-1 / top-5 / log-loss' pooled over runs of (top [n, 5], truth [n], p_true [n])."""
    top = np.concatenate([t for t, _, _ in parts])
    y = np.concatenate([y for _, y, _ in parts])
    p = np.concatenate([p for _, _, p in parts])
    top1 = np.mean(top[:, 0] == y)
    top5 = np.mean((top == y[:, None]).any(axis=1))
    return f"{top1:.4f} / {top5:.4f} / {-np.mean(np.log(np.maximum(p, 1e-12))):.4f}"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="a data root after a night (`make run`: data)")
    ap.add_argument("--config", default="configs/train-quick.yaml", help="the night's train config")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.02, 0.01, 0.005, 0.002])
    ap.add_argument("--out", default=str(PROJECT / "studies/next_share/next_share_quick.md"))
    a = ap.parse_args()
    if not all(0 < s < 1 for s in a.shares):
        ap.error(f"--shares {a.shares}: each share is in (0, 1)")
    return a


def table_rows(table: str, runs, base, seq, cfg, shares: list[float]) -> list[str]:
    """One evaluation table's lines: the network, the online counter and the mix at each share,
    pooled over the table's runs (none where no run has a position)."""
    import tasks.learning.nextcall.model as M
    from tasks.dataset.token_runs import eval_positions
    from tasks.learning.nextcall.hedge import NEXT_SHARE, hedged_next, thread_of
    from tasks.learning.predictions import ranked

    net_parts, counter_parts, mix_parts = [], [], {s: [] for s in shares}
    for run in runs:
        pos = eval_positions(run)
        if not len(pos):
            continue
        y = run.tokens[pos]
        answers, counter = base.predict_with_counter(run, pos)
        net = M.predict_distribution(seq, run, cfg.context, cfg.eval_batch_size)
        mine = ranked(net, y)
        net_parts.append((mine.top, y, mine.p_true))
        online = answers["ngram_online"]
        counter_parts.append((online.top, y, online.p_true))
        for s in shares:
            mix = hedged_next(
                [net, counter, base.majority.probs],
                thread_of(run.offsets, pos),
                y,
                share=s,
                candidates=[online.top, mine.top],
            )
            mix_parts[s].append((mix.top, y, mix.p_true))
    if not net_parts:
        return []
    positions = sum(len(y) for _, y, _ in net_parts)
    rows = [
        f"| {table} | {positions:,} | network | {_scores(net_parts)} |",
        f"| {table} | {positions:,} | online counter | {_scores(counter_parts)} |",
    ]
    for s in shares:
        mark = " (NEXT_SHARE)" if s == NEXT_SHARE else ""
        rows.append(f"| {table} | {positions:,} | mix, share {s}{mark} | {_scores(mix_parts[s])} |")
    return rows


def main() -> int:
    a = parse_args()
    from tasks.core.config import apply_embedded_defaults

    apply_embedded_defaults()
    import mlflow.keras

    import tasks.learning.nextcall.model as M
    from tasks.core.storage import Root
    from tasks.learning.counters.baselines import Baselines
    from tasks.learning.split import load_split
    from tasks.learning.train_config import load_train_config
    from tasks.registry.tracking import configure, tracking_for

    cfg = load_train_config(a.config)
    root = Root.from_url(a.root)
    tracking = tracking_for(root)
    configure(tracking)
    version = mlflow.MlflowClient().get_model_version_by_alias(tracking.model_name, "champion")
    model = mlflow.keras.load_model(f"models:/{tracking.model_name}/{version.version}")
    split = load_split(root, cfg.data)
    base = Baselines.fit(split.train, split.validation, cfg.ngram.max_order, cfg.ngram.smoothing)
    seq = M.as_sequence_model(model, cfg)
    tables = (
        ("unseen runs", split.evaluation),
        ("unseen programs", split.unseen_programs),
        ("held-out workloads", split.heldout),
    )
    rows = [
        row for table, runs in tables for row in table_rows(table, runs, base, seq, cfg, a.shares)
    ]
    text = "\n".join(
        [
            "# The next-call hedge's share",
            "",
            f"`python studies/next_share/next_share.py --root <root> --config {a.config} "
            f"--shares {' '.join(map(str, a.shares))}`",
            "",
            f"Champion v{version.version} of {tracking.model_name}; top-1 / top-5 / log-loss, "
            "pooled over each table's runs.",
            "",
            "| table | positions | predictor | top-1 / top-5 / log-loss |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    Path(a.out).write_text(text)
    print(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
