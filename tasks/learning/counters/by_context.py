"""Counters keyed on the calling context, backing off across depths: per process, the classes of
the earlier calls whose label is known by then (as counters/by_due.py counts them), at each of a
chain of keys from the coarsest (the size class alone) to the finest (the whole stack and the
class), each level's estimate smoothed toward the coarser one's:

    p_0 = (counts_0 + eps) / (n_0 + eps * k)
    p_l = (counts_l + a * p_{l-1}) / (n_l + a)       (a level whose key has no counts: p_{l-1})

so a context seen often answers by its own blocks and one seen a few times stays near its
shallower key's answer (the deepest key alone is confidently wrong there:
studies/context_depth). With a prior (ContextPrior: the same counts from the training runs,
each key's capped at `cap` blocks), each level adds the training counts of its key to the
run's own, which then outweigh them as the run's blocks of that key become known.

Keys: int64 per row and level, NO_KEY (-1) where the row has none at that level (a call without
a stack); stable across runs of one binary (tasks/dataset/contexts.py), so that a training run's
counts answer another run's calls. One compiled pass per run, rows in process call order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from tasks.core.distinct import first_seen_ids, sorted_ids

NO_KEY = -1
BACKOFF = 4.0  # blocks' worth of the shallower level's answer in a deeper level's estimate
PRIOR_CAP = 256.0  # a key's training blocks count as at most this many of the run's own


@njit(cache=True)
def _capped_prior(prior, cap):
    """(float64 [m, k] each training key's counts scaled to at most `cap` blocks in all, float64
    [m] their sum): the weight each key's training blocks carry in an estimate."""
    m, k = prior.shape
    scaled = np.zeros((m, k))
    weight = np.zeros(m)
    for r in range(m):
        t_tot = 0.0
        for j in range(k):
            t_tot += prior[r, j]
        scale = min(1.0, cap / t_tot) if t_tot > 0 else 0.0
        weight[r] = scale * t_tot
        for j in range(k):
            scaled[r, j] = prior[r, j] * scale
    return scaled, weight


@njit(cache=True)
def _estimate(counts, totals, ids, i, prior_of, prior, weight, use_prior, eps, a, p):
    """p = the chain's estimate at row i: down the levels from the uniform, each level's key's
    counts (and with use_prior its training counts, capped: _capped_prior) smoothed toward the
    level above."""
    k = p.shape[0]
    for j in range(k):
        p[j] = 1.0 / k
    for lv in range(ids.shape[0]):
        key = ids[lv, i]
        if key < 0:
            continue
        r = prior_of[key] if use_prior else -1
        t_w = weight[r] if r >= 0 else 0.0
        tot = totals[key]
        if tot + t_w <= 0.0:
            continue  # a key with no block known: the shallower level's answer
        w = eps * k if lv == 0 else a
        den = tot + t_w + w
        for j in range(k):
            t = prior[r, j] if r >= 0 else 0.0
            p[j] = (counts[key, j] + t + w * p[j]) / den


@njit(cache=True)
def _backoff_by_due(ask, ids, n_ids, due, label, eps, a, prior_of, prior, weight, slot, out):
    """out[0, slot[i]] at every asking row i (ask[i]) with slot[i] >= 0: the chain's estimate
    from the earlier asking rows of its process whose label[.] became known at a row <= i
    (due[.], -1: never); out[1, slot[i]] the same with the training counts (when out has two
    planes); the rows without a slot are counted all the same. ids int [levels, n]: each row's
    key id per level, the process folded in (-1: none); prior_of int64 [n_ids] (or [0]): the
    row of `prior` and `weight` (_capped_prior of the training counts) holding each id's key,
    -1 none. One pass counts for both."""
    levels, n = ids.shape
    k = out.shape[2]
    counts = np.zeros((n_ids, k), np.float64)
    totals = np.zeros(n_ids, np.float64)
    head = np.full(n, -1, np.int64)  # the rows whose label is known at row r, a linked list
    nxt = np.full(n, -1, np.int64)
    p = np.empty(k)
    for i in range(n):
        f = head[i]
        while f >= 0:
            for lv in range(levels):
                key = ids[lv, f]
                if key >= 0:
                    counts[key, label[f]] += 1.0
                    totals[key] += 1.0
            f = nxt[f]
        if not ask[i]:
            continue
        o = slot[i]
        for plane in range(out.shape[0] if o >= 0 else 0):
            _estimate(counts, totals, ids, i, prior_of, prior, weight, plane == 1, eps, a, p)
            for j in range(k):
                out[plane, o, j] = p[j]
        d = due[i]
        if d > i:
            nxt[i] = head[d]
            head[d] = i


