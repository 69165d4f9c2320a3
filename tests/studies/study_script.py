"""Run a study's script as a user would, for the tests of its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_writing_nothing(script: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python script ARGS --out FILE`, FILE in tmp_path; it must not have been written (a help,
    or an input refused before anything runs)."""
    out = tmp_path / "out.json"
    p = subprocess.run(
        [sys.executable, str(script), *args, "--out", str(out)], capture_output=True, text=True
    )
    assert not out.exists()
    return p
