"""Replay one run's events through an allocator cache policy: a compiled, sequential simulator.

`simulate(events, policy) -> dict` (events: a pyarrow Table of the events schema, or the
`SimInput` that `tasks.whatif.events.prepare` makes of one). One numba-compiled loop visits the
rows once, in time order across processes and call order within each; every process has its own
cache. The `oracle` kind is bounded (tasks/whatif/oracle.py), not simulated. The policies heapcast's
layer runs (largest, pools, layer_guided) are not in the loop: the layer's own decisions, the
policy core (tasks/whatif/policy_core.py), decide them, and `layer_metrics` turns its per-row
answers into the same figures in numpy.

The rules (the cache, largest, hit rate, realloc, bytes, the page-fault model, guided tiers):
docs/whatif-simulator.md#the-simulator
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
    LAYER_KINDS,
    MMAP_THRESHOLD,
    GuidedConfig,
    LayerGuidedConfig,
    NoneConfig,
    OracleConfig,
    _Policy,
)
from tasks.whatif.policy_core import (
    LayerConfig,
    core_batch,
    layer_policy,
    run_batch,
    with_call_sites,
)

PAGE = 4096
SCAN_LIMIT = 64

K_NONE, K_LRU, K_GUIDED, K_BELADY = range(4)

# node fields (a cached block), one int64 row per node; N_TIER: which of its process's lists
# holds it (0: the list every policy uses; 1..MAX_TIERS-1: guided priority's predicted blocks)
N_SIZE, N_CLS, N_TIME, N_POS, N_PROC, N_CPREV, N_CNEXT, N_GPREV, N_GNEXT, N_TIER = range(10)
_NF = 10
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


# How the loop's steps are compiled. A call between numba functions passes each array as its
# fields and counts a reference on each on the way in and out (an atomic add and a call), which
# for a step done per row costs more than the step. The steps only read and write arrays their
# caller holds and never allocate, so they are compiled without reference counting (numba's
# `_nrt=False`); the steps done per row are inlined by LLVM (`forceinline`: the compiled loop is
# as if written in one piece), the rare ones stay calls. Both flags are given explicitly: a
# callee left without them inherits those of the first caller that compiles it
# (docs/whatif-simulator.md#how-the-loop-is-compiled-and-its-speed).
_inlined = njit(cache=True, nogil=True, _nrt=False, forceinline=True)
_called = njit(cache=True, nogil=True, _nrt=False, forceinline=False)


@_inlined
def _chunk(s: int) -> int:
    """glibc's chunk size for a request of s bytes (64-bit)."""
    c = (s + 8 + 15) & ~15
    return c if c >= 32 else 32


@_inlined
def _pages(x: int) -> int:
    return (x + PAGE - 1) // PAGE * PAGE


@_inlined
def _mmap_bytes(s: int) -> int:
    return _pages(_chunk(s) + 8)


@_inlined
def _note_peaks(g):
    """After a row: the peaks of idle, live, footprint and RSS bytes (g's G_*_PEAK slots)."""
    if g[G_IDLE] > g[G_IDLE_PEAK]:
        g[G_IDLE_PEAK] = g[G_IDLE]
    if g[G_LIVE_REQ] > g[G_LIVE_PEAK]:
        g[G_LIVE_PEAK] = g[G_LIVE_REQ]
    if g[G_LIVE_BLK] + g[G_IDLE] > g[G_FOOT_PEAK]:
        g[G_FOOT_PEAK] = g[G_LIVE_BLK] + g[G_IDLE]
    if g[G_RSS] > g[G_RSS_PEAK]:
        g[G_RSS_PEAK] = g[G_RSS]


@_inlined
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


@_inlined
def _sys_release(ps, g, p, b, mmap_threshold):
    if b < mmap_threshold:
        ps[p, P_HEAP] -= _chunk(b)
    else:
        f = _mmap_bytes(b)
        ps[p, P_MAPPED] -= f
        g[G_RSS] -= f


