"""The scaling study (studies/scaling/scaling.py): its command, its errors, its plan.

GIVEN the study's script WHEN it is asked for help, pointed at a root without events or without
the held-out programs, or planned THEN help runs nothing, a bad root is one line naming what is
missing and what to run, the program schedule is fixed by its seed and mixes kinds, and (slow) a
tiny end-to-end run on synthetic events writes the JSON, the table and the figure, every point
scored on the same held-out positions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from studies.scaling import scaling as bs

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "studies" / "scaling" / "scaling.py"


def test_help_runs_nothing(tmp_path):
    # GIVEN every path it would write to or read from, and --help after them
    out = tmp_path / "out"
    argv = ["--root", str(tmp_path / "root"), "--out-dir", str(out), "--help"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "--programs" in done.stdout and "--sizes" in done.stdout
    assert "--epochs" in done.stdout
    # THEN it made nothing: no output folder, no data root
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_root_without_events_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bs.main(["--root", str(tmp_path / "empty"), "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no events dataset" in err
    assert "heapcast replay --root" in err and "heapcast dataset --root" in err
    assert not out.exists()


def test_a_root_without_the_heldout_programs_names_them(tmp_path, capsys):
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events

    root = tmp_path / "root"
    write_synthetic_events(Root.from_url(str(root)), {"alpha": 2, "beta": 2}, tokens_per_run=300)
    rc = bs.main(["--root", str(root), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    # configs/train.yaml's held-out programs, and workloads that run them
    assert "perl" in err and "nasm" in err and "graphviz_dot" in err
    assert "heapcast replay --root" in err


def test_render_only_needs_a_result_and_no_root(tmp_path, capsys):
    assert bs.main(["--render-only", "--out-dir", str(tmp_path)]) == 2
    assert "no results to render" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bs.main(["--out-dir", str(tmp_path)])  # training needs --root
    assert "--root is required" in capsys.readouterr().err


KINDS = {
    "gcc": "compiler",
    "nasm": "compiler",
    "tcc": "compiler",
    "bison": "compiler",
    "cpython": "interpreter",
    "ruby": "interpreter",
    "php": "interpreter",
    "sort": "text",
    "grep": "text",
    "sed": "text",
    "xz": "compression",
    "zstd": "compression",
    "sqlite3": "database",
}


def test_the_schedule_is_fixed_by_its_seed_and_mixes_kinds():
    a = bs.program_schedule(KINDS, seed=0)
    assert a == bs.program_schedule(dict(reversed(KINDS.items())), seed=0)  # not input order
    assert sorted(a) == sorted(KINDS)
    n_kinds = len(set(KINDS.values()))
    # round robin: the first programs are one of each kind, every prefix as mixed as it can be
    assert len({KINDS[p] for p in a[:n_kinds]}) == n_kinds
    total = {k: list(KINDS.values()).count(k) for k in set(KINDS.values())}
    for n in range(1, len(a) + 1):
        count = {k: sum(KINDS[p] == k for p in a[:n]) for k in total}
        # a kind with programs left is never two behind another kind
        assert all(count[k] >= max(count.values()) - 1 for k in total if count[k] < total[k])
    others = {tuple(bs.program_schedule(KINDS, seed=s)) for s in range(1, 6)}
    assert len(others | {tuple(a)}) > 1  # the seed matters


def test_the_points_cap_the_program_counts_and_keep_every_size():
    assert bs.program_counts(["2", "4", "8", "16", "all"], 11) == [2, 4, 8, 11]
    assert bs.program_counts(["all", "3"], 3) == [3]
    with pytest.raises(bs.ScalingError):
        bs.program_counts(["1"], 5)
    with pytest.raises(bs.ScalingError):
        bs.program_counts(["many"], 5)
    small, big = bs.parse_size("8/4"), bs.parse_size("16@20")
    assert small.units == (8, 4) and small.context is None
    assert big.units == (16,) and big.context == 20 and big.label == "16@20"
    axes = bs.plan_points([2, 4], [small, big], "axes", small)
    assert axes == [(2, small), (4, small), (4, big)]
    assert len(bs.plan_points([2, 4], [small, big], "full", small)) == 4


@pytest.mark.parametrize("text", ["", "a/b", "8/0", "8@1"])
def test_a_bad_size_is_refused(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        bs.parse_size(text)


def test_every_point_holds_out_the_same_programs(tmp_path):
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events
    from tasks.replay.workloads import load_catalog

    root = Root.from_url(str(tmp_path / "root"))
    write_synthetic_events(root, {"alpha": 2, "beta": 3, "gamma": 2, "solo": 1}, 300)
    inv = bs.inventory(root, load_catalog(), ["gamma", "perl"], "R")
    assert inv.heldout == {"gamma": ["gamma"]} and inv.heldout_absent == ["perl"]
    assert sorted(inv.programs) == ["alpha", "beta"]  # solo: one run, nothing to evaluate on
    over = bs.point_overrides(
        ["alpha", "beta"],
        ["gamma"],
        bs.parse_size("8@10"),
        epochs=3,
        patience=1,
        steps_per_epoch=None,
        tokens_per_run=100,
        validation_tokens=None,
        eval_tokens=50,
        checkpoint_dir="ck",
    )
    assert over["data"]["heldout_workloads"] == [] and over["data"]["max_train_tokens"] == 200
    assert over["context"] == 10 and over["model"]["units"] == [8]
    assert "max_validation_tokens" not in over["data"]  # the config's


@pytest.mark.slow
def test_a_tiny_study_writes_its_json_table_and_figure(tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip("matplotlib")
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events

    root = tmp_path / "root"
    write_synthetic_events(
        Root.from_url(str(root)), {"alpha": 2, "beta": 2, "delta": 2, "gamma": 2}, 2000
    )
    (tmp_path / "heldout.yaml").write_text("data:\n  heldout_programs: [gamma]\n")
    (tmp_path / "tiny.yaml").write_text(
        "context: 10\nmodel: {kind: gru, units: [8], ngram_features: true, ngram_crossfit: 0.5,"
        " online_features: true}\nbatch_size: 8\nsteps_per_epoch: 3\neval_batch_size: 32\n"
        "ngram: {max_order: 4}\nquestions: {network: true, epochs: 1, units: 8}\n"
    )
    out = tmp_path / "out"
    rc = bs.main(
        [
            "--root",
            str(root),
            "--config",
            str(tmp_path / "tiny.yaml"),
            "--heldout-config",
            str(tmp_path / "heldout.yaml"),
            "--programs",
            "2",
            "all",
            "--sizes",
            "8",
            "16",
            "--epochs",
            "2",
            "--steps-per-epoch",
            "3",
            "--out-dir",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads((out / "scaling.json").read_text())
    assert {"machine", "commit", "command", "results"} <= set(doc)
    assert str(tmp_path) not in json.dumps(doc)  # the root is written as <root>
    r = doc["results"]
    assert r["heldout_programs"] == ["gamma"]
    points = r["points"]
    assert [(p["programs"], p["size"]) for p in points] == [(2, "8"), (3, "8"), (3, "16")]
    positions = {p["next_call"]["unseen_programs"]["model"]["positions"] for p in points}
    assert len(positions) == 1 and positions.pop() == r["unseen_program_positions"] > 0
    for p in points:
        nc = p["next_call"]["unseen_programs"]
        assert {"model", "ngram_online", "majority", "model_hedged"} <= set(nc)
        # the mixture's figures per held-out workload and pooled, on the same positions
        by = p["next_call_by_workload"]
        assert set(by) == {"gamma", "all"} and by["all"]["model_hedged"] == nc["model_hedged"]
        assert by["all"]["model_hedged"]["positions"] == nc["model"]["positions"]
        # the network's own figures from its distribution are the scorer's
        assert by["all"]["model"]["log_loss"] == pytest.approx(nc["model"]["log_loss"], abs=2e-4)
        assert 1 <= p["epochs_run"] <= 2
        assert "reuse" in p["questions"]["unseen_programs"]
        # the top-1 headroom: the same positions and the same two top-1s the tables score
        head = p["top1_headroom"]
        assert set(head["by_program"]) == {"gamma"}
        pooled = head["pooled"]
        assert pooled["positions"] == nc["model"]["positions"]
        assert pooled["counter"] == pytest.approx(nc["ngram_online"]["top1"], abs=1e-4)
        assert pooled["network"] == pytest.approx(nc["model"]["top1"], abs=1e-4)
        assert pooled["better_of_two"] >= max(pooled["counter"], pooled["network"])
        assert pooled["counter"] - pooled["counter_alone"] == pytest.approx(
            pooled["network"] - pooled["network_alone"], abs=2e-4
        )  # both right: the same calls counted from either side
    assert points[0]["training_programs"] == points[1]["training_programs"][:2]
    # the questions' network does not change with the next-call network's size: computed once
    assert "questions" not in points[2]["seconds"]
    # nor do the training inputs: the second size at the same programs reads and featurises nothing
    assert points[2]["seconds"]["load"] == points[2]["seconds"]["features"] == 0
    assert points[1]["train_tokens"] == points[2]["train_tokens"]
    assert points[2]["questions"]["unseen_programs"] == points[1]["questions"]["unseen_programs"]
    table = (out / "scaling.md").read_text()
    # one row a point in each table: the next call's and the questions'
    assert table.count("\n| 2 | 8 |") == 2 and table.count("\n| 3 | 16 |") == 2
    assert "online counter" in table and r["root"] == "<root>"
    assert "network hedged" in table and "| gamma |" in table  # the per-workload rows
    assert "hindsight n-gram (bound)" in table
    h = points[-1]["top1_headroom"]["pooled"]
    assert f"| all | {h['positions']:,} | {h['counter']:.4f} | {h['network']:.4f} |" in table
    # the questions score the full night's window unless told (a cold start's is shorter)
    assert r["question_tokens"] == 1_000_000 and "the first 1,000,000 calls of each run" in table
    # the questions per held-out program: one verdict a (program, question) cell, its figures
    # the held-out program's, and the tally of the goal under them
    q = points[-1]["questions"]
    assert set(q["by_program"]) == {"gamma"}
    cells = q["hedged_cells"]
    assert {(c["program"], c["question"]) for c in cells} == {
        ("gamma", question) for question in q["by_program"]["gamma"]
    }
    for c in cells:
        hedged = q["by_program"]["gamma"][c["question"]]["network_hedged"]
        assert c["positions"] == hedged["positions"] > 0
        assert f"| gamma | {c['question']} | {c['positions']:,} | {hedged['top1']:.3f} |" in table
    assert (
        f"on {sum(c['top1_ahead'] and c['log_loss_ahead'] for c in cells)} of {len(cells)} cells"
        in table
    )
    assert (out / "scaling.png").stat().st_size > 1000
    (out / "scaling.md").unlink()
    assert bs.main(["--render-only", "--out-dir", str(out)]) == 0
    assert (out / "scaling.md").read_text() == table
