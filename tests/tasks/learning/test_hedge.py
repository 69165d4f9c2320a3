"""The network corrected inside the run (tasks/learning/hedge.py): causal, and as good as the
best of its predictors on each process."""

from __future__ import annotations

import numpy as np

from tasks.learning.hedge import SHARE, censored_events, due_events, hedge_keys, hedged


def _process(rng, n=2000, k=5, procs=2):
    """Rows in table order = process order; two processes; every row asks; labels known a few
    rows later (some never)."""
    order = np.arange(n)
    starts = np.zeros(n, bool)
    starts[:: n // procs] = True
    labels = rng.integers(0, k, n)
    due = np.arange(n) + rng.integers(1, 50, n)
    due[rng.random(n) < 0.1] = -1
    ends = np.flatnonzero(np.append(starts[1:], True))
    proc = np.cumsum(starts) - 1
    due = np.where(due <= ends[proc], due, -1)
    return order, starts, due, np.arange(n), labels


def _experts(rng, labels, k, sharp):
    """An expert that puts `sharp` on the true class (0: a uniform one)."""
    p = np.full((len(labels), k), (1 - sharp) / (k - 1) if sharp else 1 / k)
    if sharp:
        p[np.arange(len(labels)), labels] = sharp
    return p


def _loss(p, labels):
    return float(-np.log(p[np.arange(len(labels)), labels]).mean())


def test_an_answer_reads_only_the_labels_known_before_it():
    rng = np.random.default_rng(0)
    order, starts, due, rows, labels = _process(rng)
    experts = [rng.dirichlet(np.ones(5), len(rows)) for _ in range(3)]
    before = hedged(order, starts, due_events(due), rows, labels, experts)
    cut = 1200
    # every label that becomes known after the cut, and every answer after it, changed
    later = (due > cut) | (due < 0)
    labels2 = np.where(later, (labels + 1) % 5, labels)
    experts2 = [
        np.where((rows > cut)[:, None], rng.dirichlet(np.ones(5), len(rows)), e) for e in experts
    ]
    after = hedged(order, starts, due_events(due), rows, labels2, experts2)
    np.testing.assert_array_equal(before[: cut + 1], after[: cut + 1])
    assert not np.array_equal(before[cut + 1 :], after[cut + 1 :])


def test_the_mixture_is_as_good_as_its_best_predictor_on_each_process():
    rng = np.random.default_rng(1)
    order, starts, due, rows, labels = _process(rng)
    half = len(rows) // 2
    # the first process is answered well by expert 0, the second by expert 1; expert 2 is flat
    good0 = _experts(rng, labels, 5, 0.8)
    good1 = _experts(rng, labels, 5, 0.8)
    flat = _experts(rng, labels, 5, 0)
    bad0, bad1 = good0.copy(), good1.copy()
    bad0[half:] = np.roll(good0[half:], 1, axis=1)
    bad1[:half] = np.roll(good1[:half], 1, axis=1)
    mixed = hedged(order, starts, due_events(due), rows, labels, [bad0, bad1, flat])
    for part in (slice(0, half), slice(half, None)):
        best = min(_loss(e[part], labels[part]) for e in (bad0, bad1, flat))
        # the mixture's price: the fixed share (-log(1 - SHARE) a label) and the first labels
        assert _loss(mixed[part], labels[part]) <= best - np.log(1 - SHARE) + 0.02
    # with no label known yet, the predictors count alike
    np.testing.assert_allclose(mixed[0], (bad0[0] + bad1[0] + flat[0]) / 3)
    np.testing.assert_allclose(mixed.sum(axis=1), 1.0)


def test_each_call_site_learns_which_predictor_to_trust_for_it():
    rng = np.random.default_rng(2)
    order, starts, due, rows, labels = _process(rng, procs=1)
    site = rng.integers(0, 2, len(rows))  # two call sites, interleaved
    good0 = _experts(rng, labels, 5, 0.8)
    good1 = _experts(rng, labels, 5, 0.8)
    # expert 0 is right at site 0 only, expert 1 at site 1 only
    e0 = np.where((site == 0)[:, None], good0, np.roll(good0, 1, axis=1))
    e1 = np.where((site == 1)[:, None], good1, np.roll(good1, 1, axis=1))
    flat = _experts(rng, labels, 5, 0)
    keys = hedge_keys(site, np.full(len(rows), 3))
    per_site = hedged(order, starts, due_events(due), rows, labels, [e0, e1, flat], keys=keys)
    per_process = hedged(order, starts, due_events(due), rows, labels, [e0, e1, flat])
    best = min(_loss(e, labels) for e in (e0, e1, flat))
    assert _loss(per_site, labels) < best - 0.5  # better than any predictor alone
    assert _loss(per_site, labels) < _loss(per_process, labels) - 0.5


def test_a_lifetime_is_known_in_part_while_the_block_lives():
    # one process of 20 rows; block 0 freed at row 10, block 1 never freed, row 2 asks nothing
    starts = np.zeros(20, bool)
    starts[0] = True
    crossing = np.array([[5, 8, 12], [6, 15, 30], [-1, -1, -1]])
    crossing = np.vstack([crossing, np.full((17, 3), -1)])
    end = np.full(20, -1)
    end[0] = 10
    row, of, j = censored_events(starts, crossing, end)
    # block 0: above classes 0 and 1 at rows 5 and 8, its class at its free; its crossing at 12
    # comes after the free (it did not outlive that edge); block 1: above 0 and 1, row 30 is past
    # the process
    assert list(zip(row, of, j)) == [(5, 0, 0), (6, 1, 0), (8, 0, 1), (10, 0, -1), (15, 1, 1)]


def test_a_class_known_at_once_counts_its_whole_likelihood():
    # GIVEN one process whose every label is the last class, known whole a few rows later with
    # nothing known before (a reuse class "later or never" without its crossings); expert 0
    # puts 0.9 on that class, expert 1 0.9 on the first
    rng = np.random.default_rng(3)
    order, starts, due, rows, _ = _process(rng, procs=1)
    labels = np.full(len(rows), 4)
    right = _experts(rng, labels, 5, 0.9)
    wrong = _experts(rng, np.zeros(len(rows), np.int64), 5, 0.9)
    mixed = hedged(order, starts, due_events(due), rows, labels, [right, wrong])
    # THEN the right expert earns the weight (a label alone is P(label), not P(label | >= label),
    # which is 1 for the last class and taught nothing: the mixture stayed at 0.77 nats, the
    # two experts' mean), so the mixture follows it, up to what the fixed share keeps back
    assert _loss(mixed[100:], labels[100:]) < _loss(right, labels) + 0.05
    # and crossings then the label teach it as well (each step its share of the likelihood)
    crossing = np.full((len(rows), 4), -1)
    known = due >= 0
    crossing[known] = due[known, None]  # all four edges passed at the row the label is known
    stepwise = hedged(
        order, starts, censored_events(starts, crossing, due), rows, labels, [right, wrong]
    )
    assert _loss(stepwise[100:], labels[100:]) < _loss(right, labels) + 0.1
