"""Replay one run's events through an allocator cache policy: a compiled, sequential simulator.

`simulate(events, policy) -> dict` (events: a pyarrow Table of the events schema, or the
`SimInput` that `tasks.whatif.events.prepare` makes of one). One numba-compiled loop visits the
rows once, in time order across processes and call order within each; every process has its own
cache. The `oracle` kind is bounded (tasks/whatif/oracle.py), not simulated.

The rules (the cache, seed002, hit rate, realloc, bytes, the page-fault model, guided tiers):
docs/whatif.md#the-simulator
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from tasks.whatif.events import N_CLASSES, NEVER, SimInput, prepare
from tasks.whatif.oracle import oracle_metrics
from tasks.whatif.policies import (
    MMAP_THRESHOLD,
    BeladyConfig,
    GuidedConfig,
    LruConfig,
    NoneConfig,
    OracleConfig,
    Seed001Config,
    Seed002Config,
    _Policy,
)

PAGE = 4096
SCAN_LIMIT = 64
GHOSTS = 8  # seed002's proof: blocks remembered at most (layer.c HL_GHOSTS)

K_NONE, K_SEED002, K_SEED001, K_LRU, K_GUIDED, K_BELADY = range(6)

# node fields (a cached block), one int64 row per node; N_TIER: which of its process's lists
# holds it (0: the list every policy uses; 1..MAX_TIERS-1: guided priority's predicted blocks)
# N_USABLE, N_ALIGN: the block's usable size (malloc_usable_size) and its address's alignment,
# which seed002 matches on, as the layer (native/layers/layer.c) does
N_SIZE, N_CLS, N_TIME, N_POS, N_PROC, N_CPREV, N_CNEXT, N_GPREV, N_GNEXT, N_TIER = range(10)
N_USABLE, N_ALIGN = 10, 11
_NF = 12
MAX_TIERS = 8
# process fields: the head and tail of the list of tier t at 2 * t and 2 * t + 1 (P_GHEAD and
# P_GTAIL: tier 0), then the rest
P_GHEAD, P_GTAIL = 0, 1
(
    P_COUNT,
    P_IDLE,
    P_LIVE_REQ,
    P_LIVE_BLK,
    P_HEAP,
    P_HWM,
    P_MAPPED,
    P_POS,
    P_IDLE_PEAK,
) = range(2 * MAX_TIERS, 2 * MAX_TIERS + 9)
_PF = 2 * MAX_TIERS + 9
# run-level counters and state
(
    G_ALLOCS,
    G_HITS,
    G_HIT_BYTES,
    G_REQ_BYTES,
    G_WASTE,
    G_FREES,
    G_CACHED,
    G_EVICT,
    G_EVICT_BYTES,
    G_SYS,
    G_FAULT_MMAP,
    G_FAULT_HEAP,
    G_IDLE,
    G_LIVE_REQ,
    G_LIVE_BLK,
    G_RSS,
    G_IDLE_PEAK,
    G_LIVE_PEAK,
    G_FOOT_PEAK,
    G_RSS_PEAK,
    G_FREE_NODE,
    G_NODES,
) = range(22)
_GF = 22


@njit(cache=True, nogil=True)
def _chunk(s: int) -> int:
    """glibc's chunk size for a request of s bytes (64-bit)."""
    c = (s + 8 + 15) & ~15
    return c if c >= 32 else 32


@njit(cache=True, nogil=True)
def _pages(x: int) -> int:
    return (x + PAGE - 1) // PAGE * PAGE


@njit(cache=True, nogil=True)
def _mmap_bytes(s: int) -> int:
    return _pages(_chunk(s) + 8)


