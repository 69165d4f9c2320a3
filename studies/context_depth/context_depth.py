"""What each depth of the calling context explains of an allocation's lifetime (issue 65's first
table): per workload with two or more runs carrying call stacks, a per-(context, size class)
counter at depths 1 (the call site heapcast keys on today), 2, 3, 4, 8 and the whole recorded
stack.

- offline: learned on one run, scored on another run of the same program (every ordered pair,
  averaged), backing off to the next shallower depth for what the learning run never saw
  (p_d = (counts_d + p_{d-1}) / (n_d + 1), depth 0 the size class's distribution);
- online: causal, learned in the scored run itself from the blocks already freed (tasks/learning/
  counters/by_due.py, the site_online counter with the context in place of the call site).

Scored on every allocation with a lifetime label (LIFETIME_CALL_EDGES classes, never freed one of
its own): top-1 and log-loss. Usage:

    .venv/bin/python studies/context_depth/context_depth.py --root data [--root R2 ...] [--workloads a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.contexts import NO_CONTEXT, event_contexts  # noqa: E402
from tasks.dataset.events_reader import StackFrames, list_runs, read_run, read_stacks  # noqa: E402
from tasks.learning.counters.by_due import online_by_due  # noqa: E402
from tasks.learning.labels import (  # noqa: E402
    LABEL_COLUMNS,
    LIFETIME_CLASSES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.lifetime import lifetime_due  # noqa: E402

DEPTHS = (1, 2, 3, 4, 8, 32)  # 32: the whole stack as the catalog records it
K = LIFETIME_CLASSES
EPS = 1e-3
RESULTS = Path(__file__).resolve().parent


def load(root: Root, workload: str, run: str) -> dict | None:
    table = read_run(root, workload, run, [*LABEL_COLUMNS, "stack"])
    frames = StackFrames.of_table(read_stacks(root, workload, run))
    if table.num_rows == 0 or len(frames) == 0:
        return None
    labels = allocator_labels(table).lifetime_calls.astype(np.int64)
    req_cls, _ = request_and_free_classes(table)
    ctx = event_contexts(frames, table.column("stack"), DEPTHS)
    asked = (labels >= 0) & (ctx[1] != NO_CONTEXT)
    return {
        "table": table,
        "label": labels,
        "cls": req_cls.astype(np.int64),
        "ctx": ctx,
        "asked": asked,
    }


def _dist(keys: np.ndarray, label: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts [len(query), K], their totals) of each query key among (keys, label)."""
    uk, inv = np.unique(keys, return_inverse=True)
    counts = np.zeros((len(uk), K))
    np.add.at(counts, (inv, label), 1.0)
    j = np.searchsorted(uk, query)
    jc = np.minimum(j, max(len(uk) - 1, 0))
    hit = (j < len(uk)) & (uk[jc] == query) if len(uk) else np.zeros(len(query), bool)
    out = np.where(hit[:, None], counts[jc], 0.0)
    return out, out.sum(axis=1)


def offline(learn: dict, score: dict) -> dict[str, np.ndarray]:
    """Per depth, the backed-off distribution at each scored row."""
    a, b = learn["asked"], score["asked"]
    y = learn["label"][a]
    prior, _ = _dist(np.zeros(a.sum(), np.int64), y, np.zeros(1, np.int64))
    prior = (prior[0] + EPS) / (prior[0].sum() + EPS * K)
    c, n = _dist(learn["cls"][a], y, score["cls"][b])
    p = (c + prior) / (n + 1.0)[:, None]
    out = {"majority": np.broadcast_to(prior, p.shape), "class": p}
    for d in DEPTHS:
        key_a = learn["ctx"][d][a] * 64 + learn["cls"][a]
        key_b = score["ctx"][d][b] * 64 + score["cls"][b]
        c, n = _dist(key_a, y, key_b)
        p = (c + p) / (n + 1.0)[:, None]
        out[f"depth {d}"] = p
    return out


def online(run: dict) -> dict[str, np.ndarray]:
    """Per depth, the causal counter's distribution at each asked row (site_online's counting)."""
    table = run["table"]
    order, starts = process_order(table)
    due = lifetime_due(table, order, starts)
    ask = np.where(run["asked"], np.minimum(run["cls"], 31), -1)[order]
    label = np.maximum(run["label"], 0)[order]
    out = {}
    back = np.empty(len(order), np.int64)
    for d in (0, *DEPTHS):
        if d == 0:
            site = np.full(len(order), -1, np.int64)
            n_sites = 1
        else:
            uk, inv = np.unique(run["ctx"][d][order], return_inverse=True)
            site, n_sites = inv.astype(np.int64), len(uk)
        dist = np.zeros((len(order), K))
        online_by_due(starts, ask, site, due, label, n_sites, K, EPS, dist)
        back[order] = np.arange(len(order))
        out["class" if d == 0 else f"depth {d}"] = dist[back][run["asked"]]
    return out


