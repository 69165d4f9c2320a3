"""Seeded inputs: the same seed writes the same bytes; what is written is valid input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.replay.inputs import GENERATORS, generate_input
from tests.conftest import need_tool

REAL = [g for g in GENERATORS if g != "none"]


def _bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("generator", REAL)
def test_same_seed_same_bytes_other_seed_other_bytes(generator, tmp_path):
    a = generate_input(generator, 7, 40, tmp_path / "a")
    generate_input(generator, 7, 40, tmp_path / "b")
    generate_input(generator, 8, 40, tmp_path / "c")
    assert a and _bytes(tmp_path / "a") == _bytes(tmp_path / "b")
    assert _bytes(tmp_path / "a") != _bytes(tmp_path / "c")


@pytest.mark.parametrize("generator", REAL)
def test_size_grows_the_input(generator, tmp_path):
    generate_input(generator, 1, 20, tmp_path / "s")
    generate_input(generator, 1, 200, tmp_path / "l")
    size = lambda d: sum(len(b) for b in _bytes(d).values())  # noqa: E731
    assert size(tmp_path / "l") > size(tmp_path / "s")


def test_unknown_generator(tmp_path):
    with pytest.raises(ValueError, match="unknown input generator"):
        generate_input("nope", 1, 1, tmp_path)


def test_sql_runs_in_sqlite3(tmp_path):
    need_tool("sqlite3")
    generate_input("sql", 3, 300, tmp_path)
    out = subprocess.run(
        ["sqlite3", "-bail", ":memory:", f".read {tmp_path}/input.sql"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_python_script_compiles_and_c_file_parses(tmp_path):
    generate_input("python_script", 3, 50, tmp_path)
    compile((tmp_path / "workload.py").read_text(), "workload.py", "exec")
    need_tool("gcc")
    generate_input("c_file", 3, 30, tmp_path)
    out = subprocess.run(
        ["gcc", "-fsyntax-only", "-Wno-unused", str(tmp_path / "gen.c")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_git_stream_imports(tmp_path):
    need_tool("git")
    generate_input("git_repo", 3, 30, tmp_path / "in")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    with open(tmp_path / "in" / "repo.fi", "rb") as f:
        subprocess.run(["git", "-C", str(repo), "fast-import", "--quiet"], stdin=f, check=True)
    count = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--count", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert int(count) == 30


def test_freeciv_script_has_seeds_and_turns(tmp_path):
    generate_input("freeciv_script", 5, 12, tmp_path)
    text = (tmp_path / "script.serv").read_text()
    for needle in (
        "set gameseed",
        "set mapseed",
        "set timeout -1",
        "set minplayers 0",
        "set endturn 12",
        "aifill",
        "start",
    ):
        assert needle in text