@njit(cache=True, nogil=True)
def _usable(s: int, align: int, mmap_threshold: int) -> int:
    """glibc's malloc_usable_size of the block it hands out for s bytes (alignment `align`
    asked for; <= 16: none): mmapped (s >= the threshold), the mapping less the offset of the
    pointer in it (16, or `align` for an aligned request, whose chunk glibc maps with room to
    align it: chunk(chunk(s) + align + 32)); on the heap, chunk(s) - 8."""
    if s < mmap_threshold:
        return _chunk(s) - 8
    if align <= 16:
        return _mmap_bytes(s) - 16
    return _pages(_chunk(_chunk(s) + align + 32) + 8) - align


@njit(cache=True, nogil=True)
def _fits(usable: int, s: int) -> bool:
    """The layer's hl_fits: at most half of the block, plus a page, wasted."""
    return usable >= s and usable - s < s + 4096


@njit(cache=True, nogil=True)
def _sys_alloc(ps, g, p, s, mmap_threshold):
    g[G_SYS] += 1
    if s < mmap_threshold:
        h = ps[p, P_HEAP] + _chunk(s)
        ps[p, P_HEAP] = h
        if h > ps[p, P_HWM]:
            d = _pages(h) - _pages(ps[p, P_HWM])
            ps[p, P_HWM] = h
            g[G_FAULT_HEAP] += d
            g[G_RSS] += d
    else:
        f = _mmap_bytes(s)
        ps[p, P_MAPPED] += f
        g[G_FAULT_MMAP] += f
        g[G_RSS] += f


@njit(cache=True, nogil=True)
def _sys_release(ps, g, p, b, mmap_threshold):
    if b < mmap_threshold:
        ps[p, P_HEAP] -= _chunk(b)
    else:
        f = _mmap_bytes(b)
        ps[p, P_MAPPED] -= f
        g[G_RSS] -= f


@njit(cache=True, nogil=True)
def _unlink(nodes, ps, k):
    """Take node k out of its process's list (of its tier)."""
    p = nodes[k, N_PROC]
    h = P_GHEAD + 2 * nodes[k, N_TIER]
    a = nodes[k, N_GPREV]
    b = nodes[k, N_GNEXT]
    if a >= 0:
        nodes[a, N_GNEXT] = b
    else:
        ps[p, h] = b
    if b >= 0:
        nodes[b, N_GPREV] = a
    else:
        ps[p, h + 1] = a


@njit(cache=True, nogil=True)
def _link(nodes, ps, k, tier):
    """Append node k at the tail (most recent end) of its process's list of `tier`."""
    p = nodes[k, N_PROC]
    h = P_GHEAD + 2 * tier
    nodes[k, N_TIER] = tier
    tail = ps[p, h + 1]
    nodes[k, N_GPREV] = tail
    nodes[k, N_GNEXT] = -1
    if tail >= 0:
        nodes[tail, N_GNEXT] = k
    else:
        ps[p, h] = k
    ps[p, h + 1] = k


@njit(cache=True, nogil=True)
def _remove(nodes, ch, ct, ps, g, k):
    """Take node k out of its class list and its process's list; recycle it."""
    p = nodes[k, N_PROC]
    c = nodes[k, N_CLS]
    a = nodes[k, N_CPREV]
    b = nodes[k, N_CNEXT]
    if a >= 0:
        nodes[a, N_CNEXT] = b
    else:
        ch[p, c] = b
    if b >= 0:
        nodes[b, N_CPREV] = a
    else:
        ct[p, c] = a
    _unlink(nodes, ps, k)
    size = nodes[k, N_SIZE]
    ps[p, P_COUNT] -= 1
    ps[p, P_IDLE] -= size
    g[G_IDLE] -= size
    nodes[k, N_CNEXT] = g[G_FREE_NODE]
    g[G_FREE_NODE] = k


@njit(cache=True, nogil=True)
def _evict(nodes, ch, ct, ps, g, k, mmap_threshold):
    size = nodes[k, N_SIZE]
    p = nodes[k, N_PROC]
    _remove(nodes, ch, ct, ps, g, k)
    _sys_release(ps, g, p, size, mmap_threshold)
    g[G_EVICT] += 1
    g[G_EVICT_BYTES] += size