def dense_ids(proc: np.ndarray, keys: np.ndarray, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [n] ids first..first+m-1 of the distinct (process, key) pairs, -1 where key is
    NO_KEY; int64 [m] each id's key): a key's counts are its process's own, without resetting
    at each process. Hashed, not sorted: the ids follow the pairs' first appearance."""
    ids, distinct = first_seen_ids(keys)
    if len(proc) and proc[0] != proc[-1]:  # more than one process (proc ascends): the pairs
        ids, pairs = first_seen_ids(proc.astype(np.int64) * len(distinct) + ids)
        distinct = distinct[pairs % len(distinct)]
    valid = distinct != NO_KEY
    if first + int(valid.sum()) > np.iinfo(np.int32).max:
        raise OverflowError("dense_ids: more distinct (process, key) pairs than int32 ids")
    number = np.where(valid, np.cumsum(valid) - 1 + first, -1).astype(np.int32)
    return number[ids], distinct[valid].astype(np.int64)


@dataclass(frozen=True)
class KeyChain:
    """One run's chain of keys for one question, rows in process order, numbered once for every
    counter that reads it: `levels` the keys (coarsest first, each int64 [n], NO_KEY: none),
    `ids` int32 [levels, n] the dense ids of (process, key) at the asking rows, numbered apart
    across levels (-1: a row without a key, or not asking); level l's ids are
    level_start[l] .. level_start[l + 1] - 1, id i's key id_keys[i]."""

    ask: np.ndarray  # bool [n]
    levels: tuple[np.ndarray, ...]
    ids: np.ndarray
    n_ids: int
    level_start: np.ndarray  # int64 [levels + 1]
    id_keys: np.ndarray  # int64 [n_ids]

    @classmethod
    def of(cls, starts: np.ndarray, ask: np.ndarray, levels: list[np.ndarray]) -> KeyChain:
        proc = np.cumsum(starts) - 1
        ids = np.empty((len(levels), len(ask)), np.int32)
        level_start = np.zeros(len(levels) + 1, np.int64)
        id_keys = [np.zeros(0, np.int64)]
        for lv, key in enumerate(levels):  # a loop over levels, not rows
            ids[lv], keys = dense_ids(proc, np.where(ask, key, NO_KEY), int(level_start[lv]))
            level_start[lv + 1] = level_start[lv] + len(keys)
            id_keys.append(keys)
        n_ids = int(level_start[-1])
        ask = np.ascontiguousarray(ask)
        return cls(ask, tuple(levels), ids, n_ids, level_start, np.concatenate(id_keys))


@dataclass(frozen=True)
class ContextPrior:
    """Training runs' counts per level and key: level l's keys `keys[l]` (sorted, int64) have
    their class counts in rows offset[l] .. offset[l] + len(keys[l]) of `counts`."""

    keys: tuple[np.ndarray, ...]
    offset: np.ndarray  # int64 [levels]
    counts: np.ndarray  # float64 [m, k]

    @classmethod
    def of(cls, levels: list[list[np.ndarray]], labels: list[np.ndarray], k: int) -> ContextPrior:
        """From runs' asked rows: per run, its level keys (each int64 [n_run]) and labels."""
        n_levels = len(levels[0]) if levels else 0
        lab = np.concatenate(labels).astype(np.int64) if labels else np.zeros(0, np.int64)
        keys, counts = [], []
        for lv in range(n_levels):
            key = np.concatenate([run[lv] for run in levels])
            has = key != NO_KEY
            inv, uk = sorted_ids(key[has])
            c = np.bincount(inv * k + lab[has], minlength=len(uk) * k)
            keys.append(uk.astype(np.int64))
            counts.append(c.reshape(len(uk), k).astype(np.float64))
        sizes = np.array([len(x) for x in keys], np.int64)
        offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return cls(tuple(keys), offset, np.concatenate(counts) if counts else np.zeros((0, k)))

    def id_rows(self, chain: KeyChain) -> np.ndarray:
        """int64 [chain.n_ids]: the row of `counts` of each id's key, -1 where the training runs
        never met it."""
        if len(chain.levels) != len(self.keys):
            raise ValueError(
                f"context prior: {len(self.keys)} levels learned, {len(chain.levels)} asked; "
                "learn the prior with the same chain of keys"
            )
        out = np.full(chain.n_ids, -1, np.int64)
        for lv, uk in enumerate(self.keys):  # a loop over levels, each over its distinct keys
            lo, hi = chain.level_start[lv], chain.level_start[lv + 1]
            key = chain.id_keys[lo:hi]
            if len(uk) == 0 or len(key) == 0:
                continue
            j = np.minimum(np.searchsorted(uk, key), len(uk) - 1)
            out[lo:hi] = np.where(uk[j] == key, self.offset[lv] + j, -1)
        return out


def backoff_online(
    chain: KeyChain,
    due: np.ndarray,
    label: np.ndarray,
    k: int,
    eps: float = 0.1,
    backoff: float = BACKOFF,
    prior: ContextPrior | None = None,
    cap: float = PRIOR_CAP,
    at: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(float64 [n, k] the run's own counts, and with `prior` the same starting from the
    training runs' counts of the same chain, else None), in process order, at every asking
    row of `chain` (zeros elsewhere); with `at` (int64 [m], rows in process order), at those
    rows alone ([m, k]). `due` and `label` as counters/by_due.py's, in process order."""
    n = len(chain.ask)
    slot = np.arange(n) if at is None else np.full(n, -1, np.int64)
    if at is not None:
        slot[at] = np.arange(len(at))
    if prior is None:
        prior_of, table, weight = np.zeros(0, np.int64), np.zeros((0, k)), np.zeros(0)
    else:
        prior_of = prior.id_rows(chain)
        table, weight = _capped_prior(np.ascontiguousarray(prior.counts, np.float64), cap)
    out = np.zeros((1 if prior is None else 2, n if at is None else len(at), k), np.float64)
    _backoff_by_due(
        chain.ask, chain.ids, chain.n_ids, np.ascontiguousarray(due),
        np.ascontiguousarray(label), eps, backoff, prior_of, table, weight, slot, out,
    )  # fmt: skip
    return out[0], (out[1] if prior is not None else None)
