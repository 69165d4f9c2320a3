"""The counters on the calling context against the one-frame counters (issue 65's "Counters on the
context"): per workload with two or more runs carrying call stacks, every ordered pair of runs,
learned on one (the majorities, context_table's training counts) and scored on the other, as the
unseen-runs table scores a program it trained on. The predictors are the product's own
(tasks/learning/questions/lifetime.py lifetime_answers, reuse.py reuse_answers, context.py), and
the hedge of the counters without a network (hedge.py's EXPERTS, with and without the context
counters). Top-1 and log-loss per program and question, averaged over the pairs; the goal's
verdict per program: context_table's top-1 at least +0.15 over site_online, its log-loss lower,
and neither worse than the majority's.

--sweep adds the back-off's sensitivity (BACKOFF, PRIOR_CAP) on lifetime_calls and reuse;
--timing the CPU time of lifetime_answers with and without the context counters on the largest
run (min of 5 rounds, alternating). Usage:

    .venv/bin/python studies/context_counters/context_counters.py --root data [--sweep] [--timing]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.events_reader import list_runs  # noqa: E402
from tasks.learning.counters.by_context import backoff_online  # noqa: E402
from tasks.learning.labels import (  # noqa: E402
    LIFETIME_CALL_EDGES,
    NO_LABEL,
    QUESTION_CLASSES,
    REUSE_EDGES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.context import (  # noqa: E402
    CONTEXT_ONLINE,
    CONTEXT_SURVIVAL,
    CONTEXT_TABLE,
    allocation_levels,
    context_priors,
    key_chain,
    read_contexts,
    reuse_levels,
)
from tasks.learning.questions.hedge import EXPERTS, PRIOR, hedge_keys, hedged, process_prior  # noqa: E402
from tasks.learning.questions.lifetime import lifetime_answers, lifetime_due, lifetime_majority  # noqa: E402
from tasks.learning.questions.reuse import (  # noqa: E402
    MIN_PROB,
    QUESTION,
    ReuseAnswers,
    call_sites,
    majority_of,
    read_events,
    reuse_answers,
    reuse_due,
)

RESULTS = Path(__file__).resolve().parent
PREDICTORS = (
    "majority", "class_online", "site_online", "site_survival", CONTEXT_ONLINE, CONTEXT_TABLE,
    CONTEXT_SURVIVAL, "hedge_one_frame", "hedge_context",
)  # fmt: skip
QUESTIONS = ("lifetime_calls", "lifetime_time", QUESTION)
GOAL = 0.15  # issue 65: top-1 over the one-frame counter on unseen runs


def answers(table, ctx, learn: tuple) -> dict[str, ReuseAnswers]:
    """Every counter's answers on `table` with what `learn` (majority, lifetime majorities,
    context priors) holds, and the two hedges of them."""
    majority, life_maj, priors = learn
    got = {
        QUESTION: reuse_answers(table, majority, contexts=ctx, prior=priors[QUESTION]),
        **lifetime_answers(table, life_maj, contexts=ctx, priors=priors),
    }
    order, starts = process_order(table)
    req_cls, free_cls = request_and_free_classes(table)
    sites = call_sites(table)
    for q, a in got.items():
        q_maj, edges = (
            (majority, len(REUSE_EDGES))
            if q == QUESTION
            else (life_maj[q], len(LIFETIME_CALL_EDGES))
        )
        a.probs[PRIOR] = process_prior(order, starts, a.learnt, a.rows, q_maj, a.labels, edges)
        keys = hedge_keys(sites, free_cls if q == QUESTION else req_cls)[a.rows]
        for name, experts in (
            ("hedge_one_frame", [e for e in EXPERTS if not e.startswith("context_")]),
            ("hedge_context", list(EXPERTS)),
        ):
            mix = [a.probs[e] for e in experts if e in a.probs]
            a.probs[name] = hedged(order, starts, a.learnt, a.rows, a.labels, mix, keys=keys)
    return got


def scores(a: ReuseAnswers) -> dict[str, dict[str, float]]:
    y = a.labels.astype(np.int64)
    out = {}
    for name in [p for p in PREDICTORS if p in a.probs]:  # site_survival: lifetimes only
        p = a.probs[name]
        ll = -np.log(np.clip(p[np.arange(len(y)), y], MIN_PROB, 1.0)).mean()
        out[name] = {"top1": float((p.argmax(axis=1) == y).mean()), "logloss": float(ll)}
    return out


def learned(table, ctx) -> tuple:
    return majority_of([table]), lifetime_majority([table]), context_priors([table], [ctx])


def study(root: Root, workloads: list[str] | None) -> dict:
    runs: dict[str, list[str]] = {}
    for r in list_runs(root, workloads):
        runs.setdefault(r.workload, []).append(r.run)
    result = {}
    for w, names in sorted(runs.items()):
        if len(names) < 2:
            print(f"{w}: fewer than two runs; skipped", file=sys.stderr)
            continue
        data = {}
        for r in sorted(names):
            t = read_events(root, w, r)
            data[r] = (t, read_contexts(root, w, r, t))
        if not any((data[r][1][1] >= 0).any() for r in data):
            print(f"{w}: no call stacks; skipped", file=sys.stderr)
            continue
        per_q: dict[str, list[dict]] = {q: [] for q in QUESTIONS}
        for ra in data:
            learn = learned(*data[ra])
            for rb in data:
                if rb != ra:
                    for q, a in answers(*data[rb], learn).items():
                        per_q[q].append(scores(a))
        mean = {
            q: {
                p: {
                    m: round(float(np.mean([s[p][m] for s in rows])), 4)
                    for m in ("top1", "logloss")
                }
                for p in rows[0]
            }
            for q, rows in per_q.items()
        }
        result[w] = {"runs": sorted(data), **mean}
        print(w, json.dumps(result[w]["lifetime_calls"]), file=sys.stderr, flush=True)
    return result


def verdict(r: dict) -> tuple[float, bool]:
    """(context_table's top-1 gain over site_online, whether the goal is met)."""
    ct, site, maj = r[CONTEXT_TABLE], r["site_online"], r["majority"]
    gain = ct["top1"] - site["top1"]
    met = (
        gain >= GOAL
        and ct["logloss"] < site["logloss"]
        and ct["top1"] >= maj["top1"]
        and ct["logloss"] <= maj["logloss"]
    )
    return gain, met


SWEEP_BACKOFF = (1.0, 4.0, 16.0)
SWEEP_CAP = (4.0, 16.0, 64.0, 256.0, 1e9)


def _chain(table, ctx, question: str) -> dict:
    """One question's chain, labels and due rows of a run (process order), as context.py keys."""
    order, starts = process_order(table)
    req_cls, free_cls = request_and_free_classes(table)
    life_due = lifetime_due(table, order, starts)
    every = allocator_labels(table)
    if question == QUESTION:
        levels = reuse_levels(ctx, free_cls, call_sites(table), order, life_due)
        lab, due = every.reuse, reuse_due(every.reuse_calls[order], starts)
    else:
        levels = allocation_levels(table, ctx, order, starts)
        lab, due = every.lifetime_calls, life_due
    ask = (lab != NO_LABEL)[order]
    return {
        "chain": key_chain(order, starts, lab != NO_LABEL, levels), "due": due,
        "label": np.maximum(lab[order], 0).astype(np.int64), "y": lab[order][ask], "ask": ask,
    }  # fmt: skip


def _swept(c: dict, k: int, prior, backoff: float, cap: float) -> np.ndarray:
    """[top-1, log-loss] of the back-off on one run's chain `c` (_chain)."""
    online, table = backoff_online(
        c["chain"], c["due"], c["label"], k, backoff=backoff, prior=prior, cap=cap
    )
    p = (online if table is None else table)[c["ask"]]
    y = c["y"]
    ll = -np.log(np.clip(p[np.arange(len(y)), y], MIN_PROB, 1.0)).mean()
    return np.array([(p.argmax(axis=1) == y).mean(), ll])


def sweep(root: Root, workloads: list[str]) -> dict:
    """Per workload and question ("lifetime_calls", reuse): top-1 / log-loss of the back-off
    online at each BACKOFF, and with the other run's prior at each PRIOR_CAP (BACKOFF 4)."""
    out: dict = {}
    for w in workloads:
        names = sorted(r.run for r in list_runs(root, [w]))
        tables = {r: read_events(root, w, r) for r in names}
        ctx = {r: read_contexts(root, w, r, tables[r]) for r in names}
        priors = {r: context_priors([tables[r]], [ctx[r]]) for r in names}
        for q in ("lifetime_calls", QUESTION):
            chains = {r: _chain(tables[r], ctx[r], q) for r in names}
            k = QUESTION_CLASSES[q]

            row = {}
            for b in SWEEP_BACKOFF:
                row[f"online a={b:g}"] = np.mean(
                    [_swept(chains[r], k, None, b, 0.0) for r in names], axis=0
                )
            for cap in SWEEP_CAP:
                pairs = [(r, o) for r in names for o in names if o != r]
                row[f"table cap={cap:g}"] = np.mean(
                    [_swept(chains[r], k, priors[o][q], 4.0, cap) for r, o in pairs], axis=0
                )
            out.setdefault(w, {})[q] = {
                k_: {"top1": round(float(v[0]), 4), "logloss": round(float(v[1]), 4)}
                for k_, v in row.items()
            }
        print(w, "swept", file=sys.stderr, flush=True)
    return out


def timing(root: Root, workloads: list[str] | None, rounds: int = 5) -> dict:
    """CPU seconds (min of `rounds`, alternating) of lifetime_answers on the largest run, with
    and without the context counters (its contexts and priors computed once beforehand)."""
    runs = list_runs(root, workloads)
    sized = [(read_events(root, r.workload, r.run).num_rows, r.workload, r.run) for r in runs]
    n, w, r = max(sized)
    t = read_events(root, w, r)
    ctx = read_contexts(root, w, r, t)
    life_maj = lifetime_majority([t])
    priors = context_priors([t], [ctx])
    lifetime_answers(t, life_maj, contexts=ctx, priors=priors)  # compiled before timing
    got: dict[str, list[float]] = {"one frame": [], "with context": []}
    for _ in range(rounds):
        for name, kw in (("one frame", {}), ("with context", {"contexts": ctx, "priors": priors})):
            t0 = time.process_time()
            lifetime_answers(t, life_maj, **kw)
            got[name].append(time.process_time() - t0)
    t0 = time.process_time()
    read_contexts(root, w, r, t)
    keys = time.process_time() - t0
    return {
        "run": f"{w}/{r}", "events": n, **{k: round(min(v), 3) for k, v in got.items()},
        "contexts (read_contexts, once)": round(keys, 3),
    }  # fmt: skip


def markdown(result: dict, swept: dict, timed: dict | None) -> str:
    lines = [
        "Top-1 / log-loss, learned on one run of the program, scored on another (both ways).",
        "",
    ]
    for q in QUESTIONS:
        lines += [
            f"### {q}",
            "",
            "| program | " + " | ".join(PREDICTORS) + " | context_table - site_online | goal |",
            "|" + "---|" * (len(PREDICTORS) + 3),
        ]
        for w, r in result.items():
            cells = [
                f"{r[q][p]['top1']:.3f} / {r[q][p]['logloss']:.3f}" if p in r[q] else "n/a"
                for p in PREDICTORS
            ]
            gain, met = verdict(r[q])
            lines.append(
                f"| {w} | "
                + " | ".join(cells)
                + f" | {gain:+.3f} | {'met' if met else 'not met'} |"
            )
        lines.append("")
    if swept:
        lines += ["### Back-off sensitivity (top-1 / log-loss)", ""]
        for w, by_q in swept.items():
            for q, row in by_q.items():
                cols = list(row)
                if not lines[-1].startswith("|"):
                    lines += ["| program | question | " + " | ".join(cols) + " |"]
                    lines += ["|" + "---|" * (len(cols) + 2)]
                cells = [f"{row[c]['top1']:.3f} / {row[c]['logloss']:.3f}" for c in cols]
                lines.append(f"| {w} | {q} | " + " | ".join(cells) + " |")
        lines.append("")
    if timed:
        lines += [
            "### Cost of lifetime_answers (CPU seconds, min of 5)",
            "",
            "| run | events | one frame | with context | contexts (read_contexts, once) |",
            "|---|---|---|---|---|",
            f"| {timed['run']} | {timed['events']:,} | {timed['one frame']} | "
            f"{timed['with context']} | {timed['contexts (read_contexts, once)']} |",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--root", required=True, help="the data root (a night's, or data after make run)"
    )
    p.add_argument("--workloads", default="", help="comma-separated (default: all with two runs)")
    p.add_argument("--sweep", action="store_true", help="the back-off's sensitivity too")
    p.add_argument("--timing", action="store_true", help="the CPU cost on the largest run too")
    p.add_argument("--out", default=str(RESULTS), help="folder for context_counters.json/.md")
    p.add_argument("--tag", default="", help="name the results context_counters_TAG.json/.md")
    args = p.parse_args(argv)
    root = Root.from_url(args.root)
    workloads = [w for w in args.workloads.split(",") if w] or None
    result = study(root, workloads)
    swept = sweep(root, list(result)) if args.sweep else {}
    timed = timing(root, workloads) if args.timing else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"counters": result, "sweep": swept, "timing": timed}
    name = "context_counters" + (f"_{args.tag}" if args.tag else "")
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(result, swept, timed))
    print(markdown(result, swept, timed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