# A node is in two doubly linked lists: its class's (N_CPREV, N_CNEXT; head and tail in ch and
# ct) and its process's list of its tier (N_GPREV, N_GNEXT; head and tail in the process's row).
@_inlined
def _detach(nodes, k, prev, nxt, heads, tails, row, head, tail):
    """Take node k out of a list: its links in fields prev and nxt, the list's head and tail at
    heads[row, head] and tails[row, tail]."""
    a = nodes[k, prev]
    b = nodes[k, nxt]
    if a >= 0:
        nodes[a, nxt] = b
    else:
        heads[row, head] = b
    if b >= 0:
        nodes[b, prev] = a
    else:
        tails[row, tail] = a


@_inlined
def _append(nodes, k, prev, nxt, heads, tails, row, head, tail):
    """Append node k at the tail (most recent end) of a list (as `_detach`'s)."""
    last = tails[row, tail]
    nodes[k, prev] = last
    nodes[k, nxt] = -1
    if last >= 0:
        nodes[last, nxt] = k
    else:
        heads[row, head] = k
    tails[row, tail] = k


@_inlined
def _unlink(nodes, ps, k):
    """Take node k out of its process's list (of its tier)."""
    h = P_GHEAD + 2 * nodes[k, N_TIER]
    _detach(nodes, k, N_GPREV, N_GNEXT, ps, ps, nodes[k, N_PROC], h, h + 1)


@_inlined
def _link(nodes, ps, k, tier):
    """Append node k at the tail (most recent end) of its process's list of `tier`."""
    h = P_GHEAD + 2 * tier
    nodes[k, N_TIER] = tier
    _append(nodes, k, N_GPREV, N_GNEXT, ps, ps, nodes[k, N_PROC], h, h + 1)


@_inlined
def _remove(nodes, ch, ct, ps, g, k):
    """Take node k out of its class list and its process's list; recycle it."""
    p = nodes[k, N_PROC]
    c = nodes[k, N_CLS]
    _detach(nodes, k, N_CPREV, N_CNEXT, ch, ct, p, c, c)
    _unlink(nodes, ps, k)
    size = nodes[k, N_SIZE]
    ps[p, P_COUNT] -= 1
    ps[p, P_IDLE] -= size
    g[G_IDLE] -= size
    nodes[k, N_CNEXT] = g[G_FREE_NODE]
    g[G_FREE_NODE] = k


@_inlined
def _evict(nodes, ch, ct, ps, g, k, mmap_threshold):
    size = nodes[k, N_SIZE]
    p = nodes[k, N_PROC]
    _remove(nodes, ch, ct, ps, g, k)
    _sys_release(ps, g, p, size, mmap_threshold)
    g[G_EVICT] += 1
    g[G_EVICT_BYTES] += size


@_inlined
def _farthest_class(ch, nxt, p):
    """Belady: the non-empty class of process p whose next request is farthest (-1: none)."""
    best = -1
    best_at = -1
    for c in range(N_CLASSES):
        if ch[p, c] >= 0 and nxt[p, c] >= best_at:
            best = c
            best_at = nxt[p, c]
    return best


@_inlined
def _demote_outlived(nodes, ps, p, q, tier_ttl, n_tiers):
    """Guided priority: blocks whose prediction is outlived at call q of process p move to the
    unpredicted blocks' recent end."""
    for tier in range(1, n_tiers):
        life = tier_ttl[tier]
        if life > 0:
            k = ps[p, 2 * tier]
            while k >= 0 and nodes[k, N_POS] + life < q:
                _unlink(nodes, ps, k)
                _link(nodes, ps, k, 0)
                k = ps[p, 2 * tier]


@_inlined
def _evict_outlived(nodes, ch, ct, ps, g, p, q, ttl, mmap_threshold):
    """Guided admit: blocks kept more than ttl calls of process p ago are evicted."""
    k = ps[p, P_GHEAD]
    while k >= 0 and nodes[k, N_POS] + ttl < q:
        _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
        k = ps[p, P_GHEAD]


