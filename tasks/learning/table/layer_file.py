"""The layer's table file (native/TABLE.md): its header, its checksum, its writer and reader."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from tasks.learning.table.distill import N_TOKENS, ClassTable

MAGIC = b"HCLTAB\x00\x01"
# 3: call-site keys after the class scores; 2: class scores only, P(reuse within 4096 calls);
# 1 (refused): within 16 calls
FORMAT_VERSION = 3
HEADER = struct.Struct("<8sIIIIQ")  # magic, version, model version, n_tokens, payload bytes, FNV
CLASS_BYTES = N_TOKENS * N_TOKENS  # uint8 [64][64] keep scores by token (class)
# then one little-endian uint32 per known (site, class): (site * 32 + class) << 8 | keep score,
# keys rising (TABLE.md)
SITE_ENTRY = np.dtype("<u4")


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
    """The layer's file (native/TABLE.md) for `model_version`; returns `path`."""
    if not 0 < model_version < 2**32:
        raise ValueError(f"model version {model_version}: the layer's table needs 1..2^32-1")
    payload = table.keep_scores().tobytes() + site_entries(table).tobytes()
    head = HEADER.pack(
        MAGIC, FORMAT_VERSION, model_version, N_TOKENS, len(payload), fnv1a64(payload)
    )
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
    layer checks it (native/TABLE.md): magic, a format the layer reads (2 or 3), 64 tokens, the
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
    if fmt not in (2, FORMAT_VERSION):
        raise ValueError(f"{what}: format {fmt}, the layer reads 2 and {FORMAT_VERSION}")
    if n_tokens != N_TOKENS:
        raise ValueError(f"{what}: {n_tokens} tokens, the layer's are {N_TOKENS}")
    payload = data[HEADER.size :]
    if len(payload) != n_payload or fnv1a64(payload) != fnv:
        raise ValueError(
            f"{what}: its payload does not match its header ({len(payload)} bytes for "
            f"{n_payload}, or another hash): cut or changed; write it again"
        )
    return ModelTable(path=path, version=version, run_id="")
