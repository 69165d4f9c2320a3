"""The back-off counters on the calling context (tasks/learning/counters/by_context.py): causal,
backing off to the shallower key, and a training prior that the run's own blocks then correct."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.learning.counters.by_context import (
    NO_KEY,
    ContextPrior,
    KeyChain,
    backoff_online,
    dense_ids,
)

K = 3


def _run(n: int, keys: list[np.ndarray], due: np.ndarray, label: np.ndarray, **kw) -> np.ndarray:
    starts = np.zeros(n, bool)
    starts[0] = True
    chain = KeyChain.of(starts, np.ones(n, bool), keys)
    online, with_prior = backoff_online(chain, due, label, K, **kw)
    return online if with_prior is None else with_prior


@pytest.mark.parametrize("with_prior", [False, True], ids=["online", "table"])
def test_a_label_counts_only_from_its_due_row(with_prior):
    # GIVEN ten blocks of one context, each block's class known three rows after it (and, for
    # the table, training counts of that context)
    n = 10
    keys = [np.zeros(n, np.int64), np.full(n, 5, np.int64)]
    due = np.arange(n) + 3
    due[due >= n] = -1
    label = np.zeros(n, np.int64)
    kw = {}
    if with_prior:
        kw["prior"] = ContextPrior.of(
            [[np.zeros(4, np.int64), np.full(4, 5, np.int64)]], [np.array([0, 1, 1, 2])], K
        )
    # WHEN the blocks whose class is not yet known at row 5 (rows 3.. , due 6..) change class
    future = label.copy()
    future[3:] = 2
    a, b = _run(n, keys, due, label, **kw), _run(n, keys, due, future, **kw)
    # THEN no answer up to row 5 changes, and a later one does (the test can see the future)
    np.testing.assert_array_equal(a[:6], b[:6])
    assert not np.allclose(a[6:], b[6:])
    # and before any block's class is known, the answer is the prior's (uniform without one)
    assert np.allclose(a[:3], 1.0 / K) != with_prior


def test_an_unseen_deep_key_answers_as_its_shallower_key():
    # GIVEN blocks of class 1 at context (site 4, stack 7), known at once
    n = 8
    site = np.full(n, 4, np.int64)
    deep = np.full(n, 7, np.int64)
    deep[-1] = 99  # the last call: the same site from a stack never seen
    label = np.ones(n, np.int64)
    due = np.minimum(np.arange(n) + 1, n - 1)
    due[-1] = -1
    cls = np.zeros(n, np.int64)
    with_deep = _run(n, [cls, site, deep], due, label)
    deep_none = deep.copy()
    deep_none[-1] = NO_KEY
    without = _run(n, [cls, site, deep_none], due, label)
    # THEN the unseen stack answers as the site does (and leans to class 1 from its blocks)
    np.testing.assert_allclose(with_deep[-1], without[-1])
    assert with_deep[-1].argmax() == 1
    # while a stack seen often answers more surely than its site alone
    assert with_deep[-2, 1] > _run(n, [cls, site], due, label)[-2, 1]


def test_the_training_prior_is_used_then_corrected():
    # GIVEN training runs where stack 7's blocks were all class 2
    prior = ContextPrior.of(
        [[np.zeros(100, np.int64), np.full(100, 7, np.int64)]], [np.full(100, 2, np.int64)], K
    )
    # WHEN a run's blocks of stack 7 are all class 0, each known at the next row
    n = 200
    keys = [np.zeros(n, np.int64), np.full(n, 7, np.int64)]
    due = np.append(np.arange(1, n), -1)
    label = np.zeros(n, np.int64)
    chain = KeyChain.of(np.arange(n) == 0, np.ones(n, bool), keys)
    online, got = backoff_online(chain, due, label, K, prior=prior, cap=16.0)
    # (one pass answers both: the run's own counts alone, and from the prior)
    np.testing.assert_array_equal(online, _run(n, keys, due, label))
    # THEN its first call answers by the training runs (the online counter cannot)
    assert got[0].argmax() == 2
    np.testing.assert_allclose(online[0], 1.0 / K)
    # and once more of the run's own blocks are known than the prior's cap, they decide
    assert got[-1].argmax() == 0
    assert got[-1, 0] > 0.9


def test_a_prior_of_another_chain_is_refused():
    prior = ContextPrior.of([[np.zeros(3, np.int64)]], [np.zeros(3, np.int64)], K)
    two_levels = [np.zeros(3, np.int64), np.zeros(3, np.int64)]
    with pytest.raises(ValueError, match="levels"):
        _run(3, two_levels, np.full(3, -1), np.zeros(3, np.int64), prior=prior)


def test_keys_are_counted_per_process():
    proc = np.array([0, 0, 1, 1])
    ids, keys = dense_ids(proc, np.array([5, NO_KEY, 5, 6]))
    # THEN one key in two processes is two ids, and a row without a key has none
    assert len(keys) == 3 and ids[1] == -1 and sorted({ids[0], ids[2], ids[3]}) == [0, 1, 2]
    assert [keys[i] for i in ids[[0, 2, 3]]] == [5, 5, 6]


def test_answers_at_some_rows_are_those_of_every_row():
    # GIVEN two processes of random keys (some asking rows without a deeper key), blocks known
    # a few rows later, and a training prior of some of the keys
    rng = np.random.default_rng(5)
    n = 300
    starts = np.zeros(n, bool)
    starts[[0, 120]] = True
    ask = rng.random(n) < 0.8
    keys = [rng.integers(0, 3, n), np.where(rng.random(n) < 0.2, NO_KEY, rng.integers(0, 9, n))]
    due = np.arange(n) + rng.integers(1, 6, n)
    due[due >= n] = -1
    label = rng.integers(0, K, n)
    prior = ContextPrior.of([[k[:150] for k in keys]], [label[:150]], K)
    chain = KeyChain.of(starts, ask, keys)
    every_online, every_table = backoff_online(chain, due, label, K, prior=prior, cap=8.0)
    # WHEN answered only at some rows, in any order (asking or not)
    at = rng.permutation(n)[:90]
    online, table = backoff_online(chain, due, label, K, prior=prior, cap=8.0, at=at)
    # THEN those are exactly the answers at those rows (zeros where a row does not ask)
    np.testing.assert_array_equal(online, every_online[at])
    np.testing.assert_array_equal(table, every_table[at])
    assert (online[~ask[at]] == 0).all() and (online[ask[at]].sum(axis=1) > 0.99).all()
    assert not np.array_equal(online, table)  # the prior counts
