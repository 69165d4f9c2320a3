"""The token rule, in one place (DESIGN.md: 64 classes, as in the seed article).

An allocation of n bytes is `min(n.bit_length(), 31)`; a free is `32 +` the token of the block
it frees. Vectorised: bit_length is computed with numpy, never per event in Python.
"""

from __future__ import annotations

import numpy as np

N_TOKENS = 64
FREE_OFFSET = 32
MAX_SIZE_CLASS = 31


def bit_length(n: np.ndarray) -> np.ndarray:
    """Vectorised int.bit_length for unsigned 64-bit sizes."""
    n = np.asarray(n, dtype=np.uint64)
    out = np.zeros(n.shape, dtype=np.uint8)
    nz = n > 0
    # frexp is exact for integers below 2^53; sizes are saturated at 2^40-1 by the tracer.
    _, exp = np.frexp(n[nz].astype(np.float64))
    out[nz] = exp.astype(np.uint8)
    return out


def size_class(size: np.ndarray) -> np.ndarray:
    """Token of an allocation of `size` bytes: min(bit_length, 31)."""
    return np.minimum(bit_length(size), MAX_SIZE_CLASS).astype(np.uint8)


def free_token(freed_size: np.ndarray) -> np.ndarray:
    """Token of a free of a block of `freed_size` bytes (0 when unknown: an unpaired free)."""
    return (FREE_OFFSET + size_class(freed_size)).astype(np.uint8)
