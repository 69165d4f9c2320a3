"""Hand-made StackProfiles whose trees and tables are known exactly.

PROFILE: main calls parse (which allocates through xmalloc) and render (through xmalloc, and
directly in libx.so at +0x44, a frame without a symbol); one stack recurses (eval calls itself
under main); one call had no stack.

    stack (innermost first)            calls  bytes  peak  leaked  temporaries
    xmalloc <- parse <- main              10   1000   100       0            3
    xmalloc <- render <- main              5    500     0       0            1
    libx.so+0x44 <- render <- main         1   4000  4000    4000            0
    xmalloc <- eval <- eval <- main        2     64    64      64            0
    (no stack)                             2      8     0       0            0
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tasks.format.frames import Frames
from tasks.stacks.profile import StackProfile

FRAMES = Frames(
    function=("main", "parse", "xmalloc", "", "render", "eval", "xmalloc"),
    module=("/bin/p", "/bin/p", "/lib/libx.so", "/lib/libx.so", "/bin/p", "/bin/p", "/lib/libx.so"),
    # two call sites in xmalloc (rows 2 and 6) are one frame of the graph
    offset=np.array([0x10, 0x20, 0x30, 0x44, 0x50, 0x60, 0x38], dtype=np.uint64),
)
STACKS = (
    np.array([2, 1, 0], np.int32),
    np.array([6, 4, 0], np.int32),
    np.array([3, 4, 0], np.int32),
    np.array([2, 5, 5, 0], np.int32),
    np.array([], np.int32),
)


def _col(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


PROFILE = StackProfile(
    frames=FRAMES,
    stacks=STACKS,
    calls=_col(10, 5, 1, 2, 2),
    bytes=_col(1000, 500, 4000, 64, 8),
    peak=_col(100, 0, 4000, 64, 0),
    leaked=_col(0, 0, 4000, 64, 0),
    temporaries=_col(3, 1, 0, 0, 0),
)
TOTAL = {"calls": 20, "bytes": 5572, "peak": 4164, "leaked": 4064, "temporaries": 4}

# run B: render's xmalloc allocates more, libx.so+0x44 half as much and leaks nothing, parse
# is gone and a new stack allocates through xmalloc under eval's caller
LATER = StackProfile(
    frames=FRAMES,
    stacks=(STACKS[1], STACKS[2], STACKS[3], np.array([2, 0], np.int32)),
    calls=_col(9, 1, 2, 7),
    bytes=_col(900, 2000, 64, 700),
    peak=_col(0, 2000, 64, 0),
    leaked=_col(0, 0, 64, 0),
    temporaries=_col(1, 0, 0, 7),
)


def without_frames(profile: StackProfile) -> StackProfile:
    """The same figures, every stack empty (a trace without stacks)."""
    return dataclasses.replace(
        profile, stacks=tuple(np.array([], np.int32) for _ in profile.stacks)
    )
