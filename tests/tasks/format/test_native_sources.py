"""Building a native library on demand, from several threads at once (the what-if night's runs
ask for the policy core together on a fresh clone)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tasks.format.native_sources import NATIVE_DIR, POLICY_SOURCES, build_native


def test_threads_that_ask_for_one_missing_library_at_once_all_get_it(tmp_path: Path):
    native = tmp_path / "native"
    shutil.copytree(NATIVE_DIR, native, ignore=shutil.ignore_patterns("build"))

    def build(_: int) -> Path:
        return build_native(
            "policy", "libheapcast_policy.so", POLICY_SOURCES, "the policy core", native
        )

    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(build, range(4)))
    lib = native / "build" / "libheapcast_policy.so"
    assert built == [lib.resolve()] * 4
    assert lib.is_file() and not list((native / "build").glob("*.tmp"))
