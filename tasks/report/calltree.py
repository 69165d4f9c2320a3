"""A run's call stacks merged into a tree (the flame graph's and the stack tables' data), and
their sums per function, from a `StackProfile`.

Frames are merged by their label (`Frames.label`: the function, else module+offset), as flame
graphs do: two call sites in one function are one frame. The top-down tree starts at the
outermost frame (`main`'s callers) and ends at the allocating function; the bottom-up tree
(`inverted=True`) starts at the allocating function (malloc's caller) and goes out to its
callers, as heaptrack's GUI shows them. Loops run over distinct stacks and frames, never over
events; the sums are numpy bincounts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tasks.stacks.profile import StackProfile

# The figures kept per node and per function, in this order (a node's `values` columns).
COLUMNS = ("calls", "bytes", "peak", "leaked", "temporaries")
NO_STACK = "(no stack recorded)"  # the frame of calls that had no stack
ROOT = "all"


@dataclass(frozen=True)
class FrameNames:
    """The distinct labels of a profile's frames: `of_frame[i]` is frame i's row in `names`;
    `modules[j]` is the module of the first frame named `names[j]` ("" when none)."""

    of_frame: np.ndarray  # int32
    names: tuple[str, ...]
    modules: tuple[str, ...]


def frame_names(profile: StackProfile) -> FrameNames:
    """The profile's frames grouped by label; NO_STACK is the last name."""
    frames = profile.frames
    index: dict[str, int] = {}
    modules: list[str] = []
    of_frame = np.empty(len(frames), dtype=np.int32)
    for i in range(len(frames)):  # a loop over distinct frames
        label = frames.label(i)
        if label not in index:
            index[label] = len(index)
            modules.append(frames.module[i])
        of_frame[i] = index[label]
    index.setdefault(NO_STACK, len(index))
    if len(modules) < len(index):
        modules.append("")
    return FrameNames(of_frame, tuple(index), tuple(modules))


def stack_values(profile: StackProfile) -> np.ndarray:
    """(stacks, len(COLUMNS)) int64: each stack's figures."""
    return np.stack([np.asarray(getattr(profile, c), dtype=np.int64) for c in COLUMNS], axis=1)


def _named_stacks(profile: StackProfile, names: FrameNames) -> list[np.ndarray]:
    """Each stack as name rows, innermost first (a stack without frames: [NO_STACK])."""
    none = np.array([len(names.names) - 1], dtype=np.int32)
    return [names.of_frame[s] if len(s) else none for s in profile.stacks]


@dataclass(frozen=True)
class CallTree:
    """Stacks merged from their first frame on: node 0 is the root (every stack); node k > 0
    is a frame (`name[k]`, a row of `names`) reached from `parent[k]` (parent < k).
    `values[k]` sums COLUMNS over the stacks through node k (inclusive)."""

    parent: np.ndarray  # int32; -1 for the root
    name: np.ndarray  # int32; -1 for the root
    values: np.ndarray  # (nodes, len(COLUMNS)) int64
    names: tuple[str, ...]
    modules: tuple[str, ...]
    inverted: bool = False

    def __len__(self) -> int:
        return len(self.parent)

    def label(self, k: int) -> str:
        return ROOT if k == 0 else self.names[self.name[k]]

    def children(self) -> list[np.ndarray]:
        """Each node's children, in node order."""
        kids = np.argsort(self.parent[1:], kind="stable") + 1
        counts = np.bincount(self.parent[1:], minlength=len(self))
        return np.split(kids, np.cumsum(counts)[:-1])


