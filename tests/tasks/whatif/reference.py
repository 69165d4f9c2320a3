"""Test helpers of the what-if stage: random event tables and a plain-Python reference simulator.

`random_events(seed)` fabricates a run (EVENTS_SCHEMA, as tasks/dataset/synthetic_events.py
does, but with real pairing): processes of mallocs, callocs, frees, reallocs (also realloc(p, 0)
and malloc(0)), unpaired frees and failed allocations, addresses reused after free, sizes in a
few recurring classes below and above the mmap threshold, times with ties, threads.

`reference(table, policy, predictions)` replays it event by event with dicts and lists, written from
the simulator's rules (docs/whatif-simulator.md#the-simulator), independently of its arrays, for the
policies the compiled loop runs (none, lru, guided, belady). The policies heapcast's layer runs
(largest, pools, layer_guided) have no copy here: the simulator asks the layer's own code (the
policy core), and tests/tasks/whatif/test_policy_core.py holds it to the real layer: blocks are
paired by ADDRESS here (the simulator uses lifetime_calls), processes are merged by sorting (time,
process, row) here.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from tasks.dataset.events_schema import EVENTS_SCHEMA
from tasks.format.trace_reader import Op

M = 128 * 1024
# the figures every row of a sweep (and of the what-if table) carries
ROW_FIGURES = (
    "hit_rate",
    "idle_bytes_mean",
    "idle_bytes_peak",
    "peak_footprint",
    "live_peak",
    "fault_bytes_avoided",
    "max_rss",
    "ideal_rss",
)
PAGE = 4096
SCAN = 64


def cls(s: int) -> int:
    return min(int(s).bit_length(), 31)


def chunk(s: int) -> int:
    return max(32, (s + 8 + 15) & ~15)


def pages(x: int) -> int:
    return -(-x // PAGE) * PAGE


def mmap_bytes(s: int) -> int:
    return pages(chunk(s) + 8)


# --- fabricated events ------------------------------------------------------------------------

_SIZES = [24, 40, 100, 120, 1000, 1500, 3000, 5000, 9000, 140_000, 200_000, 250_000, 600_000]


def _size(rnd: random.Random, sizes: list[int]) -> int:
    base = rnd.choice(sizes)
    return max(1, base + rnd.randrange(-base // 8, base // 8 + 1))


def random_events(
    seed: int,
    n_proc: int = 2,
    n_events: int = 300,
    sizes: list[int] | None = None,
    time_step: int = 3,
    min_step: int = 0,
) -> pa.Table:
    """One run: processes one after the other in the table, each in call order; calls of a
    process are min_step..time_step ns apart (0: ties, whose order only the table keeps)."""
    rnd = random.Random(seed)
    rows: list[dict] = []
    for p in range(n_proc):
        rows += _process_rows(rnd, p, n_events, sizes or _SIZES, time_step, min_step)
    cols = {f.name: [r.get(f.name) for r in rows] for f in EVENTS_SCHEMA}
    return pa.table(cols, schema=EVENTS_SCHEMA)


def _process_rows(
    rnd: random.Random, p: int, n_events: int, sizes: list[int], time_step: int, min_step: int
) -> list[dict]:
    pid = 1000 + p
    t = rnd.randrange(0, 50)  # processes overlap in time
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, row in process)
    free_addrs: list[int] = []
    next_addr = 0x10000 + p * 0x1000000
    seqs = [0, 0, 0]
    prow: list[dict] = []

    def new_addr() -> int:
        nonlocal next_addr
        if free_addrs and rnd.random() < 0.7:
            return free_addrs.pop(rnd.randrange(len(free_addrs)))
        next_addr += 16
        return next_addr

    def emit(op: Op, size: int, addr: int, freed_addr=None, freed_size=None, token=0) -> int:
        nonlocal t
        th = rnd.randrange(3)
        t += rnd.randrange(min_step, time_step + 1)
        r = dict(
            pid=pid, ppid=1, thread=th, tid=pid + th, seq=seqs[th], time_ns=t, op=int(op),
            size=size, alignment=None, addr=addr, freed_addr=freed_addr,
            freed_size=freed_size, caller=None, lifetime_ns=None, lifetime_calls=None,
            token=token,
        )  # fmt: skip
        seqs[th] += 1
        prow.append(r)
        return len(prow) - 1

    def close(addr: int, at: int) -> int:
        size, born = live.pop(addr)
        prow[born]["lifetime_calls"] = at - born
        prow[born]["lifetime_ns"] = prow[at]["time_ns"] - prow[born]["time_ns"]
        free_addrs.append(addr)
        return size

    for _ in range(n_events):
        u = rnd.random()
        if u < 0.42 or not live:
            s = 0 if rnd.random() < 0.02 else _size(rnd, sizes)
            if rnd.random() < 0.02:  # failed allocation
                emit(Op.MALLOC, s, 0, token=cls(s))
                continue
            a = new_addr()
            op = Op.CALLOC if rnd.random() < 0.15 else Op.MALLOC
            live[a] = (s, emit(op, s, a, token=cls(s)))
        elif u < 0.82:
            a = rnd.choice(list(live))
            i = emit(Op.FREE, 0, a)
            s = close(a, i)
            prow[i]["freed_size"] = s
            prow[i]["token"] = 32 + cls(s)
        elif u < 0.85:  # unpaired free (a block from before the trace)
            emit(Op.FREE, 0, 0xDEAD0000 + rnd.randrange(1000) * 16, token=32)
        else:
            old = rnd.choice(list(live))
            if rnd.random() < 0.1:  # realloc(p, 0): frees only
                i = emit(Op.REALLOC, 0, 0, freed_addr=old)
                s = close(old, i)
                prow[i]["freed_size"] = s
                prow[i]["token"] = 32 + cls(s)
            else:
                n = _size(rnd, sizes)
                a = new_addr()
                while a == old:
                    a = new_addr()
                i = emit(Op.REALLOC, n, a, freed_addr=old, token=cls(n))
                s = close(old, i)
                prow[i]["freed_size"] = s
                live[a] = (n, i)
    return prow


def with_rows(table: pa.Table, order: np.ndarray) -> pa.Table:
    return table.take(pa.array(order))


# --- the reference ------------------------------------------------------------------------------

_DEFINING = {int(o) for o in (Op.MALLOC, Op.CALLOC, Op.REALLOC, Op.POSIX_MEMALIGN, Op.MEMALIGN)}
_DEFINING |= {int(Op.ALIGNED_ALLOC), int(Op.VALLOC), int(Op.PVALLOC), int(Op.REALLOCARRAY)}


class _Proc:
    def __init__(self) -> None:
        # [size, class, time, pos, tier, order], oldest first; guided priority: tier = the
        # prediction (0: none), order = when it joined its tier (its cache, or its demotion)
        self.cache: list[list[int]] = []
        self.blocks: dict[int, int] = {}  # addr -> block size
        self.live_req = 0
        self.live_blk = 0
        self.heap = 0
        self.hwm = 0
        self.mapped = 0
        self.pos = 0
        self.idle_peak = 0

    @property
    def idle(self) -> int:
        return sum(e[0] for e in self.cache)


def reference(table: pa.Table, policy, predictions=None) -> dict:
    kind = policy.kind
    if kind not in ("none", "lru", "guided", "belady"):
        raise ValueError(f"{kind}: the layer's policies are the policy core's, not copied here")
    d = table.to_pylist()
    for i, r in enumerate(d):
        r["_row"] = i
    pids = list(dict.fromkeys(r["pid"] for r in d))
    # process order = first appearance; the table holds each process's rows contiguously
    for r in d:
        r["_p"] = pids.index(r["pid"])
    seq = sorted(d, key=lambda r: (r["time_ns"], r["_p"], r["_row"]))
    times = [r["time_ns"] for r in seq]
    if times and times[0] == times[-1]:
        for k, r in enumerate(seq):
            r["time_ns"] = k
    last = {r["_p"]: k for k, r in enumerate(seq)}
    procs = [_Proc() for _ in pids]
    S = dict(
        allocations=0, hits=0, hit_bytes=0, waste_bytes=0, frees=0, cached_frees=0,
        evictions=0, evicted_bytes=0, system_allocations=0, fault_bytes_mmap=0,
        fault_bytes_heap=0, idle_bytes_peak=0, live_peak=0, peak_footprint=0, max_rss=0,
    )  # fmt: skip
    tot = dict(idle=0, live_req=0, live_blk=0, rss=0)
    integral = 0
    min_size = getattr(policy, "min_size", 0)
    budget = getattr(policy, "budget", 0)
    priority = kind == "guided" and policy.mode == "priority"
    order = iter(range(1 << 62))

    def tier_ttl(tier: int) -> int:
        hz = getattr(policy, "horizons", None)
        if hz:
            return sorted(hz)[len(hz) - tier] if tier <= len(hz) else 0
        return policy.ttl_calls or 0

    def release(P: _Proc, b: int) -> None:
        if b < M:
            P.heap -= chunk(b)
        else:
            P.mapped -= mmap_bytes(b)
            tot["rss"] -= mmap_bytes(b)

    def sys_alloc(P: _Proc, s: int) -> None:
        S["system_allocations"] += 1
        if s < M:
            P.heap += chunk(s)
            if P.heap > P.hwm:
                dlt = pages(P.heap) - pages(P.hwm)
                P.hwm = P.heap
                S["fault_bytes_heap"] += dlt
                tot["rss"] += dlt
        else:
            S["fault_bytes_mmap"] += mmap_bytes(s)
            P.mapped += mmap_bytes(s)
            tot["rss"] += mmap_bytes(s)

    def evict(P: _Proc, e: list[int]) -> None:
        P.cache.remove(e)
        tot["idle"] -= e[0]
        release(P, e[0])
        S["evictions"] += 1
        S["evicted_bytes"] += e[0]

    def next_request(k: int, p: int, c: int) -> float:
        for r in seq[k + 1 :]:
            if r["_p"] == p and r["op"] in _DEFINING and r["addr"] != 0 and cls(r["size"]) == c:
                return r["_k"]
        return float("inf")

    for k, r in enumerate(seq):
        r["_k"] = k
    for k, r in enumerate(seq):
        p = r["_p"]
        P = procs[p]
        t = r["time_ns"]
        if k:
            integral += tot["idle"] * (t - seq[k - 1]["time_ns"])
        P.pos += 1
        if priority:  # demote outlived predictions: by tier, oldest first
            for e in sorted(P.cache, key=lambda e: (e[4], e[3])):
                life = tier_ttl(e[4]) if e[4] > 0 else 0
                if life and e[3] + life < P.pos:
                    e[4], e[5] = 0, next(order)
        elif kind == "guided" and policy.ttl_calls:
            while P.cache and P.cache[0][3] + policy.ttl_calls < P.pos:
                evict(P, P.cache[0])
        op = r["op"]
        # request half
        sysrealloc = False
        if op in _DEFINING and r["addr"] != 0:
            s = r["size"]
            c = cls(s)
            S["allocations"] += 1
            hit = None
            if kind != "none" and s >= min_size:
                same = [e for e in P.cache if e[1] == c][::-1][:SCAN]
                hit = next((e for e in same if e[0] >= s), None)
            if hit is not None:
                P.cache.remove(hit)
                tot["idle"] -= hit[0]
                b = hit[0]
                S["hits"] += 1
                S["hit_bytes"] += s
                S["waste_bytes"] += b - s
            elif op in (Op.REALLOC, Op.REALLOCARRAY) and r["freed_size"] is not None:
                b = s
                sysrealloc = True
                bo = P.blocks[r["freed_addr"]]
                if bo >= M and s >= M:
                    S["system_allocations"] += 1
                    dlt = mmap_bytes(s) - mmap_bytes(bo)
                    P.mapped += dlt
                    tot["rss"] += dlt
                    S["fault_bytes_mmap"] += max(dlt, 0)
                else:
                    release(P, bo)
                    sys_alloc(P, s)
            else:
                b = s
                sys_alloc(P, s)
            P.blocks[r["addr"]] = b
            P.live_req += s
            P.live_blk += b
            tot["live_req"] += s
            tot["live_blk"] += b
            if kind == "belady" and next_request(k, p, c) == float("inf"):
                for e in [e for e in P.cache if e[1] == c]:
                    evict(P, e)
        # free half
        freed_addr = r["addr"] if op == Op.FREE else r["freed_addr"]
        if op in (Op.FREE, Op.REALLOC, Op.REALLOCARRAY) and r["freed_size"] is not None:
            w = r["freed_size"]
            b = P.blocks.pop(freed_addr)
            assert b >= w and cls(b) == cls(w)
            c = cls(w)
            S["frees"] += 1
            P.live_req -= w
            P.live_blk -= b
            tot["live_req"] -= w
            tot["live_blk"] -= b
            keep = False
            if sysrealloc:
                pass
            elif kind != "none" and b >= min_size:
                if kind == "lru":
                    keep = b <= budget
                elif kind == "guided":
                    keep = b <= budget and (priority or bool(predictions[r["_row"]]))
                elif kind == "belady":
                    keep = b <= budget and next_request(k, p, c) != float("inf")
            if keep:
                tier = int(predictions[r["_row"]]) if priority else 0
                P.cache.append([b, c, t, P.pos, tier, next(order)])
                tot["idle"] += b
                S["cached_frees"] += 1
                if priority:
                    while P.idle > budget:
                        low = min(e[4] for e in P.cache)
                        evict(P, min((e for e in P.cache if e[4] == low), key=lambda e: e[5]))
                elif kind in ("lru", "guided"):
                    while P.idle > budget:
                        evict(P, P.cache[0])
                if kind == "belady":
                    while P.idle > budget:
                        classes = {e[1] for e in P.cache}
                        far = max(classes, key=lambda cc: (next_request(k, p, cc), cc))
                        evict(P, next(e for e in P.cache if e[1] == far))
                P.idle_peak = max(P.idle_peak, P.idle)
            elif not sysrealloc:
                release(P, b)
        assert tot["idle"] == sum(q.idle for q in procs)
        S["idle_bytes_peak"] = max(S["idle_bytes_peak"], tot["idle"])
        S["live_peak"] = max(S["live_peak"], tot["live_req"])
        S["peak_footprint"] = max(S["peak_footprint"], tot["live_blk"] + tot["idle"])
        S["max_rss"] = max(S["max_rss"], tot["rss"])
        if last[p] == k:
            for e in list(P.cache):
                P.cache.remove(e)
                tot["idle"] -= e[0]
                release(P, e[0])
            tot["live_req"] -= P.live_req
            tot["live_blk"] -= P.live_blk
            tot["rss"] -= pages(P.hwm) + P.mapped
            P.live_req = P.live_blk = P.mapped = 0
    S["idle_bytes_peak_process"] = max((q.idle_peak for q in procs), default=0)
    S["fault_bytes"] = S["fault_bytes_mmap"] + S["fault_bytes_heap"]
    S["idle_integral"] = integral
    S["span"] = seq[-1]["time_ns"] - seq[0]["time_ns"] if seq else 0
    return S
