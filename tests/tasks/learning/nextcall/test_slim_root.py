"""tasks/learning/nextcall/slim_root.py: the root carried to a lent GPU gives the next-call study the
same tokens as the root it was cut from."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.dataset.token_runs import list_runs, read_run
from tasks.learning.nextcall import slim_root


@pytest.fixture
def full(tmp_path) -> Root:
    root = Root.from_url(str(tmp_path / "full"))
    write_synthetic_events(root, {"alpha": 2, "beta": 3}, tokens_per_run=700)
    return root


def test_the_slim_root_reads_as_the_full_one(full, tmp_path):
    out = tmp_path / "slim"
    totals = slim_root.slim(full, out, None)
    slim = Root.from_url(str(out))
    assert list_runs(slim) == list_runs(full) and totals["runs"] == 5
    for w, runs in list_runs(full).items():
        for r in runs:
            a, b = read_run(full, w, r), read_run(slim, w, r)
            assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.offsets, b.offsets)
    assert totals["rows"] == sum(
        read_run(full, w, r).n_tokens for w, rs in list_runs(full).items() for r in rs
    )


def test_a_cut_keeps_each_runs_head(full, tmp_path):
    out = tmp_path / "slim"
    slim_root.slim(full, out, 250)
    slim = Root.from_url(str(out))
    for w, runs in list_runs(full).items():
        for r in runs:
            head, cut = read_run(full, w, r).head(250), read_run(slim, w, r)
            assert cut.n_tokens == 250
            assert np.array_equal(head.tokens, cut.tokens)
            assert np.array_equal(head.offsets, cut.offsets)


def test_it_refuses_a_folder_in_use_and_an_empty_root(full, tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit):
        slim_root.main(["--root", full.url, "--out", str(used)])
    assert "not empty" in capsys.readouterr().err and (used / "keep.txt").read_text() == "mine"
    with pytest.raises(SystemExit, match="no events dataset"):
        slim_root.slim(Root.from_url(str(tmp_path / "nothing")), tmp_path / "slim", None)
