"""The token rule (DESIGN.md): allocation min(bit_length, 31); free 32 + that of its block."""

from __future__ import annotations

import numpy as np

from tasks.dataset.tokens import N_TOKENS, bit_length, free_token, size_class


def test_bit_length_matches_python_for_edge_sizes():
    sizes = [0, 1, 2, 3, 4, 7, 8, 255, 256, 2**31 - 1, 2**31, 2**39, 2**40 - 1, 2**53 - 1]
    assert list(bit_length(np.array(sizes, dtype=np.uint64))) == [s.bit_length() for s in sizes]


def test_size_class_saturates_at_31():
    sizes = np.array([0, 1, 24, 4096, 2**30, 2**31, 2**40 - 1], dtype=np.uint64)
    assert list(size_class(sizes)) == [0, 1, 5, 13, 31, 31, 31]


def test_free_token_is_32_plus_the_block_class():
    freed = np.array([0, 24, 2**40 - 1], dtype=np.uint64)
    assert list(free_token(freed)) == [32, 37, 63]
    assert int(free_token(freed).max()) < N_TOKENS
