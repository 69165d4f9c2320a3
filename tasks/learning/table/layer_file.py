"""The layer's table file (native/TABLE.md): its header, its checksum, its writer and reader."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from tasks.learning.table.distill import N_SIZE_CLASSES, N_TOKENS, ClassTable

MAGIC = b"HCLTAB\x00\x01"
# 4: allocation-context keys after the call-site keys (written when the table has contexts);
# 3: call-site keys after the class scores; 2: class scores only, P(reuse within 4096 calls);
# 1 (refused): within 16 calls
FORMAT_VERSION = 4
SITES_FORMAT = 3
READ_FORMATS = (2, 3, 4)
HEADER = struct.Struct("<8sIIIIQ")  # magic, version, model version, n_tokens, payload bytes, FNV
CLASS_BYTES = N_TOKENS * N_TOKENS  # uint8 [64][64] keep scores by token (class)
# then one little-endian uint32 per known (site, class): (site * 32 + class) << 8 | keep score,
# keys rising (TABLE.md)
SITE_ENTRY = np.dtype("<u4")
# format 4: after the class scores, u32 context depth and u32 site entries, the site entries,
# then one entry per known (allocation context, class), (context, class) strictly rising
CONTEXT_HEAD = struct.Struct("<II")
CONTEXT_ENTRY = np.dtype([("context", "<u8"), ("word", "<u4")])  # word: class << 8 | score
MAX_CONTEXT_ENTRIES = 1 << 22  # the layer's bound (native/layers/layer/table.c)


def context_entries(table: ClassTable) -> np.ndarray:
    """The file's context entries (CONTEXT_ENTRY), keys (context, class) rising."""
    c = table.context_counts
    if c is None or len(c.context) == 0:
        return np.zeros(0, CONTEXT_ENTRY)
    if (c.context < 0).any() or ((c.cls < 0) | (c.cls >= N_SIZE_CLASSES)).any():
        raise ValueError("context entries: contexts must be >= 0 and classes 0..31")
    order = np.lexsort((c.cls, c.context))
    out = np.zeros(len(order), CONTEXT_ENTRY)
    out["context"] = c.context[order].astype(np.uint64)
    out["word"] = (c.cls[order].astype(np.uint32) << 8) | c.keep_scores()[order]
    key = np.stack([out["context"], out["word"] >> 8], axis=1)
    if (
        len(out) > 1
        and not (
            (key[1:, 0] > key[:-1, 0]) | ((key[1:, 0] == key[:-1, 0]) & (key[1:, 1] > key[:-1, 1]))
        ).all()
    ):
        raise ValueError("context entries: a (context, class) key appears twice")
    if len(out) > MAX_CONTEXT_ENTRIES:
        raise ValueError(f"context entries: {len(out)}, the layer reads {MAX_CONTEXT_ENTRIES}")
    return out


def site_entries(table: ClassTable) -> np.ndarray:
    """The file's site entries: (site * 32 + class) << 8 | keep score per known key, keys rising."""
    scores, known = table.site_scores()
    keys = np.flatnonzero(known.ravel())  # site * 32 + class, rising
    return ((keys.astype(np.uint32) << 8) | scores.ravel()[keys]).astype(SITE_ENTRY)


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 (the layer's checksum): sequential by nature, so compiled."""
    return int(_fnv1a64(np.frombuffer(data, np.uint8)))


@njit(cache=True)
def _fnv1a64(data):
    h = np.uint64(0xCBF29CE484222325)
    for b in data:
        h = (h ^ np.uint64(b)) * np.uint64(0x100000001B3)
    return h


def model_version_number(version: str) -> int:
    """The registry's version string as the table's u32 model version (> 0)."""
    try:
        v = int(version)
    except ValueError:
        raise ValueError(f"model version {version!r}: the layer's table needs a number") from None
    if not 0 < v < 2**32:
        raise ValueError(f"model version {v}: the layer's table needs 1..2^32-1")
    return v


def write_layer_table(path: Path, table: ClassTable, model_version: int) -> Path:
    """The layer's file (native/TABLE.md) for `model_version`: format 4 where the table has
    allocation-context keys, else format 3; returns `path`."""
    if not 0 < model_version < 2**32:
        raise ValueError(f"model version {model_version}: the layer's table needs 1..2^32-1")
    sites = site_entries(table)
    contexts = context_entries(table)
    if len(contexts):  # format 4: the context depth and the site entries' count first
        head4 = CONTEXT_HEAD.pack(table.context_counts.depth, len(sites))
        payload = table.keep_scores().tobytes() + head4 + sites.tobytes() + contexts.tobytes()
        fmt = FORMAT_VERSION
    else:
        payload = table.keep_scores().tobytes() + sites.tobytes()
        fmt = SITES_FORMAT
    head = HEADER.pack(MAGIC, fmt, model_version, N_TOKENS, len(payload), fnv1a64(payload))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + payload)
    return path


