"""Each flow module's command line (`python -m flows.X`): --help prints usage and runs nothing,
each option reaches the flow as the parameter of the same name, a bad argument is refused by
name with exit 2 before the flow runs."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest

import flows.allocators
import flows.dataset
import flows.nightly
import flows.trace
import flows.train
import flows.whatif
from tasks.allocators import AllocatorsParams
from tasks.dataset.partitions import ConversionFailed, DatasetParams
from tasks.learning.train_config import QUICK_CONFIG, TrainParams
from tasks.nightly.night_summary import NothingTrained
from tasks.nightly.params import NightlyParams
from tasks.replay.workloads import TraceParams
from tasks.whatif.night import WhatifParams

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

FLOWS = ["trace", "dataset", "train", "whatif", "allocators", "nightly"]

# each module's flow callables: none may run on --help or a bad argument
FLOW_CALLABLES = {
    "trace": ["trace"],
    "dataset": ["dataset"],
    "train": ["train_flow"],
    "whatif": ["whatif"],
    "allocators": ["allocators", "seed_cases"],
    "nightly": ["nightly"],
}
MODULES = {
    "trace": flows.trace,
    "dataset": flows.dataset,
    "train": flows.train,
    "whatif": flows.whatif,
    "allocators": flows.allocators,
    "nightly": flows.nightly,
}


def exit_code(call) -> int:
    """What the program exits with: main's return value, or argparse's SystemExit."""
    try:
        return call()
    except SystemExit as end:
        return end.code


def recorder(monkeypatch, module, name: str, result=None, error: Exception | None = None):
    """Replace the module's flow `name` by one that records the parameters it is given."""
    given = []

    def flow(params):
        given.append(params)
        if error is not None:
            raise error
        return result

    monkeypatch.setattr(module, name, flow)
    return given


def no_flow_may_run(monkeypatch, name: str) -> None:
    for attr in FLOW_CALLABLES[name]:

        def refuse(*a, _attr=attr, **k):
            raise AssertionError(f"flows.{name}.{_attr} ran")

        monkeypatch.setattr(MODULES[name], attr, refuse)


@pytest.mark.parametrize("name", FLOWS)
def test_help_prints_usage_and_runs_nothing(name, monkeypatch, tmp_path, capsys):
    # GIVEN an empty folder as the working directory and the data root
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEAPCAST_ROOT", str(tmp_path / "root"))
    # WHEN the module's file runs as `python -m flows.NAME --help` runs it (its __main__ block;
    # in this process, whose imports are done already)
    monkeypatch.setattr(sys, "argv", [f"flows/{name}.py", "--help"])
    assert exit_code(lambda: runpy.run_path(MODULES[name].__file__, run_name="__main__")) == 0
    # THEN it printed its usage and options, and nothing ran: the folder is still empty
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m flows.{name} "), out
    assert "--root URL" in out and "examples:" in out
    assert list(tmp_path.iterdir()) == []


