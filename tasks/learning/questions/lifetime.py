"""Causal predictors of the lifetime question, beside the reuse question's (tasks/learning/questions/reuse.py).

The question (tasks/learning/labels.py): at an allocation of size class c, how long will the
block live, in calls of the process ("lifetime_calls") and in time ("lifetime_time"), bucketed,
never freed a class of its own? The predictors answer at every allocation: majority,
class_online and site_online (counted at the call that frees a block, so they never learn "never
freed"), and site_survival (censored Kaplan-Meier hazards per call site and class, which learn
long lives before any such block is freed: _survival); with the calls' stacks, the same keyed on
the calling context with back-off (context_online, context_table, context_survival:
tasks/learning/questions/context.py). Each, in full:
docs/learning-questions.md#the-lifetime-questions-predictors.

Where a free lands: the dataset's lifetime_calls counts calls of the process from the
allocation to the free, so the free is that many calls later in the process's call order
(labels.process_order). Compiled (numba), one pass per run.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from tasks.learning.counters.by_context import ContextPrior, KeyChain
from tasks.learning.counters.by_due import lifetime_due, online_by_due
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    LIFETIME_CLASSES,
    LIFETIME_NS_EDGES,
    NO_LABEL,
    allocator_labels,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.context import (
    CONTEXT_SURVIVAL,
    allocation_levels,
    context_answers,
    key_chain,
    without_context,
)
from tasks.learning.questions.hedge import censored_events, hedge_keys
from tasks.learning.questions.reuse import SITE_VOCABULARY, ReuseAnswers, call_sites

QUESTIONS = ("lifetime_calls", "lifetime_time")


def outlived_at(
    table: pa.Table, order: np.ndarray, starts: np.ndarray, question: str
) -> np.ndarray:
    """int64 [n, edges] in process order: the first row of its process at which each row's block
    (if still live) has outlived each edge of `question`'s classes, in calls (row + edge + 1) or
    in time (the first call later than its time + edge); -1 past the process's end. What a
    program that watches itself knows of a block before its free: its class is above that
    edge's (tasks/learning/questions/hedge.py censored_events)."""
    n = len(order)
    proc = np.cumsum(starts) - 1
    proc_end = np.flatnonzero(np.append(starts[1:], True))[proc]
    if question == "lifetime_calls":
        at = np.arange(n)[:, None] + np.asarray(LIFETIME_CALL_EDGES, np.int64)[None, :] + 1
    else:
        t = table.column("time_ns").to_numpy().astype(np.int64)[order]
        rel = t - t[np.flatnonzero(starts)][proc]  # time since the process's first call
        span = int(rel.max(initial=0)) + 1 + int(max(LIFETIME_NS_EDGES))
        key = proc * span + rel  # sorted: processes in order, each in time order
        want = key[:, None] + np.asarray(LIFETIME_NS_EDGES, np.int64)[None, :]
        at = np.searchsorted(key, want, side="right")
    return np.where(at <= proc_end[:, None], at, -1)


SURVIVAL = "site_survival"
NETWORK_SURVIVAL = "network_survival"  # the same, from the network's answer (questions.py)
SURVIVAL_EPS = 4.0  # blocks' worth of the process's hazards in a site's own estimate


