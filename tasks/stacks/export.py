"""A StackProfile written for other tools: folded stacks and pprof's profile.proto.

- collapsed (folded stacks, Brendan Gregg's format: flamegraph.pl, speedscope, inferno): one
  line per stack with a non-zero weight, `outer;...;inner WEIGHT`, frames named by
  `Frames.label`; a stack without frames is the one frame NO_STACK.
- pprof (github.com/google/pprof's proto/profile.proto, gzipped: `go tool pprof`, Pyroscope,
  speedscope): every weight is a sample value (SAMPLE_TYPES), the chosen one the default; one
  Location per frame (its address: the offset in its module's own ELF addresses; its Mapping:
  the module's path) with one Line naming its function; one Function per distinct name. The
  few messages needed are encoded here (protobuf's wire format: varints and length-delimited
  fields), not with a generated module.

The formats and what each weight counts: docs/export.md
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from tasks.format.frames import frame_lines
from tasks.stacks.profile import WEIGHTS, StackProfile

FORMATS = ("collapsed", "pprof")
NO_STACK = "(no stack)"  # the frame of calls recorded without one
# pprof's sample types (type, unit) per weight, in the order the values are written
SAMPLE_TYPES = {
    "bytes": ("alloc_space", "bytes"),
    "calls": ("alloc_objects", "count"),
    "peak": ("peak_space", "bytes"),
    "leaked": ("leak_space", "bytes"),
}
assert tuple(SAMPLE_TYPES) == WEIGHTS


def _label(profile: StackProfile, frame: int) -> str:
    """A frame's name, safe in a folded line (`;` separates frames, a line ends a stack)."""
    return profile.frames.label(frame).replace(";", ":").replace("\n", " ")


def collapsed(profile: StackProfile, weight: str = "bytes") -> str:
    """The profile as folded stacks weighted by `weight`, heaviest first (then by name);
    stacks named alike (calls from two lines of one function) are one line."""
    w = profile.weight(weight)
    lines: dict[str, int] = {}
    for k in np.flatnonzero(w > 0).tolist():  # a loop over distinct stacks
        frames = [_label(profile, int(f)) for f in profile.stacks[k][::-1]] or [NO_STACK]
        line = ";".join(frames)
        lines[line] = lines.get(line, 0) + int(w[k])
    order = sorted(lines.items(), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{line} {n}\n" for line, n in order)


# ------------------------------------------------------------------------------ pprof encoder


def _varint(out: bytearray, value: int) -> None:
    value &= 0xFFFF_FFFF_FFFF_FFFF  # int64 fields: negatives as their two's complement
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _int(out: bytearray, field: int, value: int) -> None:
    """A varint field (wire type 0); zero is the default and is left out."""
    if value:
        _varint(out, field << 3)
        _varint(out, value)


def _bytes(out: bytearray, field: int, data: bytes) -> None:
    """A length-delimited field (wire type 2): a message, a string or a packed list."""
    _varint(out, field << 3 | 2)
    _varint(out, len(data))
    out += data


def _packed(out: bytearray, field: int, values: list[int]) -> None:
    body = bytearray()
    for v in values:
        _varint(body, v)
    _bytes(out, field, bytes(body))


def _message(*fields: tuple[int, int]) -> bytes:
    out = bytearray()
    for f, v in fields:
        _int(out, f, v)
    return bytes(out)


class _Strings:
    """pprof's string table: index 0 is ""."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        return self.index.setdefault(s, len(self.index))


def pprof(profile: StackProfile, weight: str = "bytes", comment: str = "") -> bytes:
    """The profile as pprof's profile.proto, gzipped, every weight a sample value and `weight`
    the default sample type."""
    profile.weight(weight)  # a ValueError for an unknown weight
    s = _Strings()
    out = bytearray()
    for typ, unit in SAMPLE_TYPES.values():  # Profile.sample_type = 1
        _bytes(out, 1, _message((1, s(typ)), (2, s(unit))))

    values = np.stack([profile.weight(w) for w in WEIGHTS], axis=1)
    fr = profile.frames
    no_stack = len(fr) + 1  # the location id of NO_STACK, when used
    used_no_stack = False
    for k in np.flatnonzero(values.any(axis=1)).tolist():  # Profile.sample = 2
        ids = (profile.stacks[k].astype(np.int64) + 1).tolist() or [no_stack]
        used_no_stack |= ids == [no_stack]
        sample = bytearray()
        _packed(sample, 1, ids)  # location_id, the leaf first
        _packed(sample, 2, values[k].tolist())
        _bytes(out, 2, bytes(sample))

    # in the order the frames first name them: the first process's first module (its
    # executable, as the tracer records modules) first, which pprof shows as the profile's File
    modules = list(dict.fromkeys(m for m in fr.module if m))
    mapping_id = {m: i + 1 for i, m in enumerate(modules)}
    offsets = fr.offset.astype(np.uint64)
    for m in modules:  # Profile.mapping = 3: addresses are offsets in the module's ELF file
        mine = np.array([x == m for x in fr.module])
        named = all(fr.function[i] for i in np.flatnonzero(mine).tolist())
        limit = int(offsets[mine].max()) + 1
        _bytes(
            out,
            3,
            _message((1, mapping_id[m]), (2, 0), (3, limit), (5, s(m)), (7, int(named))),
        )

    # source lines where the modules have DWARF line tables (a binary built with -g, or with
    # its debug file installed): pprof's -lines and its source view read them
    lines = frame_lines(fr.module, offsets)
    function_id: dict[tuple[str, str], int] = {}
    for i in range(len(fr)):  # Profile.location = 4; a loop over distinct frames
        file, line = lines[i]
        fid = function_id.setdefault((fr.label(i), file), len(function_id) + 1)
        loc = bytearray(_message((1, i + 1), (2, mapping_id.get(fr.module[i], 0))))
        _int(loc, 3, int(offsets[i]))
        _bytes(loc, 4, _message((1, fid), (2, line)))
        _bytes(out, 4, bytes(loc))
    if used_no_stack:
        fid = function_id.setdefault((NO_STACK, ""), len(function_id) + 1)
        loc = bytearray(_message((1, no_stack)))
        _bytes(loc, 4, _message((1, fid)))
        _bytes(out, 4, bytes(loc))
    for (name, file), fid in function_id.items():  # Profile.function = 5
        _bytes(out, 5, _message((1, fid), (2, s(name)), (3, s(name)), (4, s(file))))

    if comment:
        _int(out, 13, s(comment))
    default = s(SAMPLE_TYPES[weight][0])
    for text in s.index:  # Profile.string_table = 6 (after every s() call above)
        _bytes(out, 6, text.encode())
    _int(out, 14, default)  # Profile.default_sample_type: an index already in the table
    return gzip.compress(bytes(out), mtime=0)


def write(
    profile: StackProfile, fmt: str, path: Path, weight: str = "bytes", comment: str = ""
) -> int:
    """Write the profile to `path` in `fmt` (one of FORMATS); the bytes written."""
    if fmt == "collapsed":
        data = collapsed(profile, weight).encode()
    elif fmt == "pprof":
        data = pprof(profile, weight, comment)
    else:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    Path(path).write_bytes(data)
    return len(data)
