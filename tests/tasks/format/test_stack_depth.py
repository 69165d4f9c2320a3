"""The stack depth's bounds are the tracer's own (native/heapcast_format.h)."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.format.stack_depth import FRAMES_MAX, frames_problem

HEADER = Path(__file__).resolve().parents[3] / "native" / "heapcast_format.h"


def test_the_deepest_stack_is_the_tracers():
    m = re.search(r"#define HC_FRAMES_MAX (\d+)u", HEADER.read_text())
    assert m and int(m[1]) == FRAMES_MAX


def test_a_depth_is_0_to_the_tracers_most():
    assert [frames_problem(n) for n in (0, 1, FRAMES_MAX)] == [None, None, None]
    assert (
        frames_problem(FRAMES_MAX + 1)
        == f"must be 0 (no stacks) to {FRAMES_MAX} frames, not {FRAMES_MAX + 1}"
    )
    assert frames_problem(-1) is not None