def test_python_m_flows_dataset_help_converts_nothing(tmp_path):
    # GIVEN an empty folder as the working directory and the data root
    env = {**os.environ, "HEAPCAST_ROOT": str(tmp_path / "root")}
    # WHEN a user asks the dataset flow's module for help, as a user does
    r = subprocess.run(
        [sys.executable, "-m", "flows.dataset", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    # THEN it prints its usage and converts nothing: the folder is still empty
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m flows.dataset ") and "--force" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_trace_options_reach_the_flow(monkeypatch, tmp_path, capsys):
    summary = SimpleNamespace(markdown=lambda: "# heapcast trace: 1 of 1 runs ok", failed=[])
    given = recorder(monkeypatch, flows.trace, "trace", summary)
    argv = ["sqlite3", "git", "--quick", "--runner", "local", "--root", str(tmp_path)]
    argv += ["--max-parallel", "3", "--no-caller"]
    assert flows.trace.main(argv) == 0
    assert given == [
        TraceParams(
            workloads=["sqlite3", "git"],
            quick=True,
            runner="local",
            root=str(tmp_path),
            max_parallel=3,
            caller=False,
        )
    ]
    assert "1 of 1 runs ok" in capsys.readouterr().out


def test_an_option_left_out_keeps_the_models_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HEAPCAST_ROOT", str(tmp_path))
    given = recorder(monkeypatch, flows.trace, "trace", SimpleNamespace(markdown=str, failed=["x"]))
    # a failed replay is exit 1
    assert flows.trace.main([]) == 1
    assert given == [TraceParams()] and given[0].root == str(tmp_path) and given[0].caller


def test_dataset_options_reach_the_flow(monkeypatch, tmp_path, capsys):
    given = recorder(
        monkeypatch, flows.dataset, "dataset", [{"workload": "w", "run": "r1", "rows": 1234}]
    )
    argv = ["w", "--run", "w/r1", "--run", "r2", "--root", str(tmp_path)]
    argv += ["--scheduler", "tcp://host:8786", "--force"]
    assert flows.dataset.main(argv) == 0
    assert given == [
        DatasetParams(
            root=str(tmp_path),
            workloads=["w"],
            runs=["w/r1", "r2"],
            scheduler="tcp://host:8786",
            force=True,
        )
    ]
    assert "w/r1: 1,234 events" in capsys.readouterr().out


def test_dataset_with_a_failed_run_exits_1_naming_it(monkeypatch, tmp_path, capsys):
    failed = ConversionFailed("1 run(s) could not be converted:\n  w/broken: OSError: disk full")
    recorder(monkeypatch, flows.dataset, "dataset", error=failed)
    assert flows.dataset.main(["--root", str(tmp_path)]) == 1
    assert "w/broken: OSError: disk full" in capsys.readouterr().err


def test_train_options_reach_the_flow(monkeypatch, tmp_path, capsys):
    model = SimpleNamespace(name="heapcast", version="3", decision="champion", reason="it won")
    given = recorder(monkeypatch, flows.train, "train_flow", SimpleNamespace(model=model))
    argv = ["--quick", "--set", "epochs=2", "--set", "model.units=[8]", "--root", str(tmp_path)]
    assert flows.train.main(argv) == 0
    assert given == [
        TrainParams(
            root=str(tmp_path),
            config=str(QUICK_CONFIG),
            overrides={"epochs": 2, "model": {"units": [8]}},
        )
    ]
    assert "registered heapcast version 3: champion (it won)" in capsys.readouterr().out


def test_whatif_options_reach_the_flow(monkeypatch, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("- {kind: lru, budget: 1048576}\n- {kind: largest}\n")
    summary = SimpleNamespace(markdown="# whatif", runs_failed={"w/r": "no events"})
    given = recorder(monkeypatch, flows.whatif, "whatif", summary)
    argv = ["--model", "7", "--run", "w/r", "--horizon", "3", "--idle-budget", "1024"]
    argv += ["--policies", str(grid), "--recompute", "--root", str(tmp_path)]
    # a run that could not be replayed is exit 1
    assert flows.whatif.main(argv) == 1
    assert given == [
        WhatifParams(
            root=str(tmp_path),
            model="7",
            runs=["w/r"],
            horizon=3,
            idle_budget=1024,
            policies=[{"kind": "lru", "budget": 1048576}, {"kind": "largest"}],
            recompute=True,
        )
    ]


@pytest.mark.parametrize("seeds", [False, True])
def test_allocators_options_reach_the_flow(monkeypatch, tmp_path, seeds):
    outcome = SimpleNamespace(markdown="| table |", report_dir=str(tmp_path), failed=[])
    seeded = SimpleNamespace(markdown=lambda: "- line", allocators=outcome)
    measured = recorder(monkeypatch, flows.allocators, "allocators", outcome)
    cases = recorder(monkeypatch, flows.allocators, "seed_cases", seeded)
    argv = ["sqlite3", "--quick", "--runner", "local", "--no-mlflow", "--table-model", "7"]
    argv += ["--root", str(tmp_path)] + (["--seeds"] if seeds else [])
    assert flows.allocators.main(argv) == 0
    expected = AllocatorsParams(
        workloads=["sqlite3"],
        quick=True,
        runner="local",
        root=str(tmp_path),
        mlflow=False,
        table_model="7",
    )
    # --seeds picks the flow `seed-cases`, with the same parameters
    assert (cases, measured) == (([expected], []) if seeds else ([], [expected]))


def test_nightly_options_reach_the_flow(monkeypatch, tmp_path, capsys):
    given = recorder(monkeypatch, flows.nightly, "nightly", error=NothingTrained("no data"))
    argv = ["--quick", "--runner", "local", "--root", str(tmp_path), "--seeds"]
    argv += ["--reports-keep-nights", "3", "--param", "trace.max_parallel=4"]
    argv += ["--param", "train.overrides.epochs=1"]
    assert flows.nightly.main(argv) == 1
    assert given == [
        NightlyParams(
            root=str(tmp_path),
            quick=True,
            seeds=True,
            reports_keep_nights=3,
            trace={"runner": "local", "max_parallel": 4},
            train={"overrides": {"epochs": 1}},
            allocators_params={"runner": "local"},
        )
    ]
    assert "the night trained no model: no data" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, argv, named",
    [
        ("trace", ["--max-parallel", "17"], "argument --max-parallel: must be from 1 to 16"),
        ("trace", ["--runner", "ssh"], "argument --runner: invalid choice: 'ssh'"),
        ("trace", ["no_such_workload"], "no workload 'no_such_workload' in the catalog"),
        ("dataset", ["--forse"], "unrecognized arguments: --forse"),
        ("train", ["--set", "epochs"], "argument --set: expected KEY=VALUE"),
        ("train", ["--set", "epoks=2"], "epoks: Extra inputs are not permitted"),
        ("train", ["--quick", "--config", "c.yaml"], "--config: not allowed with argument --quick"),
        ("whatif", ["--horizon", "0"], "argument --horizon: must be at least 1, not 0"),
        ("whatif", ["--policies", "missing.yaml"], "--policies: missing.yaml: policy grid"),
        ("allocators", ["--table-model"], "argument --table-model: expected one argument"),
        ("nightly", ["--param", "trace.bogus=1"], "parameter trace.bogus: Extra inputs"),
        ("nightly", ["--reports-keep-nights", "x"], "not a whole number: 'x'"),
    ],
)
def test_a_bad_argument_is_refused_by_name(name, argv, named, monkeypatch, tmp_path, capsys):
    # GIVEN flows that fail the test if they run
    monkeypatch.chdir(tmp_path)
    no_flow_may_run(monkeypatch, name)
    # WHEN the command line has a bad argument, THEN exit 2 with a message naming it
    assert exit_code(lambda: MODULES[name].main(argv)) == 2
    err = capsys.readouterr().err
    assert named in err and f"python -m flows.{name}" in err, err
