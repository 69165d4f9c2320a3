"""The allocator's two questions answered by a recurrent network of their own (issue 23).

At a free, "is this class requested again soon in this process?" (reuse, tasks/learning/questions/reuse.py);
at an allocation, "how long will this block live?" (lifetime, tasks/learning/questions/lifetime.py). One
head per question on one recurrent state:

- Inputs: a PROCESS's calls in call order (labels.process_order): token, call site (hashed as
  the counters do; 0 without callers), time since the previous call, the online counters'
  answers at it (class_online, site_online: causal), and the call's stack as sub-word tokens of
  its frames' names (tasks/dataset/frame_tokens.py; a free reads its block's allocation's
  stack; all padding in a trace without stacks), read by `stack_encoder`.
- CAUSALITY: a GRU reads forward only, over windows of WINDOW calls (state reset at each,
  padding after the last call): an answer reads its call and those before it in its window,
  nothing after (tests/tasks/learning/questions/test_network.py).
- Training: the split's training runs, masked losses.

PREDICTOR names it in the three tables; `distilled_table` makes the layer's table
(tasks/learning/table/distill.py) from its reuse answers at the training frees. More:
docs/learning-questions.md#the-questions-network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
from keras import layers, ops

from tasks.dataset.events_reader import StackFrames
from tasks.dataset.frame_tokens import FRAME_DEPTH, FRAME_PIECES, RunStacks
from tasks.dataset.token_runs import call_stack_rows
from tasks.dataset.tokens import FREE_OFFSET, N_TOKENS
from tasks.learning.batching import filled, full_batches
from tasks.learning.counters.by_due import online_by_due
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    NO_LABEL,
    QUESTION_CLASSES,
    REUSE_CLASSES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_due
from tasks.learning.questions.reuse import (
    SITE_VOCABULARY,
    ReuseAnswers,
    call_sites,
    reuse_answers,
    reuse_due,
)
from tasks.learning.stack_encoder import drop_stacks, stack_encoder
from tasks.learning.table.distill import (
    CONTEXT_DEPTH,
    N_SIZE_CLASSES,
    SOON_CLASS,
    ClassTable,
    context_sums,
)
from tasks.learning.train_config import QuestionsConfig

PREDICTOR = "network"
# the counters whose answers are inputs, and one counter more of the process as a whole (any
# class, _process_counter): a new program's base rates, known long before each class's counter
# has seen its first answers
COUNTERS = ("class_online", "site_online")
# What the network's inputs mean, versioned: a network is answered only with the inputs it was
# trained on (the registry tags each logged network; tasks/registry/question_artifacts.py refuses another).
# 1: the reuse counters counted a free only at the next request of its class;
# 2 (2026-11-26): they count it "later or never" once the last edge has passed without one;
# 3: the call's stack as frame tokens (the `frames` input).
INPUTS_VERSION = 3
WINDOW = 256  # calls per window (the state is reset at each)
# the project's tokens (tasks/dataset/tokens.py), and one more: a call that neither defines nor
# frees a known-size block (a failed malloc)
OTHER_TOKEN = N_TOKENS
N_INPUT_TOKENS = N_TOKENS + 1
N_FEATURES = 3 + sum(k * (len(COUNTERS) + 1) for k in QUESTION_CLASSES.values())
TIME_SCALE = 1.0 / 25.0  # log1p(ns) is at most ~25 for a 100-year gap: features stay in [0, 1]
ANSWER_WINDOWS = 1024  # windows a predict call reads (the frame tokens are gathered per chunk)


@dataclass(frozen=True)
class QuestionInputs:
    """One run's calls in process call order, as the network reads them."""

    order: np.ndarray  # int64 [n]: the table row of each call in process order
    starts: np.ndarray  # bool [n]: a process's first call
    tokens: np.ndarray  # int32 [n]
    sites: np.ndarray  # int32 [n]: call site + 1, 0 where none
    features: np.ndarray  # float32 [n, N_FEATURES]
    labels: dict[str, np.ndarray]  # question -> int32 [n], NO_LABEL where it does not apply
    free_class: np.ndarray  # int64 [n]: the freed block's size class, -1 where none
    # the call's row of stack_tokens (0: none): its own stack, a free its block's allocation's
    stack_rows: np.ndarray | None = None  # int32 [n]; None: no call has a stack
    stack_tokens: np.ndarray | None = None  # int32 [stacks + 1, depth, FRAME_PIECES]


