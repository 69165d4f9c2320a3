"""The README is a newcomer's first screen and the docs site builds.

GIVEN the README and docs/ WHEN a newcomer reads them THEN the README's links lead to files that
exist, its first screen holds the two commands and where to look, no sentence runs over 40 words,
and the MkDocs site builds in strict mode (a broken link or an unlisted page fails).
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _prose(text: str) -> str:
    """The README's sentences: code blocks, tables and headings left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.startswith(("|", "#"))]
    return " ".join(lines)


def test_the_readme_links_lead_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs"
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_first_screen_holds_the_commands_and_where_to_look():
    first = "\n".join(README.read_text().splitlines()[:60])
    for must in ("heapcast trace", "make run", "make test", "## Where to look", "heapcast tune"):
        assert must in first, f"README.md's first 60 lines lack {must!r}"


def test_no_readme_sentence_runs_over_40_words():
    sentences = re.split(r"(?<=[.!?:])\s+(?=[A-Z`*])", _prose(README.read_text()))
    long = [s for s in sentences if len(s.split()) > 40]
    assert not long, f"README.md sentences over 40 words: {long}"


def test_the_docs_site_builds_strict(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert (tmp_path / "layer" / "index.html").is_file()


def test_a_broken_docs_link_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nsee [the missing page](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text(
        (REPO / "mkdocs.yml").read_text().split("\nnav:")[0] + "\nnav:\n  - x: index.md\n"
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert built.returncode != 0 and "missing.md" in built.stderr
