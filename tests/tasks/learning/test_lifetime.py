"""Causal predictors of the lifetime question (tasks/learning/lifetime.py), against plain Python."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.learning.labels import LIFETIME_CALL_EDGES, LIFETIME_CLASSES, LIFETIME_NS_EDGES
from tasks.learning.lifetime import lifetime_answers, lifetime_majority
from tasks.learning.reuse import call_sites
from tests.tasks.learning.test_labels import _bucket, _cls, _events, _reference
from tests.tasks.learning.test_reuse import _with_callers


def _online_reference(t, by_site: bool, question: str, eps: float = 0.1):
    rows = t.to_pylist()
    sites = call_sites(t) if by_site else np.full(len(rows), -1)
    defining = {1, 2, 3, 4}
    asks = [r["op"] in defining and r["addr"] != 0 for r in rows]
    out = {}
    for i, r in enumerate(rows):
        if not asks[i]:
            continue
        proc = [j for j in range(len(rows)) if rows[j]["pid"] == r["pid"]]
        pi = proc.index(i)
        c = _cls(r["size"])
        counts_c = [0] * LIFETIME_CLASSES
        counts_s = [0] * LIFETIME_CLASSES
        for a in proc[:pi]:
            ra = rows[a]
            if not asks[a] or _cls(ra["size"]) != c or ra["lifetime_calls"] is None:
                continue
            free_at = proc.index(a) + ra["lifetime_calls"]  # the free, in process calls
            if free_at > pi or free_at >= len(proc):
                continue
            if question == "lifetime_calls":
                b = _bucket(ra["lifetime_calls"], LIFETIME_CALL_EDGES)
            else:
                b = _bucket(ra["lifetime_ns"], LIFETIME_NS_EDGES)
            counts_c[b] += 1
            if sites[a] >= 0 and sites[a] == sites[i]:
                counts_s[b] += 1
        counts = counts_s if sites[i] >= 0 and sum(counts_s) else counts_c
        out[i] = [(x + eps) / (sum(counts) + eps * LIFETIME_CLASSES) for x in counts]
    return out


def test_lifetime_counters_equal_the_plain_python_reference():
    # GIVEN two processes whose blocks die within a few calls (so counters learn in the trace)
    t = _with_callers(_events(8, n=300), 8)
    col = t.column("lifetime_calls")
    never = np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)
    short = pa.array(np.minimum(col.fill_null(0).to_numpy(), 40), mask=never)
    t = t.set_column(t.column_names.index("lifetime_calls"), "lifetime_calls", short)
    got = lifetime_answers(t, lifetime_majority([t]))
    _, calls, time = _reference(t)
    for question, labels in (("lifetime_calls", calls), ("lifetime_time", time)):
        ans = got[question]
        assert ans.labels.tolist() == [labels[i] for i in ans.rows]
        for name, by_site in (("class_online", False), ("site_online", True)):
            want = _online_reference(t, by_site, question)
            # THEN at every allocation each counter answers what plain Python computes
            assert sorted(want) == ans.rows.tolist()
            np.testing.assert_allclose(ans.probs[name], np.array([want[i] for i in ans.rows]))
        learnt = ans.probs["class_online"].max(axis=1) > 1.5 / LIFETIME_CLASSES
        assert learnt.any()  # the counters did learn something in this trace


def test_a_lifetime_answer_does_not_read_the_calls_after_it():
    t = _with_callers(_events(9, n=300), 9)
    other = _with_callers(_events(10, n=300), 10)
    cut = 150
    mixed = pa.concat_tables([t.slice(0, cut), other.slice(cut)])
    maj = lifetime_majority([t])
    a, b = lifetime_answers(t, maj), lifetime_answers(mixed, maj)
    for q in ("lifetime_calls", "lifetime_time"):
        early_a, early_b = a[q].rows < cut, b[q].rows < cut
        np.testing.assert_array_equal(a[q].rows[early_a], b[q].rows[early_b])
        for name in ("class_online", "site_online"):
            np.testing.assert_array_equal(a[q].probs[name][early_a], b[q].probs[name][early_b])
