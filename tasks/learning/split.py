"""The split: which runs a training job trains on, validates on and is scored on, by the rule of
tasks/learning/train_config.py, read as token runs (tasks/dataset/token_runs.py), beside the
events the allocator's questions read of the same runs: all a training reads of the data root,
named here at once (read_training_data) before anything is learnt (the token runs read, each
run's events read when the questions ask for them).

No TensorFlow in this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.frame_tokens import RunStacks, read_run_stacks
from tasks.dataset.token_runs import RunsRead, TokenRun, head_events, list_runs, read_run
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.labels import QUESTION_COLUMNS
from tasks.learning.train_config import DataConfig
from tasks.replay.workloads import Catalog, load_catalog


@dataclass(frozen=True)
class Split:
    """The runs of a training job, by role (see tasks/learning/train_config.py for the rule)."""

    train: list[TokenRun]
    validation: list[TokenRun]
    evaluation: list[TokenRun]  # unseen runs of trained workloads
    heldout: list[TokenRun]  # runs of held-out workloads whose program is trained on elsewhere
    notes: list[str] = field(default_factory=list)
    unseen_programs: list[TokenRun] = field(default_factory=list)  # programs never trained on

    @property
    def train_tokens(self) -> int:
        return sum(r.n_tokens for r in self.train)

    @property
    def eval_tokens(self) -> int:
        return sum(r.n_tokens for r in self.evaluation + self.heldout + self.unseen_programs)

    def content_hash(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for role, runs in (
            ("train", self.train),
            ("validation", self.validation),
            ("evaluation", self.evaluation),
            ("heldout", self.heldout),
            # only when present, so a split without unseen programs hashes as it always did
            *((("unseen_programs", self.unseen_programs),) if self.unseen_programs else ()),
        ):
            for r in runs:
                h.update(f"{role}:{r.name}:".encode())
                h.update(r.offsets.tobytes())
                h.update(r.tokens.tobytes())
        return h.hexdigest()

    def question_runs(self) -> list[tuple[str, str]]:
        """(workload, run) of each run the allocator's questions learn from or are scored on
        (QUESTION_ROLES): the training runs (whole: the validation cut is the next-call
        model's) and the three tables' runs."""
        runs = self.train + self.evaluation + self.heldout + self.unseen_programs
        return sorted({(r.workload, r.run) for r in runs})

    def token_histogram(self) -> np.ndarray:
        hist = np.zeros(N_TOKENS, np.int64)
        for r in self.train:
            hist += np.bincount(r.tokens, minlength=N_TOKENS)
        return hist


def plan_split(
    available: dict[str, list[str]],
    cfg: DataConfig,
    programs: dict[str, str] | None = None,
) -> dict[str, dict[str, list[str]]]:
    """{workload: {"train"|"validation"|"evaluation"|"heldout"|"unseen": runs}}, no tokens read.

    Default per trained workload, runs sorted: 3+ runs -> last is evaluation, second to last
    validation, the rest train; 2 runs -> first train, last evaluation, validation cut from the
    train run's thread tails. One run cannot be evaluated honestly: an error says what to do.
    Held-out runs go to "unseen" when no trained workload runs the same program (`programs`:
    {workload: program}; a workload missing from it is its own program), else to "heldout".
    """
    programs = {w: (programs or {}).get(w, w) for w in available}
    missing = [w for w in (cfg.workloads or []) + cfg.heldout_workloads if w not in available]
    if missing:
        raise ValueError(
            f"workloads {missing} are not in the events dataset (found: {sorted(available)})"
        )
    unknown = [p for p in cfg.heldout_programs if p not in programs.values()]
    if unknown:
        raise ValueError(
            f"data.heldout_programs: {unknown} is no program of the events dataset's workloads "
            f"(programs: {sorted(set(programs.values()))}); fix the name or replay it first"
        )
    trained_anyway = [w for w in cfg.workloads or [] if programs[w] in cfg.heldout_programs]
    if trained_anyway:
        raise ValueError(
            f"data.workloads lists {trained_anyway}, whose program "
            f"{sorted({programs[w] for w in trained_anyway})} is in data.heldout_programs: "
            "a program cannot be both trained on and unseen; remove one of the two"
        )
    heldout = list(cfg.heldout_workloads)
    heldout += [w for w in available if programs[w] in cfg.heldout_programs and w not in heldout]
    if cfg.workloads is not None:
        workloads = list(cfg.workloads)
    else:
        # Chosen automatically: a workload with a single run (an ad-hoc `heapcast trace`, a
        # new catalog entry) cannot be evaluated on an unseen run of itself, so it joins the
        # held-out table instead of stopping the training. Named workloads still must have two.
        workloads = [w for w in available if w not in heldout and len(available[w]) >= 2]
        heldout += [w for w in available if w not in heldout and len(available[w]) < 2]
    if not workloads:
        raise ValueError("no workload left to train on; check data.workloads / heldout_workloads")
    plan: dict[str, dict[str, list[str]]] = {}
    for w in workloads:
        runs = available[w]
        explicit = cfg.runs.get(w)
        if explicit and explicit.train and explicit.evaluation:
            tr, va, ev = list(explicit.train), list(explicit.validation), list(explicit.evaluation)
            unknown = [r for r in tr + va + ev if r not in runs]
            if unknown:
                raise ValueError(f"workload {w}: runs {unknown} not found (found: {runs})")
        elif len(runs) >= 3:
            tr, va, ev = runs[:-2], [runs[-2]], [runs[-1]]
        elif len(runs) == 2:
            tr, va, ev = [runs[0]], [], [runs[1]]
        else:
            raise ValueError(
                f"workload {w} has only run {runs}: an honest evaluation needs another run "
                f"(another input); replay it again or list it under data.heldout_workloads"
            )
        plan[w] = {"train": tr, "validation": va, "evaluation": ev, "heldout": [], "unseen": []}
    trained_programs = {programs[w] for w in workloads}
    for w in heldout:
        role = "heldout" if programs[w] in trained_programs else "unseen"
        plan[w] = {"train": [], "validation": [], "evaluation": [], "heldout": [], "unseen": []}
        plan[w][role] = list(available[w])
    return plan


def absent_heldout(
    available: dict[str, list[str]], cfg: DataConfig, catalog: dict[str, str]
) -> tuple[DataConfig, list[str]]:
    """Drop held-out names that the catalog knows but tonight's dataset lacks, with a note each.

    A night whose perl replay failed must still train and evaluate the rest: the held-out name is
    right (the catalog, {workload: program}, lists it), only its data is missing tonight. A name the catalog does not
    know either stays, and plan_split names it as an error.
    """

    present = {catalog.get(w, w) for w in available}
    gone_w = [w for w in cfg.heldout_workloads if w not in available and w in catalog]
    gone_p = [p for p in cfg.heldout_programs if p not in present and p in set(catalog.values())]
    if not gone_w and not gone_p:
        return cfg, []
    notes = [
        f"held-out {kind} {name}: in the catalog but not in tonight's events dataset "
        "(its replay failed or was not run); its table lacks it tonight"
        for kind, names in (("workload", gone_w), ("program", gone_p))
        for name in names
    ]
    cfg = cfg.model_copy(
        update={
            "heldout_workloads": [w for w in cfg.heldout_workloads if w not in gone_w],
            "heldout_programs": [p for p in cfg.heldout_programs if p not in gone_p],
        }
    )
    return cfg, notes


@dataclass(frozen=True)
class TrainingData:
    """All that a training reads from the data root, gathered before anything is learnt
    (read_training_data): the split's token runs, and the events (and stacks) the allocator's
    questions learn from and are scored on."""

    split: Split
    # (workload, run) -> the events of each training and scored run, the questions' columns cut
    # to the calls the evaluation scores (question_events), read when asked; empty when read for
    # the split alone
    events: Mapping[tuple[str, str], pa.Table]
    # ... and the same runs' call stacks, with the tokens of their first frames the questions'
    # network reads (read_run_stacks; empty frames where traced without them)
    frames: Mapping[tuple[str, str], RunStacks]


# the runs whose events the questions read: the validation runs are the next-call model's alone
QUESTION_ROLES = ("train", "evaluation", "heldout", "unseen")


def read_training_data(
    root: Root,
    cfg: DataConfig,
    catalog: Catalog,
    questions: bool = True,
) -> TrainingData:
    """Read every run the plan names, with the validation cut and the token caps, and (with
    `questions`) the questions' events of its training and scored runs; with data.call_stacks,
    each run's call stacks with its tokens (TokenRun.stacks). `catalog`: where the workloads'
    programs come from (the one data.catalog names, read where the flow starts)."""
    available = list_runs(root)
    programs = catalog.programs()  # a workload it does not list: its own program
    cfg, notes = absent_heldout(available, cfg, programs)
    plan = plan_split(available, cfg, {w: programs.get(w, w) for w in available})
    asked = [(w, r) for w, roles in plan.items() for role in QUESTION_ROLES for r in roles[role]]
    asked = asked if questions else []
    events = question_events(root, asked, cfg.max_eval_tokens)
    frames = read_run_stacks(root, asked, cfg.frame_depth)
    train: list[TokenRun] = []
    validation: list[TokenRun] = []
    evaluation: list[TokenRun] = []
    heldout: list[TokenRun] = []
    unseen: list[TokenRun] = []
    per_run_cap = None
    n_train_runs = sum(len(p["train"]) for p in plan.values())
    if cfg.max_train_tokens is not None and n_train_runs:
        per_run_cap = max(1, cfg.max_train_tokens // n_train_runs)
    for w, roles in plan.items():
        for r in roles["train"]:
            if roles["validation"]:
                train.append(read_run(root, w, r, per_run_cap, cfg.call_stacks))
                continue
            head, tail = read_run(root, w, r, stacks=cfg.call_stacks).split_tail(
                cfg.validation_fraction
            )
            notes.append(
                f"{w}: only two runs; validation (early stopping, n-gram order) is the last "
                f"{cfg.validation_fraction:.0%} of each thread of train run {r}"
            )
            train.append(head.head(per_run_cap))
            validation.append(tail.head(cfg.max_validation_tokens))
        for r in roles["validation"]:
            validation.append(read_run(root, w, r, cfg.max_validation_tokens, cfg.call_stacks))
        for r in roles["evaluation"]:
            evaluation.append(read_run(root, w, r, cfg.max_eval_tokens, cfg.call_stacks))
        for r in roles["heldout"]:
            heldout.append(read_run(root, w, r, cfg.max_eval_tokens, cfg.call_stacks))
        for r in roles["unseen"]:
            unseen.append(read_run(root, w, r, cfg.max_eval_tokens, cfg.call_stacks))
    split = Split(train, validation, evaluation, heldout, notes, unseen)
    return TrainingData(split, events, frames)


def question_events(
    root: Root, runs: list[tuple[str, str]], max_rows: int | None
) -> RunsRead[pa.Table]:
    """The questions' columns (tasks.learning.labels.QUESTION_COLUMNS) of each (workload, run)
    of `runs`, cut to the rows of the tokens that `max_rows` keeps (head_rows; data.max_eval_tokens
    in training), so that every answer is made on the calls the next-call model's evaluation
    scores; each run read when asked."""
    return head_events(root, runs, QUESTION_COLUMNS, max_rows)


def load_split(root: Root, cfg: DataConfig) -> Split:
    """The split alone, with the catalog that data.catalog names (the training bundle, studies);
    with data.call_stacks, each run's call stacks too (TokenRun.stacks)."""
    return read_training_data(root, cfg, load_catalog(cfg.catalog), questions=False).split
