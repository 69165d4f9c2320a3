"""What the predictions buy: the guided policy against lru, the best heuristic and the oracle.

    .venv/bin/python studies/whatif_guided/whatif_guided.py                 # every run under data/
    .venv/bin/python studies/whatif_guided/whatif_guided.py --runs sqlite3/medium --horizon 16

For every run under <root>/events (or --runs), at a few byte budgets per process (--budgets),
side by side (hit rates and idle bytes): `lru`; the guided policy with the perfect labels and
with the online counter's top-5 at --horizon calls, in `priority` mode, with a ttl, as tiers, and
in the old `admit` mode; each guided one against lru, the best heuristic within its idle bytes
(`beats_best_heuristic`, the issue's goal) and the oracle at its idle bytes. Each arm in full:
studies/whatif_guided/README.md. Ratios only, no timing. Writes
studies/whatif_guided/whatif_guided.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tasks.core.storage import Root
from tasks.dataset.token_runs import ScoredRun, list_runs
from tasks.whatif.events import prepare, read_events
from tasks.whatif.guided import reuse_tiers
from tasks.whatif.night import predictions_for
from tasks.whatif.oracle import bound_hits
from tasks.whatif.policies import GuidedConfig, LruConfig
from tasks.whatif.simulate import simulate
from tasks.whatif.sweep import default_grid

PROJECT = Path(__file__).resolve().parents[2]

RESULTS = PROJECT / "studies" / "whatif_guided" / "whatif_guided.json"
HEURISTICS = ("largest", "pools", "lru")


def _fig(m: dict) -> dict:
    return {"hit_rate": round(m["hit_rate"], 5), "idle": round(m["idle_bytes_mean"], 1)}


TIERS = (4, 16, 64, 256, 1024, 4096)


def variants(horizon: int) -> dict[str, tuple[str, GuidedConfig]]:
    """name -> (predictions key, config builder args) of the guided variants compared."""
    return {
        "guided_labels": ("labels", dict()),
        "guided_labels(ttl)": ("labels", dict(ttl_calls=horizon)),
        "guided_labels(tiers)": ("tiers", dict(horizons=TIERS)),
        "guided_online": ("online", dict()),
        "guided_online(ttl)": ("online", dict(ttl_calls=horizon)),
        "guided_admit_labels": ("labels", dict(ttl_calls=horizon, mode="admit")),
        "guided_admit_online": ("online", dict(ttl_calls=horizon, mode="admit")),
    }


def bench_run(root: Root, w: str, r: str, budgets: list[int], horizon: int) -> dict:
    table = read_events(root, w, r, extra=("token",))
    x = prepare(table, w, r)
    preds, _ = predictions_for(ScoredRun.of(table, w, r), None, horizon)
    preds["tiers"] = reuse_tiers(table, TIERS)
    heur = [simulate(x, p) for p in default_grid(horizon) if p.kind in HEURISTICS]
    allocs = max(heur[0]["allocations"], 1)
    out: dict = {"events": table.num_rows, "allocations": allocs, "budgets": {}}
    for b in budgets:
        row: dict = {"lru": _fig(simulate(x, LruConfig(budget=b)))}
        for name, (key, kw) in variants(horizon).items():
            row[name] = _fig(simulate(x, GuidedConfig(budget=b, **kw), preds[key]))
        for name in ("guided_labels", "guided_online"):
            g = row[name]
            ok = [h for h in heur if h["idle_bytes_mean"] <= g["idle"]]
            best = max(ok, key=lambda h: (h["hit_rate"], -h["idle_bytes_mean"]), default=None)
            g["minus_lru"] = round(g["hit_rate"] - row["lru"]["hit_rate"], 5)
            g["best_heuristic_within_its_idle"] = (
                {**_fig(best), "config": f"{best['policy']}({best['param']:g})"} if best else None
            )
            g["beats_best_heuristic"] = bool(best is None or g["hit_rate"] > best["hit_rate"])
            g["oracle_at_its_idle"] = round(int(bound_hits(x, max(g["idle"], 1e-9))[0]) / allocs, 5)
        out["budgets"][str(b)] = row
    return out


def _line(w: str, r: str, b: str, row: dict) -> str:
    cells = " ".join(f"{k.replace('guided_', '')} {v['hit_rate']:.4f}" for k, v in row.items())
    lab, onl = row["guided_labels"], row["guided_online"]
    bh = lab["best_heuristic_within_its_idle"]
    return (
        f"{w}/{r} b={int(b):>8} {cells} | best_h@labels_idle "
        f"{bh['hit_rate'] if bh else float('nan'):.4f} {bh['config'] if bh else '-'}"
        f" beats: labels {lab['beats_best_heuristic']} online {onl['beats_best_heuristic']}"
        f" | oracle@labels_idle {lab['oracle_at_its_idle']:.4f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(PROJECT / "data"))
    ap.add_argument("--runs", nargs="*", help="workload/run (default: every run)")
    ap.add_argument(
        "--budgets", nargs="*", type=int, default=[1 << 12, 1 << 14, 1 << 16, 1 << 20, 16 << 20]
    )
    ap.add_argument("--horizon", type=int, default=16)
    args = ap.parse_args()
    root = Root.from_url(args.root)
    runs = (
        [tuple(s.split("/", 1)) for s in args.runs]
        if args.runs
        else [(w, r) for w, rs in list_runs(root).items() for r in rs]
    )
    t0 = time.perf_counter()
    result = {
        "what": "whatif: guided (priority and admit) vs lru, best heuristic and oracle, per run",
        "command": "python studies/whatif_guided/whatif_guided.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "horizon": args.horizon,
        "budgets_per_process": args.budgets,
        "cpus": os.cpu_count(),
        "runs": {},
    }
    for w, r in runs:
        result["runs"][f"{w}/{r}"] = res = bench_run(root, w, r, args.budgets, args.horizon)
        for b, row in res["budgets"].items():
            print(_line(w, r, b, row), flush=True)
    result["wall_s"] = time.perf_counter() - t0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
