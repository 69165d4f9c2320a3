"""How deep the tracer records call stacks (native/FORMAT.md, Stacks): HEAPCAST_FRAMES.

`HEAPCAST_FRAMES=N`, N in 1..FRAMES_MAX, makes every allocating call record up to N return
addresses (frame 0 is the caller, so stacks imply the caller and its module map); 0 or unset
records none. `heapcast trace --frames` and the catalog's replays (`frames`) set it, both
defaulting to DEFAULT_FRAMES. Only the standard library here: the CLI imports it at start-up.
"""

from __future__ import annotations

FRAMES_ENV = "HEAPCAST_FRAMES"
FRAMES_MAX = 128  # HC_FRAMES_MAX in native/heapcast_format.h
# The floor ("at least 32"); the cost on the catalog's replays: docs/tracing-stacks.md
DEFAULT_FRAMES = 32


def frames_problem(n: int) -> str | None:
    """Why `n` is not a stack depth the tracer takes, or None when it is."""
    if not 0 <= n <= FRAMES_MAX:
        return f"must be 0 (no stacks) to {FRAMES_MAX} frames, not {n}"
    return None
