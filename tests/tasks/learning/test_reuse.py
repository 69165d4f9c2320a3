"""Causal predictors of the reuse question (tasks/learning/reuse.py), against plain Python."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.learning.labels import REUSE_CLASSES, REUSE_EDGES
from tasks.learning.reuse import (
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
        for f in earlier:  # an earlier free of class c, counted if its request came before i
            rf = rows[f]
            if rf["freed_size"] is None or rf["op"] not in (3, 4, 5) or _cls(rf["freed_size"]) != c:
                continue
            req = next(
                (
                    j
                    for j in earlier
                    if j > f
                    and rows[j]["op"] in defining
                    and rows[j]["addr"] != 0
                    and _cls(rows[j]["size"]) == c
                ),
                None,
            )
            if req is None:
                continue
            b = _bucket(earlier.index(req) - earlier.index(f), REUSE_EDGES)  # process calls
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
