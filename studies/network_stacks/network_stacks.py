"""The questions' network with and without the stack (issue 65, "the network reads the stack" and
"knowledge a counter cannot have"), side by side in one run.

One split of the data root (tasks/learning/split.py plan_split: the named workloads held out,
the others trained on their first run and scored on their last), one training set, one seed,
one budget; two networks (tasks/learning/questions/network.py): `stacks` reads each call's
frames (tasks/dataset/frame_tokens.py), `no stacks` is the same network with the frame inputs
all padding (what a trace without stacks gives it). Each is scored as question_evaluation
scores it (the counters, the network, network_survival, process_prior and network_hedged) in:

- unseen_runs / unseen_programs / heldout_workloads: each evaluation run's first --rows calls
  (head_rows, as data.max_eval_tokens caps a night's runs);
- cold start: each held-out run's first --cold calls of every process (no counter has learnt
  anything yet), with the goal's verdict per (program, question): network_hedged strictly ahead
  of every counter and the majority in top-1 and log-loss (reuse.hedged_cells).

Usage (the figures of studies/network_stacks/README.md):

    .venv/bin/python studies/network_stacks/network_stacks.py --root data \\
        --heldout git,numpy_stack,perl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.events_reader import read_stack_frames  # noqa: E402
from tasks.dataset.frame_tokens import RunStacks  # noqa: E402
from tasks.dataset.token_runs import head_rows, list_runs  # noqa: E402
from tasks.learning.evaluate import HELDOUT_WORKLOADS, UNSEEN_PROGRAMS, UNSEEN_RUNS  # noqa: E402
from tasks.learning.labels import process_order  # noqa: E402
from tasks.learning.questions.lifetime import QUESTIONS as LIFETIME_QUESTIONS  # noqa: E402
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_majority  # noqa: E402
from tasks.learning.questions.reuse import (  # noqa: E402
    QUESTION,
    hedged_cells,
    majority_of,
    read_events,
    reuse_answers,
    score_answers,
)
from tasks.learning.split import plan_split  # noqa: E402
from tasks.learning.train_config import DataConfig, QuestionsConfig  # noqa: E402
from tasks.replay.workloads import load_catalog  # noqa: E402

RESULTS = Path(__file__).resolve().parent
COLD = "cold_start"
ARMS = ("no_stacks", "stacks")
SHOWN = ("majority", "class_online", "site_online", "site_survival", "network", "network_hedged")


def plan(root: Root, heldout: list[str]) -> dict[str, list[tuple[str, str]]]:
    """{table: [(workload, run)]} and "train", by the project's split rule."""
    available = list_runs(root)
    catalog = load_catalog(None).programs()
    roles = plan_split(
        available, DataConfig(heldout_workloads=heldout), {w: catalog.get(w, w) for w in available}
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for name, role in (
        ("train", "train"),
        (UNSEEN_RUNS, "evaluation"),
        (UNSEEN_PROGRAMS, "unseen"),
        (HELDOUT_WORKLOADS, "heldout"),
    ):
        out[name] = [(w, r) for w, rs in sorted(roles.items()) for r in rs[role]]
    return out


def first_calls_of_each_process(table: pa.Table, calls: int) -> pa.Table:
    """The rows among each process's first `calls` calls (process call order), in table order."""
    order, starts = process_order(table)
    first = np.flatnonzero(starts)
    position = np.arange(len(order)) - first[np.cumsum(starts) - 1]
    return table.take(np.sort(order[position < calls]))


def run_answers(t: pa.Table, frames, nets: dict, majority, life_maj, depth: int) -> dict:
    """{arm: {question: answers}} on one run: the counters' (computed once, the same in both
    arms) and each arm's network, with the process prior, before the hedge (hedge_run)."""
    from tasks.learning.questions.evaluation import _network_answers  # the evaluation's own
    from tasks.learning.questions.network import question_inputs

    counters = {QUESTION: reuse_answers(t, majority), **lifetime_answers(t, life_maj)}
    out = {}
    for arm, net in nets.items():
        answers = {q: dataclasses.replace(a, probs=dict(a.probs)) for q, a in counters.items()}
        stacks = RunStacks.of(frames, depth) if arm == "stacks" else None
        inputs = question_inputs(t, answers, stacks)
        _network_answers(t, answers, net.answer(inputs), majority, life_maj)
        out[arm] = answers
    return out


# --share: the questions whose hedge shares back to the process's past (hedge.hedged): the
# product's (reuse only), none (every share even, the hedge before 2026-12-02) or every one
SHARES = {"reuse": (QUESTION,), "even": (), "past": (QUESTION, *LIFETIME_QUESTIONS)}


def hedge_run(kept: dict, share: str = "reuse") -> None:
    """network_hedged beside each arm's answers of one kept run, as question_evaluation
    hedges them (with `share`: SHARES)."""
    from tasks.learning.questions.evaluation import hedge_answers

    for answers in kept["arms"].values():
        hedge_answers(
            kept["order"], kept["starts"], kept["sites"], *kept["classes"], answers, SHARES[share]
        )


def train(root, runs, rows: int, cfg: QuestionsConfig, depth: int, seed: int):
    """(the two networks, the majorities, seconds): trained on the same calls, seed, budget."""
    from tasks.learning.questions.network import question_inputs, train_network

    events = [head_rows(read_events(root, w, r), rows) for w, r in runs]
    majority, life_maj = majority_of(events), lifetime_majority(events)
    inputs = []
    for t, (w, r) in zip(events, runs, strict=True):
        answers = {QUESTION: reuse_answers(t, majority), **lifetime_answers(t, life_maj)}
        stacks = RunStacks.of(read_stack_frames(root, w, r), depth)
        inputs.append(question_inputs(t, answers, stacks))
    blind = [dataclasses.replace(i, stack_rows=None, stack_tokens=None) for i in inputs]
    nets, seconds = {}, {}
    for arm, data in (("no_stacks", blind), ("stacks", inputs)):
        nets[arm] = train_network(data, cfg, seed)
        seconds[arm] = round(nets[arm].seconds, 1)
        print(f"trained {arm}: {nets[arm].seconds:.0f} s", file=sys.stderr)
    return nets, majority, life_maj, seconds, sum(len(i.order) for i in inputs)


def answer_runs(
    root: Root,
    heldout: list[str],
    rows: int,
    cold: int,
    cfg: QuestionsConfig,
    depth: int,
    seed: int,
) -> dict:
    """Both arms trained, and every evaluation run's answers before the hedge: {"split",
    "train_calls", "train_seconds", "positions", "runs": {table: [kept run]}}, a kept run being
    {"workload", "order", "starts", "sites", "classes", "arms": {arm: {question: answers}}}."""
    from tasks.learning.labels import request_and_free_classes
    from tasks.learning.questions.reuse import call_sites

    roles = plan(root, heldout)
    nets, majority, life_maj, seconds, calls = train(root, roles["train"], rows, cfg, depth, seed)
    positions: dict[str, int] = {}
    kept: dict[str, list] = {}
    for table in (UNSEEN_RUNS, UNSEEN_PROGRAMS, HELDOUT_WORKLOADS, COLD):
        runs = roles[UNSEEN_PROGRAMS] + roles[HELDOUT_WORKLOADS] if table == COLD else roles[table]
        for w, r in runs:
            whole = read_events(root, w, r)
            t = (
                first_calls_of_each_process(whole, cold)
                if table == COLD
                else head_rows(whole, rows)
            )
            positions[f"{table}/{w}/{r}"] = t.num_rows
            order, starts = process_order(t)
            kept.setdefault(table, []).append({
                "workload": w, "order": order, "starts": starts, "sites": call_sites(t),
                "classes": request_and_free_classes(t),
                "arms": run_answers(t, read_stack_frames(root, w, r), nets, majority, life_maj,
                                    depth),
            })  # fmt: skip
            print(f"{table} {w}/{r}: {t.num_rows} calls", file=sys.stderr)
    return {
        "split": roles,
        "train_calls": calls,
        "train_seconds": seconds,
        "positions": positions,
        "runs": kept,
    }


def study(answered: dict, share: str = "reuse") -> dict:
    """The kept runs (answer_runs) hedged and scored: every table's scores per arm, and the
    cold start's verdicts per (program, question)."""
    scores: dict[str, list] = {arm: [] for arm in ARMS}
    for table, runs in answered["runs"].items():
        by: dict[str, dict[str, dict[str, list]]] = {arm: {} for arm in ARMS}
        for kept in runs:
            hedge_run(kept, share)
            for arm, answers in kept["arms"].items():
                for q, a in answers.items():
                    by[arm].setdefault(q, {}).setdefault(kept["workload"], []).append(a)
        for arm in ARMS:
            for q, per_w in by[arm].items():
                for w, answers in per_w.items():
                    scores[arm] += score_answers(answers, table, w, q)
    return {
        **{k: answered[k] for k in ("split", "train_calls", "train_seconds", "positions")},
        "scores": {arm: [dataclasses.asdict(s) for s in got] for arm, got in scores.items()},
        "cold_cells": {
            arm: [dataclasses.asdict(c) for c in hedged_cells(got, COLD)]
            for arm, got in scores.items()
        },
    }


def _index(result: dict) -> dict:
    """{(arm, table, program, question, predictor): (top1, log_loss, positions)}."""
    return {
        (arm, s["table"], s["slice"], s["question"], s["predictor"]): s
        for arm, rows in result["scores"].items()
        for s in rows
    }


def markdown(result: dict, command: str) -> str:
    """The README's tables: per table, program and question, each predictor's top-1 / log-loss,
    the network's and the hedge's in both arms; then the cold start's verdicts."""
    idx = _index(result)
    lines = [f"`{command}`", "", f"Trained on {result['train_calls']:,} calls "
             f"({', '.join(f'{w}/{r}' for w, r in result['split']['train'])}); seconds: "
             f"{result['train_seconds']}.", ""]  # fmt: skip
    cells = sorted({k[1:4] for k in idx})
    for table in (UNSEEN_RUNS, UNSEEN_PROGRAMS, HELDOUT_WORKLOADS, COLD):
        rows = [c for c in cells if c[0] == table]
        if not rows:
            continue
        lines += [f"### {table}: top-1 / log-loss", "",
                  "| program | question | calls | " + " | ".join(SHOWN[:4]) +
                  " | network: no stacks | network: stacks | hedged: no stacks | hedged: stacks |",
                  "|---" * 10 + "|"]  # fmt: skip
        for _, prog, q in rows:
            base = [idx.get(("stacks", table, prog, q, p)) for p in SHOWN[:4]]
            arms = [idx.get((a, table, prog, q, p)) for p in SHOWN[4:] for a in ARMS]
            n = next(s["positions"] for s in base + arms if s)
            lines.append(
                f"| {prog} | {q} | {n:,} | " + " | ".join(_cell(s) for s in base + arms) + " |"
            )
        lines.append("")
    for arm in ARMS:
        got = result["cold_cells"][arm]
        ahead = [c for c in got if c["top1_ahead"] and c["log_loss_ahead"]]
        worse = [f"{c['program']} {c['question']}" for c in got if c["below_majority"]]
        lines.append(
            f"Cold start, {arm}: network_hedged ahead of every counter in both on {len(ahead)} of "
            f"{len(got)} cells (top-1 on {sum(c['top1_ahead'] for c in got)}, log-loss on "
            f"{sum(c['log_loss_ahead'] for c in got)}); worse than the majority: "
            f"{', '.join(worse) or 'none'}."
        )
    return "\n".join(lines) + "\n"


def _cell(s: dict | None) -> str:
    return "-" if s is None else f"{s['top1']:.3f} / {s['log_loss']:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="the data root (read only)")
    p.add_argument("--heldout", default="git,numpy_stack,perl", help="workloads held out")
    p.add_argument("--rows", type=int, default=100_000, help="first calls of each run (head_rows)")
    p.add_argument("--cold", type=int, default=65_536, help="first calls of each process (cold)")
    p.add_argument("--units", type=int, default=48)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--depth", type=int, default=8, help="frames a call (data.frame_depth)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="network_stacks")
    p.add_argument(
        "--keep", type=Path, help="pickle the answers before the hedge here (for --answers)"
    )
    p.add_argument(
        "--answers", type=Path, help="hedge and score the answers --keep pickled (no training)"
    )
    p.add_argument(
        "--share",
        choices=sorted(SHARES),
        default="reuse",
        help="whose hedge shares back to the process's past (reuse: the product's)",
    )
    a = p.parse_args(argv)
    cfg = QuestionsConfig(units=a.units, epochs=a.epochs)
    t0 = time.perf_counter()
    if a.answers is not None:
        answered = pickle.loads(a.answers.read_bytes())
    else:
        answered = answer_runs(
            Root.from_url(a.root), a.heldout.split(","), a.rows, a.cold, cfg, a.depth, a.seed
        )
        if a.keep is not None:
            a.keep.write_bytes(pickle.dumps(answered, protocol=pickle.HIGHEST_PROTOCOL))
    result = study(answered, a.share)
    result["seconds"] = round(time.perf_counter() - t0)
    result["config"] = cfg.model_dump()
    command = "python studies/network_stacks/network_stacks.py " + " ".join(argv or sys.argv[1:])
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{a.name}.md").write_text(markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
