"""Sweep policies over their parameter on runs; one table row per (run, policy, param); plot.

`sweep(root, runs)` reads each run once (tasks.whatif.events), prepares it once and replays it
through every config of the grid (`default_grid()`: the policies the layer runs through the policy
core, and lru, guided, belady and the oracle bound; each grid in
docs/whatif-simulator.md#the-sweep), so each policy draws a curve of hit rate against bytes held
idle. `sweep_run` does the same for one table. `pareto_plot` draws those curves (one PNG; one panel
per run).

The guided policy needs a prediction per event: `predictions` maps (workload, run) to a bool
array per row (or is a callable table -> array). By default it gets the true next
GUIDED_HORIZON calls of the freeing thread (`tasks.whatif.guided.reuse_labels`), which reads
the future: the `predictor` column says so (`thread_future_optimistic`, drawn dotted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.token_runs import list_runs
from tasks.whatif.events import SimInput, prepare, read_events
from tasks.whatif.guided import reuse_labels
from tasks.whatif.policies import (
    BeladyConfig,
    GuidedConfig,
    LargestConfig,
    LayerGuidedConfig,
    LruConfig,
    NoneConfig,
    OracleConfig,
    PoolsConfig,
    _Policy,
)
from tasks.whatif.simulate import simulate

GUIDED_HORIZON = 16  # calls: the thread-future reference's horizon, the admit mode's ttl
OPTIMISTIC = "_optimistic"  # the suffix of every predictor (and label) that peeks ahead
BUDGETS = tuple(1 << k for k in range(12, 34, 2))  # 4 KiB .. 4 GiB per process
ORACLE_BUDGETS = tuple(float(1 << k) for k in range(0, 35))  # mean idle bytes, 1 B .. 16 GiB

Predictions = Mapping[tuple[str, str], np.ndarray] | Callable[[pa.Table], np.ndarray] | None


def default_grid(guided_ttl: int | None = GUIDED_HORIZON) -> list[_Policy]:
    """The sweep. Guided: the `priority` mode (lru that releases unpredicted blocks first; a
    prediction is never demoted: measured better than demotion after the horizon for the online
    counter, studies/whatif_guided/whatif_guided.json) and one `admit` curve (keep only predicted
    blocks, released after `guided_ttl` calls unused: the old policy, to compare with)."""
    grid: list[_Policy] = [NoneConfig()]
    grid += [LargestConfig(n=n) for n in (1, 2, 4, 8, 16, 32, 64)]
    grid += [PoolsConfig(decay_ns=10**k) for k in range(3, 11)]  # 1 us .. 10 s
    grid += [
        LayerGuidedConfig(decay_ns=10**k, regret=regret, table=table)
        for table in (False, True)  # the table's configs run where a table is given
        for regret in (False, True)
        for k in range(5, 11)  # 100 us .. 10 s
    ]
    grid += [LruConfig(budget=b) for b in BUDGETS]
    grid += [GuidedConfig(budget=b) for b in BUDGETS]
    grid += [GuidedConfig(budget=b, ttl_calls=guided_ttl, mode="admit") for b in BUDGETS]
    grid += [BeladyConfig(budget=b) for b in BUDGETS]
    grid += [OracleConfig(budget=b) for b in ORACLE_BUDGETS]
    return grid


def sweep_run(
    events: pa.Table | SimInput,
    policies: Sequence[_Policy] | None = None,
    *,
    workload: str = "",
    run: str = "",
    predictions: np.ndarray | None = None,
    predictor: str = "",
    class_scores: np.ndarray | None = None,
) -> pd.DataFrame:
    """One run through every config; rows in the order of `policies`. `class_scores`: the layer
    table's class scores (tasks.whatif.policy_core.class_scores_of) that layer_guided configs
    with table=true ask; without them those configs are left out (no row)."""
    policies = list(policies) if policies is not None else default_grid()
    table = events if isinstance(events, pa.Table) else None
    x = prepare(events, workload, run) if table is not None else events
    policies = [
        p
        for p in policies
        if class_scores is not None or not (isinstance(p, LayerGuidedConfig) and p.table)
    ]
    need_pred = any(isinstance(p, GuidedConfig) for p in policies)
    if need_pred and predictions is None:
        if table is None:
            raise ValueError("guided policies need `predictions` when given a prepared run")
        predictions = reuse_labels(table, horizon=GUIDED_HORIZON)
        predictor = predictor or f"thread_future{OPTIMISTIC}"
    rows: list[dict[str, Any]] = []
    for p in policies:
        m = simulate(
            x, p, predictions if isinstance(p, GuidedConfig) else None, class_scores=class_scores
        )
        m["predictor"] = predictor if isinstance(p, GuidedConfig) else ""
        m["config"] = p.model_dump_json()
        rows.append(m)
    return pd.DataFrame(rows)


def sweep(
    root: Root,
    runs: Iterable[tuple[str, str]] | None = None,
    policies: Sequence[_Policy] | None = None,
    predictions: Predictions = None,
) -> pd.DataFrame:
    """Every (workload, run) (default: all under <root>/events) through every config."""
    if runs is None:
        runs = [(w, r) for w, rs in list_runs(root).items() for r in rs]
    frames = []
    for w, r in runs:
        table = read_events(root, w, r)
        pred, predictor = None, ""
        if callable(predictions):
            pred, predictor = predictions(table), "callable"
        elif predictions is not None and (w, r) in predictions:
            pred, predictor = predictions[(w, r)], "given"
        frames.append(
            sweep_run(table, policies, workload=w, run=r, predictions=pred, predictor=predictor)
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


_STYLE = {
    "none": dict(marker="X", color="black"),
    "largest": dict(marker="o", color="tab:blue"),
    "pools": dict(marker="s", color="tab:orange"),
    "layer_guided": dict(marker="P", color="tab:brown"),
    "lru": dict(marker="^", color="tab:green"),
    "guided": dict(marker="D", color="tab:purple"),
    "belady": dict(marker="v", color="tab:red"),
    "oracle": dict(linestyle="--", color="gray"),
}


def pareto_plot(
    df: pd.DataFrame, path: str | Path, x: str = "idle_bytes_mean", title: str = ""
) -> Path:
    """Hit rate against bytes held idle (`x`: idle_bytes_mean or idle_bytes_peak), one line per
    policy, one panel per run; x on a log scale (0 is drawn at 1 byte). PNG at `path`."""
    # deferred: imported on first use, for start-up time
    import matplotlib

    matplotlib.use("Agg", force=True)
    # deferred: imported on first use, for start-up time
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(zip(df["workload"], df["run"])))
    cols = min(3, max(1, len(keys)))
    nrows = -(-max(1, len(keys)) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows), squeeze=False)
    for ax, (w, r) in zip(axes.ravel(), keys):
        sub = df[(df["workload"] == w) & (df["run"] == r)]
        for policy, g in sub.groupby("policy", sort=False):
            xs = g[x].astype(float).to_numpy()
            if policy == "oracle" and x != "idle_bytes_mean":
                continue  # the bound is stated for the mean
            ok = np.isfinite(xs)
            xs, ys = np.maximum(xs[ok], 1.0), g["hit_rate"].to_numpy()[ok]
            order = np.argsort(xs, kind="stable")
            label = "oracle (bound)" if policy == "oracle" else str(policy)
            style = dict(_STYLE.get(str(policy), {}))
            if label.endswith(OPTIMISTIC):  # peeks ahead of the free: no live cache gets it
                label = f"{label} (optimistic)"
                style["linestyle"] = ":"
            ax.plot(xs[order], ys[order], label=label, **style)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(f"{x} (bytes)")
        ax.set_ylabel("hit rate")
        ax.set_title(f"{w}/{r}" if w or r else (title or "run"))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in axes.ravel()[len(keys) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
