"""Call stacks in the events dataset: each process's stack trie -> run-level stack ids, the
events' `stack` column and the run's stacks table (STACKS_SCHEMA).

A stack's id is a hash of its frames, each frame (module path, offset in the module) or, in no
module, its raw address; so the same frames in two processes of a run (ASLR moves the addresses,
not the offsets) are one id, and each file is converted on its own, with no id to agree on.

    ProcessStacks.of_trace(trace)   per file: the ids of its trie's nodes; `column` maps a group
                                    of records' stack ids to events' ids, `table` gives the
                                    frames of the stacks they used (unnamed), `warnings` what
                                    was missing (a truncated trie, frames in no module)
    run_stacks(tables, sysroot)     per run: the files' tables merged, one row per (stack,
                                    depth), each distinct (module, offset) named once

Why and the layout: docs/dataset.md#call-stacks. Per-event work is numpy (a lookup table by
node id); the per-trie work is one numpy step a depth.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dataset.events_schema import CALLER_MODULE_TYPE, STACKS_SCHEMA
from tasks.format.frames import frame_names, module_file
from tasks.format.trace_reader import StackNodes, Trace

# A file's stacks before naming: STACKS_SCHEMA less the function column.
FRAMES_SCHEMA = pa.schema([f for f in STACKS_SCHEMA if f.name != "function"])

_U64 = np.uint64
_ROOT_KEY = _U64(0x6A09E667F3BCC908)  # the hash of the empty stack (the trie's root)
_ODD = _U64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise (a bijection of uint64 that mixes every bit)."""
    x = x ^ (x >> _U64(30))
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def _module_keys(paths: Sequence[str]) -> np.ndarray:
    """A 64-bit key per module path (blake2b: the same in every process and every run)."""
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "little")
            for p in paths
        ],
        dtype=np.uint64,
    )  # a loop over modules, not events


