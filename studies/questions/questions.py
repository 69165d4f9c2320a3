"""The allocator's two questions on a data root, as the train stage scores them, without training
the next-call model: every predictor of the reuse and lifetime questions (the counters, the
majority, the questions' network and its hedged form) in the three tables, per program.

The train stage runs the same `question_evaluation` before fitting the next-call model; on the
full config that model is most of the stage's 28 minutes, and the questions' figures do not
depend on it. This script gives those figures alone, for a config and a root, so that a change
to a predictor or a counter is measured on the full night's data in minutes.

    .venv/bin/python studies/questions/questions.py --root R [--config configs/train.yaml] \
        [--out studies/questions/questions.json]

Prints each question's line per table and the per-program verdicts of the unseen programs
(tasks/learning/questions/reuse.py program_lines), and writes every score (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tasks.core.storage import Root
from tasks.dataset.frame_tokens import read_run_stacks
from tasks.learning.questions.reuse import program_lines, question_lines
from tasks.learning.split import load_split, question_events
from tasks.learning.train_config import load_train_config

PROJECT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--config", default=str(PROJECT / "configs/train.yaml"))
    ap.add_argument("--out", default=str(PROJECT / "studies/questions/questions.json"))
    ap.add_argument("--network-out", default=None, help="save the questions' network (.keras)")
    a = ap.parse_args(argv)

    # deferred: TensorFlow's start-up
    from tasks.learning.questions.evaluation import question_evaluation

    cfg = load_train_config(a.config)
    root = Root.from_url(a.root)
    split = load_split(root, cfg.data)
    t0 = time.perf_counter()
    events = question_events(root, split.question_runs(), cfg.data.max_eval_tokens)
    frames = read_run_stacks(root, split.question_runs(), cfg.data.frame_depth)
    q = question_evaluation(split, events, cfg.questions, cfg.seed, frames=frames)
    seconds = time.perf_counter() - t0
    scores = list(q.scores)
    if a.network_out and q.network is not None:
        q.network.model.save(a.network_out)
    for line in question_lines(scores, q.agreement):
        print(line)
    for line in program_lines(scores):
        print(line)
    out = {
        "command": "studies/questions/questions.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.node(),
        "root": a.root,
        "config": a.config,
        "seconds": round(seconds, 1),
        "network_train_calls": q.network.train_calls if q.network else None,
        "network_seconds": round(q.network.seconds, 1) if q.network else None,
        "programs": program_lines(scores),
        "agreement": [asdict(x) for x in q.agreement],
        "scores": [asdict(s) for s in scores],
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"{seconds:.0f} s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
