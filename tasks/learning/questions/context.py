"""The questions' counters on the calling context (issue 65): `context_online`, learned inside the
run, and `context_table`, which starts from the training runs' counts of the same keys and is
corrected by the run's own (tasks/learning/counters/by_context.py, the back-off and its figures:
docs/learning-context.md#the-context-counters); the lifetimes' `context_survival` walks the
same chain (lifetime.py).

The chain of keys, coarsest first, each with the size class the question is about:
- a lifetime (at an allocation): the class, then the allocation's context at each depth of
  CONTEXT_DEPTHS (depth 1: its call site; the last: the whole recorded stack), then beyond the
  stack (lifetime_levels): the whole stack with the exact requested size, with the call site of
  the process's previous allocation, and with the calls since the previous allocation of that
  same key (bit length): what a wrapper's one stack serves alike, told apart by what the
  program asked for and what it was doing (all known at the call);
- reuse (at a free): the class, the free's own call site (what site_online keys on; frees carry
  no stack), then the freed block's ALLOCATION context at each depth, which the program knew
  when it allocated the block (the allocation is the row whose lifetime ends at this free).

A row without a context (a trace recorded without stacks, a block allocated before the trace)
answers as site_online does, exactly: on a dataset without stacks both counters are site_online.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.contexts import NO_CONTEXT, event_contexts
from tasks.dataset.events_reader import StackFrames, read_stack_frames
from tasks.dataset.sites import call_sites
from tasks.dataset.tokens import bit_length
from tasks.learning.counters.by_context import NO_KEY, ContextPrior, KeyChain, backoff_online
from tasks.learning.counters.by_due import freed_allocations, lifetime_due
from tasks.learning.labels import (
    NO_LABEL,
    QUESTION_CLASSES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)

CONTEXT_ONLINE = "context_online"
CONTEXT_TABLE = "context_table"
# the lifetimes' censoring-aware estimate (lifetime.py's site_survival) down the same chain
CONTEXT_SURVIVAL = "context_survival"
CONTEXT_DEPTHS = (1, 2, 4, 8, 32)  # 32: the whole stack as the catalog records it
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xC2B2AE3D27D4EB4F)


def run_contexts(frames: StackFrames, table: pa.Table) -> dict[int, np.ndarray]:
    """{depth: int64 [n]} each row's context key (NO_CONTEXT without a stack), table order."""
    if "stack" not in table.column_names:
        return {d: np.full(table.num_rows, NO_CONTEXT, np.int64) for d in CONTEXT_DEPTHS}
    return event_contexts(frames, table.column("stack"), CONTEXT_DEPTHS)


def read_contexts(root: Root, workload: str, run: str, table: pa.Table) -> dict[int, np.ndarray]:
    """run_contexts of one run's events `table` (its rows, read with the `stack` column), from
    the run's stacks table (empty for a run without stacks: every row NO_CONTEXT)."""
    return run_contexts(read_stack_frames(root, workload, run), table)


