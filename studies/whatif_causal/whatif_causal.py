"""What the simulator's honesty costs the guided policy: causal against optimistic, per budget.

For the registered model's evaluation runs, the guided policy (priority mode) at 4 KiB, 16 KiB
and 256 KiB per process, fed causally (`model`, `online`: the top-5 AT the free), optimistically
(`model_optimistic`, `online_optimistic`: the 16 calls after the free) and by the thread's true
future (`thread_future_optimistic`), each against the best heuristic with no more idle bytes.
The arms and what is reported: studies/whatif_causal/README.md.

    PYTHONPATH=$PWD .venv/bin/python studies/whatif_causal/whatif_causal.py --root data

The model's and the online counter's top-5 are computed once per run. Writes
studies/whatif_causal/whatif_causal.json. Reads the root's events and MLflow store only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.storage import Root
from tasks.dataset.token_runs import ScoredRun, eval_positions
from tasks.learning.counters.online import OnlineCounter
from tasks.learning.nextcall.model import predict_positions
from tasks.whatif.events import prepare, read_events
from tasks.whatif.guided import (
    keep_at_free,
    next_call_top,
    predictions_from_topk,
    reuse_labels,
)
from tasks.whatif.night import (
    HEURISTICS,
    WhatifParams,
    _top_per_row,
    load_predictor,
    registered_ref,
)
from tasks.whatif.policies import (
    GuidedConfig,
    LargestConfig,
    LruConfig,
    NoneConfig,
    PoolsConfig,
)
from tasks.whatif.sweep import BUDGETS, GUIDED_HORIZON, sweep_run

PROJECT = Path(__file__).resolve().parents[2]

GUIDED_BUDGETS = (4 << 10, 16 << 10, 256 << 10)
PREDICTORS = (
    "model",
    "model_optimistic",
    "online",
    "online_optimistic",
    "thread_future_optimistic",
)


def replay(root: Root, ref, predictor) -> pd.DataFrame:
    plain = [NoneConfig()] + [LargestConfig(n=n) for n in (1, 2, 4, 8, 16, 32, 64)]
    plain += [PoolsConfig(decay_ns=10**k) for k in range(3, 11)]
    plain += [LruConfig(budget=b) for b in BUDGETS]
    guided = [GuidedConfig(budget=b) for b in GUIDED_BUDGETS]
    frames = []
    for w, r in ref.runs:
        t0 = time.monotonic()
        table = read_events(root, w, r, extra=("token",))
        scored = ScoredRun.of(table, w, r)
        run = scored.tokens
        x = prepare(table, w, r)
        frames.append(sweep_run(x, plain, workload=w, run=r))
        tops = {"online": OnlineCounter().predict(run, eval_positions(run)).top}
        if predictor.model is not None:
            tops["model"] = predict_positions(
                predictor.model, run, predictor.context, predictor.batch_size
            ).top
        preds = {"thread_future_optimistic": reuse_labels(table, horizon=GUIDED_HORIZON)}
        for name, top in tops.items():
            per_row = _top_per_row(scored, top)
            preds[name] = keep_at_free(table, next_call_top(table, per_row))
            preds[f"{name}_optimistic"] = predictions_from_topk(table, per_row, GUIDED_HORIZON)
        for name, keep in preds.items():
            frames.append(sweep_run(x, guided, workload=w, run=r, predictions=keep, predictor=name))
        print(f"{w}/{r}: {table.num_rows} events, {time.monotonic() - t0:.0f} s", flush=True)
    return pd.concat(frames, ignore_index=True)


def against_heuristics(df: pd.DataFrame) -> list[dict]:
    out = []
    for budget in GUIDED_BUDGETS:
        for name in PREDICTORS:
            deltas = []
            for _, g in df.groupby(["workload", "run"]):
                m = g[(g.policy == "guided") & (g.predictor == name) & (g.param == budget)]
                if not len(m):
                    continue
                m = m.iloc[0]
                h = g[g.policy.isin(HEURISTICS) & (g.idle_bytes_mean <= m.idle_bytes_mean)]
                deltas.append(m.hit_rate - (h.hit_rate.max() if len(h) else 0.0))
            if deltas:
                d = np.array(deltas)
                out.append(
                    {
                        "budget": budget,
                        "predictor": name,
                        "runs": len(d),
                        "beats_best_heuristic": int((d > 0).sum()),
                        "ties": int((d == 0).sum()),
                        "mean_hit_rate_delta": round(float(d.mean()), 4),
                    }
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(PROJECT / "data"))
    ap.add_argument("--model", default="champion")
    ap.add_argument("--out", default=str(PROJECT / "studies/whatif_causal/whatif_causal.json"))
    a = ap.parse_args()
    root = Root.from_url(a.root)
    ref = registered_ref(WhatifParams(root=a.root, model=a.model), root)
    predictor = load_predictor.fn(ref)
    df = replay(root, ref, predictor)
    rows = against_heuristics(df)
    for r in rows:
        print(r)
    g = df[df.policy == "guided"].pivot_table(
        index=["workload", "run", "param"], columns="predictor", values="hit_rate"
    )
    result = {
        "model": f"{ref.name} v{ref.version}",
        "model_error": predictor.error,
        "runs": [f"{w}/{r}" for w, r in ref.runs],
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "against_best_heuristic": rows,
        "model_beats_thread_future": {
            "rows": len(g),
            "causal": int((g["model"] > g["thread_future_optimistic"]).sum())
            if "model" in g
            else None,
            "optimistic": int((g["model_optimistic"] > g["thread_future_optimistic"]).sum())
            if "model_optimistic" in g
            else None,
        },
    }
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
