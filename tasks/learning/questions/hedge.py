"""The questions' network corrected inside the run: a per-process mixture of the network and the
online counters, weighted by how well each has answered this process so far.

Once a call's answer becomes known (labels.py), each predictor's probability of the true class is
its likelihood; the weights are the predictors' posterior (Bayes' rule over experts, with a small
fixed share, SHARE, so that a weight can recover). The share goes back evenly to every predictor,
or (`past`, reuse's) to what has served the process so far: a key's to the process's weights, the
process's to the mean of its past posteriors. The majority and process_prior are among the
experts, so a network out of its depth costs little: the bound and the figures measured are in
docs/learning-questions.md#the-hedge.

Causal: the answer at a call reads the predictors' answers at that call and the labels known before
it (due <= the call), nothing later; tests/tasks/learning/questions/test_hedge.py changes the later labels.
The predictor's name in the tables is HEDGED.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tasks.dataset.tokens import MAX_SIZE_CLASS

HEDGED = "network_hedged"
# the expert the mixture can always fall back on: the process's own classes so far, starting from
# the training runs' majority (process_prior)
PRIOR = "process_prior"
PRIOR_WEIGHT = 4.0  # blocks' worth of the majority's hazards in the process's own estimate
# the mixture's predictors, in this order: those a question has. network_survival and
# site_survival answer the lifetime questions only (the network's answer, or the process's
# hazards, corrected by the site's own blocks, still-live ones included: lifetime.py)
# PRIOR and majority: the fallbacks, as good as the majority whatever the network says;
# context_online, context_table and context_survival: the counters on the calling context
# (context.py), which answer as site_online (site_survival) where a call has no stack
EXPERTS = (
    "network", "site_online", "class_online", "network_survival", PRIOR, "majority",
    "site_survival", "context_online", "context_table", "context_survival",
)  # fmt: skip
# fixed share: each update moves this much weight back to every predictor evenly, so a weight
# can recover when a site's behaviour changes; without one a process commits to one predictor
# early (the shares tried and their log-loss: docs/learning-questions.md#the-hedge)
SHARE = 0.05
FLOOR = 1e-6  # a probability is never taken below this (a predictor's one miss is not fatal)


@njit(cache=True)
def _weights(logw, w):
    """w = the normalised weights of the log-weights logw."""
    top = -1e300
    for e in range(logw.shape[0]):
        top = max(top, logw[e])
    tot = 0.0
    for e in range(logw.shape[0]):
        w[e] = np.exp(logw[e] - top)
        tot += w[e]
    for e in range(logw.shape[0]):
        w[e] /= tot


@njit(cache=True)
def _share(logw, fac, share, w):
    """logw += fac, normalised, then the fixed share moved back evenly."""
    n_exp = logw.shape[0]
    for e in range(n_exp):
        logw[e] += fac[e]
    _weights(logw, w)
    for e in range(n_exp):
        logw[e] = np.log((1.0 - share) * w[e] + share / n_exp)


@njit(cache=True)
def _share_to(logw, fac, share, target, w):
    """logw += fac, normalised (w), then the share moved back to `target` (normalised weights)."""
    for e in range(logw.shape[0]):
        logw[e] += fac[e]
    _weights(logw, w)
    for e in range(logw.shape[0]):
        logw[e] = np.log((1.0 - share) * w[e] + share * target[e])


@njit(cache=True)
def _hedge(
    proc_start, ask, key, n_keys, ev_row, ev_f, ev_j, label, experts, share, past, floor, out
):
    """out[i] at every row asking (ask[i]): the experts' answers at i mixed by their posterior
    weights given what is known by row i of the process's earlier asking rows of the same key
    (key[i]: its call site and class); a key's weights start from the whole process's (which
    every event updates) the first time it is met. The share goes back evenly to every expert;
    with `past`, a key's goes back to the process's weights and the process's to the mean of
    its past posteriors (mixing past posteriors, from even weights at its first call). An event
    (ev_row, ev_f, ev_j), sorted by row,
    says at row ev_row what became known of row ev_f's class: ev_j >= 0, that it is above class
    ev_j (a block still live past an edge; each expert's factor P(> j) / P(> known before)); ev_j
    < 0, that it is label[ev_f] (P(label) / P(> known before)). The factors of one row telescope
    to its whole likelihood, P(label), whether or not it had crossings before its label. experts
    float64 [E, n, k]; rows in process call order.
    """
    n_exp, n, k = experts.shape
    # the class each row is known to be above so far (-1: nothing known): an event's factor is
    # the probability of what it tells GIVEN what was known before, so the factors of one row
    # multiply to its whole likelihood however its knowledge arrived (in steps, or at once)
    above = np.full(n, -1, np.int64)
    logp = np.zeros(n_exp)  # the process's weights
    logws = np.zeros((n_keys, n_exp))  # each key's
    seen = np.zeros(n_keys, np.bool_)
    fac = np.empty(n_exp)
    w = np.empty(n_exp)
    even = np.full(n_exp, 1.0 / n_exp)
    mean = even.copy()  # the mean of the process's posteriors so far, its even start included
    updates = 0.0
    wp = np.empty(n_exp)
    p = 0
    for i in range(n):
        if proc_start[i]:
            logp[:] = 0.0
            seen[:] = False
            mean[:] = even
            updates = 0.0
        while p < ev_row.shape[0] and ev_row[p] <= i:
            f, j = ev_f[p], ev_j[p]
            for e in range(n_exp):
                den = 0.0  # P(> what was known)
                for c in range(above[f] + 1, k):
                    den += experts[e, f, c]
                if j >= 0:  # P(> j) / P(> known)
                    num = 0.0
                    for c in range(j + 1, k):
                        num += experts[e, f, c]
                else:  # P(label) / P(> known)
                    num = experts[e, f, label[f]]
                fac[e] = np.log(max(num, floor)) - np.log(max(den, floor))
            above[f] = j if j >= 0 else k - 1
            kf = key[f]
            if not seen[kf]:
                seen[kf] = True
                logws[kf, :] = logp
            if past:
                _weights(logp, wp)  # the process's weights before this event
                _share_to(logws[kf], fac, share, wp, w)
                _share_to(logp, fac, share, mean, w)
                updates += 1.0
                for e in range(n_exp):  # w: the process's posterior before the share
                    mean[e] += (w[e] - mean[e]) / (updates + 1.0)
            else:
                _share(logws[kf], fac, share, w)
                _share(logp, fac, share, w)
            p += 1
        if ask[i]:
            ki = key[i]
            if not seen[ki]:
                seen[ki] = True
                logws[ki, :] = logp
            _weights(logws[ki], w)
            for j in range(k):
                s = 0.0
                for e in range(n_exp):
                    s += w[e] * experts[e, i, j]
                out[i, j] = s


@njit(cache=True)
def _prior(proc_start, ask, ev_row, ev_f, ev_j, label, edges, c, h0, f0, out):
    """out[i] at every asking row i: from what is known by row i of its process's earlier asking
    rows (events as _hedge's), the discrete Kaplan-Meier estimate over the whole process: for
    each class j < edges, the hazard ended[j] / (ended[j] + outlived[j]) shrunk toward h0[j]
    with c blocks' weight; past the last edge, one class (k == edges + 1), or two split as f0
    says (k == edges + 2: a lifetime's "later" and "never freed", which a block still live
    does not tell apart before its process ends: learning the split from the blocks freed so
    far put 0.01 on "later" where numpy_stack's blocks freed at exit were 30% of its calls).
    A whole label that comes without its crossings counts them too."""
    n, k = out.shape
    above = np.full(n, -1, np.int64)
    ended = np.zeros(k)
    outlived = np.zeros(k)
    p = 0
    for i in range(n):
        if proc_start[i]:
            ended[:] = 0.0
            outlived[:] = 0.0
        while p < ev_row.shape[0] and ev_row[p] <= i:
            f, j = ev_f[p], ev_j[p]
            if ask[f]:
                # the edges it is now known to have outlived
                top = min(j, edges - 1) if j >= 0 else min(label[f], edges) - 1
                for jj in range(above[f] + 1, top + 1):
                    outlived[jj] += 1.0
                above[f] = max(above[f], top)
                if j < 0:
                    ended[label[f]] += 1.0
                    above[f] = k - 1
            p += 1
        if ask[i]:
            alive = 1.0
            for j in range(edges):
                h = (ended[j] + c * h0[j]) / (ended[j] + outlived[j] + c)
                out[i, j] = alive * h
                alive *= 1.0 - h
            if k == edges + 1:
                out[i, edges] = alive
            else:  # "later" or "never freed": the majority's split (see process_prior)
                out[i, edges] = alive * f0
                out[i, edges + 1] = alive * (1.0 - f0)


def process_prior(
    order: np.ndarray,
    starts: np.ndarray,
    events: tuple[np.ndarray, np.ndarray, np.ndarray],
    rows: np.ndarray,
    majority: np.ndarray,
    labels: np.ndarray,
    edges: int,
    weight: float = PRIOR_WEIGHT,
) -> np.ndarray:
    """float64 [m, k] at `rows` (table order, with their `labels`): the fallback expert PRIOR, the
    process's own classes so far, whatever call site or size class asks: the training runs'
    `majority` (float64 [k]) at the process's first call, then corrected by each of its asked
    rows as its class becomes known (`events`, as hedged's: a label whole, or a block still live
    past an edge; the split of those between "later" and "never freed" stays the majority's). A
    Bayes estimate centred on the majority (the hazards' Beta priors of `weight` blocks); not a
    bound against the majority by itself, hence the majority beside it in EXPERTS
    (docs/learning-questions.md#the-hedge).

    `edges`: the question's class edges (k - 1 for reuse, k - 2 for a lifetime). Causal: the answer
    at a call reads the events at rows <= the call only.
    """
    n, k = len(order), len(majority)
    where = np.empty(n, np.int64)
    where[order] = np.arange(n)
    at = where[rows]
    ask = np.zeros(n, np.bool_)
    ask[at] = True
    lab = np.zeros(n, np.int64)
    lab[at] = labels
    m = np.maximum(np.asarray(majority, np.float64), 1e-9)
    rest = np.cumsum(m[::-1])[::-1]  # P(>= j)
    h0 = np.clip(m / rest, 1e-6, 1 - 1e-6)[:edges]
    f0 = float(m[edges] / m[edges:].sum()) if k == edges + 2 else 0.0
    ev_row, ev_f, ev_j = (np.ascontiguousarray(a[ask[events[1]]]) for a in events)
    out = np.zeros((n, k), np.float64)
    _prior(np.ascontiguousarray(starts), ask, ev_row, ev_f, ev_j, lab, edges, weight, h0, f0, out)
    return out[at]


def hedge_keys(sites: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """int64 per row: whose weights answer it, from its call site (reuse.call_sites; -1: none)
    and its size class (-1: none): a row without a site has its class's weights. Which
    predictor to trust differs by site: a program's parser and its interpreter loop do not keep
    their blocks alike."""
    return (sites + 1) * (MAX_SIZE_CLASS + 1) + np.maximum(classes, 0)


def due_events(due: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, of row, -1) events: each row's class known whole at due[row] (-1: never)."""
    f = np.flatnonzero(due >= 0)
    f = f[np.argsort(due[f], kind="stable")]
    return due[f].astype(np.int64), f.astype(np.int64), np.full(len(f), -1, np.int64)


def censored_events(
    starts: np.ndarray, crossing: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Events of a lifetime, rows in process order: crossing[f, j] is the first row at which row
    f's block has outlived edge j (-1: none in its process), end[f] the row of its free (-1: never
    freed). Until its free, a block still live past edge j is known to be above class j; at its
    free, its class. Crossings at or before the free only; at one row, crossings first."""
    n, m = crossing.shape
    proc_end = np.flatnonzero(np.append(starts[1:], True))[np.cumsum(starts) - 1]
    f = np.repeat(np.arange(n), m)
    j = np.tile(np.arange(m), n)
    r = crossing.reshape(-1)
    ok = (r >= 0) & (r <= proc_end[f]) & ((end[f] < 0) | (end[f] >= r))
    fin = np.flatnonzero(end >= 0)
    row = np.concatenate([r[ok], end[fin]])
    of = np.concatenate([f[ok], fin])
    jj = np.concatenate([j[ok], np.full(len(fin), -1)])
    o = np.lexsort((jj < 0, row))  # by row, crossings before the end
    return row[o].astype(np.int64), of[o].astype(np.int64), jj[o].astype(np.int64)


def hedged(
    order: np.ndarray,
    starts: np.ndarray,
    events: tuple[np.ndarray, np.ndarray, np.ndarray],
    rows: np.ndarray,
    labels: np.ndarray,
    experts: list[np.ndarray],
    share: float = SHARE,
    keys: np.ndarray | None = None,
    past: bool = False,
) -> np.ndarray:
    """float64 [m, k] at `rows` (table order, with their `labels`): the mixture of `experts`
    (each float64 [m, k] at `rows`), weights per process from what is known so far. `order`,
    `starts`: labels.process_order; `events`: due_events or censored_events (rows in process
    order). `past`: the fixed share goes back to what served the process so far (a key's to the
    process's weights, the process's to the mean of its past posteriors) instead of evenly to
    every expert (docs/learning-questions.md#the-hedge: reuse's, not a lifetime's)."""
    n, k = len(order), experts[0].shape[1]
    where = np.empty(n, np.int64)
    where[order] = np.arange(n)  # each table row's place in process order
    at = where[rows]
    ask = np.zeros(n, np.bool_)
    ask[at] = True
    lab = np.zeros(n, np.int64)
    lab[at] = labels
    stack = np.zeros((len(experts), n, k), np.float64)
    for e, p in enumerate(experts):
        stack[e, at] = p
    out = np.zeros((n, k), np.float64)
    ev_row, ev_f, ev_j = (np.ascontiguousarray(a[ask[events[1]]]) for a in events)  # asked only
    key = np.zeros(n, np.int64)
    if keys is not None:
        key[at] = keys
    _hedge(
        np.ascontiguousarray(starts), ask, key, int(key.max(initial=0)) + 1, ev_row, ev_f, ev_j,
        lab, stack, share, past, FLOOR, out,
    )  # fmt: skip
    return out[at]
