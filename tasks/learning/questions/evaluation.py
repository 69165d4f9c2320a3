"""The allocator's two questions scored together: reuse of a freed class (tasks/learning/questions/reuse.py)
and lifetime of a block (tasks/learning/questions/lifetime.py), every model-free predictor on the split's
evaluation runs in the three tables, and the layer's table with its coverage and agreement.

Apart from reuse.py and lifetime.py because it needs both, and lifetime.py builds on reuse.py's
call sites."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from tasks.dataset.frame_tokens import RunStacks
from tasks.learning.answers import RunAnswers, rows_digest
from tasks.learning.evaluate import HELDOUT_WORKLOADS, UNSEEN_PROGRAMS, UNSEEN_RUNS
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    REUSE_EDGES,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.context import context_priors, run_contexts
from tasks.learning.questions.hedge import (
    EXPERTS,
    HEDGED,
    PRIOR,
    hedge_keys,
    hedged,
    process_prior,
)
from tasks.learning.questions.lifetime import (
    NETWORK_SURVIVAL,
    lifetime_answers,
    lifetime_majority,
    network_survival,
)
from tasks.learning.questions.network import (
    PREDICTOR,
    QuestionNetwork,
    distilled_lifetime,
    distilled_table,
    question_inputs,
    soon_of,
    train_network,
)
from tasks.learning.questions.reuse import (
    QUESTION,
    ReuseAnswers,
    call_sites,
    majority_of,
    reuse_answers,
    score_answers,
)
from tasks.learning.scores import OVERALL, QuestionScores
from tasks.learning.split import Split
from tasks.learning.table.distill import (
    CONTEXT_DEPTH,
    MIN_CONTEXT_FREES,
    ClassTable,
    TableAgreement,
    allocation_contexts,
    class_table,
    table_agreement,
)
from tasks.learning.train_config import QuestionsConfig


@dataclass(frozen=True)
class QuestionEvaluation:
    """The allocator's questions scored in the three tables, and the layer's table (distilled
    from the network, or from the training runs' statistics without one) with its coverage and
    agreement at each table's frees."""

    scores: tuple[QuestionScores, ...]
    table: ClassTable
    agreement: tuple[TableAgreement, ...]
    network: QuestionNetwork | None = None
    # the network's reuse answer at every evaluation run's frees (tasks/learning/answers.py)
    answers: tuple[RunAnswers, ...] = ()
    # the placement's lifetime table (keys, scores: network.distilled_lifetime), distilled from
    # the network's answers at the training runs' allocations, as the layer's table is; None
    # without a network
    lifetime_table: tuple[np.ndarray, np.ndarray] | None = None


def question_evaluation(
    split: Split,
    events: Mapping[tuple[str, str], pa.Table],
    network: QuestionsConfig | None = None,
    seed: int = 0,
    frames: Mapping[tuple[str, str], RunStacks] | None = None,
    min_context_frees: float = MIN_CONTEXT_FREES,
) -> QuestionEvaluation:
    """Every predictor of the reuse and lifetime questions (tasks/learning/questions/lifetime.py) on the
    split's evaluation runs, in the three tables (per workload and pooled as "all"); the
    majorities from its training runs, and the network (`network.network`) trained on them, the
    layer's table distilled from it. `events`: each training and scored run's, by (workload,
    run), as tasks.learning.split.question_events reads them (the calls the next-call model's
    evaluation scores); `frames`: the same runs' stacks (read_run_stacks), which the context
    counters and the network read (None: no context counters, and the network reads padding);
    `min_context_frees`: the training frees a table's (allocation context, class) key needs
    (the night's: distill.MIN_CONTEXT_FREES; studies/night_context_table tries others)."""

    def stacks(key: tuple[str, str]) -> RunStacks | None:
        return None if frames is None else frames[key]

    train_runs = sorted({(r.workload, r.run) for r in split.train})
    train_events = [events[k] for k in train_runs]
    majority = majority_of(train_events)
    lifetime_maj = lifetime_majority(train_events)
    # the context counters' training counts (context_table), keyed on each call's stack;
    # without the stacks read, no context counters
    priors = {}
    # the rows' contexts at the layer table's depth (its format 4 keys); None without stacks
    table_ctx: list[np.ndarray] | None = None
    if frames is not None:
        train_ctx = [
            run_contexts(frames[k].frames, t) for k, t in zip(train_runs, train_events, strict=True)
        ]
        priors = context_priors(train_events, train_ctx)
        table_ctx = [c[CONTEXT_DEPTH] for c in train_ctx]
        del train_ctx

    def counters(t: pa.Table) -> dict[str, ReuseAnswers]:
        return {QUESTION: reuse_answers(t, majority), **lifetime_answers(t, lifetime_maj)}

    net, lifetime = None, None
    if network is not None and network.network:
        train_inputs = [
            question_inputs(t, counters(t), stacks(k))
            for t, k in zip(train_events, train_runs, strict=True)
        ]
        net = train_network(train_inputs, network, seed)
        # both tables from one answer of the network at every training call
        train_answers = [net.answer(i) for i in train_inputs]
        alloc_ctx = (
            None
            if table_ctx is None
            else [allocation_contexts(t, c) for t, c in zip(train_events, table_ctx, strict=True)]
        )
        known = distilled_table(train_inputs, train_answers, majority, alloc_ctx)
        lifetime = distilled_lifetime(train_inputs, train_answers)
        del train_inputs, train_answers, alloc_ctx
    else:
        known = class_table(train_events, majority, table_ctx)
    del train_events, table_ctx
    if known.context_counts is not None:
        # the keys the night's file holds (and the table answers from): enough training frees,
        # bounded in number (distill.MIN_CONTEXT_FREES, MAX_TABLE_CONTEXTS)
        known = replace(known, context_counts=known.context_counts.bounded(min_context_frees))
    scores: list[QuestionScores] = []
    agreement: list[TableAgreement] = []
    kept: dict[tuple[str, str], RunAnswers] = {}  # the network's answers, for whatif
    for table, runs in (
        (UNSEEN_RUNS, split.evaluation),
        (UNSEEN_PROGRAMS, split.unseen_programs),
        (HELDOUT_WORKLOADS, split.heldout),
    ):
        # {question: {workload: [answers of each run]}}
        by_q: dict[str, dict[str, list[ReuseAnswers]]] = {}
        for w, r in sorted({(x.workload, x.run) for x in runs}):
            t, stack = events[(w, r)], stacks((w, r))
            ctx = None if stack is None else run_contexts(stack.frames, t)
            answers = {
                QUESTION: reuse_answers(
                    t, majority, known=known, contexts=ctx, prior=priors.get(QUESTION)
                ),
                **lifetime_answers(t, lifetime_maj, contexts=ctx, priors=priors),
            }
            if net is not None:
                # the network reads each call's stack
                said = net.answer(question_inputs(t, answers, stack))
                _add_network_answers(t, answers, said, majority, lifetime_maj)
                kept[(w, r)] = RunAnswers(
                    w, r, rows_digest=rows_digest(t), soon=soon_of(t, said[QUESTION])
                )
            for q, a in answers.items():
                by_q.setdefault(q, {}).setdefault(w, []).append(a)
        in_table, held_to = _table_scores(table, by_q, net is not None)
        scores += in_table
        agreement += held_to
    return QuestionEvaluation(
        tuple(scores),
        known,
        tuple(agreement),
        net,
        tuple(kept[k] for k in sorted(kept)),
        lifetime,
    )


def _add_network_answers(
    t: pa.Table,
    answers: dict[str, ReuseAnswers],
    said: dict[str, np.ndarray],
    majority: np.ndarray,
    lifetime_maj: dict[str, np.ndarray],
) -> None:
    """Beside each question's counters on the run `t`: the network's answers (`said`), its
    survival form for the lifetimes, the process's prior and the hedge of them all."""
    order, starts = process_order(t)  # the run's order, classes and sites, read once for both
    req_cls, free_cls = request_and_free_classes(t)
    sites = call_sites(t)
    _network_answers(t, answers, said, majority, lifetime_maj, (order, starts, req_cls, sites))
    hedge_answers(order, starts, sites, req_cls, free_cls, answers)


def _network_answers(
    t: pa.Table,
    answers: dict[str, ReuseAnswers],
    said: dict[str, np.ndarray],
    majority: np.ndarray,
    lifetime_maj: dict[str, np.ndarray],
    keys: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """_add_network_answers before the hedge: the network's answers, their survival form for
    the lifetimes and the process's prior. `keys`: the run's (process order, process starts,
    request classes, call sites) where the caller has them; else read from `t`."""
    if keys is None:
        keys = (*process_order(t), request_and_free_classes(t)[0], call_sites(t))
    order, starts, req_cls, sites = keys
    for q, a in answers.items():
        a.probs[PREDICTOR] = said[q][a.rows]
        if q != QUESTION:
            a.probs[NETWORK_SURVIVAL] = network_survival(
                order, starts, req_cls, sites, a, a.probs[PREDICTOR]
            )
        # the expert the mixture falls back on: the process's own classes so far, from the
        # training runs' majority (never worse than it for long)
        q_maj, edges = (
            (majority, len(REUSE_EDGES))
            if q == QUESTION
            else (lifetime_maj[q], len(LIFETIME_CALL_EDGES))
        )
        a.probs[PRIOR] = process_prior(order, starts, a.learnt, a.rows, q_maj, a.labels, edges)


def hedge_answers(
    order: np.ndarray,
    starts: np.ndarray,
    sites: np.ndarray,
    req_cls: np.ndarray,
    free_cls: np.ndarray,
    answers: dict[str, ReuseAnswers],
    past: Collection[str] = (QUESTION,),
) -> None:
    """HEDGED beside each question's experts on one run (`order`, `starts`: process_order;
    `sites`: call_sites; the classes: request_and_free_classes), a step of its own so that a
    study can hedge answers it kept. `past`: the questions whose share goes back to what served
    the process (hedge.hedged); the others' goes back evenly."""
    for q, a in answers.items():
        # the network corrected inside the run by what each predictor got right, as each
        # answer's class becomes known, in part before the whole (a block still live past an
        # edge; a freed class not requested by an edge), keyed by the class the question is
        # about: the freed block's for reuse, the requested one's for a lifetime (they differ
        # at a realloc)
        keys = hedge_keys(sites, free_cls if q == QUESTION else req_cls)
        # reuse's share goes back to what served the process so far: its labels are known
        # whole within the last edge, so its past posteriors are a fair record. A lifetime's
        # goes back evenly: early in a process only short lives are known, and the even share
        # keeps the majority and process_prior, which answer for the long ones
        # (docs/learning-questions.md#the-hedge)
        a.probs[HEDGED] = hedged(
            order, starts, a.learnt, a.rows, a.labels,
            [a.probs[e] for e in EXPERTS if e in a.probs], keys=keys[a.rows],
            past=q in past,
        )  # fmt: skip


def _table_scores(
    table: str, by_q: dict[str, dict[str, list[ReuseAnswers]]], networked: bool
) -> tuple[list[QuestionScores], list[TableAgreement]]:
    """One evaluation table's scores (each workload and pooled, per question) and the layer's
    table held to what it was made from: the network, else the class counter."""
    scores: list[QuestionScores] = []
    for q, by_workload in by_q.items():
        for w, answers in by_workload.items():
            scores += score_answers(answers, table, w, q)
        pooled = [a for answers in by_workload.values() for a in answers]
        scores += score_answers(pooled, table, OVERALL, q)
    frees = [a for answers in by_q.get(QUESTION, {}).values() for a in answers]
    if not frees:
        return scores, []
    against = PREDICTOR if networked else "class_online"
    agreement = table_agreement(
        table,
        np.concatenate([a.table_covered for a in frees]),
        np.concatenate([a.probs["table"] for a in frees]),
        np.concatenate([a.probs[against] for a in frees]),
        against,
        np.concatenate([a.table_at_site for a in frees]),
        np.concatenate([a.table_at_context for a in frees]),
    )
    return scores, [agreement]