def frame_keys(module_key: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The key of each frame: its module's key (0: no module) mixed with its offset."""
    return _splitmix(module_key ^ _splitmix(np.asarray(offset, dtype=np.uint64)))


def stack_key(parent: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """The id of a stack made of a parent stack (its id; the root: _ROOT_KEY) with one frame
    inside it (its frame key): order matters, so a stack and its reverse differ."""
    with np.errstate(over="ignore"):
        return _splitmix(parent * _ODD + frame)


@dataclass
class ProcessStacks:
    """A process's stack trie, keyed for the run: per trie row (StackNodes order) its stack's
    run-level id, its frame's module (index into `paths`, -1: none) and offset (the raw address
    without a module), its parent's row (-1: the root, or a parent missing from the file)."""

    path: str  # the trace file, for messages
    trie: StackNodes
    ids: np.ndarray  # uint64 per trie row, with one more slot (the id of "no node", unused)
    module: np.ndarray  # int32 per trie row
    offset: np.ndarray  # uint64 per trie row
    parent_row: np.ndarray  # int64 per trie row
    paths: tuple[str, ...]  # the process's module paths
    lut: np.ndarray | None  # trie row (int32; -1 none) by node id where ids are dense
    used: np.ndarray  # bool per trie row, and the extra slot: a record named the stack
    cut: int  # nodes whose parent is not in the file (a truncated trie)
    unknown_records: int  # records whose stack had no node (the reader read them as none)

    @classmethod
    def of_trace(cls, trace: Trace) -> ProcessStacks | None:
        """The trie of a stack trace, keyed; None for a trace without stacks."""
        trie = trace.stacks
        if trie is None:
            return None
        n = len(trie)
        mods = trace.modules
        paths = tuple(mods.path) if mods is not None else ()
        if mods is not None and len(mods):
            module, offset = mods.locate(trie.address)
        else:
            module, offset = np.full(n, -1, np.int32), np.zeros(n, np.uint64)
        outside = module < 0
        offset = np.where(outside, trie.address, offset)
        mkey = np.concatenate([_module_keys(paths), np.zeros(1, np.uint64)])
        fkey = frame_keys(mkey[module], offset)  # module -1: the last slot, key 0
        parent_row = trie.index(trie.parent)
        depth = trie.depth.astype(np.int64)
        # a parent that is missing, or not one level out (a corrupt file), cuts the stack there
        has_parent = parent_row >= 0
        bad = trie.parent != 0
        bad &= ~has_parent | (depth[np.maximum(parent_row, 0)] != depth - 1)
        parent_row = np.where(bad | ~has_parent, -1, parent_row)
        ids = np.zeros(n + 1, np.uint64)
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.unique(depth), side="left")
        for lo, hi in zip(bounds, list(bounds[1:]) + [n]):  # one numpy step a depth
            rows = order[lo:hi]
            p = parent_row[rows]
            pk = np.where(p >= 0, ids[np.maximum(p, 0)], _ROOT_KEY)
            ids[rows] = stack_key(pk, fkey[rows])
        lut = None
        max_id = int(trie.id[-1]) if n else 0
        if max_id <= 4 * n + (1 << 16):  # the tracer's ids count from 1: dense
            lut = np.full(max_id + 1, -1, np.int32)
            lut[trie.id.astype(np.int64)] = np.arange(n, dtype=np.int32)
        return cls(
            path=trace.header.path,
            trie=trie,
            ids=ids,
            module=module,
            offset=offset.astype(np.uint64),
            parent_row=parent_row,
            paths=paths,
            lut=lut,
            used=np.zeros(n + 1, bool),
            cut=int(np.count_nonzero(bad)),
            unknown_records=trace.unknown_stack_records,
        )

    def column(self, raw: np.ndarray) -> pa.Array:
        """The events' stack column (uint64, null: none) of a group of records' stack ids (0:
        none); marks the stacks named as used."""
        if self.lut is not None:
            rows = np.take(self.lut, raw.view(np.int64))
        else:
            rows = self.trie.index(raw)
        # row -1 (none) picks the extra last slot of ids and used: no per-event mask needed
        self.used[rows] = True
        values = np.take(self.ids, rows)
        valid = rows >= 0
        if valid.all():
            return pa.array(values, type=pa.uint64())
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(
            pa.uint64(),
            len(values),
            [bitmap, pa.py_buffer(values)],
            null_count=len(valid) - int(np.count_nonzero(valid)),
        )

    def count(self) -> int:
        """How many distinct stacks `column` was given."""
        return int(np.count_nonzero(self.used[:-1]))

    def table(self) -> pa.Table:
        """The frames (FRAMES_SCHEMA) of every stack `column` was given, innermost first: one
        numpy step a depth over the stacks, not the events."""
        cur = np.flatnonzero(self.used[:-1])
        stack = self.ids[cur]
        parts: list[tuple[np.ndarray, ...]] = []
        depth = 0
        while len(cur):
            parts.append((stack, np.full(len(cur), depth, np.uint16), cur))
            nxt = self.parent_row[cur]
            keep = nxt >= 0
            cur, stack = nxt[keep], stack[keep]
            depth += 1
        if not parts:
            return FRAMES_SCHEMA.empty_table()
        stack = np.concatenate([p[0] for p in parts])
        depths = np.concatenate([p[1] for p in parts])
        rows = np.concatenate([p[2] for p in parts])
        module = self.module[rows]
        return pa.Table.from_arrays(
            [
                pa.array(stack, pa.uint64()),
                pa.array(depths, pa.uint16()),
                pa.DictionaryArray.from_arrays(
                    pa.array(module, mask=module < 0, type=pa.int32()),
                    pa.array(list(self.paths), type=pa.string()),
                ),
                pa.array(self.offset[rows], pa.uint64()),
            ],
            schema=FRAMES_SCHEMA,
        )

    def warnings(self) -> list[str]:
        """One line per thing the file's stacks lack, naming the file."""
        out = []
        if self.cut:
            out.append(
                f"{self.path}: {self.cut} stack node(s) name a parent node that is not in the "
                "file (its stack table is truncated or corrupt); their stacks end at the "
                "missing node"
            )
        if self.unknown_records:
            out.append(
                f"{self.path}: {self.unknown_records} record(s) name a stack whose nodes are not "
                "in the file (a thread's buffer was lost); their stack is null"
            )
        lost = self.module < 0
        if self.paths and lost.any():
            first = int(self.trie.address[np.flatnonzero(lost)[0]])
            out.append(
                f"{self.path}: {int(lost.sum())} of {len(lost)} stack frame(s) are in no module of "
                f"its module map (e.g. 0x{first:x}: JIT code, or a module mapped without a "
                "record); they keep their raw address as offset, unnamed"
            )
        return out


@dataclass(frozen=True)
class RunStacks:
    """The run's stacks table (STACKS_SCHEMA) and what it holds, for the run's summary."""

    table: pa.Table
    stacks: int  # distinct stacks
    frames: int  # distinct (module, offset) frames
    named: int  # of them, named
    unreadable_modules: tuple[str, ...]  # modules of frames that no file here could name


def run_stacks(tables: Sequence[pa.Table], sysroot: Path | None = None) -> RunStacks:
    """The run's stacks table from its files' (FRAMES_SCHEMA): a stack several processes used is
    kept once (its frames from the first file that has it: equal ids, equal frames), sorted by
    (stack, depth); each distinct (module, offset) named once (tasks.format.frames, under
    `sysroot` first: a container replay's copies of the image's modules)."""
    paths: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {"stack": [], "depth": [], "module": [], "offset": []}
    for i, t in enumerate(list(tables) or [FRAMES_SCHEMA.empty_table()]):  # a loop over files
        t = t.unify_dictionaries().combine_chunks()
        mod = t.column("module")
        mod = mod.chunk(0) if mod.num_chunks else pa.array([], type=CALLER_MODULE_TYPE)
        remap = [paths.setdefault(p, len(paths)) for p in mod.dictionary.to_pylist()]
        idx = mod.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        cols["module"].append(np.array(remap + [-1], np.int32)[idx])
        for c in ("stack", "depth", "offset"):
            cols[c].append(t.column(c).to_numpy())
        cols.setdefault("file", []).append(np.full(t.num_rows, i, np.int32))
    stack, depth, module, offset, where = (
        np.concatenate(cols[c]) for c in ("stack", "depth", "module", "offset", "file")
    )
    order = np.lexsort((depth, where, stack))
    stack, depth, module, offset, where = (a[order] for a in (stack, depth, module, offset, where))
    # keep each stack's rows of the first file that has it
    start = np.ones(len(stack), bool)
    start[1:] = stack[1:] != stack[:-1]
    first_file = where[np.maximum.accumulate(np.where(start, np.arange(len(stack)), 0))]
    keep = where == first_file
    stack, depth, module, offset = (a[keep] for a in (stack, depth, module, offset))

    # name each distinct (module, offset) once
    names_of = list(paths)
    in_module = np.flatnonzero(module >= 0)
    pairs = np.stack([module[in_module].astype(np.uint64), offset[in_module]], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    frame_mods = [names_of[int(m)] for m in uniq[:, 0]]  # a loop over distinct frames
    names: list[str] = []
    function = np.zeros(len(stack), np.int32)  # index into `dictionary`; 0: ""
    dictionary = [""]
    if len(uniq):
        names = frame_names(frame_mods, uniq[:, 1], sysroot)
        dictionary += sorted(set(names) - {""})
        code = {n: k for k, n in enumerate(dictionary)}
        per_frame = np.array([code[n] for n in names], np.int32)  # a loop over distinct frames
        function[in_module] = per_frame[inverse.reshape(-1)]
    used_mods = {names_of[int(m)] for m in np.unique(module[in_module])}
    # a file to read symbols from (the vDSO has none: not a path)
    unreadable = sorted(
        m for m in used_mods if m.startswith("/") and not Path(module_file(m, sysroot)).is_file()
    )
    table = pa.Table.from_arrays(
        [
            pa.array(stack, pa.uint64()),
            pa.array(depth, pa.uint16()),
            pa.DictionaryArray.from_arrays(
                pa.array(module, mask=module < 0, type=pa.int32()),
                pa.array(names_of, type=pa.string()),
            ),
            pa.array(offset, pa.uint64()),
            pa.DictionaryArray.from_arrays(
                pa.array(function, pa.int32()), pa.array(dictionary, pa.string())
            ),
        ],
        schema=STACKS_SCHEMA,
    )
    return RunStacks(
        table=table,
        stacks=int(np.count_nonzero(depth == 0)),
        frames=len(uniq),
        named=sum(1 for n in names if n),
        unreadable_modules=tuple(unreadable),
    )
