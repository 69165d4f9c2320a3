"""Numbering distinct values by hashing (tasks/core/distinct.py): exactly np.unique's answers."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.distinct import distinct_rows, first_seen_ids, sorted_ids


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    big = np.iinfo(np.uint64).max
    return [
        np.zeros(0, np.int64),
        np.array([7], np.int64),
        np.full(5, -3, np.int64),
        rng.integers(-50, 50, 1000),
        rng.integers(-(2**62), 2**62, 1000),
        rng.integers(0, 20, 5000).astype(np.int32),
        np.array([big, 0, big - 1, 2**63, 2**63 - 1, big, 0], np.uint64),
        rng.integers(2**63, big, 500, dtype=np.uint64, endpoint=True)[rng.integers(0, 500, 2000)],
    ]


@pytest.mark.parametrize("values", _inputs())
def test_sorted_ids_are_np_uniques(values):
    want_values, want_inverse = np.unique(values, return_inverse=True)
    inverse, got = sorted_ids(values)
    assert got.dtype == values.dtype and inverse.dtype == np.int64
    np.testing.assert_array_equal(got, want_values)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))


@pytest.mark.parametrize("values", _inputs())
def test_first_seen_ids_number_in_order_of_appearance(values):
    ids, distinct = first_seen_ids(values)
    np.testing.assert_array_equal(distinct[ids], values)  # each value's id names it
    _, first = np.unique(values, return_index=True)
    np.testing.assert_array_equal(distinct, values[np.sort(first)])  # first appearance order


def _row_inputs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(4)
    big = np.iinfo(np.uint64).max
    wide = rng.integers(0, 2**64 - 1, 50, dtype=np.uint64, endpoint=True)
    return [
        [np.zeros(0, np.uint64)] * 3,
        [np.array([5], np.uint64), np.array([big], np.uint64)],
        [rng.integers(-3, 3, 2000), rng.integers(-2, 2, 2000), rng.integers(-1, 1, 2000)],
        [wide[rng.integers(0, 50, 3000)], wide[rng.integers(0, 50, 3000)]],
        # a module code -1 (null) as uint64 sorts last, as in StackFrames
        [
            np.array([-1, 0, 1, -1, 0], np.int64).astype(np.uint64),
            np.array([16, 16, 0, 16, 16], np.uint64),
            np.array([2, -1, 0, 2, 3], np.int64).astype(np.uint64),
        ],
        [rng.integers(0, 4, 10_000)],
    ]


@pytest.mark.parametrize("columns", _row_inputs())
def test_distinct_rows_are_np_uniques(columns):
    want_rows, want_inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    inverse, rows = distinct_rows(columns)
    assert rows.dtype == columns[0].dtype and rows.shape == want_rows.shape
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