@njit(cache=True)
def _survival(proc_start, ask, ids, n_ids, ev_row, ev_f, ev_j, label, k, eps, prior, slot, out):
    """out[slot[i]] at every allocation row i (ask[i] >= 0) with slot[i] >= 0 (the rows asked
    for; the others are still counted): from the process's earlier allocations, what became
    known of them by row i (events as tasks/learning/questions/hedge.py's
    censored_events: ev_j >= 0, the block outlived edge ev_j; ev_j < 0, its free with its
    class), the Kaplan-Meier estimate down a chain of keys (ids int [levels, n], coarsest
    first, the process folded in; -1: the row has no key at that level): for each class j below
    the last edge, the hazard ended[j] / (ended[j] + outlived[j]) (a block still inside class
    j's interval counts for neither) of each level's key, shrunk toward the coarser level's
    hazard with `eps` blocks' weight; past the last edge, the blocks freed so far against those
    not yet freed split the rest between "later" and "never freed", shrunk the same way. The
    chain starts from a prior hazard: prior[i] where that row sums to > 0 (the network's answer
    at i), else the process's hazards so far. Rows in process call order; prior float64 [n, k]
    or [0, k] for none.
    """
    levels = ids.shape[0]
    ended = np.zeros((n_ids, k))
    outlived = np.zeros((n_ids, k))
    p_ended = np.zeros(k)
    p_outlived = np.zeros(k)
    p = 0
    for i in range(ask.shape[0]):
        if proc_start[i]:
            p_ended[:] = 0.0
            p_outlived[:] = 0.0
        while p < ev_row.shape[0] and ev_row[p] <= i:
            f, j = ev_f[p], ev_j[p]
            if ask[f] >= 0:
                if j >= 0:
                    p_outlived[j] += 1.0
                else:
                    p_ended[label[f]] += 1.0
                for lv in range(levels):
                    key = ids[lv, f]
                    if key < 0:
                        continue
                    if j >= 0:
                        outlived[key, j] += 1.0
                    else:
                        ended[key, label[f]] += 1.0
            p += 1
        o = slot[i]
        if ask[i] >= 0 and o >= 0:
            given = False
            if prior.shape[0] > 0:
                given = prior[i].sum() > 0.0
            alive = 1.0
            for j in range(k - 2):
                if given:  # the prior's hazard: P(j) / P(>= j), kept off 0 and 1
                    rest = 0.0
                    for c in range(j, k):
                        rest += prior[i, c]
                    h = min(max(prior[i, j] / max(rest, 1e-12), 1e-6), 1.0 - 1e-6)
                else:
                    h = (p_ended[j] + 0.5) / (p_ended[j] + p_outlived[j] + 1.0)
                for lv in range(levels):
                    key = ids[lv, i]
                    if key >= 0:
                        h = (ended[key, j] + eps * h) / (ended[key, j] + outlived[key, j] + eps)
                out[o, j] = alive * h
                alive *= 1.0 - h
            j = k - 2  # past the last edge: freed since, or not (yet)
            if given:
                tail = max(prior[i, j] + prior[i, j + 1], 1e-12)
                freed = min(max(prior[i, j] / tail, 1e-3), 1.0 - 1e-3)
            else:
                freed = min((p_ended[j] + 0.5) / (p_outlived[j - 1] + 1.0), 1.0)
            for lv in range(levels):
                key = ids[lv, i]
                if key >= 0:
                    freed = (ended[key, j] + eps * freed) / (outlived[key, j - 1] + eps)
                    freed = min(max(freed, 1e-3), 1.0 - 1e-3)
            out[o, j] = alive * freed
            out[o, k - 1] = alive * (1.0 - freed)


def _survival_at(
    order: np.ndarray,
    starts: np.ndarray,
    req_cls: np.ndarray,
    chain: KeyChain,
    label: np.ndarray,
    events: tuple[np.ndarray, np.ndarray, np.ndarray],
    rows: np.ndarray,
    prior: np.ndarray | None = None,
) -> np.ndarray:
    """float64 [len(rows), LIFETIME_CLASSES] at `rows` (table order): _survival over one run
    down `chain` (context.key_chain of the allocations' keys); req_cls, label, prior per row in
    table order, events in process order."""
    n = len(order)
    ask = np.ascontiguousarray(req_cls[order])
    lab = np.ascontiguousarray(np.maximum(label[order], 0).astype(np.int64))
    pri = np.zeros((0, LIFETIME_CLASSES)) if prior is None else np.ascontiguousarray(prior[order])
    place = np.empty(n, np.int64)  # each table row's place in process order
    place[order] = np.arange(n)
    slot = np.full(n, -1, np.int64)  # each row's place in the answer, process order
    slot[place[rows]] = np.arange(len(rows))
    out = np.zeros((len(rows), LIFETIME_CLASSES), np.float64)
    _survival(
        np.ascontiguousarray(starts), ask, chain.ids, chain.n_ids, *events, lab, LIFETIME_CLASSES,
        SURVIVAL_EPS, pri, slot, out,
    )  # fmt: skip
    return out