def question_inputs(
    table: pa.Table,
    answers: dict[str, ReuseAnswers],
    stacks: RunStacks | None = None,
) -> QuestionInputs:
    """The network's inputs for one run's events table, from the counters' `answers` (every
    question of QUESTION_CLASSES, as reuse_answers / lifetime_answers give them) and the run's
    stacks (RunStacks: its frames, and each stack's first frames as tokens; None: the frame
    inputs are all padding)."""
    n = table.num_rows
    order, starts = process_order(table)
    req_cls, free_cls = request_and_free_classes(table)
    tokens = np.where(
        req_cls >= 0, req_cls, np.where(free_cls >= 0, FREE_OFFSET + free_cls, OTHER_TOKEN)
    )
    sites = call_sites(table) + 1
    t = table.column("time_ns").to_numpy().astype(np.int64)[order]
    gap = np.diff(t, prepend=t[:1] if n else t)
    gap[starts] = 0
    features = np.zeros((n, N_FEATURES), np.float32)
    features[:, 0] = np.log1p(np.maximum(gap, 0)) * TIME_SCALE
    # the process's age and the share of its blocks freed so far: how a process that leaks at
    # exit (a short compiler run) looks, against one that frees (perl, cpython)
    proc, first, age = _positions(starts)
    features[:, 1] = np.log1p(age) * TIME_SCALE
    allocs = _process_cumsum(req_cls[order] >= 0, starts, first, proc)
    frees = _process_cumsum(free_cls[order] >= 0, starts, first, proc)
    features[:, 2] = frees / np.maximum(allocs, 1)
    labels: dict[str, np.ndarray] = {}
    col = 3
    due = label_known_at(table, order, starts)
    for q, k in QUESTION_CLASSES.items():
        a = answers[q]
        lab = np.full(n, NO_LABEL, np.int32)
        lab[a.rows] = a.labels
        labels[q] = lab[order]
        for name in COUNTERS:
            p = np.zeros((n, k), np.float32)
            p[a.rows] = a.probs[name]
            features[:, col : col + k] = p[order]
            col += k
        features[:, col : col + k] = _process_counter(starts, labels[q], due[q], k)
        col += k
    rows, tok = _stack_inputs(table, order, starts, stacks)
    return QuestionInputs(
        order,
        starts,
        tokens.astype(np.int32)[order],
        sites.astype(np.int32)[order],
        features,
        labels,
        free_cls[order],
        rows,
        tok,
    )


