"""The numbers behind an honest choice: rank test, Holm's correction, a margin's interval.

Pure functions of arrays (no measurement types), so that `measure` (which adds rounds while the
decision sits in the noise) and `stats` (which makes the decision) share them.

- `mann_whitney_p`: two-sided Mann-Whitney U, exact (every split enumerated, ties at mid-ranks)
  up to EXACT_LIMIT splits, else the normal approximation with the tie correction.
- `holm`: Holm's step-down adjustment of m p-values (each candidate against the baseline), so
  that picking the best of m is not m chances at a false positive: the family-wise error stays
  at alpha.
- `margin_interval`: the margin `1 - median(candidate) / median(baseline)` with a percentile
  bootstrap interval (both samples resampled, seeded: the same runs give the same interval).
- `undecided`: whether another round could change the answer (see its docstring).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pandas as pd

EXACT_LIMIT = 200_000  # splits enumerated for the exact test; beyond: the normal approximation
BOOTSTRAP = 4000
BOOTSTRAP_SEED = 20260101


def mann_whitney_p(x, y) -> float:
    """Two-sided p-value of the Mann-Whitney U test of `x` against `y` (see the module); 1.0
    when either side is empty."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    pooled = np.concatenate([x, y])
    ranks = pd.Series(pooled).rank(method="average").to_numpy()
    offset = n * (n + 1) / 2
    u_obs = ranks[:n].sum() - offset
    centre = n * m / 2
    d_obs = abs(u_obs - centre)
    if math.comb(n + m, n) <= EXACT_LIMIT:
        splits = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(n + m), n)),
            dtype=np.int64,
        ).reshape(-1, n)
        u = ranks[splits].sum(axis=1) - offset
        return float(np.mean(np.abs(u - centre) >= d_obs - 1e-9))
    ties = Counter(pooled.tolist()).values()
    t = sum(c**3 - c for c in ties)
    var = n * m / 12 * ((n + m + 1) - t / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    z = max(d_obs - 0.5, 0.0) / math.sqrt(var)
    return float(math.erfc(z / math.sqrt(2)))


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided exact Mann-Whitney p of n runs against m: complete separation."""
    return 2 / math.comb(n + m, n)


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


def undecided(
    times: dict[str, np.ndarray], baseline: str, alpha: float, promising_p: float
) -> list[str]:
    """The candidates another round could still decide: faster than `baseline` by median, with
    an uncorrected p below `promising_p`, but not beyond the noise after Holm's correction.
    Empty when the answer stands (a clear winner, or nothing near)."""
    base = times.get(baseline)
    if base is None or len(base) == 0:
        return []
    raw = {
        k: mann_whitney_p(v, base)
        for k, v in times.items()
        if k != baseline and len(v) and np.median(v) < np.median(base)
    }
    others = [k for k in times if k != baseline and len(times[k])]
    if not raw:
        return []
    # the family is every candidate compared, not only the faster ones
    adjusted = holm({k: raw.get(k, 1.0) for k in others})
    if any(adjusted[k] < alpha for k in raw):
        return []
    return sorted(k for k, p in raw.items() if p < promising_p)
