"""Causal predictors of the reuse question (tasks/learning/questions/reuse.py), against plain Python."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.format.trace_reader import Op
from tasks.learning.labels import REUSE_CLASSES, REUSE_EDGES
from tasks.learning.questions.reuse import (
    call_sites,
    majority_of,
    question_markdown,
    question_metrics,
    reuse_answers,
    score_answers,
)
from tests.tasks.learning.test_labels import _bucket, _cls, _events, _reference


def _with_callers(t: pa.Table, seed: int, missing: float = 0.2) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = t.num_rows
    module = pa.array(rng.choice(["/usr/bin/prog", "/lib/libc.so.6"], n)).dictionary_encode()
    none = rng.random(n) < missing
    offset = pa.array(rng.integers(0, 3, n).astype(np.uint64) * 16, mask=none)
    return t.append_column("caller_module", module).append_column("caller_offset", offset)


def _online_reference(t: pa.Table, by_site: bool, eps: float = 0.1) -> dict[int, list[float]]:
    """{row: distribution} at every labelled free, the counters run call by call in Python."""
    rows = t.to_pylist()
    sites = call_sites(t) if by_site else np.full(len(rows), -1)
    defining = {1, 2, 3, 4}  # MALLOC, CALLOC, REALLOC, REALLOCARRAY
    out: dict[int, list[float]] = {}
    for i, r in enumerate(rows):
        if r["freed_size"] is None or r["op"] not in (3, 4, 5):
            continue
        c = _cls(r["freed_size"])
        counts_c = [0] * REUSE_CLASSES
        counts_s = [0] * REUSE_CLASSES
        earlier = [j for j in range(i) if rows[j]["pid"] == r["pid"]]
        upto = [*earlier, i]  # a request at row i itself (a realloc's) is known at row i
        for f in earlier:  # an earlier free of class c, counted once its class is known at i:
            rf = rows[f]  # its request came by row i, or the last edge passed without one
            if rf["freed_size"] is None or rf["op"] not in (3, 4, 5) or _cls(rf["freed_size"]) != c:
                continue
            req = next(
                (
                    j
                    for j in upto
                    if j > f
                    and rows[j]["op"] in defining
                    and rows[j]["addr"] != 0
                    and _cls(rows[j]["size"]) == c
                ),
                None,
            )
            waited = len(earlier) - earlier.index(f)  # process calls from f to i
            if req is not None:
                b = _bucket(upto.index(req) - upto.index(f), REUSE_EDGES)
            elif waited > REUSE_EDGES[-1]:
                b = REUSE_CLASSES - 1  # "later or never", whatever comes after
            else:
                continue
            counts_c[b] += 1
            if sites[f] >= 0 and sites[f] == sites[i]:
                counts_s[b] += 1
        counts = counts_s if sites[i] >= 0 and sum(counts_s) else counts_c
        out[i] = [(x + eps) / (sum(counts) + eps * REUSE_CLASSES) for x in counts]
    return out


def test_online_counters_equal_the_plain_python_reference():
    # GIVEN two interleaved processes with call sites on most rows (rows stored in call order)
    t = _with_callers(_events(4, n=300), 4)
    got = reuse_answers(t, np.full(REUSE_CLASSES, 1 / REUSE_CLASSES))
    for name, by_site in (("class_online", False), ("site_online", True)):
        want = _online_reference(t, by_site)
        # THEN at every scored free each counter answers what plain Python computes
        assert sorted(want) == got.rows.tolist()
        np.testing.assert_allclose(got.probs[name], np.array([want[i] for i in got.rows]))
    reuse, _, _ = _reference(t)
    assert got.labels.tolist() == [reuse[i] for i in got.rows]
    assert 0 < got.without_site < len(got.rows)
    assert not np.allclose(got.probs["class_online"], got.probs["site_online"])


def test_a_class_never_requested_again_is_learnt_as_later_once_the_last_edge_has_passed():
    # GIVEN one process: a free of class 7 never followed by a request of 7, REUSE_EDGES[-1] + 10
    # mallocs of class 2, then two frees of class 7, a malloc of 7 between them
    quiet = REUSE_EDGES[-1] + 10
    op = [int(Op.FREE), *[int(Op.MALLOC)] * quiet, int(Op.FREE), int(Op.MALLOC), int(Op.FREE)]
    n = len(op)
    size = [0, *[3] * quiet, 0, 100, 0]
    freed = [100, *[None] * quiet, 100, None, 100]
    t = pa.table(
        {
            "pid": pa.array(np.full(n, 7, np.uint32)),
            "thread": pa.array(np.zeros(n, np.uint16)),
            "seq": pa.array(np.arange(n, dtype=np.uint64)),
            "time_ns": pa.array(np.arange(n, dtype=np.int64)),
            "op": pa.array(np.array(op, np.uint8)),
            "size": pa.array(np.array(size, np.uint64)),
            "addr": pa.array(0x1000 + np.arange(n, dtype=np.uint64) * 16),
            "freed_size": pa.array(freed, pa.uint64()),
            "lifetime_ns": pa.array([None] * n, pa.int64()),
            "lifetime_calls": pa.array([None] * n, pa.int64()),
        }
    )
    eps = 0.1
    got = reuse_answers(t, np.full(REUSE_CLASSES, 1 / REUSE_CLASSES), eps=eps)
    assert got.rows.tolist() == [0, quiet + 1, quiet + 3]
    assert got.labels.tolist() == [REUSE_CLASSES - 1, 0, REUSE_CLASSES - 1]
    later = np.full(REUSE_CLASSES, eps / (1 + eps * REUSE_CLASSES))
    later[-1] = (1 + eps) / (1 + eps * REUSE_CLASSES)
    for name in ("class_online", "site_online"):
        p = got.probs[name]
        # THEN nothing is known at the first free; at the second, the first is known to be
        # "later or never" (its last edge passed with no request), not left uncounted
        np.testing.assert_allclose(p[0], 1 / REUSE_CLASSES)
        np.testing.assert_allclose(p[1], later)
        # and at the third, the second is known too (requested at the next call: class 0)
        want = np.full(REUSE_CLASSES, eps)
        want[[0, -1]] += 1
        np.testing.assert_allclose(p[2], want / want.sum())
    # AND what the hedge learns, and when: the first free is above each class as its edge passes
    # with no request, then known "later" at the last; the second is known at its request
    row, of, j = got.learnt
    first = [(int(r), int(c)) for r, f, c in zip(row, of, j) if f == 0]
    assert first == [(e + 1, k) for k, e in enumerate(REUSE_EDGES)] + [(REUSE_EDGES[-1] + 1, -1)]
    second = [(int(r), int(c)) for r, f, c in zip(row, of, j) if f == quiet + 1]
    assert second == [(quiet + 2, -1)]


def test_an_answer_does_not_read_the_calls_after_it():
    t = _with_callers(_events(5, n=300), 5)
    cut = 150
    # the same first 150 calls, then other calls: the answers at the first 150 rows agree
    other = _with_callers(_events(6, n=300), 6)
    mixed = pa.concat_tables([t.slice(0, cut), other.slice(cut)])
    a = reuse_answers(t, np.full(REUSE_CLASSES, 0.2))
    b = reuse_answers(mixed, np.full(REUSE_CLASSES, 0.2))
    early_a, early_b = a.rows < cut, b.rows < cut
    np.testing.assert_array_equal(a.rows[early_a], b.rows[early_b])
    for name in ("class_online", "site_online"):
        np.testing.assert_array_equal(a.probs[name][early_a], b.probs[name][early_b])


def test_a_trace_without_callers_still_scores_and_says_so():
    t = _events(7, n=200)  # no caller columns at all
    ans = reuse_answers(t, majority_of([t]))
    assert ans.without_site == len(ans.rows) > 0
    np.testing.assert_array_equal(ans.probs["site_online"], ans.probs["class_online"])
    scores = score_answers([ans], "unseen_programs", "perl.x")
    assert {s.predictor for s in scores} == {"majority", "class_online", "site_online"}
    metrics = question_metrics(scores)
    assert "reuse.unseen_programs.top1/perl_x.site_online" in metrics
    assert metrics["reuse.unseen_programs.positions_without_site/perl_x"] == len(ans.rows)
    assert all(0.0 <= s.top1 <= 1.0 and s.log_loss > 0 for s in scores)
    row = next(line for line in question_markdown(scores).splitlines() if "perl.x" in line)
    assert row.startswith(f"| unseen_programs | perl.x | {len(ans.rows)} | {len(ans.rows)} |")


def test_the_nightly_summary_shows_each_question_per_table():
    from tasks.learning.questions.reuse import question_lines
    from tasks.learning.scores import OVERALL, QuestionScores
    from tasks.learning.table.distill import TableAgreement
    from tasks.nightly.markdown import markdown_text
    from tasks.nightly.summary_model import NightlySummary

    # GIVEN the reuse and lifetime scores of two tables, and the table's agreement on one
    scores = [
        QuestionScores(q, p, sl, t, 1200, top1, 0.5, 300)
        for q in ("reuse", "lifetime_calls")
        for t in ("unseen_runs", "unseen_programs")
        for sl in ("perl", OVERALL)
        for p, top1 in (("majority", 0.4), ("class_online", 0.7), ("table", 0.6), ("network", 0.8))
    ]
    agreement = (TableAgreement("unseen_programs", 1200, 0.95, 0.9, 0.8, "network"),)
    lines = question_lines(scores, agreement)
    # THEN one line per question and table, pooled, every predictor in it
    assert len(lines) == 4
    assert lines[0].startswith("reuse, unseen_runs (1,200 frees, 300 without")
    assert lines[2].startswith("lifetime_calls, unseen_runs (1,200 allocations, 300 without")
    assert "majority 0.4000 (0.500), class_online 0.7000 (0.500), table 0.6000" in lines[1]
    assert "network 0.8000 (0.500)" in lines[1]
    # the table is held to the network it was distilled from, on the reuse question only
    assert "covers 95.0% of the frees and keeps as the network does on 90.0%" in lines[1]
    assert "covers" not in lines[0] and "covers" not in lines[3]
    md = markdown_text(
        NightlySummary(root="r", finished_at="now", stages=[], allocator_questions=lines)
    )
    assert "## The allocator's questions: the network against the counters" in md
    assert f"- {lines[1]}" in md


def test_the_layer_table_counts_each_classes_training_frees_and_answers_them():
    from tasks.learning.table.distill import FREE_TOKEN, LAYER_SOON_CLASS, class_table

    # GIVEN two training runs and their reuse labels, computed call by call in Python
    runs = [_events(11, n=300), _events(12, n=300)]
    expected = np.zeros((32, REUSE_CLASSES))
    for t in runs:
        reuse, _, _ = _reference(t)
        for r, label in zip(t.to_pylist(), reuse, strict=True):
            if label is not None and label >= 0:
                expected[_cls(r["freed_size"]), label] += 1
    majority = majority_of(runs)
    table = class_table(runs, majority)
    # THEN the table holds each class's frees by reuse class
    np.testing.assert_array_equal(table.reuse_counts, expected)
    # AND answers a class never freed in training with the majority
    probs = table.reuse_probs()
    unseen = ~expected.any(axis=1)
    assert unseen.any() and np.allclose(probs[unseen], majority)
    # AND the layer's entry of each class is its share of frees reused within 4096 calls
    scores = table.keep_scores()
    soon = probs[:, : LAYER_SOON_CLASS + 1].sum(axis=1)
    assert np.array_equal(scores[FREE_TOKEN + np.arange(32), np.arange(32)], np.rint(soon * 255))
    assert scores.sum() == scores[FREE_TOKEN + np.arange(32), np.arange(32)].sum()


def test_the_nightly_summary_says_per_unseen_program_whether_the_model_leads():
    from tasks.learning.questions.reuse import program_lines
    from tasks.learning.scores import OVERALL, QuestionScores
    from tasks.nightly.markdown import markdown_text
    from tasks.nightly.summary_model import NightlySummary

    # GIVEN two programs never trained on: on perl the hedged network leads both metrics; on
    # redis a counter has the better log-loss, and the network ties the best top-1
    def row(program, predictor, top1, log_loss, table="unseen_programs"):
        return QuestionScores("reuse", predictor, program, table, 500, top1, log_loss)

    scores = [
        row("perl", "majority", 0.5, 1.4), row("perl", "site_online", 0.61, 1.27),
        row("perl", "network", 0.60, 1.05), row("perl", "network_hedged", 0.62, 1.06),
        row("redis", "class_online", 0.84, 0.43), row("redis", "site_online", 0.90, 0.26),
        row("redis", "network_hedged", 0.90, 0.30), row("redis", "table", 0.99, 0.01),
        row(OVERALL, "network", 0.99, 0.01), row("gcc", "network", 0.99, 0.01, "unseen_runs"),
    ]  # fmt: skip
    lines = program_lines(scores)
    # THEN a line per program of the unseen-programs table, the table's answer left out (it is
    # neither the model's nor a baseline), pooled rows and other tables too
    assert lines == [
        "perl, reuse (500 frees): top-1 network_hedged 0.620 against site_online 0.610 (model "
        "ahead); log-loss network 1.050 against site_online 1.270 (model ahead); network_hedged "
        "alone: top-1 ahead, log-loss ahead",
        "redis, reuse (500 frees): top-1 network_hedged 0.900 against site_online 0.900 "
        "(baseline ahead or even); log-loss network_hedged 0.300 against site_online 0.260 "
        "(baseline ahead or even); network_hedged alone: top-1 not ahead, log-loss not ahead",
    ]
    md = markdown_text(
        NightlySummary(
            root="r",
            finished_at="now",
            stages=[],
            allocator_questions=["x"],
            program_questions=lines,
        )
    )
    assert "Per program never trained on, the best of the model's answers" in md
    assert "whether network_hedged alone" in md
    assert f"- {lines[1]}" in md


def test_a_cell_counts_as_the_hedges_only_when_it_leads_every_baseline():
    from tasks.learning.questions.reuse import HedgedCell, hedged_cells
    from tasks.learning.scores import OVERALL, QuestionScores

    def row(program, question, predictor, top1, log_loss, table="unseen_programs"):
        return QuestionScores(question, predictor, program, table, 500, top1, log_loss)

    # GIVEN three held-out cells: on perl's reuse the hedge leads every baseline; on perl's
    # lifetime it leads the best top-1 but ties a counter's log-loss and is worse than the
    # majority's; on dot it trails one counter's top-1 (not the best log-loss's counter)
    scores = [
        row("perl", "reuse", "majority", 0.5, 1.4), row("perl", "reuse", "site_online", 0.61, 1.27),
        row("perl", "reuse", "network", 0.70, 0.90), row("perl", "reuse", "network_hedged", 0.62, 1.06),
        row("perl", "lifetime_calls", "majority", 0.4, 1.0),
        row("perl", "lifetime_calls", "site_survival", 0.45, 1.2),
        row("perl", "lifetime_calls", "network_hedged", 0.5, 1.2),
        row("dot", "reuse", "class_online", 0.80, 0.9), row("dot", "reuse", "site_online", 0.7, 0.5),
        row("dot", "reuse", "network_hedged", 0.75, 0.4),
        # not cells: a pooled row, another table, a program without the hedge
        row(OVERALL, "reuse", "network_hedged", 0.99, 0.01),
        row("perl", "reuse", "network_hedged", 0.99, 0.01, "unseen_runs"),
        row("jq", "reuse", "majority", 0.5, 1.0),
    ]  # fmt: skip
    # THEN each cell's verdict holds the hedge alone (not the network's better answer) against
    # each baseline strictly
    assert hedged_cells(scores) == [
        HedgedCell("dot", "reuse", 500, False, True, False),
        HedgedCell("perl", "lifetime_calls", 500, True, False, True),
        HedgedCell("perl", "reuse", 500, True, True, False),
    ]
    assert [c.ahead for c in hedged_cells(scores)] == [False, False, True]


def test_the_layer_table_answers_by_call_site_where_training_saw_it(tmp_path):
    from tasks.learning.table.distill import LAYER_SOON_CLASS, ClassTable, class_table
    from tasks.learning.table.layer_file import CLASS_BYTES, HEADER, write_layer_table

    # GIVEN training runs with callers (some calls without), and the reuse labels and sites of
    # their frees, counted call by call in Python
    runs = [_with_callers(_events(21, n=400), 1), _with_callers(_events(22, n=400), 2)]
    expected: dict[tuple[int, int], np.ndarray] = {}
    for t in runs:
        reuse, _, _ = _reference(t)
        site = call_sites(t)
        for r, label, s in zip(t.to_pylist(), reuse, site, strict=True):
            if label is not None and label >= 0 and s >= 0:
                key = (int(s), _cls(r["freed_size"]))
                expected.setdefault(key, np.zeros(REUSE_CLASSES))[label] += 1
    table = class_table(runs, majority_of(runs))
    # THEN the table holds each (site, class)'s frees by reuse class, and knows those keys only
    assert expected and table.site_counts is not None
    known = table.site_known()
    assert {(int(s), int(c)) for s, c in zip(*np.nonzero(known), strict=True)} == set(expected)
    for (s, c), counts in expected.items():
        np.testing.assert_array_equal(table.site_counts[s, c], counts)
    # AND answers a free at a known key by it, any other (a site never seen, or none) as the
    # online counter does there, as the layer asks its own
    (s0, c0) = next(iter(expected))
    unseen = next(s for s in range(4096) if not known[s, c0])
    counter = np.array([[0.1, 0.1, 0.1, 0.1, 0.6], [0.6, 0.1, 0.1, 0.1, 0.1], [0.2] * 5])
    probs, at_site, _ = table.answer(
        np.array([s0, unseen, -1]), np.array([c0, c0, c0]), 0.1, counter
    )
    assert at_site.tolist() == [True, False, False]
    want = (expected[(s0, c0)] + 0.1) / (expected[(s0, c0)].sum() + 0.1 * REUSE_CLASSES)
    np.testing.assert_allclose(probs[0], want)
    np.testing.assert_allclose(probs[1:], counter[1:])
    # AND without a counter's answers, or in a table without site keys, by the class
    probs, _, _ = table.answer(np.array([unseen]), np.array([c0]))
    np.testing.assert_allclose(probs[0], table.reuse_probs()[c0])
    no_sites = ClassTable(table.reuse_counts, table.majority)
    probs, at_site, _ = no_sites.answer(np.array([s0]), np.array([c0]), 0.1, counter[:1])
    assert not at_site.any()
    np.testing.assert_allclose(probs[0], table.reuse_probs()[c0])
    # AND, as the layer, a table whose file has no site entry (traces without callers) too
    empty = ClassTable(table.reuse_counts, table.majority, np.zeros_like(table.site_counts))
    probs, at_site, _ = empty.answer(np.array([s0]), np.array([c0]), 0.1, counter[:1])
    assert not at_site.any()
    np.testing.assert_allclose(probs[0], table.reuse_probs()[c0])
    # AND the layer's file (format 3) carries the known keys' scores, keys rising
    raw = write_layer_table(tmp_path / "t.hcltab", table, 4).read_bytes()
    assert HEADER.unpack_from(raw)[1] == 3
    assert HEADER.unpack_from(raw)[4] == len(raw) - HEADER.size == CLASS_BYTES + 4 * known.sum()
    words = np.frombuffer(raw[HEADER.size + CLASS_BYTES :], "<u4")
    keys = words >> 8
    assert (np.diff(keys.astype(np.int64)) > 0).all()
    np.testing.assert_array_equal(keys, np.flatnonzero(known.ravel()))
    at = np.flatnonzero(keys == s0 * 32 + c0)[0]
    assert words[at] & 0xFF == round(255 * want[: LAYER_SOON_CLASS + 1].sum())


def test_the_question_lines_say_plainly_where_traces_had_no_call_sites():
    from tasks.dataset.sites import has_call_sites
    from tasks.learning.questions.reuse import program_lines, question_lines
    from tasks.learning.scores import OVERALL, QuestionScores

    # GIVEN perl traced with --no-caller (no free has a call site) and redis with callers,
    # pooled in unseen_programs; and a table whose every trace had none
    def row(program, predictor, positions, without, table="unseen_programs"):
        return QuestionScores("reuse", predictor, program, table, positions, 0.6, 1.0, without)

    scores = [
        row(program, p, n, without, table)
        for program, n, without, table in (
            ("perl", 500, 500, "unseen_programs"),
            ("redis", 500, 20, "unseen_programs"),
            (OVERALL, 1000, 520, "unseen_programs"),
            (OVERALL, 300, 300, "unseen_runs"),
        )
        for p in ("class_online", "network")
    ]
    said = "no call sites (recorded with --no-caller): site_online answers as class_online"
    # THEN the program without them says so, the one with them does not
    perl, redis = program_lines(scores)
    assert perl.startswith("perl, reuse") and f"; perl's traces have {said}" in perl
    assert redis.startswith("redis, reuse") and "no call sites" not in redis
    # AND so does a table none of whose traces had them, not one where some had
    pooled = {line.split(" (")[0]: line for line in question_lines(scores)}
    assert f"; this table's traces have {said}" in pooled["reuse, unseen_runs"]
    assert "no call sites" not in pooled["reuse, unseen_programs"]
    # the events a trace without callers gives have no call site; with them, some
    assert not has_call_sites(_events(7, n=50))
    assert has_call_sites(_with_callers(_events(7, n=50), 7))
    assert not has_call_sites(_with_callers(_events(7, n=50), 7, missing=1.0))


def test_the_context_line_says_what_the_context_bought_over_one_frame_and_nothing_without():
    from tasks.learning.questions.reuse import context_line
    from tasks.learning.scores import OVERALL, QuestionScores

    # GIVEN pooled unseen-runs scores of the one-frame counter and the context's, and a
    # workload's row that the line must not read
    def row(question, predictor, top1, loss, slice_=OVERALL, table="unseen_runs"):
        return QuestionScores(question, predictor, slice_, table, 100, top1, loss)

    scores = [
        row("lifetime_calls", "site_online", 0.727, 1.19),
        row("lifetime_calls", "context_table", 0.862, 0.48),
        row("lifetime_calls", "context_table", 0.1, 9.0, slice_="perl"),
        row("reuse", "site_online", 0.80, 0.60),
        row("reuse", "context_table", 0.83, 0.55),
        row("reuse", "context_table", 0.99, 0.01, table="unseen_programs"),
    ]
    # THEN one line, each question's top-1 and log-loss from one frame to the context
    line = context_line(scores)
    assert line.startswith("The calling context on unseen runs, one frame (site_online) -> ")
    assert "lifetime_calls top-1 0.727 -> 0.862 (+0.135), log-loss 1.190 -> 0.480" in line
    assert "reuse top-1 0.800 -> 0.830 (+0.030), log-loss 0.600 -> 0.550" in line
    assert "lifetime_time" not in line
    # AND a night without stacks (no context_table) gets no line
    assert context_line([s for s in scores if s.predictor == "site_online"]) == ""
