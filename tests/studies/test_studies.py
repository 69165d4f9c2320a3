"""studies/: one folder a study, each with its script, its results and a README that gives the
command of every result; the index names every study; no result names a private path.

GIVEN the studies listed in benchmarks/suite.py and the folders under studies/ WHEN a newcomer
looks for a study's result THEN its folder holds it, its README.md says how it was made, and no
result names an absolute path of someone's machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness import PRIVATE_PATH
from benchmarks.suite import STUDIES

REPO = Path(__file__).resolve().parents[2]
STUDIES_DIR = REPO / "studies"
# what a study folder holds that is not a result
NOT_RESULTS = ("README.md", "__init__.py")


def _folders() -> list[Path]:
    return sorted(p for p in STUDIES_DIR.iterdir() if p.is_dir() and p.name != "__pycache__")


def _results(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.name not in NOT_RESULTS and p.suffix not in (".py", ".pyc")
    )


def test_every_study_folder_is_in_the_suite_and_back():
    listed = {s.name for s in STUDIES}
    folders = {p.name for p in _folders()}
    assert folders == listed, (
        f"folders without a line in benchmarks/suite.py STUDIES: {sorted(folders - listed)}; "
        f"studies listed without a folder: {sorted(listed - folders)}"
    )


def test_a_study_s_script_lives_in_its_folder():
    astray = [s.script for s in STUDIES if s.script and not s.script.startswith(s.folder + "/")]
    assert not astray, f"study scripts outside their folder studies/<name>/: {astray}"


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_every_result_has_its_command_in_the_folder_s_readme(folder):
    readme = folder / "README.md"
    assert readme.is_file(), f"{readme.relative_to(REPO)} is missing"
    text = readme.read_text()
    missing = [p.name for p in _results(folder) if f"`{p.name}`" not in text]
    assert not missing, f"{readme.relative_to(REPO)} does not name {missing}"


def test_the_index_names_every_study():
    index = (STUDIES_DIR / "README.md").read_text()
    missing = [p.name for p in _folders() if f"({p.name}/README.md)" not in index]
    assert not missing, f"studies/README.md has no line for {missing}"


def test_no_result_names_a_private_path():
    found = {
        str(p.relative_to(REPO)): PRIVATE_PATH.findall(p.read_text(errors="replace"))[:3]
        for folder in _folders()
        for p in _results(folder)
        if p.suffix != ".png"
    }
    found = {k: v for k, v in found.items() if v}
    assert not found, (
        f"result files name private paths: {found}; write them relative to the repository or "
        "the data root (benchmarks/harness.py portable)"
    )
