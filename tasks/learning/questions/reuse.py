"""Causal predictors of the reuse question, scored on the same positions in the same tables.

At a free of class c, how soon does the process request class c again? majority, class_online
and site_online (counters over the process's earlier frees) answer from the calls before the
free; the network and network_hedged join them (tasks/learning/questions/evaluation.py). Compiled (numba),
one pass per run.

Each predictor, the call site, the metric keys:
docs/learning-questions.md#the-reuse-questions-predictors
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.events_reader import read_run
from tasks.dataset.sites import NO_CALL_SITES, SITE_VOCABULARY, call_sites
from tasks.learning.counters.by_context import ContextPrior
from tasks.learning.counters.by_due import known_at, lifetime_due, online_by_due
from tasks.learning.labels import (
    NO_LABEL,
    QUESTION_COLUMNS,
    REUSE_CLASSES,
    REUSE_EDGES,
    allocator_labels,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.context import (
    CONTEXT_ONLINE,
    CONTEXT_SURVIVAL,
    CONTEXT_TABLE,
    context_answers,
    key_chain,
    reuse_levels,
)
from tasks.learning.questions.hedge import HEDGED, censored_events
from tasks.learning.scores import OVERALL, QuestionScores
from tasks.learning.table.distill import ClassTable, TableAgreement, allocation_contexts

QUESTION = "reuse"
# site_survival, network_survival: the lifetime questions' censoring-aware estimates
# (tasks/learning/questions/lifetime.py)
# context_online, context_table, context_survival: keyed on the calling context
# (tasks/learning/questions/context.py; context_survival answers the lifetime questions only)
PREDICTORS = (
    "majority", "class_online", "site_online", "site_survival", CONTEXT_ONLINE, CONTEXT_TABLE,
    CONTEXT_SURVIVAL, "table", "network", "network_survival", HEDGED,
)  # fmt: skip
# what the model answers (the network, and the network corrected inside the run) and what it is
# held against (the baselines: the counters and the majority); the table, the network's
# distillation for the layer, is neither
MODEL_PREDICTORS = ("network", "network_survival", HEDGED)
BASELINE_PREDICTORS = (
    "majority", "class_online", "site_online", "site_survival", CONTEXT_ONLINE, CONTEXT_TABLE,
    CONTEXT_SURVIVAL,
)  # fmt: skip
# the table (tasks/learning/table/distill.py) answers the reuse question only
N_SIZE_CLASSES = 32
MIN_PROB = 1e-7  # the log-loss clip of tasks.learning.evaluate


def reuse_due(reuse_calls: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 [n], in process order: the row where each free's reuse class becomes known to a
    program that watches itself (-1: not within its process): at the next request of its class,
    or, with none by then, once the last edge has passed ("later or never", the last class,
    known from that row on). `reuse_calls`: labels.AllocatorLabels.reuse_calls, process order."""
    later = REUSE_EDGES[-1] + 1
    return known_at(np.ones(len(starts), bool), np.minimum(reuse_calls, later), starts)


