"""The oracle bound is never below any policy at the same byte budget."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.whatif import policies
from tasks.whatif.events import prepare
from tasks.whatif.guided import reuse_labels, reuse_tiers
from tasks.whatif.oracle import bound_hits, infinite_cache_hits
from tasks.whatif.simulate import simulate
from tests.tasks.whatif.reference import random_events

GRID = (
    [policies.NoneConfig()]
    + [policies.LargestConfig(n=n, min_size=m) for n in (1, 2, 4, 16) for m in (0, 128 * 1024)]
    + [policies.PoolsConfig(decay_ns=d) for d in (1, 3, 10, 30, 100, 1000, 10**6)]
    + [policies.LayerGuidedConfig(decay_ns=d, regret=r) for d in (10, 10**6) for r in (False, True)]
    + [policies.LruConfig(budget=b) for b in (100, 2000, 20_000, 200_000, 2_000_000, 1 << 40)]
    + [policies.BeladyConfig(budget=b) for b in (100, 2000, 20_000, 200_000, 2_000_000, 1 << 40)]
    + [
        policies.GuidedConfig(budget=b, ttl_calls=t, mode=m)
        for b in (500, 5000, 1 << 40)
        for t in (None, 3)
        for m in ("priority", "admit")
    ]
    + [policies.GuidedConfig(budget=b, horizons=(3, 30)) for b in (2000, 50_000)]
)


@pytest.mark.parametrize("seed", range(8))
def test_oracle_at_least_every_policy_at_its_budget(seed):
    table = random_events(100 + seed, n_proc=1 + seed % 3, n_events=400)
    x = prepare(table)
    labels = reuse_labels(table, horizon=3)
    noise = np.random.default_rng(seed).random(table.num_rows) < 0.5
    tiers = reuse_tiers(table, (3, 30))
    for policy in GRID:
        for pred in [labels, noise, tiers] if policy.kind == "guided" else [None]:
            m = simulate(x, policy, pred)
            for budget in (m["idle_bytes_mean"], m["idle_bytes_peak"]):
                o = simulate(x, policies.OracleConfig(budget=max(budget, 1e-9)))
                assert o["hit_rate"] >= m["hit_rate"], (policy, budget, o["hits"], m["hits"])
                assert o["is_bound"] and o["allocations"] == m["allocations"]
    # the bound grows with the budget and stops at the infinite cache
    b = bound_hits(x, np.geomspace(1e-3, 1e12, 40))
    assert (np.diff(b) >= 0).all()
    assert b[-1] == infinite_cache_hits(x)
    unlimited = simulate(x, policies.LruConfig(budget=1 << 50))
    assert infinite_cache_hits(x) >= unlimited["hits"]


def test_oracle_row_shape():
    x = prepare(random_events(1))
    o = simulate(x, policies.OracleConfig(budget=1000.0))
    assert o["policy"] == "oracle" and o["param"] == 1000.0
    assert o["idle_bytes_mean"] == 1000.0
    assert np.isnan(o["peak_footprint"]) and np.isnan(o["fault_bytes_avoided"])
    assert o["live_peak"] == simulate(x, policies.NoneConfig())["live_peak"]
