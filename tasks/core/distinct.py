"""Numbering the distinct values of large integer arrays by hashing, not sorting.

np.unique sorts every row: on a run's million events or stack rows it costs a sort per call,
and with `axis=0` a far slower one over row records. Arrow's dictionary encoding numbers the
distinct values in one hash-table pass; only the distinct values (usually thousands) are sorted
where an order is wanted. The results are np.unique's, exactly, where the functions say so.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def first_seen_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 [n] each value's id, the distinct values [m] (values' dtype)): ids 0..m-1 in the
    order of first appearance. `values`: a 1-d integer array."""
    coded = pc.dictionary_encode(pa.array(np.ascontiguousarray(values)))
    ids = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return ids, coded.dictionary.to_numpy(zero_copy_only=False)


def sorted_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) swapped: (int64 [n] each value's rank among the
    distinct values, the distinct values ascending), with one hash pass and a sort of the
    distinct values alone."""
    ids, distinct = first_seen_ids(values)
    order = np.argsort(distinct, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank[ids], distinct[order]


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True) swapped, for integer
    columns of one dtype: (int64 [n] each row's rank among the distinct rows, the distinct rows
    [m, len(columns)] in lexicographic order, the first column first)."""
    n = len(columns[0])
    ids = np.zeros(n, np.int64)
    m = 1
    for col in columns:  # a loop over columns: (ids so far, this column) numbered again, < n^2
        own, values = first_seen_ids(col)
        ids, _ = first_seen_ids(ids * len(values) + own)
        m = int(ids.max(initial=-1)) + 1
    first = np.zeros(m, np.int64)
    first[ids] = np.arange(n)  # one row of each distinct row (any: they are equal)
    rows = np.stack([col[first] for col in columns], axis=1)
    order = np.lexsort(rows.T[::-1])
    rank = np.empty(m, np.int64)
    rank[order] = np.arange(m)
    return rank[ids], rows[order]