def reuse_learnt(
    reuse_calls: np.ndarray, asked: np.ndarray, starts: np.ndarray, due: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a program that watches itself learns of each asked free's reuse class, and when
    (hedge.py's events, rows in process order): with no request of its class by edge j's row
    (the free's row + REUSE_EDGES[j] + 1), that its class is above j; at `due` (reuse_due), its
    class. The hedge weighs its predictors by these as they come: a free whose class is
    requested again late tells early that it was not soon."""
    n = len(starts)
    edges = np.asarray(REUSE_EDGES, np.int64)
    crossing = np.arange(n, dtype=np.int64)[:, None] + edges[None, :] + 1
    crossing = np.where(asked[:, None] & (reuse_calls[:, None] > edges[None, :]), crossing, -1)
    end = np.where(asked, due, -1)
    return censored_events(starts, crossing, end)


@dataclass(frozen=True)
class ReuseAnswers:
    """The predictors' answers at a run's scored frees (rows in the table's order)."""

    rows: np.ndarray  # int64 [m]: the scored rows (frees with a reuse label)
    labels: np.ndarray  # int8 [m]
    probs: dict[str, np.ndarray]  # predictor -> float64 [m, REUSE_CLASSES]
    without_site: int  # scored rows with no call site
    # when each answer's label became known, in part or whole (hedge.py's events, process
    # order): reuse_learnt, or the lifetime counters' own; the hedged network reads them
    learnt: tuple[np.ndarray, np.ndarray, np.ndarray]
    table_covered: np.ndarray | None = None  # bool [m]: the table has the free's class
    table_at_site: np.ndarray | None = None  # bool [m]: the table answered by call site
    # bool [m]: the table answered by the freed block's allocation context (format 4)
    table_at_context: np.ndarray | None = None


def reuse_answers(
    table: pa.Table,
    majority: np.ndarray,
    eps: float = 0.1,
    known: ClassTable | None = None,
    contexts: dict[int, np.ndarray] | None = None,
    prior: ContextPrior | None = None,
) -> ReuseAnswers:
    """Every predictor's answer at every scored free of one run's events table; `known`: the
    table from the training runs (the predictor `table`), when given; with the rows'
    `contexts` (context.read_contexts), the context counters, and with the training runs'
    `prior` (context.context_prior), context_table."""
    every = allocator_labels(table)
    labels = every.reuse
    order, starts = process_order(table)
    req_cls, free_cls = request_and_free_classes(table)
    site = call_sites(table)
    reuse_calls = every.reuse_calls[order]
    due = reuse_due(reuse_calls, starts)
    ask = np.ascontiguousarray(np.where(labels != NO_LABEL, free_cls, -1)[order].astype(np.int64))
    label = np.ascontiguousarray(np.maximum(labels[order], 0).astype(np.int64))
    out = {}
    for name, s in (("class_online", np.full(len(site), -1, np.int64)), ("site_online", site)):
        p = np.zeros((table.num_rows, REUSE_CLASSES), np.float64)
        p_ord = np.zeros_like(p)
        online_by_due(
            starts, ask, np.ascontiguousarray(s[order]), due, label, SITE_VOCABULARY,
            REUSE_CLASSES, eps, p_ord,
        )  # fmt: skip
        p[order] = p_ord
        out[name] = p
    rows = np.flatnonzero(labels != NO_LABEL)
    probs = {name: out[name][rows] for name in out}
    if contexts is not None:
        levels = reuse_levels(contexts, free_cls, site, order, lifetime_due(table, order, starts))
        chain = key_chain(order, starts, labels != NO_LABEL, levels)
        probs.update(
            context_answers(order, chain, due, label, rows, probs["site_online"], prior, eps)
        )
    probs["majority"] = np.broadcast_to(majority, (len(rows), REUSE_CLASSES))
    covered = at_site = at_context = None
    if known is not None:
        cls = free_cls[rows]
        alloc_ctx = None
        if known.context_counts is not None and contexts is not None:
            # as the layer asks it: the context of the allocation this free frees, at the
            # table's depth
            alloc_ctx = allocation_contexts(table, contexts[known.context_counts.depth])[rows]
        probs["table"], at_site, at_context = known.answer(
            site[rows], cls, eps, probs["class_online"], alloc_ctx
        )
        covered = known.covered()[cls]
    learnt = reuse_learnt(reuse_calls, ask >= 0, starts, due)
    return ReuseAnswers(
        rows, labels[rows], probs, int((site[rows] < 0).sum()), learnt, covered, at_site,
        at_context,
    )  # fmt: skip


def majority_of(tables: list[pa.Table], eps: float = 0.1) -> np.ndarray:
    """float64 [REUSE_CLASSES]: the training runs' reuse classes, smoothed."""
    counts = np.zeros(REUSE_CLASSES)
    for t in tables:
        r = allocator_labels(t).reuse
        counts += np.bincount(r[r != NO_LABEL], minlength=REUSE_CLASSES)
    return (counts + eps) / (counts.sum() + eps * REUSE_CLASSES)


def score_answers(
    answers: list[ReuseAnswers], table: str, slice: str, question: str = QUESTION
) -> list[QuestionScores]:
    """top-1 (ties: the sooner class) and log-loss of every predictor over `answers`, pooled."""
    y = np.concatenate([a.labels for a in answers]).astype(np.int64)
    without = sum(a.without_site for a in answers)
    scores = []
    for name in [p for p in PREDICTORS if all(p in a.probs for a in answers)]:
        p = np.concatenate([a.probs[name] for a in answers])
        n = len(y)
        top1 = float((p.argmax(axis=1) == y).mean()) if n else float("nan")
        p_true = p[np.arange(n), y] if n else np.zeros(0)
        ll = float(-np.log(np.clip(p_true, MIN_PROB, 1.0)).mean()) if n else float("nan")
        scores.append(QuestionScores(question, name, slice, table, n, top1, ll, without))
    return scores


def read_events(root: Root, workload: str, run: str) -> pa.Table:
    """One run's events with the columns the labels, the call sites and the stacks need."""
    # a part written before callers (stacks) were traced reads them as nulls: positions without
    # a site (a stack)
    table = read_run(root, workload, run, QUESTION_COLUMNS)
    if table.num_rows == 0:
        raise ValueError(f"{root.url_of('events')}: run {workload}/{run} has no events")
    return table


def question_metrics(scores: list[QuestionScores]) -> dict[str, float]:
    """`<question>.<table>.<metric>/<slice>.<predictor>` -> value, and the positions."""
    out: dict[str, float] = {}
    for s in scores:
        sl = re.sub(r"[^A-Za-z0-9_\-]", "_", s.slice)
        for m in ("top1", "log_loss"):
            out[f"{s.question}.{s.table}.{m}/{sl}.{s.predictor}"] = float(getattr(s, m))
        out[f"{s.question}.{s.table}.positions/{sl}"] = float(s.positions)
        out[f"{s.question}.{s.table}.positions_without_site/{sl}"] = float(s.positions_without_site)
    return out


QUESTION_TITLES = {
    QUESTION: "Reuse of the freed class in the process (at each free)",
    "lifetime_calls": "Lifetime of the block in calls of the process (at each allocation)",
    "lifetime_time": "Lifetime of the block in time (at each allocation)",
}


def question_markdown(scores: list[QuestionScores]) -> str:
    """The question tables a person reads: per table and workload, each predictor's top-1 and
    log-loss, one table per question."""
    out = []
    for question in dict.fromkeys(s.question for s in scores):
        out.append(_question_markdown([s for s in scores if s.question == question], question))
    return "\n".join(out)


def _question_markdown(scores: list[QuestionScores], question: str) -> str:
    lines = [f"### {QUESTION_TITLES.get(question, question)}", ""]
    lines += [
        "| table | workload | positions | without call site | "
        + " | ".join(f"{p} top-1 | {p} log-loss" for p in PREDICTORS)
        + " |",
        "|" + "---|" * (4 + 2 * len(PREDICTORS)),
    ]
    keyed = {(s.table, s.slice, s.predictor): s for s in scores}
    for table, sl in dict.fromkeys((s.table, s.slice) for s in scores):
        first = keyed[(table, sl, PREDICTORS[0])]
        cells = [table, sl, str(first.positions), str(first.positions_without_site)]
        for p in PREDICTORS:
            s = keyed.get((table, sl, p))
            cells += ["n/a", "n/a"] if s is None else [f"{s.top1:.4f}", f"{s.log_loss:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


QUESTION_POSITIONS = {
    QUESTION: "frees",
    "lifetime_calls": "allocations",
    "lifetime_time": "allocations",
}
_AGAINST = {"class_online": "class counter", "network": "network"}  # what the table follows


@dataclass(frozen=True)
class HedgedCell:
    """One (program, question) cell of a table: whether network_hedged, the one answer the
    model gives, is strictly ahead of every baseline (the online counters and the majority) in
    top-1 and in log-loss, and whether its log-loss is worse than the majority's (a confidently
    wrong answer)."""

    program: str
    question: str
    positions: int
    top1_ahead: bool
    log_loss_ahead: bool
    below_majority: bool

    @property
    def ahead(self) -> bool:
        return self.top1_ahead and self.log_loss_ahead


def _cells(scores: list[QuestionScores], table: str) -> dict[tuple[str, str], list[QuestionScores]]:
    """{(program, question): its predictors' scores} of `table`, the pooled rows left out."""
    rows: dict[tuple[str, str], list[QuestionScores]] = {}
    for s in scores:
        if s.table == table and s.slice != OVERALL:
            rows.setdefault((s.slice, s.question), []).append(s)
    return dict(sorted(rows.items()))


def hedged_cells(scores: list[QuestionScores], table: str = "unseen_programs") -> list[HedgedCell]:
    """Per (program, question) of `table` that has network_hedged and a baseline: its verdict."""
    out = []
    for (program, question), got in _cells(scores, table).items():
        hedged = next((s for s in got if s.predictor == HEDGED), None)
        base = [s for s in got if s.predictor in BASELINE_PREDICTORS]
        if hedged is None or not base:
            continue
        majority = next((s for s in base if s.predictor == "majority"), None)
        out.append(
            HedgedCell(
                program=program,
                question=question,
                positions=hedged.positions,
                top1_ahead=all(hedged.top1 > b.top1 for b in base),
                log_loss_ahead=all(hedged.log_loss < b.log_loss for b in base),
                below_majority=majority is not None and hedged.log_loss > majority.log_loss,
            )
        )
    return out


def program_lines(scores: list[QuestionScores], table: str = "unseen_programs") -> list[str]:
    """Per program of `table` (one never trained on, by default) and question: the model's best
    answer against the best baseline, in top-1 and in log-loss, and which leads; the question's
    every predictor is in the table's rows (MLflow `questions/<table>.json`)."""
    verdicts = {(c.program, c.question): c for c in hedged_cells(scores, table)}
    lines = []
    for (program, question), got in _cells(scores, table).items():
        model = [s for s in got if s.predictor in MODEL_PREDICTORS]
        base = [s for s in got if s.predictor in BASELINE_PREDICTORS]
        if not model or not base:
            continue
        cells = []
        for label, key, best in (("top-1", "top1", max), ("log-loss", "log_loss", min)):
            m = best(model, key=attrgetter(key))
            b = best(base, key=attrgetter(key))
            mv, bv = getattr(m, key), getattr(b, key)
            lead = "model ahead" if best(mv, bv) == mv != bv else "baseline ahead or even"
            cells.append(f"{label} {m.predictor} {mv:.3f} against {b.predictor} {bv:.3f} ({lead})")
        # the one answer the model gives, without picking per cell
        v = verdicts.get((program, question))
        alone = (
            []
            if v is None
            else [
                f"top-1 {'ahead' if v.top1_ahead else 'not ahead'}",
                f"log-loss {'ahead' if v.log_loss_ahead else 'not ahead'}",
            ]
        )
        line = (
            f"{program}, {question} ({got[0].positions:,} "
            f"{QUESTION_POSITIONS.get(question, 'positions')}): {'; '.join(cells)}"
        )
        if alone:
            line += f"; {HEDGED} alone: {', '.join(alone)}"
            if v is not None and v.below_majority:
                line += " (its log-loss worse than the majority's)"
        if _siteless(got[0]):
            line += f"; {program}'s traces have {NO_CALL_SITES}"
        lines.append(line)
    return lines


def question_lines(
    scores: list[QuestionScores], agreement: tuple[TableAgreement, ...] = ()
) -> list[str]:
    """Each question in one line per evaluation table (all its workloads pooled): every
    predictor's top-1 and log-loss, and, on the reuse question, the layer table's coverage and
    its agreement with the predictor it was made to follow."""

    by_key: dict[tuple[str, str], list[QuestionScores]] = {}
    for s in scores:
        if s.slice == OVERALL:
            by_key.setdefault((s.question, s.table), []).append(s)
    agree = {a.table: a for a in agreement}
    lines = []
    for (question, table), rows in by_key.items():
        first = rows[0]
        cells = ", ".join(f"{s.predictor} {s.top1:.4f} ({s.log_loss:.3f})" for s in rows)
        line = (
            f"{question}, {table} ({first.positions:,} {QUESTION_POSITIONS.get(question, 'positions')}, "
            f"{first.positions_without_site:,} without call site): top-1 (log-loss) {cells}"
        )
        a = agree.get(table) if question == QUESTION else None
        if a is not None:
            line += (
                f"; the table covers {a.coverage:.1%} of the frees and keeps as the "
                f"{_AGAINST.get(a.against, a.against)} does on {a.keep_agreement:.1%} of those"
            )
            if a.site_coverage > 0:  # NaN or 0: no call site it knows
                line += (
                    f" ({a.site_coverage:.1%} of the frees answered by call site, "
                    f"{a.keep_agreement_at_sites:.1%} agreement there)"
                )
            if a.context_coverage > 0:  # NaN or 0: no allocation context it knows
                line += (
                    f" ({a.context_coverage:.1%} by allocation context, "
                    f"{a.keep_agreement_at_contexts:.1%} agreement there)"
                )
        if _siteless(first):
            line += f"; this table's traces have {NO_CALL_SITES}"
        lines.append(line)
    return lines


def _siteless(s: QuestionScores) -> bool:
    """Whether none of the positions scored had a call site: traces recorded without callers."""
    return s.positions > 0 and s.positions_without_site == s.positions


def context_line(scores: list[QuestionScores], table: str = "unseen_runs") -> str:
    """What the calling context bought on `table` (all its workloads pooled), per question: the
    one-frame counter (site_online) against the counter on the context that knows the training
    runs (context_table), top-1 and log-loss; "" where the scores have no context_table (a
    night without stacks)."""
    pooled = {
        (s.question, s.predictor): s for s in scores if s.slice == OVERALL and s.table == table
    }
    cells = []
    for question in ("lifetime_calls", "lifetime_time", QUESTION):
        one, ctx = pooled.get((question, "site_online")), pooled.get((question, CONTEXT_TABLE))
        if one is None or ctx is None:
            continue
        cells.append(
            f"{question} top-1 {one.top1:.3f} -> {ctx.top1:.3f} ({ctx.top1 - one.top1:+.3f}), "
            f"log-loss {one.log_loss:.3f} -> {ctx.log_loss:.3f}"
        )
    if not cells:
        return ""
    return (
        f"The calling context on {table.replace('_', ' ')}, one frame (site_online) -> the "
        f"context ({CONTEXT_TABLE}): " + "; ".join(cells) + "."
    )
