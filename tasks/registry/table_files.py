"""A registered version's tables as files on this host: their names (`table_dir`,
`table_file`, `lifetime_file`), the checks that a file is sound before a layer reads it (magic,
format, tokens, payload length and FNV-1a hash, model version: `table_fault`, `lifetime_fault`),
the placement's lifetime table written and read (`write_lifetime_table`, `read_lifetime_table`;
native/TABLE.md), and a whole-file write by rename (`write_atomically`). No MLflow here: the
cache (table_cache) and the fetch (question_artifacts) both build on it.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.core.storage import Root, scratch_parent

# native/TABLE.md's header (tasks/learning/table/distill.py HEADER, MAGIC; the tests hold them together)
_HEADER = struct.Struct("<8sIIIIQ")  # magic, format, model version, n_tokens, payload bytes, FNV
_MAGIC = b"HCLTAB\x00\x01"
_FORMATS = (2, 3)  # the formats the layer reads
_N_TOKENS = 64
# The placement's lifetime table (native/TABLE.md; native/layers/place/life.c hp_load_life): the same
# 32-byte header, its own magic; uint32 entries (site * 32 + class) << 8 | score, keys rising
LIFE_MAGIC = b"HCLIFE\x00\x01"
LIFE_FORMAT = 1
LIFE_CLASSES = 32
LIFE_SITES = 4096  # tasks/dataset/sites.py SITE_VOCABULARY
LIFE_LONG_SCORE = 128  # the layer places long at a score of at least this (P(long) >= ~1/2)


def table_dir(root: Root) -> Path:
    """Where fetched tables are kept: the root's local scratch, under tables/."""
    return scratch_parent(root) / "tables"


def table_file(dest: Path, version: int) -> Path:
    """The file of `version`'s table in the folder `dest`."""
    return dest / f"v{version}.hcltab"


def lifetime_file(dest: Path, version: int) -> Path:
    """The file of `version`'s lifetime table in the folder `dest`."""
    return dest / f"v{version}.hclife"


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _file_bytes(path: Path) -> tuple[bytes, str]:
    """A table file's bytes, or why it cannot be read (b"" then)."""
    try:
        return path.read_bytes(), ""
    except FileNotFoundError:
        return b"", "it is not there"
    except OSError as err:
        return b"", f"it cannot be read ({err.strerror})"


def table_fault(path: Path, version: int) -> str:
    """Why the layer would refuse `path` as `version`'s table ("" when it would take it)."""
    data, unread = _file_bytes(path)
    if unread:
        return unread
    if len(data) < _HEADER.size or data[:8] != _MAGIC:
        return "it has no HCLTAB header"
    _, fmt, got, n_tokens, n_payload, fnv = _HEADER.unpack_from(data)
    if fmt not in _FORMATS or n_tokens != _N_TOKENS:
        return f"it is of format {fmt} with {n_tokens} tokens, not one the layer reads"
    if got != version:
        return f"its header says model version {got}, not {version}"
    payload = memoryview(data)[_HEADER.size :]
    if len(payload) != n_payload or _fnv1a64(payload) != fnv:
        return "its payload does not match its header (cut short or changed)"
    return ""


@dataclass(frozen=True)
class LifetimeTable:
    """A lifetime table file's contents: its keys (site * 32 + class, rising) and scores
    (round(255 * P(long))), as lists of ints."""

    path: Path
    version: int  # the model version in its header (0: made outside the registry)
    keys: list[int]
    scores: list[int]

    def long_keys(self) -> set[int]:
        """The keys the layer places long."""
        return {k for k, s in zip(self.keys, self.scores, strict=True) if s >= LIFE_LONG_SCORE}


def lifetime_bytes(keys, scores, model_version: int) -> bytes:
    """A lifetime table file's bytes (native/TABLE.md): `keys` site * 32 + class, strictly
    rising, below 4096 * 32; `scores` 0..255 (arrays or sequences of ints, one per key);
    `model_version` the registered version it was written for (0: none)."""
    # one word per table entry (at most 4096 * 32), no numpy: this module stays light for the CLI
    k, v = [int(x) for x in keys], [int(x) for x in scores]
    if len(k) != len(v):
        raise ValueError(f"lifetime table: {len(k)} keys against {len(v)} scores")
    if any(b <= a for a, b in zip(k, k[1:])) or (k and not 0 <= k[0] <= k[-1] < 4096 * 32):
        raise ValueError("lifetime table: keys must rise strictly within 0..4096 * 32 - 1")
    if any(not 0 <= x <= 255 for x in v):
        raise ValueError("lifetime table: scores must be 0..255")
    if not 0 <= model_version < 2**32:
        raise ValueError(f"model version {model_version}: a lifetime table needs 0..2^32-1")
    payload = struct.pack(f"<{len(k)}I", *(a << 8 | b for a, b in zip(k, v, strict=True)))
    head = _HEADER.pack(
        LIFE_MAGIC, LIFE_FORMAT, model_version, LIFE_CLASSES, len(payload), _fnv1a64(payload)
    )
    return head + payload


def write_lifetime_table(path: Path, keys, scores, model_version: int) -> Path:
    """The lifetime table file at `path` (lifetime_bytes), written whole by a rename."""
    return write_atomically(Path(path), lifetime_bytes(keys, scores, model_version))


def _lifetime_fault(data: bytes) -> str:
    if len(data) < _HEADER.size or data[:8] != LIFE_MAGIC:
        return "it has no HCLIFE header"
    _, fmt, _, n_classes, n_payload, fnv = _HEADER.unpack_from(data)
    if fmt != LIFE_FORMAT or n_classes != LIFE_CLASSES or n_payload % 4:
        return f"it is of format {fmt} with {n_classes} classes, not one the layer reads"
    payload = memoryview(data)[_HEADER.size :]
    if len(payload) != n_payload or _fnv1a64(payload) != fnv:
        return "its payload does not match its header (cut short or changed)"
    words = struct.unpack(f"<{n_payload // 4}I", payload)
    keys = [w >> 8 for w in words]
    if any(b <= a for a, b in zip(keys, keys[1:])) or (keys and keys[-1] >= LIFE_SITES * 32):
        return "its entries are out of order (corrupt)"
    return ""


def read_lifetime_table(path: Path) -> LifetimeTable:
    """A lifetime table file, checked as the layer checks it; ValueError naming the file and
    what is wrong."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"lifetime table {path}: cannot be read ({err.strerror})") from None
    fault = _lifetime_fault(data)
    if fault:
        raise ValueError(f"lifetime table {path}: {fault}")
    _, _, version, _, n_payload, _ = _HEADER.unpack_from(data)
    words = struct.unpack_from(f"<{n_payload // 4}I", data, _HEADER.size)
    return LifetimeTable(path, version, [w >> 8 for w in words], [w & 0xFF for w in words])


def lifetime_fault(path: Path, version: int) -> str:
    """Why the placement layer would refuse `path` as `version`'s lifetime table ("" when it
    would take it)."""
    data, unread = _file_bytes(path)
    if unread:
        return unread
    fault = _lifetime_fault(data)
    if fault:
        return fault
    got = _HEADER.unpack_from(data)[2]
    return f"its header says model version {got}, not {version}" if got != version else ""


def write_atomically(path: Path, data: bytes) -> Path:
    """`data` as the file `path`, written beside it and renamed over it: a reader sees the
    old file or the whole new one, never part of it. Returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