@dataclass(frozen=True)
class ModelTable:
    """A registered version's layer table, as a file on this host: what the allocators stage's
    table-guided layer candidate reads (tasks.registry.question_artifacts.fetch_table downloads it)."""

    path: Path
    version: int  # the model version the file was written for (the layer's `model=` check)
    run_id: str  # the version's MLflow run, where it was logged

    def __post_init__(self) -> None:
        if not 0 < self.version < 2**32:
            raise ValueError(f"model version {self.version}: the layer's table needs 1..2^32-1")


def read_table_file(path: Path) -> ModelTable:
    """A layer table file someone hands in (the allocators stage's `table_file`), checked as the
    layer checks it (native/TABLE.md): magic, a format the layer reads (2, 3 or 4), 64 tokens, the
    payload's length and FNV-1a hash; its model version from the header. A file the layer would
    refuse raises ValueError naming the file and what is wrong: measured, it would have run as
    the online counter under the table's name."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"layer table {path}: cannot be read ({err.strerror})") from None
    what = f"layer table {path}"
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise ValueError(
            f"{what}: not a table (no HCLTAB header); write one with write_layer_table"
        )
    magic, fmt, version, n_tokens, n_payload, fnv = HEADER.unpack_from(data)
    if fmt not in READ_FORMATS:
        raise ValueError(f"{what}: format {fmt}, the layer reads 2, 3 and {FORMAT_VERSION}")
    if n_tokens != N_TOKENS:
        raise ValueError(f"{what}: {n_tokens} tokens, the layer's are {N_TOKENS}")
    payload = data[HEADER.size :]
    if len(payload) != n_payload or fnv1a64(payload) != fnv:
        raise ValueError(
            f"{what}: its payload does not match its header ({len(payload)} bytes for "
            f"{n_payload}, or another hash): cut or changed; write it again"
        )
    try:
        layer_entries(fmt, payload)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    return ModelTable(path=path, version=version, run_id="")


@dataclass(frozen=True)
class LayerEntries:
    """A table file's payload as the layer reads it."""

    keep_scores: np.ndarray  # uint8 [N_TOKENS, N_TOKENS]
    sites: np.ndarray  # SITE_ENTRY [n]
    contexts: np.ndarray  # CONTEXT_ENTRY [m] (format 4; empty before)
    depth: int  # the contexts' depth (0 before format 4)


def layer_entries(fmt: int, payload: bytes) -> LayerEntries:
    """The payload of a format `fmt` file, checked as the layer checks it (native/TABLE.md:
    whole entries, keys rising, a depth 2..16); ValueError says what is wrong."""
    if len(payload) < CLASS_BYTES:
        raise ValueError(
            f"payload of {len(payload)} bytes, the class scores alone are {CLASS_BYTES}"
        )
    scores = np.frombuffer(payload, np.uint8, CLASS_BYTES).reshape(N_TOKENS, N_TOKENS)
    rest, depth, contexts = payload[CLASS_BYTES:], 0, np.zeros(0, CONTEXT_ENTRY)
    if fmt == 4:
        if len(rest) < CONTEXT_HEAD.size:
            raise ValueError("format 4 without its context depth and site count")
        depth, n_sites = CONTEXT_HEAD.unpack_from(rest)
        if not 2 <= depth <= 16:
            raise ValueError(f"context depth {depth}, the layer walks 2..16 frames")
        rest = rest[CONTEXT_HEAD.size :]
        ctx = rest[4 * n_sites :]
        if 4 * n_sites > len(rest) or len(ctx) % CONTEXT_ENTRY.itemsize:
            raise ValueError("site and context entries that are not whole")
        contexts = np.frombuffer(ctx, CONTEXT_ENTRY)
        rest = rest[: 4 * n_sites]
        c, k = contexts["context"], contexts["word"] >> 8
        if (
            (c >= 1 << 63).any()
            or (k >= N_SIZE_CLASSES).any()
            or not ((c[1:] > c[:-1]) | ((c[1:] == c[:-1]) & (k[1:] > k[:-1]))).all()
        ):
            raise ValueError("context entries out of order or out of range")
    if fmt == 2 and rest:
        raise ValueError("format 2 with entries after the class scores")
    if len(rest) % 4:
        raise ValueError("site entries that are not whole")
    sites = np.frombuffer(rest, SITE_ENTRY)
    if len(sites) > 1 and not (sites[1:] >> 8 > sites[:-1] >> 8).all():
        raise ValueError("site entries out of order")
    return LayerEntries(scores, sites, contexts, depth)