def call_tree(profile: StackProfile, inverted: bool = False) -> CallTree:
    """The top-down tree of the profile's stacks (outermost frame first), or the bottom-up one
    (`inverted`: the allocating function first). Built a depth at a time: the nodes at depth d
    are the distinct (node at depth d - 1, name at depth d) of the stacks that deep."""
    names = frame_names(profile)
    paths = _named_stacks(profile, names)
    n_names = len(names.names)
    lengths = np.array([len(p) for p in paths], dtype=np.int64)
    per_stack = stack_values(profile)
    parent, name = [np.array([-1])], [np.array([-1])]
    values = [per_stack.sum(axis=0, keepdims=True)]
    if len(paths):
        flat = np.concatenate(paths).astype(np.int64)
        stack_of = np.repeat(np.arange(len(paths)), lengths)
        pos = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        depth = pos if inverted else np.repeat(lengths, lengths) - 1 - pos
        # by depth, then stack: the frames at each depth are one slice
        order = np.lexsort((stack_of, depth))
        flat, stack_of, depth = flat[order], stack_of[order], depth[order]
        bounds = np.searchsorted(depth, np.arange(int(lengths.max()) + 1))
        node = np.zeros(len(paths), dtype=np.int64)  # each stack's node so far: the root
        count = 1
        for d in range(len(bounds) - 1):  # a loop over depths
            at = slice(bounds[d], bounds[d + 1])
            s = stack_of[at]
            uniq, inv = np.unique(node[s] * n_names + flat[at], return_inverse=True)
            parent.append(uniq // n_names)
            name.append(uniq % n_names)
            node[s] = count + inv
            v = np.zeros((len(uniq), len(COLUMNS)), dtype=np.int64)
            np.add.at(v, inv, per_stack[s])
            values.append(v)
            count += len(uniq)
    return CallTree(
        np.concatenate(parent).astype(np.int32),
        np.concatenate(name).astype(np.int32),
        np.concatenate(values),
        names.names,
        names.modules,
        inverted,
    )


@dataclass(frozen=True)
class FunctionSums:
    """Per function (a row of `names`): `inclusive[j]` sums COLUMNS over the stacks that hold
    it (once per stack, however deep it recurses), `self_[j]` over the stacks it allocates in
    (it is malloc's caller)."""

    names: tuple[str, ...]
    modules: tuple[str, ...]
    inclusive: np.ndarray  # (names, len(COLUMNS)) int64
    self_: np.ndarray


def function_sums(profile: StackProfile) -> FunctionSums:
    names = frame_names(profile)
    paths = _named_stacks(profile, names)
    n = len(names.names)
    per_stack = stack_values(profile)
    inclusive = np.zeros((n, len(COLUMNS)), dtype=np.int64)
    self_ = np.zeros((n, len(COLUMNS)), dtype=np.int64)
    if paths:
        lengths = np.array([len(p) for p in paths])
        stack_of = np.repeat(np.arange(len(paths)), lengths)
        # one (stack, function) pair per function in a stack, however often it recurses
        pair = np.sort(stack_of * n + np.concatenate(paths).astype(np.int64))
        pair = pair[np.r_[True, pair[1:] != pair[:-1]]]
        ps, pf = pair // n, pair % n
        first = np.array([p[0] for p in paths], dtype=np.int64)
        for j in range(len(COLUMNS)):
            inclusive[:, j] = np.rint(np.bincount(pf, weights=per_stack[ps, j], minlength=n))
            self_[:, j] = np.rint(np.bincount(first, weights=per_stack[:, j], minlength=n))
    return FunctionSums(names.names, names.modules, inclusive, self_)


def stack_paths(profile: StackProfile) -> list[tuple[str, ...]]:
    """Each stack as its frames' labels, innermost first (the key two runs' stacks are
    matched by)."""
    names = frame_names(profile)
    return [tuple(names.names[i] for i in p.tolist()) for p in _named_stacks(profile, names)]


def has_stacks(profile: StackProfile | None) -> bool:
    """Whether a profile holds any stack with frames (a trace recorded without stacks gives
    none, or only empty ones)."""
    return profile is not None and any(len(s) for s in profile.stacks)


def column(name: str) -> int:
    return COLUMNS.index(name)


def totals(profile: StackProfile) -> dict[str, int]:
    v = stack_values(profile).sum(axis=0)
    return {c: int(x) for c, x in zip(COLUMNS, v)}


def ranked(values: np.ndarray, by: Sequence[str], n: int) -> np.ndarray:
    """Row indices of the n rows with the largest first `by` column (ties: the next `by`,
    then the row), rows where all `by` columns are 0 left out."""
    keys = [values[:, column(b)] for b in by]
    order = np.lexsort((np.arange(len(values)), *[-k for k in reversed(keys)]))
    nonzero = np.any(np.stack(keys, axis=1) != 0, axis=1)
    return order[nonzero[order]][:n]