def _stack_inputs(
    table: pa.Table, order: np.ndarray, starts: np.ndarray, stacks: RunStacks | None
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(each call's row of the run's stack tokens, process order; the tokens): a call's own
    stack, and at a free without one its block's allocation's (call_stack_rows)."""
    if stacks is None or not len(stacks.frames) or "stack" not in table.column_names:
        return None, None
    return call_stack_rows(table, stacks.frames, order)[order], stacks.tokens


def _positions(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(process index of each call, each process's first call, each call's position in its
    process), calls in process order."""
    proc = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    return proc, first, np.arange(len(starts)) - first[proc]


def _process_cumsum(flag: np.ndarray, starts, first, proc) -> np.ndarray:
    """How many rows of the process up to and including each row are flagged (process order)."""
    c = np.cumsum(flag)
    before = np.where(first > 0, c[np.maximum(first - 1, 0)], 0)
    return c - before[proc]


def label_known_at(table: pa.Table, order: np.ndarray, starts: np.ndarray) -> dict:
    """{question: int64 [n] in process order}: the row where each call's label becomes known to
    a program that watches itself (-1: never within its process). Reuse: at the next request of
    the class, or once the last edge has passed without one ("later")."""
    reuse = reuse_due(allocator_labels(table).reuse_calls[order], starts)
    life = lifetime_due(table, order, starts)
    return {"reuse": reuse, "lifetime_calls": life, "lifetime_time": life}


def _process_counter(starts: np.ndarray, label: np.ndarray, due: np.ndarray, k: int) -> np.ndarray:
    """float32 [n, k] in process order: at each call the question applies to, the distribution of
    the labels of the process's earlier calls known by then (any class), smoothed."""
    ask = np.where(label != NO_LABEL, 0, -1).astype(np.int64)
    out = np.zeros((len(label), k), np.float64)
    online_by_due(
        starts, ask, np.full(len(label), -1, np.int64), np.ascontiguousarray(due),
        np.maximum(label, 0).astype(np.int64), 1, k, 0.1, out,
    )  # fmt: skip
    return out.astype(np.float32)


def _windows(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(window, slot) of each call, and the number of windows: each process cut into windows of
    WINDOW calls from its first call, so no window holds two processes."""
    proc, first, pos = _positions(starts)
    length = np.diff(np.append(first, len(starts)))
    per = -(-length // WINDOW)
    offset = np.concatenate([[0], np.cumsum(per)[:-1]])
    return offset[proc] + pos // WINDOW, pos % WINDOW, int(per.sum())


def _as_windows(
    inputs: list[QuestionInputs], depth: int
) -> tuple[dict[str, np.ndarray], dict, list, np.ndarray]:
    """Stack runs' calls as windows: (x, y, [(window, slot) of each run's calls], the runs' stack
    tokens at `depth` frames, stacked). x's "stack_rows" index those tokens (0: padding);
    `_with_frames` gathers them for the windows read."""
    tok, site, feat, rows, where = [], [], [], [], []
    ys: dict[str, list[np.ndarray]] = {q: [] for q in QUESTION_CLASSES}
    stacks = [np.zeros((1, depth, FRAME_PIECES), np.int32)]
    base = 0
    for inp in inputs:
        w, s, m = _windows(inp.starts)
        where.append((w + base, s))
        t = np.full((m, WINDOW), OTHER_TOKEN, np.int32)
        t[w, s] = inp.tokens
        si = np.zeros((m, WINDOW), np.int32)
        si[w, s] = inp.sites
        f = np.zeros((m, WINDOW, N_FEATURES), np.float32)
        f[w, s] = inp.features
        r = np.zeros((m, WINDOW), np.int32)
        if inp.stack_rows is not None and inp.stack_tokens is not None:
            offset = sum(len(x) for x in stacks) - 1  # a run's row 0 is the shared padding
            r[w, s] = np.where(inp.stack_rows > 0, inp.stack_rows + offset, 0)
            stacks.append(_at_depth(inp.stack_tokens[1:], depth))
        for q in QUESTION_CLASSES:
            y = np.full((m, WINDOW), NO_LABEL, np.int32)
            y[w, s] = inp.labels[q]
            ys[q].append(y)
        tok.append(t), site.append(si), feat.append(f), rows.append(r)
        base += m
    x = {
        "tokens": np.concatenate(tok) if tok else np.zeros((0, WINDOW), np.int32),
        "sites": np.concatenate(site) if site else np.zeros((0, WINDOW), np.int32),
        "features": np.concatenate(feat) if feat else np.zeros((0, WINDOW, N_FEATURES), np.float32),
        "stack_rows": np.concatenate(rows) if rows else np.zeros((0, WINDOW), np.int32),
    }
    y = {q: np.concatenate(v) if v else np.zeros((0, WINDOW), np.int32) for q, v in ys.items()}
    return x, y, where, np.concatenate(stacks)


def input_depth(inputs: list[QuestionInputs]) -> int:
    """The frames a call the inputs carry (their stack tokens' depth: data.frame_depth where
    they were read), FRAME_DEPTH where none has stacks."""
    depths = {i.stack_tokens.shape[1] for i in inputs if i.stack_tokens is not None}
    return max(depths, default=FRAME_DEPTH)


def _at_depth(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Stack tokens [stacks, d, FRAME_PIECES] cut or padded to `depth` frames."""
    if tokens.shape[1] >= depth:
        return tokens[:, :depth]
    pad = np.zeros((len(tokens), depth - tokens.shape[1], FRAME_PIECES), np.int32)
    return np.concatenate([tokens, pad], axis=1)


def _with_frames(x: dict[str, np.ndarray], stacks: np.ndarray, keep) -> dict[str, np.ndarray]:
    """The model's inputs for the windows `keep` (indices or a slice) of `x`: its stack rows
    replaced by their frame tokens [windows, WINDOW, depth, FRAME_PIECES]."""
    return {
        "tokens": x["tokens"][keep],
        "sites": x["sites"][keep],
        "features": x["features"][keep],
        "frames": stacks[x["stack_rows"][keep]],
    }


def frame_depth_of(model: keras.Model) -> int:
    """The frames of a call's stack a network reads (its `frames` input's shape)."""
    return int(model.get_layer("frames").output.shape[2])


def masked_crossentropy(y_true, y_pred):
    """Mean cross-entropy over the calls the question applies to (label >= 0)."""
    y = ops.cast(y_true, "int32")
    valid = ops.cast(ops.greater_equal(y, 0), "float32")
    ce = keras.losses.sparse_categorical_crossentropy(ops.maximum(y, 0), y_pred)
    return ops.sum(ce * valid) / ops.maximum(ops.sum(valid), 1.0)


