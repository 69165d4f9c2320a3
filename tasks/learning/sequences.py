"""Per-thread token sequences from the events dataset, and the positions that get scored.

A run's tokens are held as the trace itself: one flat uint8 array, the threads one after the
other (each ordered by `seq`), and `offsets` marking where each thread starts (n_threads + 1
entries). Training chunks and evaluation positions are index arrays into that flat array, so no
window is ever materialised here (the tf.data side is tasks/learning/token_data.py).

No TensorFlow in this module.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.events_reader import EVENTS_DIR, EventsNotFound, has_dataset
from tasks.dataset.events_reader import list_runs as list_events_runs
from tasks.dataset.events_reader import read_run as read_events_run
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.train_config import DataConfig
from tasks.replay.workloads import load_catalog

COLUMNS = ["pid", "thread", "seq", "token"]


@dataclass(frozen=True)
class TokenRun:
    """The token sequences of one run (or a part of one): flat tokens + thread offsets."""

    workload: str
    run: str
    tokens: np.ndarray  # uint8 [n]
    offsets: np.ndarray  # int64 [n_threads + 1], offsets[0] == 0, offsets[-1] == n
    part: str = "all"  # "all", or "head"/"tail" when a run was cut for validation

    def __post_init__(self) -> None:
        if self.offsets[0] != 0 or self.offsets[-1] != len(self.tokens):
            raise ValueError(f"{self.name}: offsets do not span the tokens")

    @property
    def name(self) -> str:
        suffix = "" if self.part == "all" else f"[{self.part}]"
        return f"{self.workload}/{self.run}{suffix}"

    @property
    def n_tokens(self) -> int:
        return int(len(self.tokens))

    @property
    def n_threads(self) -> int:
        return int(len(self.offsets) - 1)

    def thread_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def position_in_thread(self) -> np.ndarray:
        """For every token, its index within its thread (int64 [n])."""
        lengths = self.thread_lengths()
        return np.arange(self.n_tokens, dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)

    def head(self, max_tokens: int) -> TokenRun:
        """The first `max_tokens` tokens (whole threads in order, the last one cut)."""
        if max_tokens >= self.n_tokens:
            return self
        offsets = np.concatenate([self.offsets[self.offsets < max_tokens], [max_tokens]])
        return TokenRun(self.workload, self.run, self.tokens[:max_tokens], offsets, self.part)

    def split_tail(self, fraction: float) -> tuple[TokenRun, TokenRun]:
        """(head, tail): the time-ordered last `fraction` of every thread goes to the tail."""
        lengths = self.thread_lengths()
        tail_len = np.floor(lengths * fraction).astype(np.int64)
        head_len = lengths - tail_len
        pos = self.position_in_thread()
        in_head = pos < np.repeat(head_len, lengths)
        head_off = np.concatenate([[0], np.cumsum(head_len)])
        tail_off = np.concatenate([[0], np.cumsum(tail_len)])
        return (
            TokenRun(self.workload, self.run, self.tokens[in_head], head_off, "head"),
            TokenRun(self.workload, self.run, self.tokens[~in_head], tail_off, "tail"),
        )


def concat_runs(runs: list[TokenRun], workload: str = "*", run: str = "*") -> TokenRun:
    """Several runs as one (threads never join: boundaries are kept)."""
    if not runs:
        return TokenRun(workload, run, np.zeros(0, np.uint8), np.zeros(1, np.int64))
    tokens = np.concatenate([r.tokens for r in runs])
    starts = np.cumsum([0] + [r.n_tokens for r in runs[:-1]])
    offsets = np.concatenate([r.offsets[:-1] + s for r, s in zip(runs, starts)] + [[len(tokens)]])
    return TokenRun(workload, run, tokens, offsets.astype(np.int64))


# --- reading -------------------------------------------------------------------------------


def list_runs(root: Root) -> dict[str, list[str]]:
    """{workload: sorted runs} of the events dataset (tasks.dataset.events_reader)."""
    if not has_dataset(root):
        raise EventsNotFound(
            f"{root.url_of(EVENTS_DIR)}: no events dataset; run the dataset flow first"
        )
    found: dict[str, list[str]] = {}
    for r in list_events_runs(root):
        found.setdefault(r.workload, []).append(r.run)
    return found


def read_run(root: Root, workload: str, run: str) -> TokenRun:
    """One run's tokens, per thread (per (pid, thread)), each thread ordered by seq."""
    return token_run(read_events_run(root, workload, run, COLUMNS), workload, run)


