"""What each native library is built from (native/Makefile lists the same files as its
prerequisites): the one list the build tasks and the CLI check a library's age against, and the
one way to build a library when a source is newer (`build_native`). Standard library only, apart
from tasks.format.build (which imports Prefect), so that the CLI can read it at once."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import threading
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"

# the tracer, native/build/libheapcast.so (make's default target): heapcast.c and the parts it
# includes (one translation unit)
TRACER_SOURCES = (
    "heapcast.c",
    "heapcast_state.c",
    "heapcast_file.c",
    "heapcast_unwind.c",
    "heapcast_modules.c",
    "heapcast_writer.c",
    "heapcast_stacks.c",
    "heapcast_hooks.c",
    "heapcast_format.h",
    "bootstrap_pool.h",
    "module_range.h",
    "real.h",
    "say.h",
    "options.h",
    "Makefile",
)
# the allocator layer, native/build/libheapcast_layer.so (make's `layer` target): layers/layer.c
# and the parts it includes (one translation unit)
LAYER_SOURCES = (
    "layers/layer.c",
    "layers/layer/options.c",
    "layers/layer/locks.c",
    "layers/layer/stats.c",
    "layers/layer/live.c",
    "layers/layer/cache.c",
    "layers/layer/predict.c",
    "layers/layer/policy.c",
    "layers/layer/fronts.c",
    "layers/layer/alloc.c",
    "layers/layer/follow.c",
    "layers/layer/free.c",
    "layers/layer/hooks.c",
    "layers/layer/table.c",
    "layers/layer/init.c",
    "policy/core.c",
    "policy/core.h",
    "layers/predictor.h",
    "bootstrap_pool.h",
    "module_range.h",
    "site_key.h",
    "table_head.h",
    "real.h",
    "say.h",
    "options.h",
    "Makefile",
)
# the placement layer, native/build/libheapcast_place.so (make's `place` target): layers/place.c
# and the parts it includes (one translation unit)
PLACE_SOURCES = (
    "layers/place.c",
    "layers/place/options.c",
    "layers/place/sites.c",
    "layers/place/stats.c",
    "layers/place/sample.c",
    "layers/place/life.c",
    "layers/place/sites_file.c",
    "layers/place/init.c",
    "layers/place/decide.c",
    "layers/place/hooks.c",
    "layers/place/cxx.c",
    "layers/place/watch.c",
    "bootstrap_pool.h",
    "site_key.h",
    "module_range.h",
    "table_head.h",
    "real.h",
    "say.h",
    "options.h",
    "Makefile",
)
# the policy core's batch replay, native/build/libheapcast_policy.so (make's `policy` target):
# policy/replay.c, which includes policy/core.c
POLICY_SOURCES = (
    "policy/replay.c",
    "policy/core.c",
    "policy/core.h",
    "layers/predictor.h",
    "Makefile",
)


class NativeBuildError(RuntimeError):
    """A native library cannot be built; the message names the missing tool or make's error."""


def build_native(
    target: str,
    library: str,
    sources: tuple[str, ...],
    what: str,
    native_dir: str | Path | None = None,
    error: type[NativeBuildError] = NativeBuildError,
) -> Path:
    """`make -C native TARGET` when `library` (under native/build) is missing or older than one
    of `sources`; its path. `what` names the library in errors (raised as `error`)."""
    native = Path(native_dir or NATIVE_DIR).resolve()
    lib = native / "build" / library
    if _up_to_date(native, lib, sources):
        return lib
    # one build at a time, across threads and processes: two makes of one library write the
    # same temporary file, and the second's `mv` finds it gone
    (native / "build").mkdir(parents=True, exist_ok=True)
    with _BUILD_LOCK, open(native / "build" / ".build.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if _up_to_date(native, lib, sources):  # built meanwhile by the holder before us
            return lib
        return _make(native, lib, target, what, error)


_BUILD_LOCK = threading.Lock()


def _up_to_date(native: Path, lib: Path, sources: tuple[str, ...]) -> bool:
    try:
        built = lib.stat().st_mtime_ns
        return all((native / s).stat().st_mtime_ns <= built for s in sources)
    except FileNotFoundError:
        return False


def _make(native: Path, lib: Path, target: str, what: str, error: type[NativeBuildError]) -> Path:
    for tool in ("make", "cc"):
        if shutil.which(tool) is None:
            raise error(
                f"cannot build {what}: `{tool}` is not on PATH (install make and a C compiler: "
                "apt-get install build-essential)"
            )
    proc = subprocess.run(["make", "-s", "-C", str(native), target], capture_output=True, text=True)
    if proc.returncode != 0 or not lib.is_file():
        raise error(
            f"`make -C {native} {target}` failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-1000:]}{proc.stderr[-3000:]}"
        )
    return lib
