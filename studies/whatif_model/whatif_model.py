"""What the registered model's predictions buy: guided by the model vs the best heuristic.

    .venv/bin/python studies/whatif_model/whatif_model.py                     # newest data/whatif/*.parquet
    .venv/bin/python studies/whatif_model/whatif_model.py --table data/whatif/heapcast-next-call-v2.parquet

Reads the table a night's whatif step wrote (tasks/whatif/night.py) and, per run and per byte
budget, compares the guided policy fed by the MODEL's top-5 with the best heuristic holding no
more bytes idle and with the oracle bound at that idle level; the online counter's and the
thread-future reference's figures beside it. `--predictor` picks the predictor to line up (a
table of the old optimistic default names them differently: studies/whatif_model/README.md). The simulation itself is the night's; this script only lines its rows up.
Writes studies/whatif_model/whatif_model.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

PROJECT = Path(__file__).resolve().parents[2]

HEURISTICS = ("largest", "pools", "lru")
BUDGETS = (4 << 10, 16 << 10, 1 << 20, 16 << 20)


def rows(df: pd.DataFrame, predictor: str = "model") -> list[dict]:
    df = df.assign(
        label=np.where(df.predictor != "", df.policy + "[" + df.predictor + "]", df.policy)
    )
    out = []
    for (w, r), g in df.groupby(["workload", "run"]):
        for budget in BUDGETS:
            m = g[(g.label == f"guided[{predictor}]") & (g.param == budget)]
            if not len(m):
                continue
            m = m.iloc[0]
            h = g[g.policy.isin(HEURISTICS) & (g.idle_bytes_mean <= m.idle_bytes_mean)]
            best = h.sort_values("hit_rate").iloc[-1] if len(h) else None
            bound = g[(g.policy == "oracle") & (g.param <= max(m.idle_bytes_mean, 1.0))]
            bound = bound.sort_values("param")
            other = {
                p: float(g[(g.label == f"guided[{p}]") & (g.param == budget)].hit_rate.iloc[0])
                for p in ("online", "thread_future_optimistic")
                if len(g[(g.label == f"guided[{p}]") & (g.param == budget)])
            }
            out.append(
                {
                    "run": f"{w}/{r}",
                    "budget": int(budget),
                    "guided_model_hit_rate": round(float(m.hit_rate), 4),
                    "guided_model_idle_bytes_mean": round(float(m.idle_bytes_mean), 1),
                    "best_heuristic": None if best is None else best.policy,
                    "best_heuristic_hit_rate": None
                    if best is None
                    else round(float(best.hit_rate), 4),
                    "oracle_bound": round(float(bound.hit_rate.iloc[-1]), 4)
                    if len(bound)
                    else None,
                    "guided_online_hit_rate": round(other.get("online", float("nan")), 4),
                    "guided_thread_future_optimistic_hit_rate": round(
                        other.get("thread_future_optimistic", float("nan")), 4
                    ),
                    "model_beats_best_heuristic": best is None or bool(m.hit_rate > best.hit_rate),
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=None, help="a whatif Parquet table (default: the newest)")
    ap.add_argument("--predictor", default="model", help="the guided rows to line up")
    ap.add_argument("--out", default=str(PROJECT / "studies/whatif_model/whatif_model.json"))
    a = ap.parse_args()
    table = (
        Path(a.table)
        if a.table
        else max((PROJECT / "data/whatif").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
    )
    df = pd.read_parquet(table)
    out = rows(df, a.predictor)
    wins = pd.DataFrame(out).groupby("budget").model_beats_best_heuristic.mean()
    for r in out:
        print(
            f"{r['run']:20s} {r['budget'] >> 10:6d} KiB  model {r['guided_model_hit_rate']:.4f}"
            f"  best heuristic {r['best_heuristic']}:{r['best_heuristic_hit_rate']}"
            f"  oracle {r['oracle_bound']}"
        )
    print("share of runs where guided(model) beats the best heuristic, per budget:")
    print(wins.to_string())
    result = {
        "table": str(table),
        "model": f"{df.model_name.iloc[0]} v{df.model_version.iloc[0]}",
        "predictor": a.predictor,
        "rows": out,
        "wins_per_budget": {str(k): float(v) for k, v in wins.items()},
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