def build_network(units: int = 48, frame_depth: int = FRAME_DEPTH) -> keras.Model:
    """tokens, sites [batch, calls], features [batch, calls, N_FEATURES], frames [batch, calls,
    frame_depth, FRAME_PIECES] -> one softmax per question [batch, calls, k]."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    sites = keras.Input((None,), dtype="int32", name="sites")
    features = keras.Input((None, N_FEATURES), name="features")
    frames = keras.Input((None, frame_depth, FRAME_PIECES), dtype="int32", name="frames")
    x = layers.Concatenate()(
        [
            layers.Embedding(N_INPUT_TOKENS, 16)(tokens),
            layers.Embedding(SITE_VOCABULARY + 1, 8)(sites),
            features,
            stack_encoder(frames, frame_depth),
        ]
    )
    x = layers.Dense(units, activation="relu")(x)
    h = layers.GRU(units, return_sequences=True)(x)  # forward only: causal
    z = layers.Concatenate()([h, x])
    outputs = {
        q: layers.Dense(k, activation="softmax", name=q)(z) for q, k in QUESTION_CLASSES.items()
    }
    inputs = {"tokens": tokens, "sites": sites, "features": features, "frames": frames}
    return keras.Model(inputs, outputs)


@dataclass(frozen=True)
class QuestionNetwork:
    """The trained network and what it was trained on."""

    model: keras.Model
    train_calls: int
    epochs: int
    seconds: float

    def answer(self, inputs: QuestionInputs, batch_size: int = 128) -> dict[str, np.ndarray]:
        """{question: float64 [n, k]}: the network's answer at every call, in TABLE row order."""
        x, _, where, stacks = _as_windows([inputs], frame_depth_of(self.model))
        m = len(x["tokens"])
        out: dict[str, list[np.ndarray]] = {q: [] for q in QUESTION_CLASSES}
        for lo in range(0, m, ANSWER_WINDOWS):  # a loop over chunks of windows
            chunk = _with_frames(x, stacks, slice(lo, lo + ANSWER_WINDOWS))
            b = len(chunk["tokens"])  # the last chunk at full batches (tasks/learning/batching.py)
            chunk = {k: filled(v, full_batches(b, batch_size)) for k, v in chunk.items()}
            said = self.model.predict(chunk, batch_size=batch_size, verbose=0)
            for q in QUESTION_CLASSES:
                out[q].append(np.asarray(said[q])[:b])
        w, s = where[0]
        n = len(inputs.order)
        answers = {}
        for q, k in QUESTION_CLASSES.items():
            p = np.empty((n, k), np.float64)
            if n:
                p[inputs.order] = np.concatenate(out[q])[w, s]
            answers[q] = p
        return answers


