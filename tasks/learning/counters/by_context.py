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

NO_KEY = -1
BACKOFF = 4.0  # blocks' worth of the shallower level's answer in a deeper level's estimate
PRIOR_CAP = 256.0  # a key's training blocks count as at most this many of the run's own


@njit(cache=True)
def _estimate(counts, totals, ids, i, prior_rows, prior, cap, use_prior, eps, a, p):
    """p = the chain's estimate at row i: down the levels from the uniform, each level's key's
    counts (and with use_prior its training counts, capped) smoothed toward the level above."""
    k = p.shape[0]
    for j in range(k):
        p[j] = 1.0 / k
    for lv in range(ids.shape[0]):
        key = ids[lv, i]
        if key < 0:
            continue
        r = prior_rows[lv, i] if use_prior else -1
        scale, t_tot = 0.0, 0.0
        if r >= 0:
            for j in range(k):
                t_tot += prior[r, j]
            scale = min(1.0, cap / t_tot) if t_tot > 0 else 0.0
        tot = totals[key]
        if tot + scale * t_tot <= 0.0:
            continue  # a key with no block known: the shallower level's answer
        w = eps * k if lv == 0 else a
        den = tot + scale * t_tot + w
        for j in range(k):
            t = prior[r, j] * scale if r >= 0 else 0.0
            p[j] = (counts[key, j] + t + w * p[j]) / den


@njit(cache=True)
def _backoff_by_due(ask, ids, n_ids, due, label, eps, a, prior_rows, prior, cap, out):
    """out[0, i] at every asking row i (ask[i]): the chain's estimate from the earlier asking
    rows of its process whose label[.] became known at a row <= i (due[.], -1: never); out[1, i]
    the same with the training counts (when out has two planes). ids int64 [levels, n]: each
    row's key id per level, the process folded in (-1: none); prior_rows int64 [levels, n] (or
    [levels, 0]): the row of `prior` (float64 [m, k], training counts) holding each row's key
    per level, -1 none. One pass counts for both."""
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
        for plane in range(out.shape[0]):
            _estimate(counts, totals, ids, i, prior_rows, prior, cap, plane == 1, eps, a, p)
            for j in range(k):
                out[plane, i, j] = p[j]
        d = due[i]
        if d > i:
            nxt[i] = head[d]
            head[d] = i


def dense_ids(proc: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(int64 [n] ids 0..m-1 of the distinct (process, key) pairs, -1 where key is NO_KEY; m):
    a key's counts are its process's own, without resetting at each process."""
    has = keys != NO_KEY
    out = np.full(len(keys), -1, np.int64)
    p, k = proc[has], keys[has]
    o = np.lexsort((k, p))
    new = np.ones(len(o), bool)
    new[1:] = (p[o][1:] != p[o][:-1]) | (k[o][1:] != k[o][:-1])
    ids = np.empty(len(o), np.int64)
    ids[o] = np.cumsum(new) - 1
    out[has] = ids
    return out, int(new.sum())


@dataclass(frozen=True)
class KeyChain:
    """One run's chain of keys for one question, rows in process order, numbered once for every
    counter that reads it: `levels` the keys (coarsest first, each int64 [n], NO_KEY: none),
    `ids` int64 [levels, n] the dense ids of (process, key) at the asking rows, numbered apart
    across levels (-1: a row without a key, or not asking)."""

    ask: np.ndarray  # bool [n]
    levels: tuple[np.ndarray, ...]
    ids: np.ndarray
    n_ids: int

    @classmethod
    def of(cls, starts: np.ndarray, ask: np.ndarray, levels: list[np.ndarray]) -> KeyChain:
        proc = np.cumsum(starts) - 1
        ids = np.full((len(levels), len(ask)), -1, np.int64)
        n_ids = 0
        for lv, key in enumerate(levels):  # a loop over levels, not rows
            got, m = dense_ids(proc, np.where(ask, key, NO_KEY))
            ids[lv] = np.where(got >= 0, got + n_ids, -1)
            n_ids += m
        return cls(np.ascontiguousarray(ask), tuple(levels), ids, n_ids)


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
        keys, counts = [], []
        for lv in range(n_levels):
            key = np.concatenate([run[lv] for run in levels])
            lab = np.concatenate(labels).astype(np.int64)
            has = key != NO_KEY
            uk, inv = np.unique(key[has], return_inverse=True)
            c = np.zeros((len(uk), k))
            np.add.at(c, (inv, lab[has]), 1.0)
            keys.append(uk)
            counts.append(c)
        sizes = np.array([len(x) for x in keys], np.int64)
        offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return cls(tuple(keys), offset, np.concatenate(counts) if counts else np.zeros((0, k)))

    def rows(self, levels: list[np.ndarray]) -> np.ndarray:
        """int64 [levels, n]: the row of `counts` of each row's key per level, -1 where the
        training runs never met it."""
        if len(levels) != len(self.keys):
            raise ValueError(
                f"context prior: {len(self.keys)} levels learned, {len(levels)} asked; "
                "learn the prior with the same chain of keys"
            )
        out = np.full((len(levels), len(levels[0]) if levels else 0), -1, np.int64)
        for lv, (key, uk) in enumerate(zip(levels, self.keys, strict=True)):
            at = np.flatnonzero(key != NO_KEY)
            if len(uk) == 0 or len(at) == 0:
                continue
            j = np.minimum(np.searchsorted(uk, key[at]), len(uk) - 1)
            out[lv, at] = np.where(uk[j] == key[at], self.offset[lv] + j, -1)
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
) -> tuple[np.ndarray, np.ndarray | None]:
    """(float64 [n, k] the run's own counts, and with `prior` the same starting from the
    training runs' counts of the same chain, else None), in process order, at every asking
    row of `chain`; `due` and `label` as counters/by_due.py's, in process order."""
    n_levels, n = len(chain.levels), len(chain.ask)
    if prior is None:
        rows, table = np.zeros((n_levels, 0), np.int64), np.zeros((0, k))
    else:
        rows, table = prior.rows(list(chain.levels)), prior.counts
    out = np.zeros((1 if prior is None else 2, n, k), np.float64)
    _backoff_by_due(
        chain.ask, chain.ids, chain.n_ids, np.ascontiguousarray(due),
        np.ascontiguousarray(label), eps, backoff, rows, table, cap, out,
    )  # fmt: skip
    return out[0], (out[1] if prior is not None else None)
