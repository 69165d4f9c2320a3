"""`heapcast run|replay|dataset|train|whatif|allocators`: each stage's flow once, through the
flow module's own command line. --help runs nothing and imports no flow, no Prefect, no
TensorFlow; the arguments reach the flow; a bad one is refused by name, with exit 2."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cli.main import STAGES, main
from tasks.nightly.night_summary import NothingTrained

# verb -> (the flow callable in flows.<STAGES[verb]>, the name of its parameters' model,
# what it returns so that the verb exits 0 (None: it raises NothingTrained, exit 1))
FLOWS = {
    "replay": ("trace", "TraceParams", SimpleNamespace(markdown=lambda: "ok", failed=[])),
    "dataset": ("dataset", "DatasetParams", []),
    "train": (
        "train_flow",
        "TrainParams",
        SimpleNamespace(model=SimpleNamespace(name="m", version="1", decision=None)),
    ),
    "whatif": ("whatif", "WhatifParams", SimpleNamespace(markdown="ok", runs_failed={})),
    "allocators": (
        "allocators",
        "AllocatorsParams",
        SimpleNamespace(markdown="ok", report_dir="r", failed=[]),
    ),
    "run": ("nightly", "NightlyParams", None),
}

# run in a fresh interpreter: the verb's --help, then the modules it left imported
HELP_PROBE = """\
import json, sys
from cli.main import main
try:
    code = main([sys.argv[1], "--help"])
except SystemExit as end:
    code = end.code
sys.stdout.flush()
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_every_stage_has_a_verb():
    assert STAGES == {
        "run": "nightly",
        "replay": "trace",
        "dataset": "dataset",
        "train": "train",
        "whatif": "whatif",
        "allocators": "allocators",
    }
    assert set(FLOWS) == set(STAGES)


def test_heapcast_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as end:
        main(["--help"])
    assert end.value.code == 0
    out = capsys.readouterr().out
    listed = out[out.index("commands:") :]
    for verb in [*STAGES, "trace", "layer", "inspect", "report", "tune", "bundle"]:
        assert f"\n    {verb} " in listed or f"\n    {verb}\n" in listed, verb


@pytest.mark.parametrize("verb", sorted(STAGES))
def test_help_runs_nothing_and_imports_no_flow(verb, tmp_path):
    # GIVEN an empty folder as the working directory and the data root
    env = {**os.environ, "HEAPCAST_ROOT": str(tmp_path / "root")}
    # WHEN `heapcast VERB --help` runs in a fresh interpreter
    r = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, verb],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    probe = json.loads(r.stderr.strip().splitlines()[-1])
    # THEN it printed the flow's options under the verb's name and exited 0, having imported
    # neither the flow's module nor Prefect nor TensorFlow, and written nothing
    assert probe["code"] == 0
    assert r.stdout.startswith(f"usage: heapcast {verb} ") and "--root URL" in r.stdout
    loaded = set(probe["modules"])
    assert f"flows.{STAGES[verb]}" not in loaded
    assert not {"prefect", "tensorflow", "keras", "mlflow", "dask"} & loaded
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", sorted(STAGES))
def test_the_arguments_reach_the_flow(verb, monkeypatch, tmp_path, capsys):
    # GIVEN the verb's flow replaced by one that records its parameters
    module = importlib.import_module(f"flows.{STAGES[verb]}")
    name, model, result = FLOWS[verb]
    given = []

    def flow(params):
        given.append(params)
        if result is None:
            raise NothingTrained("nothing to train on")
        return result

    monkeypatch.setattr(module, name, flow)
    # WHEN the verb runs with a data root
    code = main([verb, "--root", str(tmp_path / "root")])
    # THEN the flow got its parameters' model, with that root
    assert code == (1 if result is None else 0)
    assert [type(p).__name__ for p in given] == [model]
    assert given[0].root == str(tmp_path / "root")


@pytest.mark.parametrize("verb", sorted(STAGES))
def test_a_bad_argument_is_refused_by_name(verb, capsys):
    with pytest.raises(SystemExit) as end:
        main([verb, "--no-such-option"])
    assert end.value.code == 2
    err = capsys.readouterr().err
    assert f"heapcast {verb}: error: unrecognized arguments: --no-such-option" in err


def test_replay_takes_the_stack_depth_and_refuses_stacks_without_the_caller(monkeypatch, capsys):
    # GIVEN the replay's flow replaced by one that records its parameters
    module = importlib.import_module("flows.trace")
    given = []
    monkeypatch.setattr(module, "trace", lambda params: given.append(params) or FLOWS["replay"][2])
    # WHEN the depth is given, or left to its default THEN the flow gets it
    assert main(["replay", "sqlite3", "--frames", "8"]) == 0
    assert main(["replay", "sqlite3"]) == 0
    assert main(["replay", "sqlite3", "--no-caller"]) == 0
    assert [p.stack_frames for p in given] == [8, 32, 0]
    # a depth the tracer does not take, or stacks without the caller: exit 2, by name
    for argv, says in (
        (["--frames", "129"], "argument --frames: must be from 0 to 128, not 129"),
        (["--no-caller", "--frames", "4"], "frames 4 records call stacks"),
    ):
        with pytest.raises(SystemExit) as end:
            main(["replay", "sqlite3", *argv])
        assert end.value.code == 2 and says in capsys.readouterr().err, argv