@_inlined
def _lookup(nodes, ct, p, c, s):
    """The cached block of class c that serves s bytes: the most recent one that fits among the
    SCAN_LIMIT most recent of the class (-1: a miss)."""
    k = ct[p, c]
    scanned = 0
    while k >= 0 and scanned < SCAN_LIMIT:
        if nodes[k, N_SIZE] >= s:
            return k
        k = nodes[k, N_CPREV]
        scanned += 1
    return -1


@_called
def _sys_realloc(ps, g, p, s, bo, mmap_threshold):
    """The system reallocates a block of bo bytes to s bytes (a realloc the cache cannot
    serve): mremap between two mappings, else a release and an allocation."""
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


@_inlined
def _request(nodes, ch, ct, ps, g, blk, i, p, s, c, cached, freed, partner, mmap_threshold):
    """Row i's request of s bytes (class c): a hit from the cache (`cached`: the policy looks
    there), else the system; the block it got in blk[i]. True when the system reallocated."""
    g[G_ALLOCS] += 1
    g[G_REQ_BYTES] += s
    hit = _lookup(nodes, ct, p, c, s) if cached else -1
    sysrealloc = False
    if hit >= 0:
        b = nodes[hit, N_SIZE]
        _remove(nodes, ch, ct, ps, g, hit)
        g[G_HITS] += 1
        g[G_HIT_BYTES] += s
        g[G_WASTE] += b - s
    else:
        b = s
        if freed[i] >= 0:  # a realloc the cache cannot serve: the old block never reaches it
            sysrealloc = True
            a = partner[i]
            _sys_realloc(ps, g, p, s, blk[a] if a >= 0 else freed[i], mmap_threshold)
        else:
            _sys_alloc(ps, g, p, s, mmap_threshold)
    blk[i] = b
    ps[p, P_LIVE_REQ] += s
    ps[p, P_LIVE_BLK] += b
    g[G_LIVE_REQ] += s
    g[G_LIVE_BLK] += b
    return sysrealloc


@_called
def _drop_class(nodes, ch, ct, ps, g, p, c, mmap_threshold):
    """Belady: class c of process p is never requested again; its cached blocks are evicted."""
    k = ch[p, c]
    while k >= 0:
        _evict(nodes, ch, ct, ps, g, k, mmap_threshold)
        k = ch[p, c]


@_inlined
def _keeps(kind, tiered, b, c, p, i, min_size, budget, pred, nxt):
    """Whether the policy keeps a freed block of b bytes (class c, process p, row i)."""
    if kind == K_NONE or b < min_size or b > budget:
        return False
    if kind == K_LRU:
        return True
    if kind == K_GUIDED:
        return tiered or pred[i] > 0
    return nxt[p, c] != NEVER


@njit(cache=True, nogil=True)
def _new_state(kind, n_proc, n):
    """The loop's state, empty: run counters, process rows, class lists' heads and tails, the
    node table, and the block each request got."""
    g = np.zeros(_GF, np.int64)
    g[G_FREE_NODE] = -1
    ps = np.zeros((n_proc, _PF), np.int64)
    ps[:, : 2 * MAX_TIERS] = -1
    ch = np.full((n_proc, N_CLASSES), -1, np.int64)
    ct = np.full((n_proc, N_CLASSES), -1, np.int64)
    nodes = np.empty((1024 if kind != K_NONE else 1, _NF), np.int64)
    return g, ps, ch, ct, nodes, np.zeros(n, np.int64)


@njit(cache=True, nogil=True)
def _grown(nodes):
    """The node table with twice the rows."""
    grown = np.empty((2 * nodes.shape[0], _NF), np.int64)
    grown[: nodes.shape[0]] = nodes
    return grown


