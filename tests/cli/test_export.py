"""`heapcast export`: what it writes, what it says, and its one line on bad input (exit 2)."""

from __future__ import annotations

import gzip

import pytest

from cli.main import build_parser, main
from tasks.stacks.export import FORMATS
from tasks.stacks.profile import WEIGHTS
from tests.tasks.report import scenario
from tests.tasks.stacks import known_stacks as known
from tests.tracegen import malloc, thread_start, write_trace


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["export", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_exports_a_run_folder_and_says_what_it_wrote(tmp_path, capsys):
    # GIVEN a run's folder of stack traces
    known.write_run(tmp_path / "run")
    # WHEN exported as folded stacks weighted by the peak
    out = tmp_path / "peak.folded"
    code, said, err = run(
        capsys, "--format", "collapsed", "--weight", "peak", "-o", str(out), str(tmp_path / "run")
    )
    # THEN the file holds the stacks live at the peak, and one line says so
    assert (code, err) == (0, "")
    assert (
        out.read_text()
        == "prog+0x1200;prog+0x1100;prog+0x1020 1000\nprog+0x1300;prog+0x1010 1000\n"
    )
    assert said == f"heapcast export: {out}: collapsed, 4 stacks, 6 frames, peak 2,000 in all\n"


def test_pprof_of_trace_files_is_gzipped_protobuf(tmp_path, capsys):
    paths = known.write_run(tmp_path)
    out = tmp_path / "heap.pb.gz"
    code, said, _ = run(capsys, "--format", "pprof", "-o", str(out), *map(str, paths))
    assert code == 0 and "bytes 2,658 in all" in said
    assert gzip.decompress(out.read_bytes())[:1] == b"\x0a"  # field 1 (sample_type) first


def test_a_trace_without_stacks_is_exported_with_a_warning(tmp_path, capsys):
    path = write_trace(
        tmp_path / "1-1.hct",
        [thread_start(0, tid=1), malloc(1, 9, 0x10, caller=0xAB)],
        caller=True,
        pid=1,
    )
    code, _, err = run(capsys, "--format", "collapsed", "-o", str(tmp_path / "f"), str(path))
    assert code == 0
    assert err == (
        f"heapcast export: warning: {path}: no call stacks (format version 3, or traced with "
        "--frames 0): its stacks are one frame, malloc's caller\n"
    )
    assert (tmp_path / "f").read_text() == "0xab 9\n"


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--format", "pprof", "-o", "{tmp}/x", "{tmp}/nothing"],
            "{tmp}/nothing: no such file or folder",
        ),
        (["--format", "pprof", "-o", "{tmp}/x", "{tmp}/empty"], "{tmp}/empty: no heapcast traces"),
        (["--format", "pprof", "-o", "{tmp}/no/x", "{tmp}/run"], "{tmp}/no/x: cannot write here"),
        (["--format", "pprof", "-o", "{tmp}/run", "{tmp}/run"], "{tmp}/run: cannot write here"),
        (
            ["--format", "pprof", "-o", "{tmp}/x", "{tmp}/bad.hct"],
            "{tmp}/bad.hct: no readable trace",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    # GIVEN a run, an empty folder, and a file that is not a trace
    known.write_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.hct").write_bytes(b"not a trace")
    # WHEN exported from what does not exist, cannot be read, or to where it cannot be written
    code, said, err = run(capsys, *(a.format(tmp=tmp_path) for a in args))
    # THEN one line names it, nothing is written, and the exit code is 2
    assert code == 2 and said == ""
    assert err.startswith(f"heapcast export: {says.format(tmp=tmp_path)}") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--format", "pprof", "--weight", "size", "-o", "x", "run"], "invalid choice: 'size'"),
        (["--format", "svg", "-o", "x", "run"], "invalid choice: 'svg'"),
        (["--format", "pprof", "-o", "x"], "the following arguments are required: RUN_OR_FILES"),
    ],
)
def test_bad_options_exit_2_naming_the_choices(capsys, args, says):
    with pytest.raises(SystemExit) as e:
        main(["export", *args])
    err = capsys.readouterr().err
    # argparse's usage, then one line naming the option and its choices
    assert e.value.code == 2
    assert err.splitlines()[-1].startswith("heapcast export: error: ") and says in err


def test_help_runs_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["export", "--help", "--format", "pprof", "-o", str(tmp_path / "x"), str(tmp_path)])
    assert e.value.code == 0 and "go tool pprof" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_the_choices_are_the_exports(tmp_path):
    # the parser's choices are written out (the module defining them imports numpy)
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["export"]
    choices = {a.dest: tuple(a.choices) for a in sub._actions if a.choices}
    assert choices == {"format": FORMATS, "weight": WEIGHTS}


def test_an_events_run_says_to_name_its_raw_traces(tmp_path, capsys):
    # GIVEN a run converted into the events dataset (its parts carry no stacks)
    events = scenario.write_events(scenario.write_raw(tmp_path / "raw"), tmp_path / "root")
    # WHEN exported from its events folder
    code, said, err = run(capsys, "--format", "pprof", "-o", str(tmp_path / "x"), str(events))
    # THEN one line says to name the raw traces instead
    assert (code, said) == (2, "")
    assert err == (
        f"heapcast export: {events}: an events run: its parts carry no call stacks; name the "
        "run's raw traces (its raw/WORKLOAD/RUN folder or its *.hct files)\n"
    )


def test_a_converted_workload_run_is_exported_from_its_raw_traces(tmp_path, capsys):
    # GIVEN a data root holding a run's raw traces and their conversion
    root = tmp_path / "root"
    raw = known.write_run(root / "raw" / "prog" / "r1")[0].parent
    scenario.write_events(raw, root, workload="prog", run="r1")
    # WHEN exported by its WORKLOAD/RUN name
    out = tmp_path / "heap.folded"
    code, _, err = run(
        capsys, "--format", "collapsed", "--root", str(root), "-o", str(out), "prog/r1"
    )
    # THEN its raw traces (where the stacks are) are read
    assert (code, err) == (0, "")
    assert out.read_text().endswith("prog+0x1030 8\n")
