"""The allocator layer's table (native/TABLE.md), distilled from the questions' network.

The layer asks at a free of a block of size class c the reuse question of tasks/learning/labels.py.
This module holds, per key, the sum of the network's answers over the training runs' frees
(`ClassTable`, question_network.distilled_table; without a network, `class_table` counts the frees'
true reuse classes instead), answers the question from it at the evaluation positions (the predictor
`table`, tasks/learning/questions/reuse.py), and writes the layer's file: the keep score P(reuse class <=
LAYER_SOON_CLASS | a free of class c).

Its keys (format 3): the free's call site (tasks/dataset/sites.py) and size class where the
training frees had that site; elsewhere the layer asks its online counter, and the evaluation
`class_online`. A table without site keys (format 2) answers by the size class alone. Format 4 adds
(allocation context, size class) keys (`ContextCounts`, `context_counts`): the freed block's
allocation's calling context (tasks/dataset/contexts.py, at CONTEXT_DEPTH frames), which the layer
computes when it hands the block out and asks at its free before the call site; `ClassTable.answer`
asks them in the same order. The night's table keeps the keys with MIN_CONTEXT_FREES training
frees, at most MAX_TABLE_CONTEXTS (`ContextCounts.bounded`). `TableAgreement.site_coverage` and
`context_coverage` say how many frees a site, a context answered. Why sites, and the figures:
docs/layer.md#the-table-distilled-from-the-network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.dataset.contexts import NO_CONTEXT
from tasks.dataset.sites import SITE_VOCABULARY, call_sites
from tasks.learning.counters.by_due import freed_allocations, lifetime_due
from tasks.learning.labels import (
    NO_LABEL,
    REUSE_CLASSES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)

N_SIZE_CLASSES = 32
N_TOKENS = 64  # the project's tokens: allocations 0..31, frees 32 + class
FREE_TOKEN = 32
SOON_CLASS = 1  # whatif's "soon": reuse class <= 1, the class requested again within 16 calls
# The layer's "soon": reuse class <= 3, requested again within REUSE_EDGES[3] = 4096 calls of the
# process. The layer keeps blocks of 128 KiB and more until reused or idle for a second, so reuse
# within 16 calls (SOON_CLASS) asks what the layer never needs (docs/layer.md).
LAYER_SOON_CLASS = 3
# The depth of the allocation contexts a format 4 table keys on (one of the questions' depths,
# tasks/learning/questions/context.py CONTEXT_DEPTHS): a wrapper and its caller, and two more;
# the file says its depth, and the layer walks that many frames (native/TABLE.md).
CONTEXT_DEPTH = 4
# The night's table keeps a (context, class) key only where at least this many training frees
# had it: a key seen once or twice says what one run did, and the site entry (or the counter)
# answers it no worse; the file stays small.
MIN_CONTEXT_FREES = 8
# ... and at most this many keys, those with the most training frees: every process the layer
# runs in maps an open-addressing set of at least 32 bytes a key (16-byte slots, at most half
# full, layers/layer/table.c) and the file holds 12 bytes a key, so 65,536 keys are at most
# 2 MiB of each process's memory and 768 KiB of file; the layer itself reads up to 2^22.
MAX_TABLE_CONTEXTS = 1 << 16


@dataclass(frozen=True)
class ContextCounts:
    """The training runs' frees per (allocation context, size class): how many fell in each reuse
    class. Keys sorted by (context, class), unique; contexts non-negative (63-bit keys)."""

    depth: int  # the contexts' frames (2..16)
    context: np.ndarray  # int64 [m]
    cls: np.ndarray  # int64 [m]
    counts: np.ndarray  # float64 [m, REUSE_CLASSES]

    def __post_init__(self) -> None:
        if not 2 <= self.depth <= 16:
            raise ValueError(f"context depth {self.depth}: the layer walks 2..16 frames")

    def keep_scores(self, eps: float = 0.1) -> np.ndarray:
        """uint8 [m]: 255 * P(reuse class <= LAYER_SOON_CLASS) per key, as site_scores."""
        return _score(soon_of_reuse(_smoothed(self.counts, eps)))

    def frees(self) -> np.ndarray:
        """float64 [m]: the training frees each key had (a distilled key's rows are the
        network's distributions, one per free, each summing to 1)."""
        return self.counts.sum(axis=1)

    def bounded(
        self, min_frees: float = MIN_CONTEXT_FREES, cap: int = MAX_TABLE_CONTEXTS
    ) -> ContextCounts:
        """The keys with at least `min_frees` training frees, at most `cap` of them (the most
        frees first; ties: the lower key), still sorted by (context, class)."""
        n = self.frees()
        keep = np.flatnonzero(n >= min_frees - 1e-9)
        if len(keep) > cap:
            keep = np.sort(keep[np.argsort(-n[keep], kind="stable")[:cap]])
        return ContextCounts(self.depth, self.context[keep], self.cls[keep], self.counts[keep])

    def lookup(self, context: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """int64 [n]: the key index of each (context, class) (NO_CONTEXT, or a key not held:
        -1): `context_key_index`."""
        return context_key_index(self.context, self.cls, context, cls)


def context_key_index(
    held_context: np.ndarray, held_cls: np.ndarray, context: np.ndarray, cls: np.ndarray
) -> np.ndarray:
    """int64 [n]: the index among the held keys (`held_context`, `held_cls`, sorted by
    (context, class), unique) of each asked (context, class); -1 where it is not held (or
    NO_CONTEXT, a class outside 0..31). What the table's answer and whatif's replay ask of a
    format 4 table's context entries. Each context's rank among the held contexts, then
    (rank, class) searched as one sorted integer."""
    context = np.asarray(context, np.int64)
    cls = np.asarray(cls, np.int64)
    held_context = np.asarray(held_context, np.int64)
    out = np.full(len(context), -1, np.int64)
    if len(held_context) == 0 or len(context) == 0:
        return out
    held = np.unique(held_context)  # sorted
    rank = np.searchsorted(held, context)
    ok = (context >= 0) & (cls >= 0) & (cls < N_SIZE_CLASSES)
    ok &= held[np.minimum(rank, len(held) - 1)] == context
    keys = np.searchsorted(held, held_context) * N_SIZE_CLASSES + np.asarray(held_cls, np.int64)
    want = rank * N_SIZE_CLASSES + np.clip(cls, 0, N_SIZE_CLASSES - 1)
    at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    ok &= keys[at] == want
    out[ok] = at[ok]
    return out


@dataclass(frozen=True)
class ClassTable:
    """The training runs' frees, per size class: how many fell in each reuse class (or, distilled,
    the sum of the network's answers there)."""

    reuse_counts: np.ndarray  # float64 [N_SIZE_CLASSES, REUSE_CLASSES]
    majority: np.ndarray  # float64 [REUSE_CLASSES]: the answer for a class never freed in training
    # float64 [SITE_VOCABULARY, N_SIZE_CLASSES, REUSE_CLASSES]: the same, per call site and class
    # of the training frees that had a call site; None: no site keys (a trace without callers)
    site_counts: np.ndarray | None = None
    # per (allocation context, class) of the training frees whose allocation had a stack (format
    # 4); None: no context keys
    context_counts: ContextCounts | None = None

    def covered(self) -> np.ndarray:
        """bool [N_SIZE_CLASSES]: the classes some training free answers for."""
        return self.reuse_counts.sum(axis=1) > 0

    def site_known(self) -> np.ndarray:
        """bool [SITE_VOCABULARY, N_SIZE_CLASSES]: the (site, class) keys some training free
        answers for."""
        if self.site_counts is None:
            return np.zeros((SITE_VOCABULARY, N_SIZE_CLASSES), bool)
        return self.site_counts.sum(axis=2) > 0

    def answer(
        self,
        site: np.ndarray,
        cls: np.ndarray,
        eps: float = 0.1,
        counter: np.ndarray | None = None,
        alloc_context: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """At frees of size class `cls` (>= 0) from call site `site` (-1: none) of blocks whose
        allocation had the context `alloc_context` (allocation_contexts at the table's depth;
        NO_CONTEXT, or None: none): the reuse classes as the layer's table answers them
        (layers/layer/policy.c hl_keep_at_free): by (allocation context, class) where the table
        holds that key; else by (site, class) where it holds that one; elsewhere, in a table
        with site or context keys, the online counter's answer (`counter`, float
        [n, REUSE_CLASSES]: the layer asks its own there), else by class. Also bool [n] each:
        where a site answered, where a context answered (never both)."""
        known = self.site_known()
        ctx = self.context_counts
        held = ctx is not None and len(ctx.context) > 0
        # as the layer: a file without entries answers by class (hl_use_sites: site or
        # context entries)
        keyed = bool(known.any()) or held
        if keyed and counter is not None:
            probs = np.array(counter, dtype=np.float64)
        else:
            probs = self.reuse_probs(eps)[cls]
        at_site = np.zeros(len(cls), bool)
        at_context = np.zeros(len(cls), bool)
        if held and alloc_context is not None:
            entry = ctx.lookup(alloc_context, cls)
            at_context = entry >= 0
            probs[at_context] = _smoothed(ctx.counts[entry[at_context]], eps)
        if known.any():
            has = (site >= 0) & ~at_context
            at_site[has] = known[site[has], cls[has]]
            probs[at_site] = _smoothed(self.site_counts[site[at_site], cls[at_site]], eps)
        return probs, at_site, at_context

    def reuse_probs(self, eps: float = 0.1) -> np.ndarray:
        """float64 [N_SIZE_CLASSES, REUSE_CLASSES]: each class's reuse classes, smoothed as the
        counters smooth theirs; the majority for a class with no training free."""
        p = _smoothed(self.reuse_counts, eps)
        return np.where(self.covered()[:, None], p, self.majority[None, :])

    def keep_scores(self) -> np.ndarray:
        """uint8 [N_TOKENS, N_TOKENS]: the layer's payload. Entry [FREE_TOKEN + c][c] is
        255 * P(reuse class <= LAYER_SOON_CLASS) of class c; the layer asks no other entry, so
        the others are 0."""
        soon = soon_of_reuse(self.reuse_probs())
        scores = np.zeros((N_TOKENS, N_TOKENS), np.uint8)
        c = np.arange(N_SIZE_CLASSES)
        scores[FREE_TOKEN + c, c] = _score(soon)
        return scores

    def site_scores(self, eps: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
        """uint8 [SITE_VOCABULARY, N_SIZE_CLASSES] keep scores by call site and class (0 where
        unknown) and bool [SITE_VOCABULARY, N_SIZE_CLASSES]: known."""
        known = self.site_known()
        if self.site_counts is None:
            return np.zeros(known.shape, np.uint8), known
        soon = soon_of_reuse(_smoothed(self.site_counts, eps))
        return np.where(known, _score(soon), 0).astype(np.uint8), known


def _smoothed(counts: np.ndarray, eps: float) -> np.ndarray:
    """Reuse-class counts (last axis) as distributions, smoothed as the counters smooth theirs."""
    return (counts + eps) / (counts.sum(axis=-1, keepdims=True) + eps * REUSE_CLASSES)


def soon_of_reuse(probs: np.ndarray) -> np.ndarray:
    """P(reuse class <= LAYER_SOON_CLASS) from reuse distributions (last axis): the layer's
    question, reuse within 4096 calls."""
    return probs[..., : LAYER_SOON_CLASS + 1].sum(axis=-1)


def _score(p: np.ndarray) -> np.ndarray:
    """uint8 keep scores from probabilities: 255 * p, rounded."""
    return np.rint(np.clip(p, 0.0, 1.0) * 255).astype(np.uint8)


def allocation_contexts(table: pa.Table, contexts: np.ndarray) -> np.ndarray:
    """int64 [n], table order: at each row that frees a block, the context of the row that
    allocated it (`contexts`: each row's key at one depth, tasks/dataset/contexts.py
    event_contexts); NO_CONTEXT elsewhere (no free, an allocation outside the table, or one
    without a stack). The allocation is the row whose lifetime ends at this free."""
    order, starts = process_order(table)
    by_order = freed_allocations(lifetime_due(table, order, starts))
    alloc = np.full(table.num_rows, -1, np.int64)
    alloc[order] = np.where(by_order >= 0, order[np.maximum(by_order, 0)], -1)
    ctx = np.asarray(contexts, np.int64)
    return np.where(alloc >= 0, ctx[np.maximum(alloc, 0)], NO_CONTEXT)


def context_sums(
    depth: int, contexts: list[np.ndarray], classes: list[np.ndarray], weights: list[np.ndarray]
) -> ContextCounts:
    """Per (allocation context, size class): the sum of `weights` (float [k, REUSE_CLASSES]
    per free: a one-hot true class, or the network's answer) over the frees with that key."""
    n = sum(len(k) for k in contexts)
    if not n:
        z = np.zeros(0, np.int64)
        return ContextCounts(depth, z, z.copy(), np.zeros((0, REUSE_CLASSES)))
    pair = np.stack([np.concatenate(contexts), np.concatenate(classes)], axis=1)
    uniq, inv = np.unique(pair, axis=0, return_inverse=True)
    counts = np.zeros((len(uniq), REUSE_CLASSES))
    np.add.at(counts, inv.ravel(), np.concatenate(weights))
    return ContextCounts(depth, uniq[:, 0].copy(), uniq[:, 1].copy(), counts)


def context_counts(
    tables: list[pa.Table], contexts: list[np.ndarray | None], depth: int = CONTEXT_DEPTH
) -> ContextCounts:
    """The reuse classes of the training runs' frees per (allocation context, size class):
    `contexts[i]` each row's context key at `depth` in tables[i] (None: a run without stacks)."""
    keys, classes, labels = [], [], []
    for t, ctx in zip(tables, contexts, strict=True):
        if ctx is None:
            continue
        label = allocator_labels(t).reuse
        _, free_cls = request_and_free_classes(t)
        actx = allocation_contexts(t, ctx)
        at = (label != NO_LABEL) & (free_cls >= 0) & (actx >= 0)
        keys.append(actx[at])
        classes.append(free_cls[at])
        labels.append(np.eye(REUSE_CLASSES)[label[at].astype(np.int64)])
    return context_sums(depth, keys, classes, labels)


def class_table(
    tables: list[pa.Table],
    majority: np.ndarray,
    contexts: list[np.ndarray | None] | None = None,
    depth: int = CONTEXT_DEPTH,
) -> ClassTable:
    """The reuse classes of the training runs' frees per size class, and per call site and class
    where the free has a site (`tables`: their events, callers where traced); with `contexts`
    (each table's rows' context keys at `depth`), per allocation context and class too."""
    counts = np.zeros(N_SIZE_CLASSES * REUSE_CLASSES)
    by_site = np.zeros(SITE_VOCABULARY * N_SIZE_CLASSES * REUSE_CLASSES)
    for t in tables:
        label = allocator_labels(t).reuse
        _, free_cls = request_and_free_classes(t)
        site = call_sites(t)
        at = (label != NO_LABEL) & (free_cls >= 0)
        key = free_cls[at] * REUSE_CLASSES + label[at]
        counts += np.bincount(key, minlength=len(counts))
        s = site[at]
        has = s >= 0
        by_site += np.bincount(
            s[has] * (N_SIZE_CLASSES * REUSE_CLASSES) + key[has], minlength=len(by_site)
        )
    return ClassTable(
        counts.reshape(N_SIZE_CLASSES, REUSE_CLASSES),
        np.asarray(majority, float),
        by_site.reshape(SITE_VOCABULARY, N_SIZE_CLASSES, REUSE_CLASSES),
        None if contexts is None else context_counts(tables, contexts, depth),
    )


@dataclass(frozen=True)
class TableAgreement:
    """The table at one evaluation table's reuse positions (frees)."""

    table: str
    positions: int
    coverage: float  # share of positions whose class some training free answers for
    keep_agreement: float  # on covered positions: the layer's keep decision, table vs `against`
    top1_agreement: float  # on covered positions: the reuse class top-1, table vs `against`
    against: str = "class_online"  # the predictor the table follows (the one it was made from)
    # share of positions the table answers by call site and class (a key training saw), and
    # the keep agreement on those; the rest answer as the online counter (by class in a table
    # without site keys)
    site_coverage: float = float("nan")
    keep_agreement_at_sites: float = float("nan")
    # share of positions the table answers by (allocation context, class) (format 4; before
    # any site), and the keep agreement on those
    context_coverage: float = float("nan")
    keep_agreement_at_contexts: float = float("nan")


KEEP_AT = 0.5  # keep a freed block when P(reuse soon) is at least this (the layer; whatif)


def keep_soon(soon: np.ndarray) -> np.ndarray:
    """bool per row from P(reuse soon) per row (NaN where the row frees nothing): the layer's
    rule, which whatif's `guided_questions` applies to the questions' network."""
    return np.nan_to_num(soon, nan=0.0) >= KEEP_AT


def table_agreement(
    table: str,
    covered: np.ndarray,
    table_probs: np.ndarray,
    counter_probs: np.ndarray,
    against: str = "class_online",
    at_site: np.ndarray | None = None,
    at_context: np.ndarray | None = None,
) -> TableAgreement:
    """Coverage and agreement with the predictor `against` (its answers `counter_probs`: the
    network the table is distilled from, else the layer's online class counter) at one
    evaluation table's frees; keep = P(reuse class <= LAYER_SOON_CLASS) >= 1/2 (the layer's
    rule at topk=2); `at_site`, `at_context`: where the table answered by call site, by
    allocation context."""
    n = len(covered)
    if n == 0:
        return TableAgreement(table, 0, float("nan"), float("nan"), float("nan"), against)
    same = keep_soon(soon_of_reuse(table_probs)) == keep_soon(soon_of_reuse(counter_probs))
    top = table_probs.argmax(axis=1) == counter_probs.argmax(axis=1)
    m = int(covered.sum())
    sites = at_site if at_site is not None else np.zeros(n, bool)
    ctxs = at_context if at_context is not None else np.zeros(n, bool)
    return TableAgreement(
        table,
        n,
        m / n,
        float(same[covered].mean()) if m else float("nan"),
        float(top[covered].mean()) if m else float("nan"),
        against,
        float(sites.mean()),
        float(same[sites].mean()) if sites.any() else float("nan"),
        float(ctxs.mean()),
        float(same[ctxs].mean()) if ctxs.any() else float("nan"),
    )