@_inlined
def _take_node(nodes, g):
    """A node for a block: a recycled one, else the next row of the table (the caller grows a
    full table first)."""
    k = g[G_FREE_NODE]
    if k >= 0:
        g[G_FREE_NODE] = nodes[k, N_CNEXT]
    else:
        k = g[G_NODES]
        g[G_NODES] = k + 1
    return k


@_inlined
def _book_free(ps, g, p, w, b):
    """A free of w requested bytes (a block of b) of process p: the live bytes drop."""
    g[G_FREES] += 1
    ps[p, P_LIVE_REQ] -= w
    ps[p, P_LIVE_BLK] -= b
    g[G_LIVE_REQ] -= w
    g[G_LIVE_BLK] -= b


@_inlined
def _cache_block(nodes, ch, ct, ps, g, k, p, b, c, t, q, tier):
    """Node k holds a freed block (b bytes, class c, freed at time t, call q of process p): at
    the recent end of its class list and of its process's list of `tier`."""
    nodes[k, N_SIZE] = b
    nodes[k, N_CLS] = c
    nodes[k, N_TIME] = t
    nodes[k, N_POS] = q
    nodes[k, N_PROC] = p
    nodes[k, N_TIER] = 0
    _append(nodes, k, N_CPREV, N_CNEXT, ch, ct, p, c, c)
    _link(nodes, ps, k, tier)
    ps[p, P_COUNT] += 1
    ps[p, P_IDLE] += b
    g[G_IDLE] += b
    g[G_CACHED] += 1


@_inlined
def _make_room(nodes, ch, ct, ps, g, nxt, p, kind, budget, n_tiers, mmap_threshold):
    """Evictions until process p's idle bytes are within the budget: LRU and guided the least
    recent block of the lowest tier, Belady a block of the class requested farthest ahead."""
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


@_called
def _process_exit(nodes, ch, ct, ps, g, p, n_lists, mmap_threshold):
    """Process p exits: its cached blocks (its n_lists lists) and live blocks leave the run."""
    for tier in range(n_lists):
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


@njit(cache=True, nogil=True)
def _simulate(
    kind,
    min_size,
    budget,
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
):
    """The compiled loop: each row's request, then its free, through the policy `kind`;
    (counters, integrals of idle, footprint and live bytes over time, per-process idle peak)."""
    g, ps, ch, ct, nodes, blk = _new_state(kind, n_proc, len(req))
    nxt = first_req.copy()  # Belady: each process's next request of each class
    integral = 0.0
    foot_integral = 0.0
    live_integral = 0.0
    tiered = kind == K_GUIDED and n_tiers > 1  # priority mode
    for i in range(len(req)):
        p = proc[i]
        if i > 0:
            dt = float(time[i] - time[i - 1])
            integral += float(g[G_IDLE]) * dt
            foot_integral += float(g[G_LIVE_BLK] + g[G_IDLE]) * dt
            live_integral += float(g[G_LIVE_REQ]) * dt
        ps[p, P_POS] += 1
        q = ps[p, P_POS]
        if tiered:
            _demote_outlived(nodes, ps, p, q, tier_ttl, n_tiers)
        elif kind == K_GUIDED and ttl > 0:  # admit mode
            _evict_outlived(nodes, ch, ct, ps, g, p, q, ttl, mmap_threshold)
        sysrealloc = False
        s = req[i]
        if s >= 0:
            c = cls_req[i]
            cached = kind != K_NONE and s >= min_size
            sysrealloc = _request(
                nodes, ch, ct, ps, g, blk, i, p, s, c, cached, freed, partner, mmap_threshold
            )
            if kind == K_BELADY:
                nxt[p, c] = next_same[i]
                if next_same[i] == NEVER:  # the class is never requested again
                    _drop_class(nodes, ch, ct, ps, g, p, c, mmap_threshold)
        w = freed[i]
        if w >= 0:
            a = partner[i]
            b = blk[a] if a >= 0 else w
            c = cls_free[i]
            _book_free(ps, g, p, w, b)
            if sysrealloc:
                pass  # the system reallocated the block: nothing to release or keep
            elif _keeps(kind, tiered, b, c, p, i, min_size, budget, pred, nxt):
                if g[G_FREE_NODE] < 0 and g[G_NODES] == nodes.shape[0]:
                    nodes = _grown(nodes)
                k = _take_node(nodes, g)
                _cache_block(nodes, ch, ct, ps, g, k, p, b, c, time[i], q, pred[i] if tiered else 0)
                _make_room(nodes, ch, ct, ps, g, nxt, p, kind, budget, n_tiers, mmap_threshold)
            else:
                _sys_release(ps, g, p, b, mmap_threshold)
        _note_peaks(g)
        if is_last[i]:
            _process_exit(nodes, ch, ct, ps, g, p, n_tiers if tiered else 1, mmap_threshold)
    floats = np.array([integral, foot_integral, live_integral])
    return g, floats, ps[:, P_IDLE_PEAK].max() if n_proc else 0


