"""The numbers behind an honest choice: rank test, Holm's correction, a margin's interval.

Pure functions of arrays (no measurement types), so that `rounds` (when the rounds stop, the
one rule of tune and of the stage) and `stats` (the recommendation) share them.

- `mann_whitney_p`: the Mann-Whitney U test, exact (the null distribution of U counted by its
  recurrence when no value is tied; every split enumerated, ties at mid-ranks, up to EXACT_LIMIT
  splits), else the normal approximation with the tie correction. `alternative="less"`: the
  one-sided test that x is lower than y, the rule's question (does the candidate beat the
  baseline?); "two-sided": a difference either way (the seeds' pairs, descriptive).
- `smallest_p`: the smallest p a test of n runs against m can give (complete separation): what
  the rounds must be planned for before any run.
- `holm`: Holm's step-down adjustment of m p-values (each candidate against the baseline), so
  that picking the best of m is not m chances at a false positive: the family-wise error stays
  at alpha.
- `margin_interval`: the margin `1 - median(candidate) / median(baseline)` with a percentile
  bootstrap interval (both samples resampled, seeded: the same runs give the same interval).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from typing import Literal

import numpy as np
import pandas as pd

EXACT_LIMIT = 200_000  # tied values: splits enumerated for the exact test; beyond: the normal
EXACT_CELLS = 40_000  # untied: n * m up to this counted exactly by the recurrence
BOOTSTRAP = 4000
BOOTSTRAP_SEED = 20260101

Alternative = Literal["two-sided", "less"]


@functools.lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> np.ndarray:
    """How many of the C(n+m, n) splits give each U in 0..n*m (no ties): the recurrence
    f(n, m, u) = f(n-1, m, u-m) + f(n, m-1, u), one row of m at a time, in floats (exact
    below 2**53, and C(n+m, n) beyond that is far past what a measurement has)."""
    # rows[j] = counts for (i, j) as i grows; start at i = 0: one split, U = 0, for every j
    rows = [np.ones(1) for _ in range(m + 1)]
    for i in range(1, n + 1):
        new = [np.ones(1)]  # (i, 0): U = 0
        for j in range(1, m + 1):
            a = np.zeros(i * j + 1)
            prev_i = rows[j]  # (i-1, j): its U shifted by j
            a[j : j + len(prev_i)] += prev_i
            a[: len(new[j - 1])] += new[j - 1]  # (i, j-1)
            new.append(a)
        rows = new
    return rows[m]


def mann_whitney_p(x, y, alternative: Alternative = "two-sided") -> float:
    """p-value of the Mann-Whitney U test of `x` against `y` (see the module); 1.0 when either
    side is empty."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    if alternative not in ("two-sided", "less"):
        raise ValueError(f"alternative must be two-sided or less, not {alternative!r}")
    pooled = np.concatenate([x, y])
    ranks = pd.Series(pooled).rank(method="average").to_numpy()
    offset = n * (n + 1) / 2
    u_obs = ranks[:n].sum() - offset  # pairs where x is above y, ties half
    centre = n * m / 2
    d_obs = abs(u_obs - centre)
    tied = len(np.unique(pooled)) < n + m
    if not tied and n * m <= EXACT_CELLS:
        counts = _u_counts(n, m)
        u = np.arange(len(counts))
        if alternative == "less":
            hit = u <= u_obs + 1e-9
        else:
            hit = np.abs(u - centre) >= d_obs - 1e-9
        return float(min(1.0, counts[hit].sum() / counts.sum()))
    if tied and math.comb(n + m, n) <= EXACT_LIMIT:
        splits = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(n + m), n)),
            dtype=np.int64,
        ).reshape(-1, n)
        u = ranks[splits].sum(axis=1) - offset
        if alternative == "less":
            return float(np.mean(u <= u_obs + 1e-9))
        return float(np.mean(np.abs(u - centre) >= d_obs - 1e-9))
    ties = Counter(pooled.tolist()).values()
    t = sum(c**3 - c for c in ties)
    var = n * m / 12 * ((n + m + 1) - t / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    if alternative == "less":
        z = (centre - u_obs - 0.5) / math.sqrt(var)
        return float(min(1.0, 0.5 * math.erfc(z / math.sqrt(2))))
    z = max(d_obs - 0.5, 0.0) / math.sqrt(var)
    return float(math.erfc(z / math.sqrt(2)))


def smallest_p(n: int, m: int, alternative: Alternative = "two-sided") -> float:
    """The smallest exact Mann-Whitney p of n runs against m: complete separation."""
    return (1 if alternative == "less" else 2) / math.comb(n + m, n)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values: sorted ascending, the i-th (0-based) times (m - i), made
    monotone, capped at 1. Reject where adjusted < alpha."""
    names = sorted(p_values, key=lambda k: p_values[k])
    m = len(names)
    out: dict[str, float] = {}
    running = 0.0
    for i, name in enumerate(names):
        running = max(running, min(1.0, (m - i) * p_values[name]))
        out[name] = running
    return out


def margin_interval(
    x, base, confidence: float = 0.95, n_boot: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float, float]:
    """(margin, low, high): `1 - median(x) / median(base)` (0.12: 12% less than the baseline)
    and its percentile bootstrap interval at `confidence`."""
    x, base = np.asarray(x, dtype=float), np.asarray(base, dtype=float)
    margin = 1 - np.median(x) / np.median(base)
    rng = np.random.default_rng(seed)
    bx = np.median(rng.choice(x, size=(n_boot, len(x))), axis=1)
    bb = np.median(rng.choice(base, size=(n_boot, len(base))), axis=1)
    boots = 1 - bx / bb
    tail = (1 - confidence) / 2
    low, high = np.quantile(boots, [tail, 1 - tail])
    return float(margin), float(low), float(high)
