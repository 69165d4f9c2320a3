"""The scaling study: the next-call network on more training programs and a bigger model.

    .venv/bin/python studies/scaling/scaling.py --root DATA_ROOT
    scripts/gpu_check.sh scaling-device SECONDS [THESE OPTIONS]    # on a lent GPU machine

Given a data root with an events dataset, trains configs/train-quick.yaml (or --config) on the
first N programs of a seeded schedule that mixes kinds (`program_schedule`), N in --programs,
and at each of --sizes, each point to early stopping under --epochs, nothing registered; scores
every point on the same positions of configs/train.yaml's held-out programs: next call and,
unless --no-questions, the allocator's questions, beside every baseline. Keras 3 only: the same
command runs on a GPU. Writes studies/scaling/scaling.{json,md,png}; `--render-only`
redraws from the JSON. The points, the options and what the curve shows:
docs/scaling.md#the-scaling-study.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

DEFAULT_PROGRAMS = ("2", "4", "8", "16", "all")
DEFAULT_SIZES = ("32/16", "64/32")
OUT_DIR = PROJECT / "studies" / "scaling"
NAME = "scaling"
# the allocator's questions the table shows, and their baselines (tasks/learning/questions/reuse.py)
QUESTIONS = ("reuse", "lifetime_calls")
QUESTION_BASELINES = ("majority", "class_online", "site_online", "site_survival")
# a (program, question) cell's verdict: network_hedged strictly ahead of every baseline in
# (top-1, log-loss)
VERDICTS = {
    (True, True): "ahead",
    (True, False): "top-1 only",
    (False, True): "log-loss only",
    (False, False): "behind",
}


class ScalingError(ValueError):
    """The root cannot hold the study: says what is missing and what to run."""


@dataclass(frozen=True)
class Size:
    """One model size: the recurrent layers' units and the context (None: the config's)."""

    units: tuple[int, ...]
    context: int | None = None

    @property
    def label(self) -> str:
        return "/".join(map(str, self.units)) + (f"@{self.context}" if self.context else "")


def parse_size(text: str) -> Size:
    """`64/32` (two layers, the config's context) or `64/32@200` (context 200)."""
    units, _, context = text.partition("@")
    try:
        size = Size(tuple(int(u) for u in units.split("/")), int(context) if context else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: UNITS[/UNITS...][@CONTEXT], e.g. 64/32 or 128/64@200"
        ) from None
    if not size.units or min(size.units) < 1 or (size.context is not None and size.context < 2):
        raise argparse.ArgumentTypeError(f"size {text!r}: units >= 1, context >= 2")
    return size


def program_counts(requested: list[str], available: int) -> list[int]:
    """The distinct numbers of training programs, ascending: `all` is `available`, a number
    above it is capped to it, a number below 2 is an error (cross-fitting needs two)."""
    counts = set()
    for r in requested:
        if r == "all":
            n = available
        else:
            try:
                n = int(r)
            except ValueError:
                raise ScalingError(f"--programs {r!r}: a number or `all`") from None
            if n < 2:
                raise ScalingError(f"--programs {r}: at least 2 training programs a point")
        counts.add(min(n, available))
    return sorted(counts)


def program_schedule(kinds: dict[str, str], seed: int) -> list[str]:
    """Every program of `kinds` ({program: kind}) in a fixed, seeded order that mixes kinds:
    each kind's programs shuffled, the kinds shuffled, then one program of each kind in turn
    (round robin) until none is left. The first N programs of the schedule are point N's, so
    every point's programs include the previous point's."""
    rng = random.Random(seed)
    by_kind: dict[str, list[str]] = {}
    for program in sorted(kinds):
        by_kind.setdefault(kinds[program], []).append(program)
    order = sorted(by_kind)
    rng.shuffle(order)
    for k in order:
        rng.shuffle(by_kind[k])
    schedule: list[str] = []
    while any(by_kind.values()):
        for k in order:
            if by_kind[k]:
                schedule.append(by_kind[k].pop(0))
    return schedule


@dataclass(frozen=True)
class Inventory:
    """What the root holds for the study: {program: its workloads with 2+ runs}, each program's
    kind, and the held-out programs present (with their workloads)."""

    programs: dict[str, list[str]]
    kinds: dict[str, str]
    heldout: dict[str, list[str]]
    heldout_absent: list[str]

    def workloads(self, programs: list[str]) -> list[str]:
        return sorted(w for p in programs for w in self.programs[p])


def inventory(root, catalog, heldout_programs: list[str], root_arg: str) -> Inventory:
    """Read the root's events dataset; ScalingError names what is missing and what to run."""
    from tasks.dataset.events_reader import EventsNotFound
    from tasks.dataset.token_runs import list_runs

    replay = (
        f"`heapcast replay --root {root_arg} [WORKLOAD...]` then "
        f"`heapcast dataset --root {root_arg}`"
    )
    try:
        runs = list_runs(root)
    except EventsNotFound:
        runs = {}
    if not runs:
        raise ScalingError(
            f"{root_arg}: no events dataset (<root>/events/workload=*/run=*/); run {replay}"
        )
    programs_of = catalog.programs()
    kind_of = {w.name: w.kind or "other" for w in catalog.workloads}
    heldout: dict[str, list[str]] = {}
    programs: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    for w in sorted(runs):
        p = programs_of.get(w, w)
        if p in heldout_programs:
            heldout.setdefault(p, []).append(w)
        elif len(runs[w]) >= 2:  # one run cannot be evaluated on an unseen run of itself
            programs.setdefault(p, []).append(w)
            # the kind of the workload named after the program, else of its first workload
            if p not in kinds or w == p:
                kinds[p] = kind_of.get(w, "other")
    absent = [p for p in heldout_programs if p not in heldout]
    if not heldout:
        wanted = sorted(w for w, p in programs_of.items() if p in heldout_programs)
        raise ScalingError(
            f"{root_arg}: none of the held-out programs {heldout_programs} "
            f"(configs/train.yaml data.heldout_programs) is in the events dataset; replay "
            f"some of their workloads ({', '.join(wanted)}): {replay}"
        )
    if len(programs) < 2:
        raise ScalingError(
            f"{root_arg}: {len(programs)} training program(s) with two runs or more "
            f"({sorted(programs)}); the study needs 2 or more besides the held-out ones: "
            f"run {replay} for more workloads (their small and medium inputs)"
        )
    return Inventory(programs, kinds, heldout, absent)


def point_overrides(
    workloads: list[str],
    heldout_programs: list[str],
    size: Size,
    *,
    epochs: int,
    patience: int | None,
    steps_per_epoch: int | None,
    tokens_per_run: int | None,
    validation_tokens: int | None,
    eval_tokens: int | None,
    checkpoint_dir: str,
) -> dict[str, Any]:
    """The config overrides of one point: its training workloads, the held-out programs (no
    held-out workloads: the unseen-programs table is the same for every point), the size."""
    out: dict[str, Any] = {
        "data": {
            "workloads": workloads,
            "heldout_workloads": [],
            "heldout_programs": heldout_programs,
            "runs": {},
            # per run: load_split splits max_train_tokens evenly among the training runs
            "max_train_tokens": None if tokens_per_run is None else tokens_per_run * len(workloads),
            "max_eval_tokens": eval_tokens,
            "min_eval_positions": 0,
        },
        "model": {"units": list(size.units)},
        "epochs": epochs,
        # an epoch of the same steps at every point (None: one pass over the training chunks,
        # a few steps on two programs' data, hundreds on all of them)
        "steps_per_epoch": steps_per_epoch,
        "checkpoint_dir": checkpoint_dir,
    }
    if validation_tokens is not None:
        out["data"]["max_validation_tokens"] = validation_tokens
    if size.context:
        out["context"] = size.context
    if patience is not None:
        out["patience"] = patience
    return out


def next_call_scores(evaluation, table: str) -> dict[str, dict[str, float]]:
    """{predictor: {top1, top5, log_loss, positions}} on `table`, all slices pooled."""
    from tasks.learning.scores import OVERALL

    return {
        s.predictor: {
            "top1": round(s.top1, 4),
            "top5": round(s.top5, 4),
            "log_loss": round(s.log_loss, 4),
            "positions": s.positions,
        }
        for s in evaluation.scores
        if s.table == table and s.slice == OVERALL
    }


def question_scores(
    scores, table: str, slice: str | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """{question: {predictor: {top1, log_loss, positions}}} on `table`, one slice (a workload;
    None: all slices pooled)."""
    from tasks.learning.scores import OVERALL

    slice = OVERALL if slice is None else slice
    out: dict[str, dict[str, dict[str, float]]] = {}
    for s in scores:
        if s.table == table and s.slice == slice:
            out.setdefault(s.question, {})[s.predictor] = {
                "top1": round(s.top1, 4),
                "log_loss": round(s.log_loss, 4),
                "positions": s.positions,
            }
    return out


def top1_headroom(runs: list, kept: list, baselines) -> dict[str, Any]:
    """The top-1 headroom (tasks/learning/nextcall/headroom.py) on `runs` (the held-out programs'),
    pooled and per program: the counter's and the network's top-1 (the network's from `kept`,
    evaluate_model's RunAnswers), their agreement, each right alone, the better of the two and the
    hindsight n-gram (both optimistic bounds)."""
    # deferred: the study's top stays free of the project's modules (--render-only)
    from tasks.dataset.token_runs import eval_positions
    from tasks.learning.nextcall.headroom import Headroom, hindsight_top1

    per: dict[str, Any] = {}
    for run in runs:
        pos = eval_positions(run)
        tops = [a.top_for(run) for a in kept if a.key == (run.workload, run.run)]
        top = next((t for t in tops if t is not None), None)
        if not len(pos) or top is None:
            continue
        counter = baselines.online.predict(run, pos).top[:, 0]
        hindsight = hindsight_top1(run, pos, baselines.online.orders)
        here = Headroom.of(run.tokens[pos], counter, top[:, 0], hindsight)
        per[run.workload] = per.get(run.workload, Headroom()) + here
    pooled = sum(per.values(), Headroom())
    return {"pooled": pooled.rates(), "by_program": {w: h.rates() for w, h in sorted(per.items())}}


def inputs_key(cfg) -> str:
    """What a point's training inputs (tokens, n-gram and online features) depend on: the data,
    the model's feature settings, the context (cross-fitting's blocks) and the seed; not the
    recurrent layers' units."""
    model = cfg.model.model_dump(mode="json", exclude={"units"})
    return json.dumps([cfg.data.model_dump(mode="json"), model, cfg.context, cfg.seed])


def by_workload(evaluation, table: str) -> dict[str, dict[str, dict[str, float]]]:
    """{workload or `all`: {predictor: {top1, top5, log_loss, positions}}} on `table`: the
    network, the online counter and their per-thread mixture with the majority (model_hedged,
    tasks/learning/nextcall/hedge.py), as evaluate_model scored them."""
    from tasks.learning.scores import HEDGED_NEXT, MODEL, ONLINE_COUNTER

    out: dict[str, dict[str, dict[str, float]]] = {}
    for s in evaluation.scores:
        if s.table == table and s.predictor in (MODEL, ONLINE_COUNTER, HEDGED_NEXT):
            out.setdefault(s.slice, {})[s.predictor] = {
                "top1": round(s.top1, 4),
                "top5": round(s.top5, 4),
                "log_loss": round(s.log_loss, 4),
                "positions": s.positions,
            }
    return out


def run_point(
    root,
    cfg,
    questions: dict[tuple, dict] | None,
    unseen_runs: bool,
    inputs: dict[str, tuple] | None = None,
    question_tokens: int | None = None,
) -> dict[str, Any]:
    """Train and score one point; its figures. The unseen-runs table (the training programs'
    other runs: not the same positions from point to point) only with `unseen_runs`. The
    allocator's questions unless `questions` is None: their network is its own (the config's
    `questions` section), the same at every size, so a point whose programs an earlier point
    had takes that point's figures from `questions` ({workloads: figures}). `inputs` keeps the
    split and the training inputs of the last key (`inputs_key`): the sizes at the same programs
    reuse them (cross-fitting tens of millions of calls takes minutes of one core).
    `question_tokens`: the first calls of each run the questions score (None: all of them)."""
    import numpy as np

    from tasks.dataset.token_runs import eval_positions
    from tasks.learning.evaluate import UNSEEN_PROGRAMS, UNSEEN_RUNS
    from tasks.learning.nextcall.fitting import fit_inputs, placement_facts
    from tasks.learning.nextcall.training import evaluate_model

    split, fitted, load_s, features_s = split_and_inputs(root, cfg, unseen_runs, inputs)
    t0 = time.perf_counter()
    model, facts = fit_inputs(cfg, fitted, Path(cfg.checkpoint_dir), verbose=0)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    kept: list = []
    evaluation, baselines = evaluate_model(model, cfg, split, kept)
    eval_s = time.perf_counter() - t0
    history = facts["history"]
    val = history.get("val_loss") or history.get("loss") or []
    point: dict[str, Any] = {
        "train_runs": [f"{r.workload}/{r.run}" for r in split.train],
        "train_tokens": split.train_tokens,
        "validation_tokens": sum(r.n_tokens for r in split.validation),
        "unseen_program_runs": [f"{r.workload}/{r.run}" for r in split.unseen_programs],
        "unseen_program_positions": int(sum(len(eval_positions(r)) for r in split.unseen_programs)),
        "epochs_run": len(val),
        "best_epoch": (min(range(len(val)), key=val.__getitem__) + 1) if val else None,
        "best_val_loss": round(min(val), 4) if val else None,
        "max_epochs": cfg.epochs,
        # the trainable weights: the n-gram table inside the hybrid is weights too, not learned
        "params": int(sum(np.prod(w.shape) for w in model.trainable_weights)),
        "steps_per_epoch": facts["steps_per_epoch"],
        "placement": placement_facts(facts["placement"], facts["batch_size"]),
        "predictions_per_second": round(facts["predictions_per_second"]),
        "seconds": {
            "load": round(load_s, 1),
            "features": round(features_s, 1),
            "train": round(train_s, 1),
            "evaluate": round(eval_s, 1),
        },
        "next_call": {"unseen_programs": next_call_scores(evaluation, UNSEEN_PROGRAMS)},
        # per held-out workload and pooled: the network, the counter, their mixture
        "next_call_by_workload": by_workload(evaluation, UNSEEN_PROGRAMS),
        # how far a top-1 could go past the counter's there, and how much the network took
        "top1_headroom": top1_headroom(split.unseen_programs, kept, baselines),
    }
    if unseen_runs:
        point["next_call"]["unseen_runs"] = next_call_scores(evaluation, UNSEEN_RUNS)
    key = tuple(cfg.data.workloads or ())
    if questions is not None and key in questions:
        point["questions"] = {**questions[key], "same_as_the_point_with_these_programs": True}
    elif questions is not None:
        t0 = time.perf_counter()
        point["questions"] = point_questions(root, split, cfg, question_tokens, unseen_runs)
        point["seconds"]["questions"] = round(time.perf_counter() - t0, 1)
        questions[key] = point["questions"]
    return point


def split_and_inputs(root, cfg, unseen_runs: bool, inputs: dict[str, tuple] | None):
    """The split and its training inputs, taken from `inputs` where the last point had the same
    key (`inputs_key`); (split, inputs, load seconds, features seconds)."""
    import dataclasses

    from tasks.learning.nextcall.training import training_inputs
    from tasks.learning.split import load_split

    key = inputs_key(cfg)
    if inputs is not None and key in inputs:
        split, fitted = inputs[key]
        return split, fitted, 0.0, 0.0
    t0 = time.perf_counter()
    split = load_split(root, cfg.data)
    if not unseen_runs:
        split = dataclasses.replace(split, evaluation=[])
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fitted = training_inputs(cfg, split)
    features_s = time.perf_counter() - t0
    if inputs is not None:
        inputs.clear()  # one set held at a time: tens of millions of calls each
        inputs[key] = (split, fitted)
    return split, fitted, load_s, features_s


def point_questions(root, split, cfg, question_tokens: int | None, unseen_runs: bool) -> dict:
    """The allocator's questions at a point: pooled on the unseen programs, per held-out program
    with the goal's verdict on each (program, question) cell, and on the unseen runs if asked."""
    import dataclasses

    from tasks.dataset.frame_tokens import read_run_stacks
    from tasks.learning.evaluate import UNSEEN_PROGRAMS, UNSEEN_RUNS
    from tasks.learning.questions.evaluation import question_evaluation
    from tasks.learning.questions.reuse import hedged_cells
    from tasks.learning.split import question_events

    events = question_events(root, split.question_runs(), question_tokens)
    frames = read_run_stacks(root, split.question_runs(), cfg.data.frame_depth)
    q = question_evaluation(split, events, cfg.questions, cfg.seed, frames=frames)
    out = {
        "unseen_programs": question_scores(q.scores, UNSEEN_PROGRAMS),
        "by_program": {
            w: question_scores(q.scores, UNSEEN_PROGRAMS, w)
            for w in sorted({r.workload for r in split.unseen_programs})
        },
        "hedged_cells": [
            dataclasses.asdict(c) for c in hedged_cells(list(q.scores), UNSEEN_PROGRAMS)
        ],
    }
    if unseen_runs:
        out["unseen_runs"] = question_scores(q.scores, UNSEEN_RUNS)
    return out


def plan_points(
    counts: list[int], sizes: list[Size], grid: str, base: Size
) -> list[tuple[int, Size]]:
    """(programs, size) of every point: the program axis at `base`, the size axis at the most
    programs (grid `axes`), or every pair (grid `full`); each once, in that order."""
    if grid == "full":
        pairs = [(n, s) for s in sizes for n in counts]
    else:
        pairs = [(n, base) for n in counts] + [(counts[-1], s) for s in sizes]
    out: list[tuple[int, Size]] = []
    for p in pairs:
        if p not in out:
            out.append(p)
    return out


# --- the files -----------------------------------------------------------------------------------


def markdown(doc: dict[str, Any]) -> str:
    """The table of scaling.md: one row per point, the unseen programs' figures."""
    r = doc["results"]
    lines = [
        "# Scaling: training programs and model size",
        "",
        f"`{doc['command']}`",
        "",
        f"Commit {str(doc['commit']['sha'])[:12]}{' (dirty)' if doc['commit']['dirty'] else ''}, "
        f"{doc['when']}, {doc['machine']['cpu']} ({doc['machine']['cores_usable']} cores), "
        f"backend {r['backend']}.",
        "",
        f"Held-out programs (never trained on, the same {r['unseen_program_positions']:,} "
        f"positions for every point): {', '.join(r['heldout_programs'])}"
        + (
            f"; absent from the root: {', '.join(r['heldout_absent'])}"
            if r["heldout_absent"]
            else ""
        )
        + ".",
        "",
        f"Program schedule (seed {r['seed']}): {', '.join(r['schedule'])}.",
        "",
        "Next call on the unseen programs: top-1 / top-5 / log-loss. Network hedged: the "
        "network, the online counter and the majority mixed per thread by what each predicted "
        "of the thread's calls so far, its top-5 the counter's list until the network's has "
        "led it in the thread (tasks/learning/nextcall/hedge.py; `-`: a point run before it). "
        "Epochs: run (best; `cap`: still improving when the --epochs cap stopped it).",
        "",
        "| programs | size | params | train tokens | epochs (best) | network | online counter "
        "| network hedged | n-gram | majority | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    for p in r["points"]:
        nc = p["next_call"]["unseen_programs"]
        lines.append(
            f"| {p['programs']} | {p['size']} | {p['params']:,} | {p['train_tokens']:,} "
            f"| {p['epochs_run']} ({p['best_epoch']}{_capped(p)}) | {_cell(nc.get('model'))} "
            f"| {_cell(nc.get('ngram_online'))} | {_cell(nc.get('model_hedged'))} "
            f"| {_cell(nc.get('ngram'))} "
            f"| {_cell(nc.get('majority'))} | {p['seconds']['train']:.0f} |"
        )
    last = r["points"][-1] if r["points"] else {}
    lines += workload_lines(last)
    lines += headroom_lines(last)
    lines += question_lines(r)
    lines += question_cell_lines(r["points"])
    lines.append("")
    return "\n".join(lines)


def _capped(p: dict) -> str:
    # still improving at the last epoch the cap allowed: not converged
    return ", cap" if p["best_epoch"] == p["epochs_run"] == p["max_epochs"] else ""


def _cell(s: dict | None) -> str:
    return "-" if not s else f"{s['top1']:.3f} / {s['top5']:.3f} / {s['log_loss']:.3f}"


def workload_lines(last: dict) -> list[str]:
    """The last point's next-call figures per held-out workload (a point run before them: none)."""
    by_workload = {k: v for k, v in last.get("next_call_by_workload", {}).items() if k != "all"}
    if not by_workload:
        return []
    lines = [
        "",
        f"Per held-out workload, the last point ({last['programs']} programs, "
        f"{last['size']}): top-1 / top-5 / log-loss.",
        "",
        "| workload | positions | network | online counter | network hedged |",
        "|---|---|---|---|---|",
    ]
    for w, preds in sorted(by_workload.items()):
        lines.append(
            f"| {w} | {preds['model']['positions']:,} | {_cell(preds.get('model'))} "
            f"| {_cell(preds.get('ngram_online'))} | {_cell(preds.get('model_hedged'))} |"
        )
    return lines


def question_lines(r: dict) -> list[str]:
    """Every point's allocator questions on the unseen programs: the network, the hedged
    network and the best baseline (none where no point scored them)."""
    if not any("questions" in p for p in r["points"]):
        return []
    # a result from before --question-tokens scored the questions on the next call's window
    window = r.get("question_tokens", r["eval_tokens"])
    lines = [
        "",
        "Allocator questions on the unseen programs ("
        + (f"the first {window:,} calls of each run" if window else "every call")
        + "): top-1 / log-loss of the question "
        "network, of the network hedged with the online counters (network_hedged, what "
        "the layer's table is distilled from) and of the best baseline (majority, "
        "class_online, site_online, site_survival; by top-1). Every predictor is in "
        "scaling.json. The questions' network is its own (the config's `questions` "
        "section), the same at every size of the next-call network: its rows change with "
        "the programs only.",
        "",
        "| programs | size | reuse: network | reuse: hedged | reuse: best baseline "
        "| lifetime (calls): network | lifetime (calls): hedged "
        "| lifetime (calls): best baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in r["points"]:
        q = p.get("questions", {}).get("unseen_programs", {})
        cells = []
        for question in QUESTIONS:
            preds = q.get(question, {})
            net, hedged = preds.get("network"), preds.get("network_hedged")
            others = {k: v for k, v in preds.items() if k in QUESTION_BASELINES}
            best = max(others.items(), key=lambda kv: kv[1]["top1"], default=None)
            for x in (net, hedged):
                cells.append("-" if not x else f"{x['top1']:.3f} / {x['log_loss']:.3f}")
            cells.append(
                "-" if not best else f"{best[0]} {best[1]['top1']:.3f} / {best[1]['log_loss']:.3f}"
            )
        lines.append(f"| {p['programs']} | {p['size']} | " + " | ".join(cells) + " |")
    return lines


def headroom_lines(point: dict) -> list[str]:
    """The last point's top-1 headroom on the held-out programs (a point run before it: none)."""
    head = point.get("top1_headroom")
    if not head:
        return []
    lines = [
        "",
        f"Top-1 headroom on the held-out programs, the last point ({point['programs']} "
        "programs, " + point["size"] + "): the online counter's and the network's top-1, how "
        "often they agree, each right where the other is wrong, and two optimistic bounds "
        "(they read what no predictor has when it answers): the better of the two at every "
        "call (an oracle choosing between them) and the counter's back-off n-gram had it "
        "read the whole thread first (hindsight: the same contexts at every other call, "
        "before and after; tasks/learning/nextcall/headroom.py).",
        "",
        "| program | positions | counter | network | agree | counter alone | network alone "
        "| better of the two (bound) | hindsight n-gram (bound) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [*head["by_program"].items(), ("all", head["pooled"])]
    for w, h in rows:
        lines.append(
            f"| {w} | {h['positions']:,} | {h['counter']:.4f} | {h['network']:.4f} "
            f"| {h['agree']:.4f} | {h['counter_alone']:.4f} | {h['network_alone']:.4f} "
            f"| {h['better_of_two']:.4f} | {h['hindsight']:.4f} |"
        )
    return lines


def question_cell_lines(points: list[dict]) -> list[str]:
    """The last point with per-program questions: each (program, question) cell, network_hedged
    against the best baseline in each metric, and the tally of the questions' goal (ahead of every
    counter in top-1 and log-loss on >= 80% of the cells, never below the majority)."""
    last = next((p for p in reversed(points) if "hedged_cells" in p.get("questions", {})), None)
    if last is None:
        return []
    q = last["questions"]
    cells = q["hedged_cells"]
    lines = [
        "",
        f"Allocator questions per held-out program, the last point ({last['programs']} "
        "programs): network_hedged against the best baseline (majority, class_online, "
        "site_online, site_survival) in top-1 and in log-loss; `ahead`: strictly ahead of "
        "every baseline in both.",
        "",
        "| program | question | positions | hedged top-1 | best baseline top-1 | hedged log-loss "
        "| best baseline log-loss | majority log-loss | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        preds = q["by_program"][c["program"]][c["question"]]
        hedged = preds["network_hedged"]
        base = {k: v for k, v in preds.items() if k in QUESTION_BASELINES}
        t = max(base.items(), key=lambda kv: kv[1]["top1"])
        ll = min(base.items(), key=lambda kv: kv[1]["log_loss"])
        verdict = VERDICTS[(c["top1_ahead"], c["log_loss_ahead"])]
        if c["below_majority"]:
            verdict += ", worse than the majority"
        maj = base.get("majority", {}).get("log_loss")
        lines.append(
            f"| {c['program']} | {c['question']} | {c['positions']:,} | {hedged['top1']:.3f} "
            f"| {t[0]} {t[1]['top1']:.3f} | {hedged['log_loss']:.3f} "
            f"| {ll[0]} {ll[1]['log_loss']:.3f} | {'-' if maj is None else f'{maj:.3f}'} "
            f"| {verdict} |"
        )
    ahead = sum(c["top1_ahead"] and c["log_loss_ahead"] for c in cells)
    worse = [f"{c['program']} {c['question']}" for c in cells if c["below_majority"]]
    lines += [
        "",
        f"network_hedged ahead of every baseline in both on {ahead} of {len(cells)} cells "
        f"({ahead / max(len(cells), 1):.0%}; the goal: 80%); in top-1 on "
        f"{sum(c['top1_ahead'] for c in cells)}, in log-loss on "
        f"{sum(c['log_loss_ahead'] for c in cells)}. Log-loss worse than the majority's: "
        f"{', '.join(worse) if worse else 'none'}.",
    ]
    return lines


def plot(doc: dict[str, Any], path: Path) -> None:
    """scaling.png: top-1 and log-loss on the unseen programs against the training programs,
    one line per model size, the online counter and the majority dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = doc["results"]["points"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in (
        (axes[0], "top1", "next call top-1 (unseen programs)"),
        (axes[1], "log_loss", "next call log-loss (unseen programs)"),
    ):
        for size in dict.fromkeys(p["size"] for p in points):
            pts = sorted((p for p in points if p["size"] == size), key=lambda p: p["programs"])
            xs = [p["programs"] for p in pts]
            ax.plot(
                xs,
                [p["next_call"]["unseen_programs"]["model"][metric] for p in pts],
                "o-",
                label=f"network {size}",
            )
        by_n = {p["programs"]: p for p in points}
        xs = sorted(by_n)
        for pred, style in (("ngram_online", "k--"), ("ngram", "g:"), ("majority", "r:")):
            ys = [by_n[n]["next_call"]["unseen_programs"].get(pred, {}).get(metric) for n in xs]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, style, label={"ngram_online": "online counter"}.get(pred, pred))
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("training programs")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the command ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Results: <out-dir>/scaling.json, scaling.md, scaling.png.",
    )
    ap.add_argument("--root", help="data root with an events dataset (required to train)")
    ap.add_argument("--config", default=None, help="base config (default configs/train-quick.yaml)")
    ap.add_argument(
        "--override",
        default="{}",
        metavar="JSON",
        help="settings merged over the base config at every point, e.g. "
        '\'{"model": {"online_ranks": 5}}\' (the point\'s own settings win)',
    )
    ap.add_argument(
        "--heldout-config",
        default=None,
        help="where heldout_programs comes from (default configs/train.yaml)",
    )
    ap.add_argument(
        "--programs",
        nargs="+",
        default=list(DEFAULT_PROGRAMS),
        help="numbers of training programs, or `all` (default: %(default)s)",
    )
    ap.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        default=[parse_size(s) for s in DEFAULT_SIZES],
        metavar="UNITS[/UNITS][@CONTEXT]",
        help="model sizes (default: 32/16 64/32)",
    )
    ap.add_argument(
        "--grid",
        choices=("axes", "full"),
        default="axes",
        help="axes: programs at the first size, sizes at the most programs; full: every pair",
    )
    _training_arguments(ap)
    _scoring_arguments(ap)
    ap.add_argument("--seed", type=int, default=0, help="the program schedule's seed")
    ap.add_argument("--out-dir", default=str(OUT_DIR))
    ap.add_argument("--name", default=NAME, help="the files' name (default %(default)s)")
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite scaling.md and scaling.png from <out-dir>/scaling.json; train nothing "
        "(--root is not read)",
    )
    return ap


def _training_arguments(ap: argparse.ArgumentParser) -> None:
    """What each point trains for: epochs, steps, patience, the tokens it reads."""
    ap.add_argument("--epochs", type=int, default=12, help="max epochs a point (default 12)")
    ap.add_argument(
        "--steps-per-epoch",
        type=int,
        default=50,
        help="training steps an epoch, the same at every point; 0: one pass over the "
        "training chunks (default 50)",
    )
    ap.add_argument("--patience", type=int, default=None, help="default: the config's")
    ap.add_argument(
        "--tokens-per-run",
        type=int,
        default=80_000,
        help="cap on each training run's tokens, 0 for none (default 80000)",
    )
    ap.add_argument(
        "--validation-tokens",
        type=int,
        default=20_000,
        help="cap on each validation run's tokens (early stopping), 0 for the config's "
        "(default 20000)",
    )


def _scoring_arguments(ap: argparse.ArgumentParser) -> None:
    """What each point is scored on: the held-out calls, the questions, the unseen runs."""
    ap.add_argument(
        "--eval-tokens",
        type=int,
        default=50_000,
        help="first calls of each held-out run scored, 0 for all (default 50000)",
    )
    ap.add_argument("--no-questions", action="store_true", help="skip reuse/lifetime")
    ap.add_argument(
        "--question-tokens",
        type=int,
        default=1_000_000,
        help="first calls of each held-out run the allocator's questions score, 0 for all "
        "(default 1000000, the full night's: a block's lifetime past 65536 calls cannot be "
        "known inside a shorter window, so the online counters' answers there are a cold "
        "start's)",
    )
    ap.add_argument(
        "--unseen-runs",
        action="store_true",
        help="also score the training programs' unseen runs (a different table at each point)",
    )


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.epochs < 1:
        parser().error("--epochs: 1 or more")
    if a.render_only:
        return render_only(a)
    if not a.root:
        parser().error("--root is required (a data root with an events dataset)")

    from tasks.core.config import apply_embedded_defaults

    apply_embedded_defaults()
    from tasks.core.storage import Root
    from tasks.learning.nextcall.backend import backend_name
    from tasks.learning.train_config import (
        DEFAULT_CONFIG,
        QUICK_CONFIG,
        load_train_config,
        merged_settings,
    )

    base_path = a.config or QUICK_CONFIG
    override = parse_override(a.override)
    heldout_cfg = load_train_config(a.heldout_config or DEFAULT_CONFIG)
    root = Root.from_url(a.root)
    try:
        inv, schedule, points = study_plan(a, root, heldout_cfg)
    except ScalingError as e:
        print(f"bench_scaling: {e}", file=sys.stderr)
        return 2
    heldout = list(inv.heldout)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    question_tokens = a.question_tokens or None  # 0: every call
    results = results_header(a, base_path, override, inv, schedule, backend_name())
    questions: dict[tuple, dict] | None = None if a.no_questions else {}
    inputs: dict[str, tuple] = {}
    ckpt_base = Path(tempfile.mkdtemp(prefix="heapcast-scaling-"))
    t_all = time.perf_counter()
    try:
        for n, size in points:
            programs = schedule[:n]
            ckpt = ckpt_base / f"{n}-{size.label.replace('/', '_')}"
            overrides = point_settings(a, inv.workloads(programs), heldout, size, ckpt)
            cfg = load_train_config(base_path, merged_settings(override, overrides))
            t0 = time.perf_counter()
            point = {"programs": n, "size": size.label, "training_programs": programs}
            try:
                point.update(
                    run_point(root, cfg, questions, a.unseen_runs, inputs, question_tokens)
                )
            except (ValueError, MemoryError) as e:  # e.g. fewer chunks than one batch
                print(f"programs {n} size {size.label}: {e}", file=sys.stderr, flush=True)
                results.setdefault("failed", []).append({**point, "error": str(e)})
                continue
            point["seconds"]["total"] = round(time.perf_counter() - t0, 1)
            print_point(n, size, point)
            add_point(results, point)
            results["seconds"] = round(time.perf_counter() - t_all, 1)
            write(results, out_dir, argv, a.root, a.name)
    finally:
        shutil.rmtree(ckpt_base, ignore_errors=True)
    if not results["points"]:
        print("bench_scaling: no point trained; nothing written", file=sys.stderr)
        return 1
    results["seconds"] = round(time.perf_counter() - t_all, 1)
    write(results, out_dir, argv, a.root, a.name)
    drawn = f", {a.name}.png" if (out_dir / f"{a.name}.png").exists() else ""
    print(f"wrote {out_dir / (a.name + '.json')}, {a.name}.md{drawn}")
    return 0


def study_plan(a: argparse.Namespace, root, heldout_cfg):
    """What the root holds, the programs' schedule and the points to train, printed; (inventory,
    schedule, points). A root that cannot serve the study raises ScalingError."""
    from tasks.replay.workloads import load_catalog

    catalog = load_catalog(heldout_cfg.data.catalog)
    inv = inventory(root, catalog, list(heldout_cfg.data.heldout_programs), a.root)
    schedule = program_schedule(inv.kinds, a.seed)
    counts = program_counts(a.programs, len(schedule))
    points = plan_points(counts, a.sizes, a.grid, a.sizes[0])
    print(
        f"{len(schedule)} training programs, held out {list(inv.heldout)}"
        + (f" (absent: {inv.heldout_absent})" if inv.heldout_absent else "")
        + f"; {len(points)} points",
        flush=True,
    )
    return inv, schedule, points


def render_only(a: argparse.Namespace) -> int:
    """--render-only: the .md and .png again from the JSON in --out-dir."""
    path = Path(a.out_dir) / f"{a.name}.json"
    if not path.exists():
        print(f"bench_scaling: {path}: no results to render; run the study", file=sys.stderr)
        return 2
    render(json.loads(path.read_text()), Path(a.out_dir), a.name)
    return 0


def parse_override(text: str) -> dict:
    """--override: a JSON object of settings, or the parser's error."""
    try:
        override = json.loads(text)
    except json.JSONDecodeError as e:
        parser().error(f"--override: not JSON ({e})")
    if not isinstance(override, dict):
        parser().error("--override: a JSON object of settings, e.g. '{\"epochs\": 2}'")
    return override


def results_header(
    a: argparse.Namespace, base_path, override: dict, inv: Inventory, schedule: list[str], backend
) -> dict[str, Any]:
    """What every point shares, at the top of the JSON's results; the points follow."""
    question_tokens = a.question_tokens or None  # 0: every call
    return {
        "root": a.root,
        "config": str(base_path),
        "override": override,
        "backend": backend,
        "heldout_programs": list(inv.heldout),
        "heldout_absent": inv.heldout_absent,
        "seed": a.seed,
        "schedule": schedule,
        "kinds": {p: inv.kinds[p] for p in schedule},
        "epochs_cap": a.epochs,
        "steps_per_epoch": a.steps_per_epoch or None,
        "tokens_per_run": a.tokens_per_run or None,
        "validation_tokens": a.validation_tokens or None,
        "eval_tokens": a.eval_tokens or None,
        "question_tokens": None if a.no_questions else question_tokens,
        "grid": a.grid,
        "questions": not a.no_questions,
        "points": [],
    }


def point_settings(
    a: argparse.Namespace, workloads: list[str], heldout: list[str], size: Size, ckpt: Path
) -> dict:
    """A point's settings over the base config: its programs, its size, the run's budget."""
    return point_overrides(
        workloads,
        heldout,
        size,
        epochs=a.epochs,
        patience=a.patience,
        steps_per_epoch=a.steps_per_epoch or None,
        tokens_per_run=a.tokens_per_run or None,
        validation_tokens=a.validation_tokens or None,
        eval_tokens=a.eval_tokens or None,
        checkpoint_dir=str(ckpt),
    )


def add_point(results: dict[str, Any], point: dict) -> None:
    """A trained point into the results: every point is scored on the same held-out positions,
    or the study stops."""
    results["points"].append(point)
    positions = {p["unseen_program_positions"] for p in results["points"]}
    if len(positions) != 1:
        raise RuntimeError(f"the held-out positions differ between points: {positions}")
    results["unseen_program_positions"] = positions.pop()


def print_point(n: int, size: Size, point: dict) -> None:
    m = point["next_call"]["unseen_programs"]["model"]
    o = point["next_call"]["unseen_programs"]["ngram_online"]
    print(
        f"programs {n:3d} size {size.label:10s} epochs {point['epochs_run']:2d} "
        f"network top-1 {m['top1']:.4f} log-loss {m['log_loss']:.3f} | online counter "
        f"top-1 {o['top1']:.4f} log-loss {o['log_loss']:.3f} | {point['seconds']['total']:.0f} s",
        flush=True,
    )


def write(
    results: dict[str, Any], out_dir: Path, argv: list[str] | None, root: str, name: str = NAME
) -> None:
    """<name>.json (after every point, so a cut run keeps what finished), .md and .png."""
    from benchmarks import harness

    doc = harness.envelope(
        name,
        results,
        reference="majority, repeat_last, the n-gram and the online counter (ngram_online) "
        "on the same held-out positions",
        command_line=harness.command(argv, script=__file__),
        roots=(root,),
    )
    (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    render(doc, out_dir, name)


def render(doc: dict[str, Any], out_dir: Path, name: str = NAME) -> None:
    """<name>.md and <name>.png from the JSON's document; without matplotlib (a lent GPU
    machine has none) the .png is left to `--render-only` on a machine that has it."""
    (out_dir / f"{name}.md").write_text(markdown(doc))
    try:
        # deferred: only the plot needs it
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"bench_scaling: no matplotlib here: {name}.png not drawn (--render-only draws it)")
        return
    plot(doc, out_dir / f"{name}.png")


if __name__ == "__main__":
    raise SystemExit(main())