def thread_key(table: pa.Table) -> np.ndarray:
    """uint64 per row: its thread, (pid << 16) | thread (a run's threads in this key's order)."""
    pid = table.column("pid").to_numpy().astype(np.uint64)
    return (pid << np.uint64(16)) | table.column("thread").to_numpy().astype(np.uint64)


def token_run(table: pa.Table, workload: str, run: str) -> TokenRun:
    """The tokens of one run's events (columns pid, thread, seq, token; any row order), per
    thread (per (pid, thread)), each thread ordered by seq."""
    if table.num_rows == 0:
        raise ValueError(f"run {workload}/{run} has no events")
    seq = table.column("seq").to_numpy()
    token = table.column("token").to_numpy().astype(np.uint8)
    key = thread_key(table)
    # Parts arrive in call order (a process's calls in time order, threads interleaved): sort
    # only when needed (a stable lexsort otherwise).
    if len(key) > 1 and not (
        np.all(key[1:] >= key[:-1]) and np.all((key[1:] != key[:-1]) | (seq[1:] > seq[:-1]))
    ):
        order = np.lexsort((seq, key))
        key, token = key[order], token[order]
    if int(token.max(initial=0)) >= N_TOKENS:
        raise ValueError(f"run {workload}/{run}: token {int(token.max())} outside 0..63")
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    offsets = np.concatenate([starts, [len(token)]]).astype(np.int64)
    return TokenRun(workload, run, token, offsets)


def head_rows(table: pa.Table, max_tokens: int | None) -> pa.Table:
    """The rows of one run's events (columns pid, thread, seq; any row order) whose tokens are
    `token_run(table, ...).head(max_tokens)`, in the table's row order: the part of a run the
    evaluation scores when data.max_eval_tokens caps it, which every stage that reads the same
    run beside the evaluation (the allocator's questions, whatif) reads too, so that their
    answers are made on the same calls. None, or a cap the run fits in: the table itself."""
    if max_tokens is None or table.num_rows <= max_tokens:
        return table
    order = np.lexsort((table.column("seq").to_numpy(), thread_key(table)))
    keep = np.zeros(table.num_rows, bool)
    keep[order[:max_tokens]] = True
    return table.filter(pa.array(keep))


# --- the split ---------------------------------------------------------------------------------


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

    def token_histogram(self) -> np.ndarray:
        hist = np.zeros(N_TOKENS, np.int64)
        for r in self.train:
            hist += np.bincount(r.tokens, minlength=N_TOKENS)
        return hist


def workload_programs(cfg: DataConfig, workloads: list[str]) -> dict[str, str]:
    """{workload: program} from the catalog; a workload it does not list is its own program."""

    known = load_catalog(cfg.catalog).programs()
    return {w: known.get(w, w) for w in workloads}


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
    available: dict[str, list[str]], cfg: DataConfig
) -> tuple[DataConfig, list[str]]:
    """Drop held-out names that the catalog knows but tonight's dataset lacks, with a note each.

    A night whose perl replay failed must still train and evaluate the rest: the held-out name is
    right (the catalog lists it), only its data is missing tonight. A name the catalog does not
    know either stays, and plan_split names it as an error.
    """

    catalog = load_catalog(cfg.catalog).programs()
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


def load_split(root: Root, cfg: DataConfig) -> Split:
    """Read every run the plan names and apply the validation cut and the token caps."""
    available = list_runs(root)
    cfg, notes = absent_heldout(available, cfg)
    plan = plan_split(available, cfg, workload_programs(cfg, list(available)))
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
            run = read_run(root, w, r)
            if not roles["validation"]:
                head, tail = run.split_tail(cfg.validation_fraction)
                notes.append(
                    f"{w}: only two runs; validation (early stopping, n-gram order) is the last "
                    f"{cfg.validation_fraction:.0%} of each thread of train run {r}"
                )
                run = head
                validation.append(_cap(tail, cfg.max_validation_tokens))
            train.append(_cap(run, per_run_cap))
        for r in roles["validation"]:
            validation.append(_cap(read_run(root, w, r), cfg.max_validation_tokens))
        for r in roles["evaluation"]:
            evaluation.append(_cap(read_run(root, w, r), cfg.max_eval_tokens))
        for r in roles["heldout"]:
            heldout.append(_cap(read_run(root, w, r), cfg.max_eval_tokens))
        for r in roles["unseen"]:
            unseen.append(_cap(read_run(root, w, r), cfg.max_eval_tokens))
    return Split(train, validation, evaluation, heldout, notes, unseen)


