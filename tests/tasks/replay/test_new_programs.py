"""The perl, make_build and numpy_stack workloads: seeded inputs, catalog entries, and each input
run for real (untraced, tiny sizes) where its program is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tasks.replay.inputs import DEBIAN_NUMPY_DIR, generate_input
from tasks.replay.workloads import IMAGES_DIR, load_catalog
from tests.conftest import in_ci, need_tool
from tests.tasks.replay.replay_checks import assert_seeded_flat_input

NEW = {"perl": "perl_script", "make_build": "c_project", "numpy_stack": "numpy_script"}
IMAGES = {"perl": "perl", "make_build": "make", "numpy_stack": "numpy"}


@pytest.mark.parametrize("generator", sorted(NEW.values()))
def test_generator_same_seed_same_bytes(generator, tmp_path):
    assert_seeded_flat_input(generator, 6, tmp_path)


def test_catalog_has_the_new_programs_each_with_two_quick_inputs_and_a_larger_one():
    catalog = load_catalog()
    for name, generator in NEW.items():
        w = catalog.get(name)
        assert w.generator == generator and w.image == IMAGES[name]
        assert (IMAGES_DIR / w.image / "Dockerfile").is_file()
        quick = [i for i in w.inputs if i.quick]
        other = [i for i in w.inputs if not i.quick]
        assert len(quick) == 2 and other, name
        assert min(i.size for i in other) > max(i.size for i in quick), name
        assert len({i.seed for i in w.inputs}) == len(w.inputs), name
    assert catalog.images(list(NEW), quick=True) == ["perl", "make", "numpy"]
    driver = IMAGES_DIR / "make" / "make-driver.sh"
    assert catalog.get("make_build").command[0] == "{bin}/make-driver.sh"
    assert driver.is_file() and os.access(driver, os.X_OK)
    # the numpy script is told where Debian's numpy is: the same path on host and image
    assert catalog.get("numpy_stack").command[-1] == DEBIAN_NUMPY_DIR


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": str(cwd)}
    out = subprocess.run(argv, env=base | env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_perl_script_runs_and_repeats_itself(tmp_path):
    need_tool("perl")
    w = load_catalog().get("perl")
    generate_input("perl_script", 3, 60, tmp_path)
    argv = [a.format(input=tmp_path) for a in w.command]
    first = _run(argv, w.env, tmp_path)
    assert first.startswith("heapcast perl workload done")
    assert _run(argv, w.env, tmp_path) == first


def test_numpy_script_runs_on_debians_numpy(tmp_path):
    # Debian's interpreter and numpy, not whatever `python3.11` comes first on PATH
    for path, package in (
        (Path("/usr/bin/python3.11"), "python3.11"),
        (Path(DEBIAN_NUMPY_DIR), "python3-numpy"),
    ):
        if not path.exists():
            msg = f"{path} is missing (scripts/setup.sh installs it: apt-get install {package})"
            if in_ci():
                pytest.fail(msg + "; CI=true requires it")
            pytest.skip(msg)
    w = load_catalog().get("numpy_stack")
    generate_input("numpy_script", 3, 4, tmp_path)
    argv = [a.format(input=tmp_path) for a in w.command]
    assert argv[0] == "/usr/bin/python3.11"
    first = _run(argv, w.env, tmp_path)
    assert first.startswith("heapcast numpy workload done")
    assert _run(argv, w.env, tmp_path) == first


def test_make_driver_builds_and_runs_the_c_project(tmp_path):
    for tool in ("make", "gcc", "gcc-ar"):
        need_tool(tool, "make gcc")
    generate_input("c_project", 3, 3, tmp_path / "in")
    work = tmp_path / "work"
    work.mkdir()
    driver = IMAGES_DIR / "make" / "make-driver.sh"
    _run([str(driver), str(tmp_path / "in"), str(work)], {}, work)
    project = work / "project"
    assert (project / "libgen.a").is_file() and (project / "prog").is_file()
    assert (project / "check.txt").read_text().startswith("heapcast c project ")
    # the input folder is only read
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == sorted(
        ["Makefile", "common.h", "util.c", "main.c", "mod000.c", "mod001.c", "mod002.c"]
    )