@njit(cache=True, nogil=True)
def _smallest(nodes, ps, p):
    """seed002: the process's kept block of the smallest usable size, the oldest of equals
    (-1: none)."""
    small = -1
    k = ps[p, P_GHEAD]
    while k >= 0:
        if small < 0 or nodes[k, N_USABLE] < nodes[small, N_USABLE]:
            small = k
        k = nodes[k, N_GNEXT]
    return small


@njit(cache=True, nogil=True)
def _bound(nodes, ch, ct, ps, g, p, lay_live, lay_peak, peak_pct, mmap_threshold):
    """seed002, the layer's bound (native/layers/layer.c hl_bound) at a miss that maps a block:
    the smallest kept blocks (the oldest of equals) go, at most 8, until the live tracked blocks
    and the kept ones are within the live ones' peak plus peak_pct percent."""
    live = lay_live[p]
    if live > lay_peak[p]:
        lay_peak[p] = live
    limit = lay_peak[p] + lay_peak[p] // 100 * peak_pct
    kept = 0
    k = ps[p, P_GHEAD]
    while k >= 0:
        kept += nodes[k, N_USABLE]
        k = nodes[k, N_GNEXT]
    over = live + kept - limit
    out = 0
    while over > 0 and ps[p, P_GHEAD] >= 0 and out < 8:
        small = _smallest(nodes, ps, p)
        over -= nodes[small, N_USABLE]
        _evict(nodes, ch, ct, ps, g, small, mmap_threshold)
        out += 1


@njit(cache=True, nogil=True)
def _ghost_drop(gh_u, gh_al, gh_n, p, j):
    """seed002's proof: process p forgets its j-th remembered block (layer.c hl_ghost_drop)."""
    gh_n[p] -= 1
    for i in range(j, gh_n[p]):
        gh_u[p, i] = gh_u[p, i + 1]
        gh_al[p, i] = gh_al[p, i + 1]


@njit(cache=True, nogil=True)
def _farthest_class(ch, nxt, p):
    """Belady: the non-empty class of process p whose next request is farthest (-1: none)."""
    best = -1
    best_at = -1
    for c in range(N_CLASSES):
        if ch[p, c] >= 0 and nxt[p, c] >= best_at:
            best = c
            best_at = nxt[p, c]
    return best


