"""The network corrected inside the run (tasks/learning/questions/hedge.py): causal, and as good as the
best of its predictors on each process."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.learning.questions.hedge import (
    SHARE,
    censored_events,
    due_events,
    hedge_keys,
    hedged,
    process_prior,
)


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


def _fixed(p, n):
    return np.broadcast_to(p, (n, len(p))).copy()


def _fooled(rng, n=3000, k=5, right=False):
    """One process whose classes follow the training runs' majority, labels known 1-50 rows
    later; a network that puts ~1 on a wrong class at every call (right: 0.9 on the true one)
    and two slow counters (uniform: they have learnt nothing yet)."""
    order, starts, due, rows, _ = _process(rng, n=n, k=k, procs=1)
    majority = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    labels = rng.choice(k, n, p=majority)
    if right:
        network = _experts(rng, labels, k, 0.9)
    else:
        network = np.full((n, k), 1e-9)
        network[np.arange(n), (labels + 1) % k] = 1.0
    slow = np.full((n, k), 1 / k)
    events = due_events(due)
    prior = process_prior(order, starts, events, rows, majority, labels, k - 1)
    return order, starts, events, rows, labels, majority, [network, slow, slow, prior]


@pytest.mark.parametrize("past", [False, True])
def test_a_network_confidently_wrong_loses_its_weight_and_the_mixture_stays_near_majority(past):
    # GIVEN a program that fools the network: ~1 on a wrong class at every call (with either
    # share: reuse's goes back to the process's past, a lifetime's evenly)
    rng = np.random.default_rng(4)
    order, starts, events, rows, labels, majority, experts = _fooled(rng)
    mixed = hedged(order, starts, events, rows, labels, experts, past=past)
    # THEN once K labels are known, the mixture's log-loss is at most the majority's (here the
    # best fixed distribution: the process follows it) plus a margin of 0.05: the fixed share's
    # -log(1 - SHARE) a label, log(4)/n, and process_prior's price for learning what the
    # majority is told
    known = int(np.sort(events[0])[99])  # the row by which K = 100 labels are known
    later = slice(known + 1, None)
    maj = _loss(_fixed(majority, len(rows))[later], labels[later])
    assert _loss(mixed[later], labels[later]) <= maj + 0.05
    # and over the whole process, its first calls answered before any label is known included
    assert _loss(mixed, labels) <= _loss(_fixed(majority, len(rows)), labels) + 0.1
    # AND the weight moved off the network within the run: at the first call the network's
    # (wrong) class got a quarter of the mass on top of what the fallback gives it, once labels
    # are known about the fixed share's floor (SHARE / 4), and the per-call loss fell
    wrong = (labels + 1) % 5
    at = np.arange(len(rows))
    excess = mixed[at, wrong] - experts[3][at, wrong]  # the network's weight, nearly
    assert excess[0] > 0.2
    assert excess[later].mean() < SHARE / 4 + 0.005
    assert _loss(mixed[:10], labels[:10]) > _loss(mixed[later], labels[later]) + 0.2
    # AND the stream does fool a mixture without the fallback (the test can fail): the slow
    # counters alone leave it above the majority
    without = hedged(order, starts, events, rows, labels, experts[:3], past=past)
    assert _loss(without[later], labels[later]) > maj + 0.15
    # AND with the majority itself an expert too (as the product's mixture has it), the same
    both = hedged(
        order, starts, events, rows, labels, [*experts, _fixed(majority, len(rows))], past=past
    )
    assert _loss(both[later], labels[later]) <= maj + 0.05


@pytest.mark.parametrize("past", [False, True])
def test_a_network_that_is_right_keeps_its_advantage_in_the_mixture(past):
    # GIVEN the same process answered well by the network (0.9 on the true class)
    rng = np.random.default_rng(5)
    order, starts, events, rows, labels, majority, experts = _fooled(rng, right=True)
    mixed = hedged(order, starts, events, rows, labels, experts, past=past)
    known = int(np.sort(events[0])[99])
    later = slice(known + 1, None)
    net = _loss(experts[0][later], labels[later])
    n = len(rows) - known - 1
    # THEN the mixture is within log(4)/n and the fixed share's price of the network: no
    # regression from the fallback expert
    assert _loss(mixed[later], labels[later]) <= net + np.log(4) / n - np.log(1 - SHARE)
    assert _loss(mixed[later], labels[later]) < _loss(experts[3][later], labels[later]) - 0.5
    # AND with the majority an expert too (5 of them, as the product's reuse mixture)
    both = hedged(
        order, starts, events, rows, labels, [*experts, _fixed(majority, len(rows))], past=past
    )
    assert _loss(both[later], labels[later]) <= net + np.log(5) / n - np.log(1 - SHARE)


def _served(rng, n=4000, sites=40):
    """One process, `sites` call sites interleaved (a key each, about n / sites labels a key);
    expert 0 right everywhere (0.9 on the true class), the other three flat or wrong."""
    order, starts, due, rows, labels = _process(rng, n=n, procs=1)
    keys = hedge_keys(rng.integers(0, sites, n), np.full(n, 3))
    right = _experts(rng, labels, 5, 0.9)
    wrong = _experts(rng, (labels + 1) % 5, 5, 0.9)
    flat = _experts(rng, labels, 5, 0)
    return order, starts, due_events(due), rows, labels, keys, [right, flat, flat, wrong]


def test_with_past_the_share_goes_back_to_what_served_the_process():
    # GIVEN a process of many call sites, each with a few labels, that one expert answers best
    rng = np.random.default_rng(7)
    order, starts, events, rows, labels, keys, experts = _served(rng)
    best = _loss(experts[0], labels)
    even = hedged(order, starts, events, rows, labels, experts, keys=keys)
    past = hedged(order, starts, events, rows, labels, experts, keys=keys, past=True)
    later = slice(len(rows) // 4, None)
    # THEN the even share keeps about SHARE * 3 / 4 of every key's weight on the three others
    # at every update: a price of ~0.03 nats a call above the best expert
    assert _loss(even[later], labels[later]) > _loss(experts[0][later], labels[later]) + 0.02
    # AND with past, each key's share goes back to the process's weights, which go back to the
    # mean of the process's posteriors, by now the best expert's: the price is gone
    assert _loss(past[later], labels[later]) < _loss(experts[0][later], labels[later]) + 0.01
    assert _loss(past, labels) < best + 0.01
    # AND it is causal as the even share is: the first call is answered with even weights
    np.testing.assert_allclose(past[0], np.mean([e[0] for e in experts], axis=0))
    np.testing.assert_allclose(past.sum(axis=1), 1.0)


def test_with_past_a_weight_still_recovers_when_the_best_expert_changes():
    # GIVEN the same process where the best expert turns wrong half-way and a flat one (the
    # second) is then the best
    rng = np.random.default_rng(8)
    order, starts, events, rows, labels, keys, experts = _served(rng)
    half = len(rows) // 2
    turned = experts[0].copy()
    turned[half:] = np.roll(turned[half:], 1, axis=1)
    second = experts[1].copy()
    second[half:] = _experts(rng, labels[half:], 5, 0.6)
    mixed = hedged(
        order, starts, events, rows, labels, [turned, second, *experts[2:]], keys=keys, past=True
    )
    # THEN within a few hundred calls of the change the mixture follows the new best (the mean
    # of the past posteriors still holds its even start and keeps every weight recoverable)
    after = slice(half + 300, None)
    assert _loss(mixed[after], labels[after]) < _loss(second[after], labels[after]) + 0.05


def test_the_fallback_starts_at_the_majority_and_learns_the_process_causally():
    rng = np.random.default_rng(6)
    order, starts, due, rows, _ = _process(rng, n=4000, procs=2)
    majority = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    labels = rng.choice(5, len(rows), p=[0.05, 0.05, 0.1, 0.2, 0.6])  # unlike the majority
    prior = process_prior(order, starts, due_events(due), rows, majority, labels, 4)
    # each process starts at the majority, and ends near its own frequencies
    np.testing.assert_allclose(prior[0], majority)
    np.testing.assert_allclose(prior[2000], majority)
    np.testing.assert_allclose(prior[1999], [0.05, 0.05, 0.1, 0.2, 0.6], atol=0.03)
    np.testing.assert_allclose(prior.sum(axis=1), 1.0)
    # causal: labels known after the cut change nothing before it
    cut = 1200
    labels2 = np.where((due > cut) | (due < 0), (labels + 1) % 5, labels)
    again = process_prior(order, starts, due_events(due), rows, majority, labels2, 4)
    np.testing.assert_array_equal(prior[: cut + 1], again[: cut + 1])
    assert not np.array_equal(prior[cut + 1 :], again[cut + 1 :])


def test_the_fallback_learns_never_freed_from_blocks_still_live():
    # GIVEN a lifetime question (4 edges, "later", "never freed") whose blocks are never freed:
    # no label ever comes whole, only crossings of every edge 10 rows apart
    n, k = 400, 6
    starts = np.zeros(n, bool)
    starts[0] = True
    crossing = np.arange(n)[:, None] + 10 * np.arange(1, 5)[None, :]
    crossing = np.where(crossing < n, crossing, -1)
    events = censored_events(starts, crossing, np.full(n, -1))
    majority = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    labels = np.full(n, k - 1)
    prior = process_prior(np.arange(n), starts, events, np.arange(n), majority, labels, 4)
    # THEN the fallback moves its mass past the last edge as the blocks outlive it, split
    # between "later" and "never freed" as the majority splits them (a block still live tells
    # neither apart before its process ends)
    assert prior[0, k - 1] == majority[k - 1]
    assert prior[-1, k - 2 :].sum() > 0.9
    np.testing.assert_allclose(prior[-1, k - 2] / prior[-1, k - 1], 1.0)