def scores(dist: dict[str, np.ndarray], y: np.ndarray) -> dict[str, dict[str, float]]:
    res = {}
    for name, p in dist.items():
        top1 = float(np.mean(np.argmax(p, axis=1) == y)) if len(y) else float("nan")
        ll = (
            float(np.mean(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-12))))
            if len(y)
            else float("nan")
        )
        res[name] = {"top1": round(top1, 4), "logloss": round(ll, 4)}
    return res


def study(root: Root, workloads: list[str] | None) -> dict:
    runs_by_w: dict[str, list[str]] = {}
    for r in list_runs(root, workloads):
        runs_by_w.setdefault(r.workload, []).append(r.run)
    result = {}
    for w, runs in sorted(runs_by_w.items()):
        loaded = {r: load(root, w, r) for r in sorted(runs)}
        loaded = {r: v for r, v in loaded.items() if v is not None and v["asked"].any()}
        if len(loaded) < 2:
            print(f"{w}: fewer than two runs with call stacks; skipped", file=sys.stderr)
            continue
        off: dict[str, list[dict]] = {}
        for ra in loaded:
            for rb in loaded:
                if ra == rb:
                    continue
                y = loaded[rb]["label"][loaded[rb]["asked"]]
                for name, s in scores(offline(loaded[ra], loaded[rb]), y).items():
                    off.setdefault(name, []).append(s)
        on: dict[str, list[dict]] = {}
        for v in loaded.values():
            for name, s in scores(online(v), v["label"][v["asked"]]).items():
                on.setdefault(name, []).append(s)

        def mean(rows: list[dict]) -> dict:
            return {m: round(float(np.mean([x[m] for x in rows])), 4) for m in ("top1", "logloss")}

        result[w] = {
            "runs": sorted(loaded),
            "allocations": int(sum(v["asked"].sum() for v in loaded.values())),
            "offline": {k: mean(v) for k, v in off.items()},
            "online": {k: mean(v) for k, v in on.items()},
        }
        print(w, json.dumps(result[w]["offline"]), file=sys.stderr)
    return result


def markdown(result: dict, root_url: str) -> str:
    cols = ["majority", "class", *[f"depth {d}" for d in DEPTHS]]
    head = (
        "| program | allocations | "
        + " | ".join(c.replace("depth 32", "whole") for c in cols)
        + " |"
    )
    lines = [
        f"Lifetime class (calls), top-1 / log-loss, on `{root_url}`.",
        "",
        "Offline (learned on one run, scored on another):",
        "",
        head,
        "|" + "---|" * (len(cols) + 2),
    ]
    for w, r in result.items():
        cells = [f"{r['offline'][c]['top1']:.3f} / {r['offline'][c]['logloss']:.2f}" for c in cols]
        lines.append(f"| {w} | {r['allocations']:,} | " + " | ".join(cells) + " |")
    on_cols = ["class", *[f"depth {d}" for d in DEPTHS]]
    lines += [
        "",
        "Online (causal, in the scored run):",
        "",
        "| program | " + " | ".join(c.replace("depth 32", "whole") for c in on_cols) + " |",
        "|" + "---|" * (len(on_cols) + 1),
    ]
    for w, r in result.items():
        cells = [f"{r['online'][c]['top1']:.3f} / {r['online'][c]['logloss']:.2f}" for c in on_cols]
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--root",
        required=True,
        action="append",
        help="a data root (a night's root, or data after make run); repeat it to join roots "
        "whose workloads differ (a workload in two roots is refused)",
    )
    p.add_argument(
        "--workloads", default="", help="comma-separated workloads (default: all with stacks)"
    )
    p.add_argument("--out", default=str(RESULTS), help="folder for context_depth.json/.md")
    args = p.parse_args(argv)
    wanted = [w for w in args.workloads.split(",") if w] or None
    result: dict = {}
    for url in args.root:
        part = study(Root.from_url(url), wanted)
        both = sorted(set(part) & set(result))
        if both:
            p.error(f"workload(s) {', '.join(both)} in more than one --root; keep one root each")
        result.update(part)
    result = dict(sorted(result.items()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "context_depth.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "context_depth.md").write_text(markdown(result, "<root>"))
    print(markdown(result, " + ".join(args.root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