@njit(cache=True, nogil=True)
def _simulate(
    kind,
    n_keep,
    min_size,
    budget,
    decay,
    ttl,
    tier_ttl,
    n_tiers,
    mmap_threshold,
    proc,
    n_proc,
    req,
    freed,
    cls_req,
    cls_free,
    partner,
    time,
    is_last,
    pred,
    next_same,
    first_req,
    align_req,
    addr_align,
    thread,
    n_threads,
    peak_pct,
    proof,
):
    n = len(req)
    g = np.zeros(_GF, np.int64)
    g[G_FREE_NODE] = -1
    ps = np.zeros((n_proc, _PF), np.int64)
    ps[:, : 2 * MAX_TIERS] = -1
    ch = np.full((n_proc, N_CLASSES), -1, np.int64)
    ct = np.full((n_proc, N_CLASSES), -1, np.int64)
    nxt = first_req.copy()
    nodes = np.empty((1024 if kind != K_NONE else 1, _NF), np.int64)
    blk = np.zeros(n, np.int64)  # block size each request got
    layer = kind == K_SEED002  # the rules of native/layers/layer.c, policy=seed002
    blk_u = np.zeros(n if layer else 1, np.int64)  # seed002: its usable size
    blk_al = np.zeros(n if layer else 1, np.int64)  # seed002: its address's alignment
    # seed002, the outgrown rule: per thread, its last request >= min_size and the rows whose
    # requests got its last two blocks (-1: none)
    t_req = np.zeros(n_threads if layer else 1, np.int64)
    t_last = np.full(n_threads if layer else 1, -1, np.int64)
    t_prev = np.full(n_threads if layer else 1, -1, np.int64)
    # seed002, the bound (layer.c's hl_bound, peak_pct >= 0): per process, the usable bytes of
    # the blocks it tracks (requested >= min_size) that are live, and their peak
    lay_live = np.zeros(n_proc if layer else 1, np.int64)
    lay_peak = np.zeros(n_proc if layer else 1, np.int64)
    # seed002, the proof (layer.c's hl_ghost_hit): per process, the last GHOSTS blocks it passed
    # on before it (usable size, alignment; oldest first), the misses they could have served,
    # and whether it keeps yet
    n_lay = n_proc if layer else 1
    gh_u = np.zeros((n_lay, GHOSTS), np.int64)
    gh_al = np.zeros((n_lay, GHOSTS), np.int64)
    gh_n = np.zeros(n_lay, np.int64)
    gh_hits = np.zeros(n_lay, np.int64)
    proven = np.full(n_lay, proof == 0)
    integral = 0.0
    foot_integral = 0.0
    live_integral = 0.0
    caching = kind != K_NONE
    tiered = kind == K_GUIDED and n_tiers > 1  # priority mode
    for i in range(n):
        p = proc[i]
        t = time[i]
        if i > 0:
            dt = float(t - time[i - 1])
            integral += float(g[G_IDLE]) * dt
            foot_integral += float(g[G_LIVE_BLK] + g[G_IDLE]) * dt
            live_integral += float(g[G_LIVE_REQ]) * dt
        ps[p, P_POS] += 1
        q = ps[p, P_POS]
        # timed releases, at the process's own calls (lazy)
        if kind == K_SEED001:
            k = ps[p, P_GHEAD]
            while k >= 0 and nodes[k, N_TIME] + decay < t:
                _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
                k = ps[p, P_GHEAD]
        elif tiered:  # predictions outlived: demoted to the unpredicted blocks' recent end
            for tier in range(1, n_tiers):
                life = tier_ttl[tier]
                if life > 0:
                    k = ps[p, 2 * tier]
                    while k >= 0 and nodes[k, N_POS] + life < q:
                        _unlink(nodes, ps, k)
                        _link(nodes, ps, k, 0)
                        k = ps[p, 2 * tier]
        elif kind == K_GUIDED and ttl > 0:  # admit mode
            k = ps[p, P_GHEAD]
            while k >= 0 and nodes[k, N_POS] + ttl < q:
                _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
                k = ps[p, P_GHEAD]

        # --- request half
        sysrealloc = False
        s = req[i]
        if s >= 0:
            c = cls_req[i]
            g[G_ALLOCS] += 1
            g[G_REQ_BYTES] += s
            hit = -1
            ar = align_req[i]
            if layer and s >= min_size:
                # the most recently cached block that fits (any class) and has the alignment
                k = ps[p, P_GTAIL]
                while k >= 0:
                    if _fits(nodes[k, N_USABLE], s) and (ar <= 1 or nodes[k, N_ALIGN] % ar == 0):
                        hit = k
                        break
                    k = nodes[k, N_GPREV]
            elif caching and s >= min_size:
                k = ct[p, c]
                scanned = 0
                while k >= 0 and scanned < SCAN_LIMIT:
                    if nodes[k, N_SIZE] >= s:
                        hit = k
                        break
                    k = nodes[k, N_CPREV]
                    scanned += 1
            if hit >= 0:
                b = nodes[hit, N_SIZE]
                bu = nodes[hit, N_USABLE]  # (0 but for seed002)
                bal = nodes[hit, N_ALIGN]
                _remove(nodes, ch, ct, ps, g, hit)
                g[G_HITS] += 1
                g[G_HIT_BYTES] += s
                g[G_WASTE] += (bu if layer else b) - s  # the layer: usable sizes
            elif freed[i] >= 0:
                # realloc that the cache cannot serve: the system reallocates the old block
                b = s
                bu = _usable(s, 0, mmap_threshold) if layer else 0
                bal = addr_align[i] if layer else 0
                sysrealloc = True
                a = partner[i]
                bo = blk[a] if a >= 0 else freed[i]
                if layer and freed[i] >= min_size:  # the layer drops old, then reallocs
                    lay_live[p] -= blk_u[a] if a >= 0 else _usable(freed[i], 0, mmap_threshold)
                if bo >= mmap_threshold and s >= mmap_threshold:  # mremap: new pages only
                    g[G_SYS] += 1
                    d = _mmap_bytes(s) - _mmap_bytes(bo)
                    ps[p, P_MAPPED] += d
                    g[G_RSS] += d
                    if d > 0:
                        g[G_FAULT_MMAP] += d
                else:  # in place on the heap, or a move between heap and mmap
                    _sys_release(ps, g, p, bo, mmap_threshold)
                    _sys_alloc(ps, g, p, s, mmap_threshold)
            else:
                b = s
                bu = _usable(s, ar, mmap_threshold) if layer else 0
                bal = addr_align[i] if layer else 0
                _sys_alloc(ps, g, p, s, mmap_threshold)
            blk[i] = b
            if layer:
                blk_u[i] = bu
                blk_al[i] = bal
                if s >= min_size and hit < 0 and not proven[p]:
                    # the proof: the newest remembered block that would have served it
                    j = gh_n[p] - 1
                    while j >= 0:
                        if _fits(gh_u[p, j], s) and (ar <= 1 or gh_al[p, j] % ar == 0):
                            break
                        j -= 1
                    if j >= 0:
                        _ghost_drop(gh_u, gh_al, gh_n, p, j)
                        gh_hits[p] += 1
                        proven[p] = gh_hits[p] >= proof
                if s >= min_size:
                    lay_live[p] += bu
                    if hit < 0 and s >= mmap_threshold and peak_pct >= 0:
                        _bound(
                            nodes, ch, ct, ps, g, p, lay_live, lay_peak, peak_pct, mmap_threshold
                        )
                    th = thread[i]
                    t_req[th] = s
                    t_prev[th] = t_last[th]
                    t_last[th] = i
            ps[p, P_LIVE_REQ] += s
            ps[p, P_LIVE_BLK] += b
            g[G_LIVE_REQ] += s
            g[G_LIVE_BLK] += b
            if kind == K_BELADY:
                nxt[p, c] = next_same[i]
                if next_same[i] == NEVER:  # the class is never requested again: drop its pool
                    k = ch[p, c]
                    while k >= 0:
                        _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
                        k = ch[p, c]

        # --- free half
        w = freed[i]
        if w >= 0:
            g[G_FREES] += 1
            a = partner[i]
            b = blk[a] if a >= 0 else w
            bu = 0
            bal = 0
            if layer:
                bu = blk_u[a] if a >= 0 else _usable(w, 0, mmap_threshold)
                bal = blk_al[a] if a >= 0 else 16
                if w >= min_size and not sysrealloc:
                    lay_live[p] -= bu
            c = cls_free[i]
            ps[p, P_LIVE_REQ] -= w
            ps[p, P_LIVE_BLK] -= b
            g[G_LIVE_REQ] -= w
            g[G_LIVE_BLK] -= b
            keep = False
            if sysrealloc:
                pass  # the system reallocated the block: nothing to release or keep
            elif layer and bu >= min_size and w >= min_size:  # usable sizes; blocks it made
                th = thread[i]
                if a >= 0 and a == t_prev[th] and t_req[th] > bu:
                    pass  # outgrown: the thread just asked for more than this block holds
                elif not proven[p]:  # passed on, remembered (the last GHOSTS)
                    if gh_n[p] == GHOSTS:
                        _ghost_drop(gh_u, gh_al, gh_n, p, 0)
                    gh_u[p, gh_n[p]] = bu
                    gh_al[p, gh_n[p]] = bal
                    gh_n[p] += 1
                elif ps[p, P_COUNT] < n_keep:
                    keep = True
                else:
                    small = _smallest(nodes, ps, p)
                    if bu >= nodes[small, N_USABLE]:
                        _evict(nodes, ch, ct, ps, g, small, mmap_threshold)
                        keep = True
            elif caching and not layer and b >= min_size:
                if kind == K_SEED001:
                    keep = True
                elif kind == K_LRU:
                    keep = b <= budget
                elif kind == K_GUIDED:
                    keep = b <= budget and (tiered or pred[i] > 0)
                elif kind == K_BELADY:
                    keep = b <= budget and nxt[p, c] != NEVER
            if keep:
                k = g[G_FREE_NODE]
                if k >= 0:
                    g[G_FREE_NODE] = nodes[k, N_CNEXT]
                else:
                    k = g[G_NODES]
                    if k == nodes.shape[0]:
                        grown = np.empty((2 * k, _NF), np.int64)
                        grown[:k] = nodes
                        nodes = grown
                    g[G_NODES] = k + 1
                nodes[k, N_SIZE] = b
                nodes[k, N_CLS] = c
                nodes[k, N_TIME] = t
                nodes[k, N_POS] = q
                nodes[k, N_PROC] = p
                nodes[k, N_TIER] = 0
                nodes[k, N_USABLE] = bu
                nodes[k, N_ALIGN] = bal
                tail = ct[p, c]
                nodes[k, N_CPREV] = tail
                nodes[k, N_CNEXT] = -1
                if tail >= 0:
                    nodes[tail, N_CNEXT] = k
                else:
                    ch[p, c] = k
                ct[p, c] = k
                _link(nodes, ps, k, pred[i] if tiered else 0)
                ps[p, P_COUNT] += 1
                ps[p, P_IDLE] += b
                g[G_IDLE] += b
                g[G_CACHED] += 1
                if kind == K_LRU or kind == K_GUIDED:
                    while ps[p, P_IDLE] > budget:  # lowest tier first (only tier 0 but tiered)
                        k = ps[p, P_GHEAD]
                        tier = 1
                        while k < 0 and tier < n_tiers:
                            k = ps[p, 2 * tier]
                            tier += 1
                        _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
                elif kind == K_BELADY:
                    while ps[p, P_IDLE] > budget:
                        cc = _farthest_class(ch, nxt, p)
                        _evict(nodes, ch, ct, ps, g, ch[p, cc], mmap_threshold)
                if ps[p, P_IDLE] > ps[p, P_IDLE_PEAK]:
                    ps[p, P_IDLE_PEAK] = ps[p, P_IDLE]
            elif not sysrealloc:
                _sys_release(ps, g, p, b, mmap_threshold)

        # --- peaks, then the process's exit
        if g[G_IDLE] > g[G_IDLE_PEAK]:
            g[G_IDLE_PEAK] = g[G_IDLE]
        if g[G_LIVE_REQ] > g[G_LIVE_PEAK]:
            g[G_LIVE_PEAK] = g[G_LIVE_REQ]
        if g[G_LIVE_BLK] + g[G_IDLE] > g[G_FOOT_PEAK]:
            g[G_FOOT_PEAK] = g[G_LIVE_BLK] + g[G_IDLE]
        if g[G_RSS] > g[G_RSS_PEAK]:
            g[G_RSS_PEAK] = g[G_RSS]
        if is_last[i]:
            for tier in range(n_tiers if tiered else 1):
                k = ps[p, 2 * tier]
                while k >= 0:
                    size = nodes[k, N_SIZE]
                    _remove(nodes, ch, ct, ps, g, k)
                    _sys_release(ps, g, p, size, mmap_threshold)
                    k = ps[p, 2 * tier]
            g[G_LIVE_REQ] -= ps[p, P_LIVE_REQ]
            g[G_LIVE_BLK] -= ps[p, P_LIVE_BLK]
            g[G_RSS] -= _pages(ps[p, P_HWM]) + ps[p, P_MAPPED]
            ps[p, P_LIVE_REQ] = 0
            ps[p, P_LIVE_BLK] = 0
            ps[p, P_MAPPED] = 0
    idle_peak_process = 0
    for p in range(n_proc):
        if ps[p, P_IDLE_PEAK] > idle_peak_process:
            idle_peak_process = ps[p, P_IDLE_PEAK]
    floats = np.array([integral, foot_integral, live_integral])
    return g, floats, idle_peak_process


