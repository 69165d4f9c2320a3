"""Causal predictors of the lifetime question (tasks/learning/questions/lifetime.py), against plain Python."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.format.trace_reader import Op
from tasks.learning.labels import (
    LIFETIME_CALL_EDGES,
    LIFETIME_CLASSES,
    LIFETIME_NS_EDGES,
    REUSE_CLASSES,
    process_order,
    request_and_free_classes,
)
from tasks.learning.questions.lifetime import (
    SURVIVAL,
    lifetime_answers,
    lifetime_majority,
    network_survival,
)
from tasks.learning.questions.reuse import call_sites, reuse_answers
from tests.tasks.learning.questions.test_reuse import _with_callers
from tests.tasks.learning.test_labels import _bucket, _cls, _events, _reference


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


def _freed_after(t: pa.Table, cut: int) -> tuple[np.ndarray, ...]:
    """(each row's place in its process's call order, never freed, lifetime in calls, freed
    after row `cut` of the process) per row of `t` (process rows ~ table rows here)."""
    order, _ = process_order(t)
    where = np.empty(len(order), np.int64)
    where[order] = np.arange(len(order))
    calls = t.column("lifetime_calls")
    never = np.asarray(calls.is_null().to_numpy(zero_copy_only=False), bool)
    life = calls.fill_null(0).to_numpy()
    return where, never, life, ~never & (where + life > cut)


def test_the_survival_counter_reads_only_what_is_known_before_the_call():
    # GIVEN a run, and the same run where every block still live at row `cut` of its process
    # lives longer or is never freed (all that changes is known only after the cut)
    t = _with_callers(_events(11, n=400), 11)
    cut = 250
    where, never, life, later = _freed_after(t, cut)
    longer = pa.array(np.where(later, life + 5000, life), mask=never | (later & (life % 2 == 0)))
    ns = t.column("lifetime_ns")
    ns2 = pa.array(
        np.where(later, ns.fill_null(0).to_numpy() * 1000, ns.fill_null(0).to_numpy()),
        mask=never | (later & (life % 2 == 0)),
    )
    u = t.set_column(t.column_names.index("lifetime_calls"), "lifetime_calls", longer)
    u = u.set_column(u.column_names.index("lifetime_ns"), "lifetime_ns", ns2)
    maj = lifetime_majority([t])
    a, b = lifetime_answers(t, maj), lifetime_answers(u, maj)
    # THEN every answer at or before the cut is the same
    for q in ("lifetime_calls",):
        early = where[a[q].rows] <= cut
        np.testing.assert_array_equal(a[q].rows, b[q].rows)
        np.testing.assert_array_equal(a[q].probs[SURVIVAL][early], b[q].probs[SURVIVAL][early])
        assert not np.array_equal(a[q].probs[SURVIVAL][~early], b[q].probs[SURVIVAL][~early])


def _never_freed(n: int) -> pa.Table:
    """One process, one call site, n 64-byte blocks never freed."""
    return pa.table(
        {
            "pid": pa.array(np.full(n, 7, np.uint32)),
            "thread": pa.array(np.zeros(n, np.uint16)),
            "seq": pa.array(np.arange(n, dtype=np.uint64)),
            "time_ns": pa.array(np.arange(n, dtype=np.int64) * 1000),
            "op": pa.array(np.full(n, int(Op.MALLOC), np.uint8)),
            "size": pa.array(np.full(n, 64, np.uint64)),
            "addr": pa.array(0x1000 + np.arange(n, dtype=np.uint64) * 64),
            "freed_size": pa.nulls(n, pa.uint64()),
            "lifetime_ns": pa.nulls(n, pa.int64()),
            "lifetime_calls": pa.nulls(n, pa.int64()),
        }
    )


def test_the_survival_counter_learns_long_lives_before_any_free():
    # GIVEN one process and one call site whose 64-byte blocks are never freed
    t = _never_freed(2000)
    got = lifetime_answers(t, lifetime_majority([t]))["lifetime_calls"]
    # THEN the counters of freed blocks never learn a thing, the survival counter does: blocks
    # have outlived 16 and 256 calls, so those classes are all but ruled out (what lies past
    # the oldest block's age, 2000 calls, it cannot know yet)
    last = got.probs[SURVIVAL][-1]
    assert last[:2].sum() < 0.01 and last[2:].sum() > 0.99
    np.testing.assert_allclose(got.probs["site_online"][-1], 1 / LIFETIME_CLASSES)
    # at the first call it knows nothing: even hazards, 1/2 a class
    np.testing.assert_allclose(
        got.probs[SURVIVAL][0], [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 32]
    )


def _network_survival(t: pa.Table, question: str, network: np.ndarray) -> np.ndarray:
    a = lifetime_answers(t, lifetime_majority([t]))[question]
    order, starts = process_order(t)
    req_cls, _ = request_and_free_classes(t)
    return network_survival(order, starts, req_cls, call_sites(t), a, network)


def test_the_network_survival_starts_from_the_network_and_learns_the_sites_own_lives():
    # GIVEN a network sure that every block is freed within 16 calls (class 0), at a site whose
    # blocks are never freed
    t = _never_freed(2000)
    net = np.tile([0.97, 0.01, 0.01, 0.005, 0.0025, 0.0025], (t.num_rows, 1))
    got = _network_survival(t, "lifetime_calls", net)
    # THEN at the first call, with nothing known of the site, it answers as the network
    np.testing.assert_allclose(got[0], net[0], atol=1e-6)
    # and once the site's blocks have outlived 16 and 256 calls, it no longer believes it
    assert got[-1][:2].sum() < 0.01 and got[-1][2:].sum() > 0.99


def test_the_network_survival_reads_only_what_is_known_before_the_call():
    # GIVEN a run, the network's answers at its allocations, and the same run where every block
    # freed after row `cut` of its process lives longer (known only after the cut), with the
    # network's answers after the cut changed too
    t = _with_callers(_events(12, n=400), 12)
    cut = 250
    where, never, life, later = _freed_after(t, cut)
    u = t.set_column(
        t.column_names.index("lifetime_calls"),
        "lifetime_calls",
        pa.array(np.where(later, life + 5000, life), mask=never),
    )
    rows = lifetime_answers(t, lifetime_majority([t]))["lifetime_calls"].rows
    rng = np.random.default_rng(0)
    net = rng.dirichlet(np.ones(LIFETIME_CLASSES), len(rows))
    net2 = np.where((where[rows] > cut)[:, None], net[::-1], net)
    a = _network_survival(t, "lifetime_calls", net)
    b = _network_survival(u, "lifetime_calls", net2)
    # THEN every answer at or before the cut is the same, and some later ones differ
    early = where[rows] <= cut
    np.testing.assert_array_equal(a[early], b[early])
    assert not np.array_equal(a[~early], b[~early])
    np.testing.assert_allclose(a.sum(axis=1), 1.0)


def test_the_network_survival_refuses_answers_that_are_not_a_lifetimes():
    # GIVEN the reuse question's answers (their own classes and events, not a lifetime's)
    t = _with_callers(_events(13, n=200), 13)
    reuse = reuse_answers(t, np.full(REUSE_CLASSES, 1.0 / REUSE_CLASSES))
    order, starts = process_order(t)
    req_cls, _ = request_and_free_classes(t)
    net = np.full((len(reuse.rows), LIFETIME_CLASSES), 1.0 / LIFETIME_CLASSES)
    # THEN it says what it needs rather than answer from nothing
    with pytest.raises(ValueError, match="lifetime question"):
        network_survival(order, starts, req_cls, call_sites(t), reuse, net)
