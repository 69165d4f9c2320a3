"""What reading the evaluation's answers saves whatif: a run replayed with the answers the
evaluation logged with the version, against the same run replayed computing them again.

For the champion of a data root, each workload's smallest evaluation run as the quick night's
whatif step replays it; per run, `--rounds` alternating pairs in one process: `logged` (reading
answers/<workload>/<run>.npz) and `recomputed` (params.recompute, the networks loaded once
beforehand, not timed). The rows are compared too, and the script fails if they differ. The
details: studies/whatif_answers/README.md.

    .venv/bin/python studies/whatif_answers/whatif_answers.py --root data

Writes studies/whatif_answers/whatif_answers.json: per run, median seconds of each and their ratio;
the sums over runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.storage import Root
from tasks.whatif.night import (
    WhatifParams,
    load_predictor,
    registered_ref,
    replay_run,
    smallest_run_per_workload,
)

PROJECT = Path(__file__).resolve().parents[2]


def timed(root, w, r, params, predictor, cap) -> tuple[float, pd.DataFrame, list[str]]:
    t0 = time.perf_counter()
    rep = replay_run.fn(root, w, r, params, predictor, cap)
    dt = time.perf_counter() - t0
    if not rep.ok:
        raise SystemExit(f"{w}/{r}: {rep.error}")
    return dt, rep.rows, rep.notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(PROJECT / "studies/whatif_answers/whatif_answers.json"))
    a = ap.parse_args(argv)
    root = Root.from_url(a.root)
    logged = WhatifParams(root=root.url)
    again = WhatifParams(root=root.url, recompute=True)
    ref = registered_ref(logged, root)
    predictor = load_predictor.fn(ref)
    t0 = time.perf_counter()
    if predictor.model is None or predictor.questions is None:  # loads both, once
        raise SystemExit(f"v{ref.version}: {predictor.error or predictor.questions_error}")
    load_s = time.perf_counter() - t0
    runs = smallest_run_per_workload(root, list(ref.runs))
    out = {"model": f"{ref.name} v{ref.version}", "networks_load_s": load_s, "runs": []}
    for w, r in runs:
        times: dict[str, list[float]] = {"logged": [], "recomputed": []}
        rows = {}
        for _ in range(a.rounds):
            for name, params in (("logged", logged), ("recomputed", again)):
                dt, rows[name], notes = timed(root, w, r, params, predictor, ref.max_eval_tokens)
                times[name].append(dt)
                if name == "logged" and notes:
                    raise SystemExit(f"{w}/{r}: the logged answers were not used: {notes}")
        cols = [c for c in rows["logged"].columns if c != "created_at"]
        pd.testing.assert_frame_equal(rows["logged"][cols], rows["recomputed"][cols])
        med = {k: float(np.median(v)) for k, v in times.items()}
        line = {
            "run": f"{w}/{r}",
            **{f"{k}_s": v for k, v in med.items()},
            "ratio": med["logged"] / med["recomputed"],
            "spread": {k: [min(v), max(v)] for k, v in times.items()},
        }
        out["runs"].append(line)
        print(
            f"{w}/{r}: logged {med['logged']:.2f} s, recomputed {med['recomputed']:.2f} s, "
            f"ratio {line['ratio']:.2f}",
            flush=True,
        )
    total = {k: sum(x[f"{k}_s"] for x in out["runs"]) for k in ("logged", "recomputed")}
    out["total"] = {**total, "ratio": total["logged"] / total["recomputed"]}
    print(
        f"all {len(runs)} runs: logged {total['logged']:.1f} s, recomputed "
        f"{total['recomputed']:.1f} s (ratio {out['total']['ratio']:.2f}); the networks' load "
        f"{load_s:.1f} s, saved too when every answer is logged"
    )
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