_KIND = {
    NoneConfig: K_NONE,
    Seed002Config: K_SEED002,
    Seed001Config: K_SEED001,
    LruConfig: K_LRU,
    GuidedConfig: K_GUIDED,
    BeladyConfig: K_BELADY,
}
_NO_PRED = np.zeros(0, np.int64)
_NO_NEXT = np.zeros(0, np.int64)


def _tier_ttl(policy: GuidedConfig, n_tiers: int) -> np.ndarray:
    """Calls after which a block of each tier is demoted (0: never): horizons[-t] for tier t
    (the horizon its prediction was made for), else ttl_calls for every tier."""
    out = np.zeros(MAX_TIERS, np.int64)
    hz = getattr(policy, "horizons", None)
    if hz:
        hz = sorted(hz)
        for t in range(1, min(n_tiers, len(hz) + 1)):
            out[t] = hz[len(hz) - t]
    elif policy.ttl_calls:
        out[1:] = policy.ttl_calls
    return out


def _or_zeros(a: np.ndarray | None, n: int, fill: int = 0) -> np.ndarray:
    return a if a is not None else np.full(n, fill, np.int64)


def as_input(events: pa.Table | SimInput, workload: str = "", run: str = "") -> SimInput:
    if isinstance(events, SimInput):
        return events
    return prepare(events, workload=workload, run=run)


