"""StackProfile: what each distinct call stack of a run allocated (the contract between the
stacks' readers and their users: the report's flame graphs and tables, `heapcast export`).

A stack is a tuple of frames, innermost first (frame 0 is malloc's caller); a frame is a row of
`Frames` (function, module, offset: tasks/format/frames.py), shared by every stack that holds it. Stacks of different
processes of one run with the same frames are one stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.format.frames import Frames

WEIGHTS = ("bytes", "calls", "peak", "leaked")  # what a flame graph or an export can weigh by


@dataclass(frozen=True)
class StackProfile:
    """Per distinct stack (row k): `stacks[k]` is an int32 array of rows of `frames`, innermost
    first (empty: the call had no stack, e.g. a trace without stacks); the int64 columns say
    what its allocating calls did over the run."""

    frames: Frames
    stacks: tuple[np.ndarray, ...]
    calls: np.ndarray  # allocating calls (malloc, calloc, realloc, aligned forms)
    bytes: np.ndarray  # bytes they asked for
    peak: np.ndarray  # bytes of its blocks live at the moment the run's live heap peaked
    leaked: np.ndarray  # bytes of its blocks never freed
    temporaries: np.ndarray  # calls whose block was freed before the thread's next allocation

    def __len__(self) -> int:
        return len(self.stacks)

    def weight(self, name: str) -> np.ndarray:
        """The column a flame graph or export weighs by (one of WEIGHTS)."""
        if name not in WEIGHTS:
            raise ValueError(f"weight {name!r}: choose one of {', '.join(WEIGHTS)}")
        return getattr(self, name)