_KIND = {"none": K_NONE, "lru": K_LRU, "guided": K_GUIDED, "belady": K_BELADY}  # by policy kind
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


def as_input(events: pa.Table | SimInput, workload: str = "", run: str = "") -> SimInput:
    """A run laid out for the simulator; from an events table, with its rows' call sites (a
    layer table with site entries asks them: policy_core.with_call_sites)."""
    if isinstance(events, SimInput):
        return events
    return with_call_sites(prepare(events, workload=workload, run=run), events)


def run_kernel(
    x: SimInput,
    policy: _Policy,
    predictions: np.ndarray | None = None,
    mmap_threshold: int = MMAP_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The compiled loop on a prepared run: (counters, integrals, per-process idle peak). The
    policies the layer runs are not here: `simulate` hands them to the policy core."""
    if policy.kind not in _KIND:  # type: ignore[attr-defined]
        raise ValueError(
            f"{policy.kind} is a policy the layer runs: the policy core computes it "  # type: ignore[attr-defined]
            "(simulate, or tasks.whatif.policy_core), not the compiled loop"
        )
    kind = _KIND[policy.kind]  # type: ignore[attr-defined]
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
        getattr(policy, "min_size", 0),
        getattr(policy, "budget", 0),
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


# a process's fields in the layer's figures, one int64 row per process
L_HEAP, L_HWM, L_MAPPED, L_LIVE_REQ, L_LIVE_BLK, L_IDLE, L_RSS = range(7)
_LF = 7


@_inlined
def _layer_alloc(g, lp, p, s, m):
    """The system allocates s bytes for process p: a mapping of m bytes, or (m = 0) the heap."""
    if m > 0:
        lp[p, L_MAPPED] += m
        g[G_FAULT_MMAP] += m
    else:
        lp[p, L_HEAP] += _chunk(s)
        if lp[p, L_HEAP] > lp[p, L_HWM]:
            g[G_FAULT_HEAP] += _pages(lp[p, L_HEAP]) - _pages(lp[p, L_HWM])
            lp[p, L_HWM] = lp[p, L_HEAP]


@_inlined
def _layer_release(lp, p, b, m):
    """A block of b bytes leaves process p: its mapping of m bytes, or (m = 0) the heap."""
    if m > 0:
        lp[p, L_MAPPED] -= m
    else:
        lp[p, L_HEAP] -= _chunk(b)


@_inlined
def _layer_old_block(blk, mp, a, w, mmap_threshold):
    """The block a free of w requested bytes releases and its mapping: the one its request
    (row a) got, else (a = -1: allocated before the trace) the system's for w bytes."""
    if a >= 0:
        return blk[a], mp[a]
    return w, _mmap_bytes(w) if w >= mmap_threshold else 0


@_inlined
def _layer_request(g, lp, blk, mp, i, p, s, w, bo, mo, hit, usable, mmap_threshold):
    """Row i's request of s bytes: a kept block of `usable` bytes (a hit: mapped, as the layer
    keeps only blocks it mapped), else the system's, which reallocates the old block (bo bytes,
    mapping mo) of a realloc (w >= 0); the block and its mapping in blk[i] and mp[i]."""
    g[G_ALLOCS] += 1
    g[G_REQ_BYTES] += s
    if hit:
        b = usable
        m = _pages(b + 16)
        lp[p, L_MAPPED] += m
        g[G_HITS] += 1
        g[G_HIT_BYTES] += s
        g[G_WASTE] += b - s
    else:
        b = s
        m = _mmap_bytes(s) if s >= mmap_threshold else 0
        g[G_SYS] += 1
        if w >= 0 and mo > 0 and m > 0:  # mremap: new pages only
            if m > mo:
                g[G_FAULT_MMAP] += m - mo
            lp[p, L_MAPPED] += m - mo
        else:  # a move (the old block released, the new one allocated), or a new block
            if w >= 0:
                _layer_release(lp, p, bo, mo)
            _layer_alloc(g, lp, p, s, m)
    blk[i] = b
    mp[i] = m
    lp[p, L_LIVE_REQ] += s
    lp[p, L_LIVE_BLK] += b
    g[G_LIVE_REQ] += s
    g[G_LIVE_BLK] += b


@_inlined
def _layer_keeps(g, lp, p, kept):
    """After a row, process p keeps `kept` usable bytes (the core's): idle bytes and the RSS
    (its heap's high-water pages, its mappings and what it keeps)."""
    g[G_IDLE] += kept - lp[p, L_IDLE]
    lp[p, L_IDLE] = kept
    r = _pages(lp[p, L_HWM]) + lp[p, L_MAPPED] + kept
    g[G_RSS] += r - lp[p, L_RSS]
    lp[p, L_RSS] = r


@_called
def _layer_exit(g, lp, p):
    """Process p exits: its live and kept bytes and its RSS leave the run."""
    g[G_LIVE_REQ] -= lp[p, L_LIVE_REQ]
    g[G_LIVE_BLK] -= lp[p, L_LIVE_BLK]
    g[G_IDLE] -= lp[p, L_IDLE]
    g[G_RSS] -= lp[p, L_RSS]
    lp[p, L_LIVE_REQ] = lp[p, L_LIVE_BLK] = lp[p, L_IDLE] = lp[p, L_RSS] = lp[p, L_MAPPED] = 0


@njit(cache=True, nogil=True)
def _layer_figures(
    req, freed, partner, proc, time, is_last, hit, got_usable, kept, n_proc, mmap_threshold
):
    """The byte figures of a policy the layer runs, from the policy core's answers per row (a
    hit and the usable bytes it got; the bytes each process keeps after the row): the compiled
    loop's fault model, the decisions taken as given. Counters as `_simulate`'s."""
    n = len(req)
    g = np.zeros(_GF, np.int64)
    blk = np.zeros(n, np.int64)  # the block each request got (a hit: the kept block's usable)
    mp = np.zeros(n, np.int64)  # its mapping (0: on the heap)
    lp = np.zeros((n_proc, _LF), np.int64)
    idle_peak_process = 0
    integral = 0.0
    foot_integral = 0.0
    live_integral = 0.0
    for i in range(n):
        p = proc[i]
        if i > 0:
            dt = float(time[i] - time[i - 1])
            integral += float(g[G_IDLE]) * dt
            foot_integral += float(g[G_LIVE_BLK] + g[G_IDLE]) * dt
            live_integral += float(g[G_LIVE_REQ]) * dt
        s = req[i]
        w = freed[i]
        bo, mo = _layer_old_block(blk, mp, partner[i], w, mmap_threshold) if w >= 0 else (0, 0)
        if s >= 0:
            _layer_request(
                g, lp, blk, mp, i, p, s, w, bo, mo, hit[i], got_usable[i], mmap_threshold
            )
        if w >= 0:
            g[G_FREES] += 1
            lp[p, L_LIVE_REQ] -= w
            lp[p, L_LIVE_BLK] -= bo
            g[G_LIVE_REQ] -= w
            g[G_LIVE_BLK] -= bo
            if s < 0 or hit[i]:  # the block leaves the program: kept (counted in idle) or freed
                _layer_release(lp, p, bo, mo)
        _layer_keeps(g, lp, p, kept[i])
        if kept[i] > idle_peak_process:
            idle_peak_process = kept[i]
        _note_peaks(g)
        if is_last[i]:  # the process exits
            _layer_exit(g, lp, p)
    return g, np.array([integral, foot_integral, live_integral]), idle_peak_process


def layer_metrics(
    x: SimInput,
    policy: LayerConfig,
    class_scores: np.ndarray | None = None,
    mmap_threshold: int = MMAP_THRESHOLD,
) -> tuple[dict[str, Any], dict[str, int]]:
    """A policy the layer runs, decided by the policy core (tasks/whatif/policy_core.py) over
    the run; its figures (`_metrics`' names) from the core's per-row decisions, in numpy; and
    the core's own counters (the layer's stats line).

    The byte figures follow the fault model of the compiled loop (docs/whatif.md), with the
    layer's sizes (`_layer_figures`): a hit holds the kept block's usable bytes; idle bytes are
    the usable bytes its process keeps (shared cache and threads' fronts), which count to the
    RSS by their usable bytes; the layer keeps only blocks it mapped."""
    lp, decay_ns = layer_policy(policy)
    scores = None
    if isinstance(policy, LayerGuidedConfig) and policy.table:
        if class_scores is None:
            raise ValueError(
                "layer_guided with table=true needs the version's class table: "
                "simulate(..., class_scores=) (tasks.whatif.policy_core.class_scores_of)"
            )
        scores = class_scores
    batch = core_batch(x, lp, mmap_threshold, decay_ns=decay_ns, class_scores=scores)
    stats, decision, got_usable, kept = run_batch(batch)
    g, floats, idle_peak_process = _layer_figures(
        x.req,
        x.freed,
        x.partner,
        x.proc,
        x.time,
        x.is_last,
        (decision & 3) == 1,
        got_usable,
        kept,
        x.n_proc,
        mmap_threshold,
    )
    g[G_CACHED] = stats["kept"]
    g[G_EVICT] = stats["given_back"]
    g[G_EVICT_BYTES] = stats["bytes_given_back"]
    return _metrics(x, policy, g, floats, idle_peak_process), stats


def simulate(
    events: pa.Table | SimInput,
    policy: _Policy,
    predictions: np.ndarray | None = None,
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    workload: str = "",
    run: str = "",
    class_scores: np.ndarray | None = None,
) -> dict[str, Any]:
    """Metrics of one run under one policy (every rule:
    docs/whatif-simulator.md#the-simulator).

    `predictions`: the guided policy's keep/drop per row of the input table (bool array).
    The policies the layer runs (largest, pools, layer_guided) are the layer's own decisions,
    the policy core's (`layer_metrics`); `class_scores`: the class table layer_guided(table=true)
    asks."""
    x = as_input(events, workload, run)
    base = _baseline(x, mmap_threshold)
    if isinstance(policy, OracleConfig):
        return oracle_metrics(x, policy, base)
    if isinstance(policy, NoneConfig):
        out = dict(base)
    elif policy.kind in LAYER_KINDS:  # type: ignore[attr-defined]
        out, _ = layer_metrics(x, policy, class_scores, mmap_threshold)
    else:
        out = _metrics(x, policy, *run_kernel(x, policy, predictions, mmap_threshold))
    out["fault_bytes_none"] = base["fault_bytes"]
    out["fault_bytes_avoided"] = base["fault_bytes"] - out["fault_bytes"]
    return out