def train_network(
    inputs: list[QuestionInputs], config: QuestionsConfig, seed: int = 0
) -> QuestionNetwork:
    """Fit the network on the training runs' calls (config.max_train_calls: a sample of their
    windows, drawn with `seed`)."""
    t0 = time.perf_counter()
    keras.utils.set_random_seed(seed)
    depth = input_depth(inputs)
    x, y, _, stacks = _as_windows(inputs, depth)
    cap = config.max_train_calls
    if cap is not None and len(x["tokens"]) * WINDOW > cap:
        keep = np.random.default_rng(seed).permutation(len(x["tokens"]))[: max(1, cap // WINDOW)]
        x = {k: v[keep] for k, v in x.items()}
        y = {k: v[keep] for k, v in y.items()}
    model = build_network(config.units, depth)
    model.compile(
        optimizer=keras.optimizers.Adam(config.learning_rate),
        loss={q: masked_crossentropy for q in QUESTION_CLASSES},
    )
    if len(x["tokens"]):
        batches = _WindowBatches(x, y, stacks, config.batch_size, seed)
        model.fit(batches, epochs=config.epochs, verbose=0)
    calls = int(sum(len(i.order) for i in inputs))
    return QuestionNetwork(model, calls, config.epochs, time.perf_counter() - t0)


class _WindowBatches(keras.utils.PyDataset):
    """Training batches of windows in a seeded shuffled order (a new one each epoch), their
    frame tokens gathered per batch (the stacked tokens of every window at once would be
    depth x FRAME_PIECES times the calls) and dropped (STACK_DROPOUT, PIECE_DROPOUT)."""

    def __init__(self, x, y, stacks: np.ndarray, batch_size: int, seed: int) -> None:
        super().__init__()
        self.x, self.y, self.stacks, self.batch_size = x, y, stacks, batch_size
        self.seed, self.epoch = seed, 0
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(len(x["tokens"]))

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch_size)

    def __getitem__(self, i: int):
        keep = np.sort(self.order[i * self.batch_size : (i + 1) * self.batch_size])
        x = _with_frames(self.x, self.stacks, keep)
        # a copy (fancy indexing), dropped in place; the same batch, the same drops
        drop_stacks(x["frames"], np.random.default_rng((self.seed, self.epoch, i)))
        return x, {q: v[keep] for q, v in self.y.items()}

    def on_epoch_end(self) -> None:
        self.order = self.rng.permutation(len(self.order))
        self.epoch += 1


def distilled_table(
    inputs: list[QuestionInputs],
    answers: list[dict[str, np.ndarray]],
    majority: np.ndarray,
    alloc_contexts: list[np.ndarray | None] | None = None,
    depth: int = CONTEXT_DEPTH,
) -> ClassTable:
    """The layer's table distilled from the network: per size class, and per call site and size
    class where the free had a site, the sum of the network's reuse distributions at the
    training frees with that key (ClassTable smooths them into the mean), so the table answers
    each key as the network does on average there. With `alloc_contexts` (per run, TABLE row
    order: the freed block's allocation's context at `depth`, distill.allocation_contexts;
    None: a run without stacks), per (allocation context, size class) too (format 4), every
    key the training frees had (ContextCounts.bounded trims them)."""
    sums = np.zeros((N_SIZE_CLASSES, REUSE_CLASSES))
    by_site = np.zeros((SITE_VOCABULARY, N_SIZE_CLASSES, REUSE_CLASSES))
    ctx_keys, ctx_cls, ctx_p = [], [], []
    runs = alloc_contexts if alloc_contexts is not None else [None] * len(inputs)
    for inp, ans, actx in zip(inputs, answers, runs, strict=True):
        cls = inp.free_class  # process order
        p = ans["reuse"][inp.order]  # process order
        at = (cls >= 0) & (inp.labels["reuse"] != NO_LABEL)
        np.add.at(sums, cls[at], p[at])
        has = at & (inp.sites > 0)  # sites: call site + 1, 0 where none
        np.add.at(by_site, (inp.sites[has] - 1, cls[has]), p[has])
        if actx is not None:
            c = np.asarray(actx, np.int64)[inp.order]  # process order
            with_ctx = at & (c >= 0)
            ctx_keys.append(c[with_ctx])
            ctx_cls.append(cls[with_ctx])
            ctx_p.append(p[with_ctx].astype(np.float64))
    contexts = None if alloc_contexts is None else context_sums(depth, ctx_keys, ctx_cls, ctx_p)
    return ClassTable(sums, np.asarray(majority, float), by_site, contexts)


# The placement layer's "long" (native/layers/place/decide.c, native/TABLE.md): a block living past
# LIFETIME_CALL_EDGES[-1] = 65536 calls of its process, or never freed (lifetime_calls classes
# 4 and 5). The layer's own counter calls a block long past `horizon` allocations (262144, about
# twice as many calls); 65536 calls is the network's longest edge, the nearest it can answer.
LONG_LIFETIME_CLASS = len(LIFETIME_CALL_EDGES)


def lifetime_entries(
    site: np.ndarray, cls: np.ndarray, p_long: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The placement's lifetime table from allocations (call site 0..SITE_VOCABULARY-1, size
    class 0..31, P(long) each): per (site, class) some allocation had, the key site * 32 + class
    (uint32, rising) and the mean P(long) as a score, round(255 * p) (uint8)."""
    key = np.asarray(site, np.int64) * N_SIZE_CLASSES + np.asarray(cls, np.int64)
    size = SITE_VOCABULARY * N_SIZE_CLASSES
    n = np.bincount(key, minlength=size)
    total = np.bincount(key, weights=np.asarray(p_long, np.float64), minlength=size)
    keys = np.flatnonzero(n)
    mean = total[keys] / n[keys]
    return keys.astype(np.uint32), np.rint(np.clip(mean, 0.0, 1.0) * 255).astype(np.uint8)


def distilled_lifetime(
    inputs: list[QuestionInputs], answers: list[dict[str, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The placement's lifetime table distilled from the network (`answers`: its answers at the
    training runs' calls, TABLE row order): per (allocation call site, size class) the training
    allocations had, the network's mean P(lifetime_calls class >= LONG_LIFETIME_CLASS) there.
    Allocations without a call site (a trace without callers) give no entry: the layer's counter
    answers for them."""
    sites, classes, probs = [], [], []
    for inp, ans in zip(inputs, answers, strict=True):
        p = ans["lifetime_calls"][inp.order]  # process order
        at = (inp.tokens < N_SIZE_CLASSES) & (inp.labels["lifetime_calls"] != NO_LABEL)
        at &= inp.sites > 0  # sites: call site + 1, 0 where none
        sites.append(inp.sites[at] - 1)
        classes.append(inp.tokens[at])
        probs.append(p[at, LONG_LIFETIME_CLASS:].sum(axis=1))
    if not sites:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint8)
    return lifetime_entries(np.concatenate(sites), np.concatenate(classes), np.concatenate(probs))