def _cap(run: TokenRun, cap: int | None) -> TokenRun:
    return run if cap is None else run.head(cap)


# --- chunks and scored positions -------------------------------------------------------------


def train_chunks(run: TokenRun, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Training chunks of `context + 1` tokens inside threads, stride `context`.

    Returns (starts, first_scored): chunk i covers tokens[starts[i] : starts[i] + context + 1]
    (inputs = the first `context`, targets = the last `context`). A thread's last chunk is
    aligned to its end so its tail is not lost; the targets it shares with the chunk before are
    weighted 0 (`first_scored` is the first target index that counts). Threads shorter than
    `context + 1` tokens give no chunk.
    """
    lengths = run.thread_lengths()
    ok = lengths >= context + 1
    starts_t, lengths = run.offsets[:-1][ok], lengths[ok]
    if not len(lengths):
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    n_full = (lengths - 1) // context  # chunks of stride `context` that fit entirely
    rem = (lengths - 1) - n_full * context  # targets left after them
    n_chunks = n_full + (rem > 0)
    thread_of = np.repeat(np.arange(len(lengths)), n_chunks)
    k = np.arange(n_chunks.sum()) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    starts = starts_t[thread_of] + k * context
    first = np.zeros(len(starts), np.int32)
    last = k == n_full[thread_of]  # the extra, end-aligned chunk
    end = starts_t[thread_of] + lengths[thread_of]
    starts = np.where(last, end - context - 1, starts)
    first[last] = (context - rem[thread_of][last]).astype(np.int32)
    return starts.astype(np.int64), first


def window_starts(run: TokenRun, context: int) -> np.ndarray:
    """The article's windows: every start whose `context` tokens and next token lie in one thread."""
    pos = run.position_in_thread()
    lengths = np.repeat(run.thread_lengths(), run.thread_lengths())
    ok = pos + context < lengths
    return np.flatnonzero(ok).astype(np.int64)


def eval_positions(run: TokenRun) -> np.ndarray:
    """Scored positions, defined once for every predictor: every token but a thread's first.

    Position p's label is tokens[p]; a predictor may look at tokens[p - k : p] of the same
    thread only.
    """
    pos = run.position_in_thread()
    return np.flatnonzero(pos >= 1).astype(np.int64)


def eval_chunks(run: TokenRun, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stateless evaluation chunks of `2 * context` input tokens with a warm-up prefix.

    Chunk k of a thread starts at thread_start + k * context. Output i of a chunk predicts token
    start + i + 1. Chunk 0 scores outputs 0 .. 2c-1 (all the context the thread has); chunk
    k >= 1 scores outputs c .. 2c-1, so every scored position beyond the thread's first 2c tokens
    has at least `context` previous tokens in view. Together they score exactly
    `eval_positions(run)`, in that order.

    Returns (starts, lo, hi): chunk i scores outputs lo[i] <= o < hi[i].
    """
    lengths = run.thread_lengths()
    n_targets = lengths - 1
    # chunk 0 covers targets 1..2c; chunk k covers (k+1)c+1 .. (k+2)c
    n_chunks = np.where(n_targets <= 0, 0, np.maximum(1, -(-(n_targets - context) // context)))
    thread_of = np.repeat(np.arange(len(lengths)), n_chunks)
    k = np.arange(n_chunks.sum()) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    starts = run.offsets[:-1][thread_of] + k * context
    lo = np.where(k == 0, 0, context)
    hi = np.minimum(2 * context, n_targets[thread_of] - k * context)
    return starts.astype(np.int64), lo.astype(np.int32), hi.astype(np.int32)
