"""The call site of an events row, as the predictors and the layer's table key it.

The call site is caller_module + caller_offset (the module's path and the caller's address in
it, which survive ASLR: native/FORMAT.md, Modules), hashed to SITE_VOCABULARY buckets:
crc32(path) << 32 xor offset, times 0x9E3779B97F4A7C15, xor its own bits shifted right by 29,
modulo SITE_VOCABULARY. The allocator layer computes the same hash from the return address of
the free it is asked about (native/layers/layer.c, hl_site_of; native/TABLE.md), so that a table
keyed here answers there; tests/native/test_layer_table.py holds the two together.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SITE_VOCABULARY = 4096
# What the questions say of a trace without callers (`heapcast trace --no-caller`; callers are on
# by default and in every catalog trace): its answers are worse there, and not silently so.
NO_CALL_SITES = (
    "no call sites (recorded with --no-caller): site_online answers as class_online there and "
    "the network reads no site; trace it again without --no-caller"
)


def module_hashes(paths: list[str] | tuple[str, ...]) -> np.ndarray:
    """uint64 per module path: its crc32 ("" for none: 0). A loop over modules, not rows."""
    return np.array([zlib.crc32(m.encode()) for m in paths], np.uint64)


def site_keys(module_hash: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The key of each (module, offset) before hashing to the vocabulary: crc32(path) << 32 xor
    offset, what the layer computes too (the calling contexts fold these, one a frame)."""
    return (module_hash.astype(np.uint64) << np.uint64(32)) ^ np.asarray(offset, np.uint64)


def has_call_sites(table: pa.Table) -> bool:
    """Whether any row of an events table has a call site (its trace recorded callers)."""
    if "caller_module" not in table.column_names or "caller_offset" not in table.column_names:
        return False
    valid = pc.and_(
        pc.is_valid(table.column("caller_module")), pc.is_valid(table.column("caller_offset"))
    )
    return bool(pc.any(valid).as_py())


def call_sites(table: pa.Table, vocabulary: int = SITE_VOCABULARY) -> np.ndarray:
    """int64 [n]: each row's call site (caller_module + caller_offset) hashed to 0..vocabulary-1;
    -1 where the row has none (a trace without callers, an address in no module)."""
    n = table.num_rows
    if "caller_module" not in table.column_names or "caller_offset" not in table.column_names:
        return np.full(n, -1, np.int64)
    module = table.column("caller_module").combine_chunks()
    if pa.types.is_dictionary(module.type):
        module = module.cast(pa.string())
    # the modules once each (Arrow's hash table, not Python strings per row), crc32 per module
    coded = pc.dictionary_encode(module.fill_null(""))
    ids = coded.indices.to_numpy(zero_copy_only=False)
    name_hash = module_hashes(coded.dictionary.to_pylist())
    offset = table.column("caller_offset")
    valid = np.asarray(pc.is_valid(offset).to_numpy(zero_copy_only=False), bool)
    valid &= np.asarray(pc.is_valid(module).to_numpy(zero_copy_only=False), bool)
    off = offset.fill_null(0).to_numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        h = site_keys(name_hash[ids], off)
        h = h * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return np.where(valid, (h % np.uint64(vocabulary)).astype(np.int64), -1)
