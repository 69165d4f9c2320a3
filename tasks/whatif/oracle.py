"""The oracle: an upper bound of the hit rate of ANY cache policy at a given byte budget.

Not a policy: choosing blocks of many sizes under a byte budget is a packing problem. `bound(B)
= min(k(B * span), H_inf)` is >= the hits of every policy whose idle_bytes_mean is <= B (k: the
most requests whose cheapest idle-byte costs fit in B * span; H_inf: an infinite cache's hits).

Why a bound, the proof and largest's exception: docs/whatif-simulator.md#the-oracle
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from tasks.whatif.events import N_CLASSES, NEVER, SimInput
from tasks.whatif.policies import OracleConfig


@njit(cache=True)
def _reuse_costs(proc, n_proc, req, freed, cls_req, cls_free, time):
    """(cost of every request that an earlier free of its class could serve, H_inf)."""
    n = len(req)
    count = np.zeros((n_proc, N_CLASSES), np.int64)
    wmin = np.full((n_proc, N_CLASSES), NEVER, np.int64)
    tlast = np.zeros((n_proc, N_CLASSES), np.int64)
    costs = np.empty(n, np.float64)
    m = 0
    h_inf = 0
    for i in range(n):
        p = proc[i]
        s = req[i]
        if s >= 0:
            c = cls_req[i]
            if count[p, c] > 0:
                count[p, c] -= 1
                h_inf += 1
            if wmin[p, c] != NEVER:
                costs[m] = float(wmin[p, c]) * float(time[i] - tlast[p, c])
                m += 1
        w = freed[i]
        if w >= 0:
            c = cls_free[i]
            count[p, c] += 1
            if w < wmin[p, c]:
                wmin[p, c] = w
            tlast[p, c] = time[i]
    return costs[:m], h_inf


def _table(x: SimInput) -> tuple[np.ndarray, int, int]:
    """(cumulative sorted costs, H_inf, requests), cached on the prepared run."""
    if "oracle" not in x.cache:
        costs, h_inf = _reuse_costs(x.proc, x.n_proc, x.req, x.freed, x.cls_req, x.cls_free, x.time)
        costs.sort()
        x.cache["oracle"] = (np.cumsum(costs), int(h_inf), int((x.req >= 0).sum()))
    return x.cache["oracle"]


def bound_hits(x: SimInput, budgets: np.ndarray | float) -> np.ndarray:
    """Upper bound of the hits of any policy whose idle_bytes_mean is <= each budget (bytes)."""
    cum, h_inf, _ = _table(x)
    budget = np.atleast_1d(np.asarray(budgets, dtype=np.float64))
    k = np.searchsorted(cum, budget * max(x.span, 0), side="right")
    return np.minimum(k, h_inf).astype(np.int64)


def infinite_cache_hits(x: SimInput) -> int:
    return _table(x)[1]


def oracle_metrics(x: SimInput, cfg: OracleConfig, base: dict[str, Any]) -> dict[str, Any]:
    """The oracle's row: hit_rate is the bound at idle_bytes_mean = cfg.budget; what a bound
    does not define (peaks, faults) is NaN."""
    hits = int(bound_hits(x, cfg.budget)[0])
    allocs = _table(x)[2]
    out = {k: (math.nan if isinstance(v, int | float) else v) for k, v in base.items()}
    out.update(
        run=x.run,
        workload=x.workload,
        policy="oracle",
        param=float(cfg.budget),
        events=x.n,
        processes=x.n_proc,
        allocations=allocs,
        hits=hits,
        hit_rate=hits / allocs if allocs else 0.0,
        idle_bytes_mean=float(cfg.budget),
        live_peak=base["live_peak"],
        ideal_rss=base["ideal_rss"],
        span=base["span"],
        fault_bytes_none=base["fault_bytes"],
        fault_bytes_avoided=math.nan,
        is_bound=True,
    )
    return out
