"""Keep a converting worker's freed memory for its next conversion; give it back when idle.

While conversions run (`heap_kept`), large blocks come from the heap (not glibc's mmap, whose
fresh pages cost about a third of a conversion's CPU time) and freed memory stays there for the
next temporary. The memory is kept for HOLD_S seconds after the last conversion ends; when no
conversion starts within that time, malloc's settings are restored and malloc_trim gives the
memory back to the system. No effect without glibc. Other code of the process that allocates
during a conversion or the hold also takes its large blocks from the heap; that costs at most
fragmentation until the release. Why: docs/dataset.md#a-converting-workers-heap.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HOLD_S = 5.0

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_MMAP_MAX_DEFAULT, _TRIM_DEFAULT = 65536, 128 * 1024  # glibc's defaults
try:
    _LIBC: Any = ctypes.CDLL(None)
    _LIBC.mallopt, _LIBC.malloc_trim  # noqa: B018 (both needed)
except (OSError, AttributeError):
    _LIBC = None

_lock = threading.Lock()
_users = 0  # conversions running in this process
_kept = False  # malloc currently keeps large blocks on the heap
_timer: threading.Timer | None = None


def is_kept() -> bool:
    """Whether freed memory is being kept (a conversion runs, or one ended under HOLD_S ago)."""
    return _kept


@contextmanager
def heap_kept(hold_s: float | None = None) -> Iterator[None]:
    """Run a conversion with large blocks kept on the heap; release `hold_s` (default HOLD_S)
    seconds after the last one ends, unless another starts first."""
    global _users, _kept, _timer
    if _LIBC is None:
        yield
        return
    with _lock:
        if _timer is not None:
            _timer.cancel()
            _timer = None
        _users += 1
        if not _kept:
            _LIBC.mallopt(_M_MMAP_MAX, 0)
            _LIBC.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
            _kept = True
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _timer = threading.Timer(HOLD_S if hold_s is None else hold_s, release_if_idle)
                _timer.daemon = True
                _timer.start()


def release_if_idle() -> bool:
    """Restore malloc's settings and give the kept memory back, unless a conversion runs.
    True when released."""
    global _kept, _timer
    with _lock:
        if _users or not _kept or _LIBC is None:
            return False
        if _timer is not None:
            _timer.cancel()
            _timer = None
        _LIBC.mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _TRIM_DEFAULT)
        _LIBC.malloc_trim(0)
        _kept = False
        return True
