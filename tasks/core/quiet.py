"""TensorFlow's start-up lines, held to the user's TF_CPP_MIN_LOG_LEVEL.

While `tensorflow` is imported, the process's stderr (file descriptor 2, where the C++ code
writes) goes to a temporary file; after, the lines below the level are dropped and the others
written to stderr as they came. The import itself is unchanged: `install()` adds a finder that
only wraps the module's exec_module, once. Levels are TF's (0 everything .. 3 no ERROR either);
lines that are not Abseil records are always kept. Three lines of other libraries are dropped,
each matched by its logger (or warning category) and the start of its message, never by level
(`quiet_library_lines`). Why: docs/pipeline.md#tensorflows-start-up-lines.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MODULE = "tensorflow"
# An Abseil/glog record: severity letter, MMDD, time, thread id, file:line]. Before Abseil is
# initialised the time reads "0000 00:00:<epoch seconds>.<us>": its seconds are any digits.
_RECORD = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+\S+:\d+\]")
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
# Lines of the process's other writers, never a record's continuation: Prefect's console log
# ("12:00:01.123 | INFO | ..."), Python's warnings ("file.py:12: UserWarning: ...") and tracebacks.
_OTHER_WRITER = re.compile(rb"^(\d\d:\d\d:\d\d\.\d+ \||\S+:\d+: \w+:|Traceback )")
# Abseil's own line when it was not initialised: a warning about the records that follow
_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called"


def min_level(env: dict[str, str] | os._Environ | None = None) -> int:
    """TF_CPP_MIN_LOG_LEVEL as TF reads it (unset or not a number: 0, everything)."""
    env = os.environ if env is None else env
    try:
        return int(env.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def filter_lines(data: bytes, level: int) -> bytes:
    """`data` without the Abseil records below `level`. The one unlabelled line right after a
    dropped record is taken as its continuation (the CPU-instructions message has two lines)
    and dropped with it, unless it starts like another writer's line (Prefect's console log,
    a Python warning or traceback): other threads write to the same stderr meanwhile."""
    out = []
    after_dropped = False  # the previous line was a dropped record
    for line in data.splitlines(keepends=True):
        m = _RECORD.match(line)
        if m:
            drop = _SEVERITY[m[1]] < level
        elif line.startswith(_BANNER):
            drop = level >= 1
        else:
            drop = after_dropped and bool(line.strip()) and not _OTHER_WRITER.match(line)
        after_dropped = drop and (m is not None or line.startswith(_BANNER))
        if not drop:
            out.append(line)
    return b"".join(out)


@contextmanager
def stderr_filtered(level: int) -> Iterator[None]:
    """File descriptor 2 captured for the block, then written back without the Abseil records
    below `level`. Python's sys.stderr writes to fd 2 too: they come back in order."""
    if level <= 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(prefix="heapcast-stderr-") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = filter_lines(tmp.read(), level)
            if kept:
                os.write(2, kept)


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` with the other finders and runs its module code under
    stderr_filtered; then leaves sys.meta_path."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != MODULE:
            return None
        remove()  # once: the real finders answer from here on, and for this lookup
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        # The loader object stays (importlib.resources and others use it); only this
        # instance's exec_module is wrapped, and restored once the module ran.
        real: Callable[[Any], None] = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                with stderr_filtered(min_level()):
                    real(module)
            finally:
                loader.__dict__.pop("exec_module", None)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Quiet the next `import tensorflow` (nothing when it is already imported or installed)."""
    if MODULE in sys.modules or any(isinstance(f, _QuietImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietImport())


def remove() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietImport)]


def has_nvidia_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU to processes: its device files (what the driver
    creates, and what a container is given), read without loading any CUDA library."""
    return os.path.exists("/dev/nvidiactl") or any(
        n.startswith("nvidia") and n[6:].isdigit() for n in _dev_names()
    )


def _dev_names() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


# (logger, message start) of log lines dropped. MLflow's, once per new embedded store (every fresh
# data root); Prefect's, when its embedded API starts and stops (a temporary server is the
# embedded mode's design, not something to act on).
QUIET_LOG_LINES = (
    ("mlflow.store.db.utils", "Creating initial MLflow database tables"),
    ("mlflow.store.db.utils", "Updating database tables"),  # the same new store's migrations
    ("prefect", "Starting temporary server on"),
    ("prefect", "Stopping temporary server on"),
)
# Keras, loading a registered model for inference (a champion re-scored, the whatif stage): the
# saved optimizer state is not restored into an optimizer that was never built, nor needed.
QUIET_WARNING = r"Skipping variable loading for optimizer "


class DropLines(logging.Filter):
    """Drops the records of one logger whose message starts with one of `starts`."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_library_lines() -> None:
    """Drop QUIET_LOG_LINES and the QUIET_WARNING (once per process; nothing is imported)."""
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, start in QUIET_LOG_LINES:
        by_logger[name] = (*by_logger.get(name, ()), start)
    for name, starts in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropLines) for f in logger.filters):
            logger.addFilter(DropLines(starts))
    warnings.filterwarnings("ignore", message=QUIET_WARNING, category=UserWarning)