def network_survival(
    order: np.ndarray,
    starts: np.ndarray,
    req_cls: np.ndarray,
    site: np.ndarray,
    answers: ReuseAnswers,
    network: np.ndarray,
) -> np.ndarray:
    """float64 [m, k] at answers.rows (one lifetime question's, with its learnt events): the
    network's answer at each allocation as the prior of site_survival's estimate, which the
    process's own blocks of that site and class then correct. Why: the network knows from other
    programs what a process's own short history cannot (blocks freed at exit, a phase to come);
    the site's blocks say where this program departs from it. Causal as site_survival is."""
    if any(p.shape[1] != LIFETIME_CLASSES for p in (network, *answers.probs.values())):
        raise ValueError("network_survival needs a lifetime question's answers and network's")
    n = len(order)
    label = np.zeros(n, np.int64)
    label[answers.rows] = answers.labels
    prior = np.zeros((n, LIFETIME_CLASSES), np.float64)
    prior[answers.rows] = network
    chain = key_chain(order, starts, req_cls >= 0, [hedge_keys(site, req_cls)])
    return _survival_at(order, starts, req_cls, chain, label, answers.learnt, answers.rows, prior)


def lifetime_answers(
    table: pa.Table,
    majority: dict[str, np.ndarray],
    eps: float = 0.1,
    contexts: dict[int, np.ndarray] | None = None,
    priors: dict[str, ContextPrior] | None = None,
) -> dict[str, ReuseAnswers]:
    """{question: every predictor's answer at every allocation} of one run's events table;
    with the rows' `contexts` (context.read_contexts), the context counters too, and with the
    training runs' `priors` ({question: context.context_prior}), context_table."""
    labels = allocator_labels(table)
    order, starts = process_order(table)
    req_cls, _ = request_and_free_classes(table)
    site = call_sites(table)
    n = table.num_rows
    due = lifetime_due(table, order, starts)
    ask = np.ascontiguousarray(req_cls[order])
    rows = np.flatnonzero(labels.lifetime_calls != NO_LABEL)
    # the chains of keys, numbered once for both questions: the site's, the context's
    site_chain = key_chain(order, starts, req_cls >= 0, [hedge_keys(site, req_cls)])
    ctx_chain = None
    if contexts is not None:
        levels = allocation_levels(table, contexts, order, starts)
        ctx_chain = key_chain(order, starts, req_cls >= 0, levels)
    out = {}
    for question, lab in (
        ("lifetime_calls", labels.lifetime_calls),
        ("lifetime_time", labels.lifetime_time),
    ):
        label = np.ascontiguousarray(np.maximum(lab[order], 0).astype(np.int64))
        probs = {}
        for name, s in (("class_online", np.full(n, -1, np.int64)), ("site_online", site)):
            p_ord = np.zeros((n, LIFETIME_CLASSES), np.float64)
            online_by_due(
                starts, ask, np.ascontiguousarray(s[order]), due, label, SITE_VOCABULARY,
                LIFETIME_CLASSES, eps, p_ord,
            )  # fmt: skip
            p = np.empty_like(p_ord)
            p[order] = p_ord
            probs[name] = p[rows]
        # the censoring-aware counter: what is known of the earlier blocks, freed or still live
        events = censored_events(starts, outlived_at(table, order, starts, question), due)
        probs[SURVIVAL] = _survival_at(order, starts, req_cls, site_chain, lab, events, rows)
        if ctx_chain is not None:
            probs.update(
                context_answers(
                    order, ctx_chain, due, label, rows, probs["site_online"],
                    (priors or {}).get(question), eps,
                )
            )  # fmt: skip
            # the survival estimate down the context's chain; site_survival's without a context
            ctx = _survival_at(order, starts, req_cls, ctx_chain, lab, events, rows)
            without = np.flatnonzero(without_context(order, ctx_chain)[rows])
            ctx[without] = probs[SURVIVAL][without]
            probs[CONTEXT_SURVIVAL] = ctx
        probs["majority"] = np.broadcast_to(majority[question], (len(rows), LIFETIME_CLASSES))
        out[question] = ReuseAnswers(
            rows, lab[rows], probs, int((site[rows] < 0).sum()), learnt=events
        )
    return out


def lifetime_majority(tables: list[pa.Table], eps: float = 0.1) -> dict[str, np.ndarray]:
    """{question: float64 [LIFETIME_CLASSES]}: the training runs' lifetime classes, smoothed."""
    counts = {q: np.zeros(LIFETIME_CLASSES) for q in QUESTIONS}
    for t in tables:
        labels = allocator_labels(t)
        for q, lab in (
            ("lifetime_calls", labels.lifetime_calls),
            ("lifetime_time", labels.lifetime_time),
        ):
            counts[q] += np.bincount(lab[lab != NO_LABEL], minlength=LIFETIME_CLASSES)
    return {q: (c + eps) / (c.sum() + eps * LIFETIME_CLASSES) for q, c in counts.items()}