def observed_lifetime(tables: list[pa.Table]) -> tuple[np.ndarray, np.ndarray]:
    """The same table from the runs' own lifetimes instead of a network's answers: per (call
    site, size class), the share of the allocations that lived long (benchmarks/bench_place.py
    makes one from a traced run this way; no registered model needed)."""
    sites, classes, longs = [], [], []
    for t in tables:
        label = allocator_labels(t).lifetime_calls
        req, _ = request_and_free_classes(t)
        site = call_sites(t)
        at = (req >= 0) & (label != NO_LABEL) & (site >= 0)
        sites.append(site[at])
        classes.append(req[at])
        longs.append((label[at] >= LONG_LIFETIME_CLASS).astype(np.float64))
    if not sites:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint8)
    return lifetime_entries(np.concatenate(sites), np.concatenate(classes), np.concatenate(longs))


def load_question_network(path: str | Path) -> keras.Model:
    """The network as the registry logged it (questions/network.keras): for answering only."""
    return keras.models.load_model(path, compile=False)


def network_answers(
    table: pa.Table, model: keras.Model, frames: StackFrames | None = None
) -> tuple[dict[str, ReuseAnswers], dict[str, np.ndarray]]:
    """A logged network's answers on an events table (LABEL_COLUMNS, callers where traced; its
    run's stacks in `frames`, read_stack_frames, None: answered without them): (the counters'
    answers it reads, {question: its answer at every row, TABLE row order})."""
    answers, _, said = answered_inputs(table, model, frames)
    return answers, said


def answered_inputs(
    table: pa.Table, model: keras.Model, frames: StackFrames | None = None
) -> tuple[dict[str, ReuseAnswers], QuestionInputs, dict[str, np.ndarray]]:
    """network_answers, and the inputs the network read (what `distilled_table` needs)."""
    flat = {q: np.full(k, 1.0 / k) for q, k in QUESTION_CLASSES.items()}
    answers = {  # the majority is not an input (only the class and site counters are)
        "reuse": reuse_answers(table, flat["reuse"]),
        **lifetime_answers(table, {q: flat[q] for q in ("lifetime_calls", "lifetime_time")}),
    }
    stacks = None if frames is None else RunStacks.of(frames, frame_depth_of(model))
    inputs = question_inputs(table, answers, stacks)
    return answers, inputs, QuestionNetwork(model, 0, 0, 0.0).answer(inputs)


def soon_probability(
    table: pa.Table, model: keras.Model, frames: StackFrames | None = None
) -> np.ndarray:
    """float64 per row of an events table (LABEL_COLUMNS, callers where traced; the run's stacks
    in `frames`): the network's P(the class the row frees is requested again within
    REUSE_EDGES[SOON_CLASS] calls of the process), NaN where the row frees no block of known
    size. Causal: its answer at the free."""
    return soon_of(table, network_answers(table, model, frames)[1]["reuse"])


def soon_of(table: pa.Table, reuse: np.ndarray) -> np.ndarray:
    """float64 per row of `table`: from the network's reuse answer at each row (TABLE row order),
    P(reuse within REUSE_EDGES[SOON_CLASS] calls) where the row frees a block of known size, NaN
    elsewhere. The inputs are the class and site counters only (not the majority nor the
    table), so the evaluation's answers (tasks/learning/questions/evaluation.py) are these."""
    _, free_cls = request_and_free_classes(table)
    return np.where(free_cls >= 0, reuse[:, : SOON_CLASS + 1].sum(axis=1), np.nan)
