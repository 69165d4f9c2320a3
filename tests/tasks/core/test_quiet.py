"""TensorFlow's start-up lines held to TF_CPP_MIN_LOG_LEVEL (tasks/core/quiet.py).

GIVEN the lines TensorFlow 2.21 writes while it is imported, before Abseil logging is set up
WHEN  they pass the filter at a level
THEN  the records below the level (and their continuation lines) are gone, the rest is kept as it
      came; and a real `import tensorflow` after `import tasks` is silent by default, yet shows
      them all when the user asks for level 0.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tasks.core.config import PROJECT_DIR
from tasks.core.quiet import filter_lines, min_level

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
INFO = b"I0000 00:00:1795451130.196608    6873 port.cc:153] oneDNN custom operations are on.\n"
CPU = (
    b"I0000 00:00:1795451130.948443    6873 cpu_feature_guard.cc:227] This TensorFlow binary is "
    b"optimized to use available CPU instructions in performance-critical operations.\n"
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n"
)
WARN = b"W0000 00:00:1795451131.000001    6873 some.cc:1] a warning\n"
ERROR = b"E0000 00:00:1795451138.020469    6873 cuda_platform.cc:52] failed call to cuInit\n"
PYTHON = b"Traceback (most recent call last):\n  ValueError: not TensorFlow's\n"
STARTUP = BANNER + INFO + CPU + WARN + ERROR + b"\n" + PYTHON


@pytest.mark.parametrize(
    "level, kept",
    [
        (0, STARTUP),
        (1, WARN + ERROR + b"\n" + PYTHON),
        (2, ERROR + b"\n" + PYTHON),
        (3, b"\n" + PYTHON),
    ],
)
def test_records_below_the_level_are_dropped_and_the_rest_kept_in_order(level, kept):
    assert filter_lines(STARTUP, level) == kept


def test_other_writers_lines_between_records_are_kept():
    # Prefect's threads write to the same stderr while tensorflow is imported
    prefect = b"16:40:01.123 | INFO    | Task run 'train-0' - Created\n"
    warning = b"/x/keras.py:12: UserWarning: something\n"
    text = INFO + prefect + INFO + warning + INFO + b"second line of the record\n" + b"plain\n"
    assert filter_lines(text, 1) == prefect + warning + b"plain\n"


def test_the_level_is_read_as_tensorflow_reads_it():
    assert [min_level(e) for e in ({}, {"TF_CPP_MIN_LOG_LEVEL": "2"})] == [0, 2]
    assert min_level({"TF_CPP_MIN_LOG_LEVEL": "x"}) == 0


def test_what_the_process_writes_to_fd_2_comes_back_filtered():
    # in a child process: its fd 2 and sys.stderr are the real ones, as in `heapcast run`
    code = (
        "import os, sys\n"
        "from tasks.core.quiet import stderr_filtered\n"
        "print('before', file=sys.stderr)\n"
        "with stderr_filtered(2):\n"
        f"    os.write(2, {INFO + ERROR!r})\n"
        "    print('from python', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_DIR
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == "before\n" + ERROR.decode() + "from python\nafter\n"


def _import_tensorflow(level: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    code = "import tasks, tensorflow as tf; tf.constant(1) + 1; print('imported')"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_DIR, env=env
    )
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr[-3000:]
    return r.stderr


def test_importing_tensorflow_is_silent_by_default_and_the_users_level_wins():
    # the user's level 0: every start-up line, as TensorFlow writes them
    loud = _import_tensorflow("0")
    # (which lines TensorFlow writes depends on the machine: oneDNN's only on some CPUs, cuInit's
    # only where a CUDA library is found; the absl line comes first everywhere)
    assert "absl::InitializeLog" in loud
    # by default (the embedded defaults of `import tasks`): nothing at all
    assert _import_tensorflow(None) == ""