def with_class(key: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """int64 [n]: one key of (key, size class), NO_KEY where key is NO_CONTEXT or cls < 0."""
    with np.errstate(over="ignore"):
        mixed = (key.astype(np.uint64) * _MIX) ^ np.maximum(cls, 0).astype(np.uint64)
    return np.where(
        (key != NO_CONTEXT) & (cls >= 0), (mixed >> np.uint64(1)).astype(np.int64), NO_KEY
    )


def mixed(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """int64 [n]: one key of (key, value) (any int64 / uint64 values), NO_KEY where key is."""
    with np.errstate(over="ignore"):
        m = (key.astype(np.uint64) * _MIX) ^ (value.astype(np.uint64) * _MIX2)
        m ^= m >> np.uint64(29)
    return np.where(key != NO_KEY, (m >> np.uint64(1)).astype(np.int64), NO_KEY)


def previous_allocation(
    key: np.ndarray, defines: np.ndarray, order: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """int64 [n] (table order): `key` of the process's allocation before each row (the last
    earlier row of its process, in call order, with `defines`), NO_KEY before its first."""
    n = len(order)
    at = np.where(defines[order], np.arange(n), -1)
    last = np.maximum.accumulate(at) if n else at
    prev = np.full(n, -1, np.int64)
    prev[1:] = last[:-1]
    proc = np.cumsum(starts) - 1
    ok = (prev >= 0) & (proc[np.maximum(prev, 0)] == proc)
    out = np.empty(n, np.int64)
    out[order] = np.where(ok, key[order][np.maximum(prev, 0)], NO_KEY)
    return out


def calls_since_same(key: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 [n] (table order): the bit length of the calls of the process since its last
    earlier row with the same `key`, NO_KEY where the key is NO_KEY or has no earlier row."""
    n = len(order)
    proc = np.cumsum(starts) - 1
    k = key[order]
    s = np.lexsort((np.arange(n), k, proc))  # by process, key, then call order
    gap = np.full(n, NO_KEY, np.int64)
    same = (k[s][1:] == k[s][:-1]) & (proc[s][1:] == proc[s][:-1]) & (k[s][1:] != NO_KEY)
    later = s[1:][same]
    gap[later] = bit_length((later - s[:-1][same]).astype(np.uint64)).astype(np.int64)
    out = np.empty(n, np.int64)
    out[order] = gap
    return out


def lifetime_levels(
    contexts: dict[int, np.ndarray],
    req_cls: np.ndarray,
    size: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
) -> list[np.ndarray]:
    """The lifetime questions' chain (table order): the class, each depth's context, then the
    whole stack with the exact requested `size` (uint64 [n]), with the depth-1 context of the
    process's previous allocation (order, starts: process_order), and with the bit length of
    the calls since the previous allocation with that same key: each known at the call."""
    levels = [req_cls.astype(np.int64), *(with_class(contexts[d], req_cls) for d in CONTEXT_DEPTHS)]
    by_size = mixed(levels[-1], size)
    after = mixed(by_size, previous_allocation(contexts[1], req_cls >= 0, order, starts))
    since = mixed(after, calls_since_same(by_size, order, starts))
    return [*levels, by_size, after, since]


def allocation_levels(
    table: pa.Table, contexts: dict[int, np.ndarray], order: np.ndarray, starts: np.ndarray
) -> list[np.ndarray]:
    """lifetime_levels of one run's events `table` (process_order's order and starts)."""
    req_cls, _ = request_and_free_classes(table)
    size = table.column("size").to_numpy().astype(np.uint64)
    return lifetime_levels(contexts, req_cls, size, order, starts)


def reuse_levels(
    contexts: dict[int, np.ndarray],
    free_cls: np.ndarray,
    site: np.ndarray,
    order: np.ndarray,
    due: np.ndarray,
) -> list[np.ndarray]:
    """The reuse question's chain (table order): the class, the free's call site (-1: none),
    then each depth of the freed block's allocation context. `due`: lifetime_due (process
    order), which names each allocation's free."""
    by_order = freed_allocations(due)  # the allocation each row frees, process order
    alloc = np.full(len(order), -1, np.int64)  # the same in table rows
    alloc[order] = np.where(by_order >= 0, order[np.maximum(by_order, 0)], -1)
    site_key = np.where(site >= 0, with_class(site, free_cls), NO_KEY)
    levels = [free_cls.astype(np.int64), site_key]
    for d in CONTEXT_DEPTHS:
        ctx = np.where(alloc >= 0, contexts[d][np.maximum(alloc, 0)], NO_CONTEXT)
        levels.append(with_class(ctx, free_cls))
    return levels


def context_answers(
    order: np.ndarray,
    chain: KeyChain,
    due: np.ndarray,
    label: np.ndarray,
    rows: np.ndarray,
    site_online: np.ndarray,
    prior: ContextPrior | None = None,
    eps: float = 0.1,
) -> dict[str, np.ndarray]:
    """{CONTEXT_ONLINE, and CONTEXT_TABLE with a prior: float64 [m, k]} at `rows` (table order):
    the back-off down `chain` (key_chain of a question's levels; `due` and `label` in process
    order), site_online's answer there (float64 [m, k]) where a row has no context."""
    at = np.empty(len(order), np.int64)
    at[order] = np.arange(len(order))
    at = at[rows]  # each scored row's place in process order
    without = np.flatnonzero(chain.levels[-1][at] == NO_KEY)
    k = site_online.shape[1]
    online, table = backoff_online(chain, due, label, k, eps, prior=prior, at=at)
    out = {CONTEXT_ONLINE: online}
    if table is not None:
        out[CONTEXT_TABLE] = table
    for p in out.values():
        p[without] = site_online[without]
    return out


def without_context(order: np.ndarray, chain: KeyChain) -> np.ndarray:
    """bool [n] in table order: the rows with no key at the chain's deepest level, which
    answer as the call-site counters do."""
    out = np.empty(len(order), bool)
    out[order] = chain.levels[-1] == NO_KEY
    return out


def key_chain(
    order: np.ndarray, starts: np.ndarray, ask: np.ndarray, levels: list[np.ndarray]
) -> KeyChain:
    """KeyChain of `levels` at the asking rows (`ask` and `levels` in table order)."""
    return KeyChain.of(starts, ask[order], [np.ascontiguousarray(x[order]) for x in levels])


def context_priors(
    tables: list[pa.Table], contexts: list[dict[int, np.ndarray]]
) -> dict[str, ContextPrior]:
    """{question: ContextPrior}: the training runs' counts of each question's chain ("reuse",
    "lifetime_calls", "lifetime_time"), from their events and contexts (run_contexts); {}
    without training runs."""
    if not tables:
        return {}
    levels: dict[str, list[list[np.ndarray]]] = {q: [] for q in QUESTION_CLASSES}
    labels: dict[str, list[np.ndarray]] = {q: [] for q in QUESTION_CLASSES}
    for t, ctx in zip(tables, contexts, strict=True):
        every = allocator_labels(t)
        order, starts = process_order(t)
        req_cls, free_cls = request_and_free_classes(t)
        due = lifetime_due(t, order, starts)
        life = allocation_levels(t, ctx, order, starts)
        chains = {
            "reuse": (reuse_levels(ctx, free_cls, call_sites(t), order, due), every.reuse),
            "lifetime_calls": (life, every.lifetime_calls),
            "lifetime_time": (life, every.lifetime_time),
        }
        for q, (lv, lab) in chains.items():
            asked = lab != NO_LABEL
            levels[q].append([x[asked] for x in lv])
            labels[q].append(lab[asked].astype(np.int64))
    return {q: ContextPrior.of(levels[q], labels[q], k) for q, k in QUESTION_CLASSES.items()}
