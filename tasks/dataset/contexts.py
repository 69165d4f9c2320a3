"""Calling contexts: the key of an allocation's first `depth` frames, as the predictors key on it.

A frame's key is its module path and offset (both survive ASLR and processes:
crc32(path) << 32 xor offset, the call site's own key, tasks/dataset/sites.py), or its raw
address where no module holds it. A context of depth d is the frames 0..d-1 of the call's stack
(frame 0: malloc's caller), folded innermost first; a stack shorter than d is its whole self.
Depth 1 is the call site the one-frame predictors key on. Keys are computed once per distinct
stack of a run (a numpy step per depth), then gathered per event.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.dataset.events_reader import StackFrames
from tasks.dataset.sites import module_hashes, site_keys

NO_CONTEXT = -1  # an event without a stack (a free, a trace recorded without stacks)


def frame_keys(frames: StackFrames) -> np.ndarray:
    """uint64 [len(frames.frames)]: each distinct frame's key (the call site's, sites.py)."""
    f = frames.frames
    paths = sorted(set(f.module))
    row = {m: i for i, m in enumerate(paths)}  # per distinct module, not event
    hashes = module_hashes(paths)[[row[m] for m in f.module]] if len(f) else np.zeros(0, np.uint64)
    return site_keys(hashes, f.offset)


def stack_contexts(frames: StackFrames, depths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """int64 [len(frames)] per depth: each stack's context key (non-negative)."""
    keys = frame_keys(frames)
    deepest = max(depths)
    m = frames.matrix(frames.ids, deepest) if len(frames) else np.zeros((0, deepest), np.int32)
    h = np.full(len(frames), 0x9E3779B97F4A7C15, np.uint64)
    out: dict[int, np.ndarray] = {}
    with np.errstate(over="ignore"):
        for d in range(m.shape[1]):  # a loop over depth, not events
            col = m[:, d]
            has = col >= 0
            step = (h ^ keys[np.maximum(col, 0)]) * np.uint64(0xFF51AFD7ED558CCD)
            step ^= step >> np.uint64(32)
            h = np.where(has, step, h)
            if d + 1 in depths:
                out[d + 1] = (h >> np.uint64(1)).astype(np.int64)
    for d in depths:  # depths past the deepest stack: the whole stacks
        out.setdefault(d, (h >> np.uint64(1)).astype(np.int64))
    return out


def event_contexts(
    frames: StackFrames, stack: pa.ChunkedArray | pa.Array | np.ndarray, depths: tuple[int, ...]
) -> dict[int, np.ndarray]:
    """int64 [n events] per depth: each event's context key, NO_CONTEXT without a stack."""
    row = frames.index(stack)
    if len(frames) == 0:  # a run without stacks (recorded with --frames 0, an older dataset)
        return {d: np.full(len(row), NO_CONTEXT, np.int64) for d in depths}
    per_stack = stack_contexts(frames, depths)
    return {d: np.where(row >= 0, k[np.maximum(row, 0)], NO_CONTEXT) for d, k in per_stack.items()}