def run_kernel(
    x: SimInput,
    policy: _Policy,
    predictions: np.ndarray | None = None,
    mmap_threshold: int = MMAP_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The compiled loop on a prepared run: (counters, integrals, per-process idle peak)."""
    kind = _KIND[type(policy)]
    pred, n_tiers = _NO_PRED, 1
    tier_ttl = np.zeros(MAX_TIERS, np.int64)
    if kind == K_GUIDED:
        if predictions is None:
            raise ValueError(
                "the guided policy needs a prediction per event (tasks.whatif.guided: "
                "predictions_from_topk or reuse_labels)"
            )
        pred = np.ascontiguousarray(x.align(np.asarray(predictions)).astype(np.int64))
        if len(pred) and (pred.min() < 0 or pred.max() >= MAX_TIERS):
            raise ValueError(f"guided predictions must be bools or tiers 0..{MAX_TIERS - 1}")
        if policy.mode == "priority":  # type: ignore[attr-defined]
            n_tiers = max(2, int(pred.max()) + 1 if len(pred) else 2)
            tier_ttl[:] = _tier_ttl(policy, n_tiers)
    next_same, first = _NO_NEXT, np.full((x.n_proc, N_CLASSES), NEVER, np.int64)
    if kind == K_BELADY:
        next_same, first = x.next_requests()
    return _simulate(
        kind,
        getattr(policy, "n", 0),
        getattr(policy, "min_size", 0),
        getattr(policy, "budget", 0),
        getattr(policy, "decay_ns", 0),
        getattr(policy, "ttl_calls", None) or 0,
        tier_ttl,
        n_tiers,
        mmap_threshold,
        x.proc,
        x.n_proc,
        x.req,
        x.freed,
        x.cls_req,
        x.cls_free,
        x.partner,
        x.time,
        x.is_last,
        pred,
        next_same,
        first,
        _or_zeros(x.align_req, x.n),
        _or_zeros(x.addr_align, x.n, 16),
        x.thread if x.thread is not None else x.proc,
        x.n_threads if x.thread is not None else x.n_proc,
        -1 if getattr(policy, "peak", None) is None else policy.peak,  # type: ignore[attr-defined]
        getattr(policy, "proof", 0),
    )


def _baseline(x: SimInput, mmap_threshold: int) -> dict[str, Any]:
    key = f"baseline:{mmap_threshold}"
    if key not in x.cache:
        x.cache[key] = _metrics(x, NoneConfig(), *run_kernel(x, NoneConfig(), None, mmap_threshold))
    return x.cache[key]


def _metrics(
    x: SimInput, policy: _Policy, g: np.ndarray, floats: np.ndarray, idle_peak_process: int
) -> dict[str, Any]:
    span = x.span
    allocs = int(g[G_ALLOCS])
    live_peak = int(g[G_LIVE_PEAK])

    def mean(v: float) -> float:
        return v / span if span > 0 else 0.0

    return {
        "run": x.run,
        "workload": x.workload,
        "policy": policy.kind,  # type: ignore[attr-defined]
        "param": policy.param,
        "events": x.n,
        "processes": x.n_proc,
        "allocations": allocs,
        "hits": int(g[G_HITS]),
        "hit_rate": g[G_HITS] / allocs if allocs else 0.0,
        "byte_hit_rate": g[G_HIT_BYTES] / g[G_REQ_BYTES] if g[G_REQ_BYTES] else 0.0,
        "hit_bytes": int(g[G_HIT_BYTES]),
        "waste_bytes": int(g[G_WASTE]),
        "frees": int(g[G_FREES]),
        "cached_frees": int(g[G_CACHED]),
        "evictions": int(g[G_EVICT]),
        "evicted_bytes": int(g[G_EVICT_BYTES]),
        "system_allocations": int(g[G_SYS]),
        "idle_bytes_mean": mean(floats[0]),
        "idle_bytes_peak": int(g[G_IDLE_PEAK]),
        "idle_bytes_peak_process": int(idle_peak_process),
        "footprint_mean": mean(floats[1]),
        "live_mean": mean(floats[2]),
        "live_peak": live_peak,
        "peak_footprint": int(g[G_FOOT_PEAK]),
        "footprint_ratio": g[G_FOOT_PEAK] / live_peak if live_peak else math.nan,
        "fault_bytes": int(g[G_FAULT_MMAP] + g[G_FAULT_HEAP]),
        "fault_bytes_mmap": int(g[G_FAULT_MMAP]),
        "fault_bytes_heap": int(g[G_FAULT_HEAP]),
        "max_rss": int(g[G_RSS_PEAK]),
        "ideal_rss": live_peak,
        "span": span,
        "time_basis": x.time_basis,
        "is_bound": False,
    }


def simulate(
    events: pa.Table | SimInput,
    policy: _Policy,
    predictions: np.ndarray | None = None,
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    workload: str = "",
    run: str = "",
) -> dict[str, Any]:
    """Metrics of one run under one policy (every rule: docs/whatif.md#the-simulator).

    `predictions`: the guided policy's keep/drop per row of the input table (bool array)."""
    x = as_input(events, workload, run)
    base = _baseline(x, mmap_threshold)
    if isinstance(policy, OracleConfig):
        return oracle_metrics(x, policy, base)
    if isinstance(policy, NoneConfig):
        out = dict(base)
    else:
        out = _metrics(x, policy, *run_kernel(x, policy, predictions, mmap_threshold))
    out["fault_bytes_none"] = base["fault_bytes"]
    out["fault_bytes_avoided"] = base["fault_bytes"] - out["fault_bytes"]
    return out
