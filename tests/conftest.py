"""Settings every test shares: no telemetry, Prefect's home inside a temp folder, one harness."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# Set before anything imports prefect: a test must never write into the project's or the
# user's Prefect home. The project's own defaults (telemetry off, startup timeout) follow.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="heapcast-test-prefect-"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from tasks.core.config import apply_embedded_defaults  # noqa: E402
from tests.native.tracer_harness import NATIVE, PROGRAMS  # noqa: E402

apply_embedded_defaults()


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test API for the whole session (its start costs ~20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_tool(tool: str, package: str | None = None) -> str:
    """The path of `tool`; skip without it on a developer's machine, fail in CI, where
    scripts/setup.sh must have installed it (a skip there would hide a missing install step)."""
    import shutil

    path = shutil.which(tool)
    if path is None:
        msg = f"{tool} is not installed (scripts/setup.sh installs it: apt-get install {package or tool})"
        if in_ci():
            pytest.fail(msg + "; CI=true requires it")
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def engine() -> str:
    """The container engine's DOCKER_HOST; skip without one on a developer's machine, fail in
    CI (`make test` starts one with scripts/engine.sh up)."""
    from tasks.replay.runners.docker_runner import engine_answers, engine_host

    host = engine_host()
    if not engine_answers(host):
        msg = (
            f"no container engine answers at DOCKER_HOST={host}; start one with "
            '`eval "$(scripts/engine.sh up)"`'
        )
        if in_ci():
            pytest.fail(msg + " (CI=true: the engine is required)")
        pytest.skip(msg)
    return host


@pytest.fixture(scope="session")
def program(tmp_path_factory) -> Callable[..., Path]:
    """Compiles tests/native/programs/<name>.c once (per set of extra gcc flags, e.g.
    "-rdynamic") and returns the executable's path.

    -fno-builtin: gcc otherwise deletes malloc/free pairs whose block is unused, and the tests
    count exactly those calls."""
    bin_dir = tmp_path_factory.mktemp("programs")
    built: dict[tuple[str, ...], Path] = {}

    def build(name: str, *flags: str) -> Path:
        key = (name, *flags)
        if key not in built:
            exe = bin_dir / (name + "".join(f.replace("/", "_") for f in flags))
            subprocess.run(
                [
                    "gcc",
                    "-O1",
                    "-g",
                    "-fno-builtin",
                    "-Wall",
                    "-pthread",
                    f"-I{NATIVE}",
                    "-o",
                    str(exe),
                    str(PROGRAMS / f"{name}.c"),
                    *flags,
                ],
                check=True,
            )
            built[key] = exe
        return built[key]

    return build


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tiers by cost and the order over the cores (tests/costs.py): a test measured at SLOW_S
    or more is `slow`; under pytest-xdist (`--dist loadfile`, as `make test` runs it) each module
    is one unit of work, sent whole to one worker, and the costliest modules start first
    (`--no-loadscope-reorder` keeps this order)."""
    from tests import costs

    table = costs.load()
    for item in items:
        if table.get(item.nodeid, 0.0) >= costs.SLOW_S:
            item.add_marker(pytest.mark.slow)
    if not hasattr(config, "workerinput"):  # not an xdist worker: the order as collected
        return
    cost: dict[str, float] = {}
    first: dict[str, int] = {}
    for k, item in enumerate(items):
        unit = costs.module_of(item.nodeid)
        cost[unit] = cost.get(unit, 0.0) + table.get(item.nodeid, costs.QUICK_S)
        first.setdefault(unit, k)
    items.sort(key=lambda i: (-cost[costs.module_of(i.nodeid)], first[costs.module_of(i.nodeid)]))
