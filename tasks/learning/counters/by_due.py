"""The online counters of a question whose answer becomes known at a later row: per process, per
size class (and per call site and class), counts of the classes of the process's EARLIER calls
whose label is known by then, the distribution a program that watches itself can keep.

Where a label becomes known is the question's fact (`due`): a lifetime at the block's free
(lifetime_due), a reuse distance at the next request of the class or once its last
edge has passed without one (reuse.reuse_due). One compiled pass per run, rows in process call
order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit


@njit(cache=True)
def online_by_due(proc_start, ask_cls, site, due, label, n_sites, k, eps, out):
    """out[i] at every row asking (ask_cls[i] >= 0): the counters' distribution over k classes
    from the earlier asking rows of its process whose label[.] became known at a row <= i
    (due[.], -1: never). site[i] < 0: class counts only. Rows in process call order."""
    n = ask_cls.shape[0]
    by_class = np.zeros((32, k), np.float64)
    by_site = np.zeros((n_sites * 32, k), np.float64)
    head = np.full(n, -1, np.int64)  # the rows whose label is known at row r, a linked list
    nxt = np.full(n, -1, np.int64)
    for i in range(n):
        if proc_start[i]:
            by_class[:, :] = 0.0
            by_site[:, :] = 0.0
        f = head[i]
        while f >= 0:
            c = ask_cls[f]
            by_class[c, label[f]] += 1.0
            if site[f] >= 0:
                by_site[site[f] * 32 + c, label[f]] += 1.0
            f = nxt[f]
        c = ask_cls[i]
        if c >= 0:
            s = site[i]
            counts = by_class[c]
            if s >= 0:
                tot = 0.0
                for j in range(k):
                    tot += by_site[s * 32 + c, j]
                if tot > 0:
                    counts = by_site[s * 32 + c]
            tot = 0.0
            for j in range(k):
                tot += counts[j]
            for j in range(k):
                out[i, j] = (counts[j] + eps) / (tot + eps * k)
            d = due[i]
            if d > i:
                nxt[i] = head[d]
                head[d] = i


def known_at(defined: np.ndarray, distance: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 [n], in process order: row i + distance[i] where `defined` and that row is in row
    i's process, else -1 (rows in process order; `starts`: each process's first row)."""
    n = len(starts)
    proc = np.cumsum(starts) - 1
    proc_end = np.flatnonzero(np.append(starts[1:], True))  # last row of each process
    at = np.arange(n) + np.minimum(distance, n)
    return np.where(defined & (at <= proc_end[proc]), at, -1)


def lifetime_due(table: pa.Table, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 [n], in process order: the row (in process order) of each allocation's free, where
    its lifetime becomes known; -1: not freed in its process."""
    col = table.column("lifetime_calls")
    freed = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), bool)[order]
    life = col.fill_null(0).to_numpy().astype(np.int64)[order]
    return known_at(freed & (life > 0), life, starts)


def freed_allocations(due: np.ndarray) -> np.ndarray:
    """int64 [n], process order: at each row that frees a block, the row that allocated it
    (-1: none in the table); `due`: lifetime_due, which names each allocation's free."""
    out = np.full(len(due), -1, np.int64)
    alloc = np.flatnonzero(due >= 0)
    out[due[alloc]] = alloc
    return out
