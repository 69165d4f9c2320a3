"""The oracle: an upper bound of the hit rate of ANY cache policy at a given byte budget.

Why a bound and not a policy: with blocks of many sizes, choosing which freed blocks to keep
under a byte budget so as to serve the most requests is a packing problem (NP-hard in general);
Belady's rule is optimal only for equal sizes. `belady` (tasks/whatif/policies.py) is the
realisable clairvoyant policy; this module gives the bound that every policy, belady included,
stays under, and that the tests check.

THE BOUND. Take any policy P of the simulator (tasks/whatif/simulate.py) on a run, and let
I(P) = its integral over time of idle bytes (= idle_bytes_mean * span). Each hit of P at a
request r (class c, process p) takes a block that P cached at some earlier free f of class c in
p, held idle from t_f to t_r, of at least freed_size(f) bytes. So the hit costs P at least
    cost(r) = wmin(p, c, r) * (t_r - tlast(p, c, r))
where wmin is the smallest freed_size among the frees of class c in p before r and tlast the
time of the latest of them (no earlier free: r can never hit). Distinct hits are distinct
requests, so hits(P) <= the largest k such that the k cheapest costs sum to <= I(P).
Independently, hits(P) <= H_inf, the hits of an infinite cache that keeps every freed block
(greedy per class: a request hits whenever a block of its class is cached; for blocks of a
class taken as interchangeable, that is the most hits any policy can have).

So `bound(B) = min(k(B * span), H_inf)` is >= the hits of every policy whose idle_bytes_mean is
<= B, and hence of every policy whose idle bytes never exceed B (the mean is below the peak):
the oracle curve lies above every policy's point on the Pareto plot (hit rate vs idle_bytes_mean).
It relaxes the fit rule (b >= s), the byte budget at each moment (to its mean) and which free
serves which request (any earlier free of the class, each as cheap as the cheapest), so it is
optimistic; H_inf caps it at large budgets.

One exception to the argument: seed002 follows its real layer's rules (native/layers/layer.c), and
can serve a request from a block of the next class up (usable size u >= s and u - s < s +
4096). Such a hit is not charged to a free of the request's class, so the bound does not cover
it in principle; on the evaluation's runs (data/events, N = 1, 4, 16) and the random traces of
tests/tasks/whatif/test_oracle.py seed002 stays under the bound.
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
