"""Sweep table and Pareto plot, from an events dataset on disk."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.whatif import policies
from tasks.whatif.events import read_events
from tasks.whatif.sweep import default_grid, pareto_plot, sweep, sweep_run
from tests.tasks.whatif.reference import ROW_FIGURES, random_events

COLUMNS = ["run", "workload", "policy", "param", *ROW_FIGURES]


def test_sweep_from_root_and_plot(tmp_path):
    root = Root.from_url(str(tmp_path / "data"))
    write_synthetic_events(root, {"alpha": 1, "beta": 1}, tokens_per_run=2000)
    # a real-looking run too, in two parts (two processes)
    t = random_events(3, n_proc=2)
    path = tmp_path / "data" / "events" / "workload=hand" / "run=r1"
    path.mkdir(parents=True)
    pids = t.column("pid").to_numpy()
    for pid in np.unique(pids):
        pq.write_table(t.filter(t.column("pid").to_numpy() == pid), path / f"part-{pid}.parquet")
    ev = read_events(root, "hand", "r1")
    assert ev.num_rows == t.num_rows and set(ev.column("image").to_numpy()) == {0, 1}

    grid = [
        policies.NoneConfig(),
        policies.LargestConfig(n=2),
        policies.PoolsConfig(decay_ns=1000),
        policies.LruConfig(budget=1 << 16),
        policies.GuidedConfig(budget=1 << 16),
        policies.BeladyConfig(budget=1 << 16),
        policies.OracleConfig(budget=1e3),
        policies.OracleConfig(budget=1e6),
    ]
    df = sweep(root, policies=grid)
    assert set(COLUMNS) <= set(df.columns)
    assert sorted(set(zip(df["workload"], df["run"]))) == [
        ("alpha", "r0"),
        ("beta", "r0"),
        ("hand", "r1"),
    ]
    assert len(df) == 3 * len(grid)
    assert (df[df["policy"] == "none"]["hit_rate"] == 0).all()
    assert (df[df["policy"] == "guided"]["predictor"] == "thread_future_optimistic").all()
    for (_w, _r), g in df.groupby(["workload", "run"]):
        top = g[g["policy"] == "oracle"]["hit_rate"].max()
        assert top >= g[g["policy"] != "oracle"]["hit_rate"].max()
    png = pareto_plot(df, tmp_path / "pareto.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_grid_draws_curves():
    grid = default_grid()
    kinds = [p.kind for p in grid]
    for k in ("largest", "pools", "layer_guided", "lru", "guided", "belady", "oracle"):
        assert kinds.count(k) >= 5
    table = random_events(7, n_proc=2)
    df = sweep_run(table, grid, workload="w", run="r")
    # the layer's guided configs that ask a class table run only where one is given
    asks = [p for p in grid if p.kind == "layer_guided" and p.table]
    assert asks and len(df) == len(grid) - len(asks)
    assert not df["config"].str.contains('"table":true', regex=False).any()
    scores = np.full((64, 64), 255, np.uint8)
    with_table = sweep_run(table, asks, workload="w", run="r", class_scores=scores)
    assert len(with_table) == len(asks) and (with_table["policy"] == "layer_guided").all()
    lru = df[df["policy"] == "lru"].sort_values("param")
    # not monotone in general (blocks of many sizes), but an unbounded budget keeps everything
    assert lru["hit_rate"].iloc[-1] == lru["hit_rate"].max() > lru["hit_rate"].iloc[0]
