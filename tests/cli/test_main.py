"""`heapcast trace` and `heapcast inspect`, run as a user runs them: the installed command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.format.trace_reader import Op, read_trace
from tests.conftest import need_tool

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

HEAPCAST = Path(sys.executable).with_name("heapcast")


def heapcast(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(HEAPCAST), *args], cwd=cwd, capture_output=True, text=True)


def test_trace_keeps_output_and_prints_a_summary(tmp_path):
    need_tool("sqlite3")
    # GIVEN a real program; WHEN traced through the CLI
    plain = subprocess.run(["sqlite3", ":memory:", "select 6*7"], capture_output=True, text=True)
    r = heapcast("trace", "-o", "out", "--", "sqlite3", ":memory:", "select 6*7", cwd=tmp_path)
    # THEN its output and exit code are unchanged, and one summary line names the trace
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout) == (0, "42\n")
    m = re.search(
        r"heapcast: (\d+) process\(es\), (\d+) thread\(s\), (\d+) events -> (\S+)", r.stderr
    )
    assert m, r.stderr
    processes, threads, events, where = int(m[1]), int(m[2]), int(m[3]), Path(m[4])
    t = read_trace(where)
    assert (processes, threads) == (1, 1)
    assert events == int((t.op != Op.THREAD_START).sum()) > 100
    assert t.header.cmdline == ("sqlite3", ":memory:", "select 6*7")


def test_trace_passes_the_exit_code_through_and_counts_every_process(tmp_path):
    # sh forks a child (the subshell) that execs `true`: three process images in all
    r = heapcast(
        "trace", "-o", "out", "--", "sh", "-c", "(true; /bin/true); echo done; exit 3", cwd=tmp_path
    )
    assert r.returncode == 3 and r.stdout == "done\n"
    m = re.search(r"(\d+) process\(es\)", r.stderr)
    files = list((tmp_path / "out").glob("*/*.hct"))
    assert int(m[1]) == len(files) >= 2


def test_trace_without_a_program_says_how(tmp_path):
    r = heapcast("trace", cwd=tmp_path)
    assert r.returncode == 2 and "heapcast trace [-o DIR] -- PROGRAM" in r.stderr


def test_trace_records_call_sites_unless_told_not_to(tmp_path):
    """Callers are on by default, as in the catalog's traces the questions were trained on;
    --no-caller leaves them out (even where the environment asks for them); --caller is kept."""
    import os

    for i, (options, env, want) in enumerate(
        (
            ((), {}, True),
            (("--caller",), {}, True),
            (("--no-caller",), {}, False),
            (("--no-caller",), {"HEAPCAST_CALLER": "1"}, False),
        )
    ):
        out = tmp_path / f"out{i}"
        r = subprocess.run(
            [str(HEAPCAST), "trace", *options, "-o", str(out), "--", "sh", "-c", "true"],
            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        traces = [read_trace(f) for f in out.glob("*/*.hct")]
        assert traces and {t.header.has_caller for t in traces} == {want}, (options, env)
        # with the caller come stacks, 32 frames deep by default (48-byte records)
        assert {t.header.record_size for t in traces} == {48 if want else 32}


def test_trace_sets_the_stack_depth_for_the_tracer(tmp_path):
    """--frames N reaches the tracer as HEAPCAST_FRAMES (32 by default, as the catalog's
    replays); --frames 0 and --no-caller record no stacks, even where the environment asks."""
    import os

    script = 'echo "${HEAPCAST_FRAMES-unset}"'
    sizes = {"unset": 32, "32": 48, "8": 48, "128": 48}
    for i, (options, env, want) in enumerate(
        (
            ((), {}, "32"),
            (("--frames", "8"), {}, "8"),
            (("--frames", "128"), {}, "128"),
            (("--frames", "0"), {"HEAPCAST_FRAMES": "5"}, "unset"),
            (("--no-caller",), {"HEAPCAST_FRAMES": "5"}, "unset"),
            (("--no-caller", "--frames", "0"), {}, "unset"),
        )
    ):
        r = subprocess.run(
            [str(HEAPCAST), "trace", *options, "-o", str(tmp_path / f"out{i}"), "--", "sh", "-c",
             script],
            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env},
        )  # fmt: skip
        assert (r.returncode, r.stdout) == (0, want + "\n"), (options, r.stderr)
        # and the tracer recorded what it was told: sh's allocations with or without stacks
        traces = [read_trace(f) for f in (tmp_path / f"out{i}").glob("*/*.hct")]
        has_stacks = {t.header.has_stacks for t in traces}
        assert traces and has_stacks == {want != "unset"}, (options, has_stacks)
        if options == ("--frames", "0"):
            assert {t.header.record_size for t in traces} == {40}
        elif want != "unset":
            assert {t.header.record_size for t in traces} == {sizes[want]}
            depth = max(int(t.stacks.depth.max(initial=0)) for t in traces)
            assert 1 < depth <= int(want), (options, depth)


@pytest.mark.parametrize(
    "options, says",
    [
        (("--frames", "129"), "must be 0 (no stacks) to 128 frames, not 129"),
        (("--frames", "-1"), "must be 0 (no stacks) to 128 frames, not -1"),
        (("--frames", "deep"), "not a whole number: 'deep'"),
        (("--no-caller", "--frames", "4"), "drop --no-caller, or give --frames 0"),
    ],
)
def test_trace_refuses_a_depth_it_cannot_record_before_running_anything(options, says, tmp_path):
    r = heapcast("trace", *options, "-o", "out", "--", "touch", "ran", cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


def test_inspect_says_whether_a_trace_has_stacks(tmp_path):
    from tests.tracegen import StackTrie, malloc, module, thread_start, write_trace

    trie = StackTrie()
    recs = [thread_start(0, tid=7)] + [
        malloc(10 + i, 24, 0x1000 * (i + 1), caller=0x401000 + i,
               stack=trie.id((0x401000 + i, 0x401500, 0x401600)))
        for i in range(3)
    ]  # fmt: skip
    prog = module(0, 0x400000, 0x500000, 0, "/bin/prog")
    write_trace(tmp_path / "stacks.hct", prog + trie.records() + recs, stacks=True)
    write_trace(tmp_path / "caller.hct", prog + recs[:1], caller=True)
    r = heapcast("inspect", "stacks.hct", "caller.hct", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    stacks, caller = r.stdout.split("caller.hct")
    # 3 distinct stacks sharing their two outer frames: 2 + 3 nodes
    assert "record 48 bytes, caller yes, modules 1, stacks yes (5 nodes)" in stacks
    assert "record 40 bytes, caller yes, modules 1, stacks no" in caller


def test_inspect_prints_header_and_counts(tmp_path):
    heapcast("trace", "-o", "out", "--", "sh", "-c", "true", cwd=tmp_path)
    (f,) = (tmp_path / "out").glob("*/*.hct")
    r = heapcast("inspect", str(f), cwd=tmp_path)
    assert r.returncode == 0
    assert "format version 3" in r.stdout and "command sh -c true" in r.stdout
    assert re.search(
        r"record 48 bytes, caller yes, modules \d+, stacks yes \(\d+ nodes\)", r.stdout
    )
    assert re.search(r"malloc\s+\d+", r.stdout)


def test_inspect_names_a_bad_file_and_fails(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    r = heapcast("inspect", str(bad), cwd=tmp_path)
    assert r.returncode == 1
    assert str(bad) in r.stderr and "does not look like a heapcast trace" in r.stderr


def test_layer_keeps_output_and_exit_code_and_says_what_it_did(tmp_path):
    # GIVEN a numpy program making and dropping large temporaries (40 MB: glibc maps every
    # one, above its largest mmap threshold), exiting with 5
    code = (
        "import sys, numpy as np\n"
        "a = np.linspace(0.0, 1.0, 5_000_000)\n"
        "s = sum(float(((a * i) ** 2 + 3)[::991].sum()) for i in range(20))\n"
        "print(repr(s))\n"
        "sys.exit(5)\n"
    )
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    # WHEN it runs under the layer, guided by the online counter
    r = heapcast("layer", "--policy", "guided", "--", sys.executable, "-c", code, cwd=tmp_path)
    # THEN its output and exit code are the program's, and one line says what the layer did
    assert plain.returncode == r.returncode == 5
    assert r.stdout == plain.stdout
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("heapcast layer (")]
    m = re.match(r"heapcast layer \(guided, online\): (\d+) process\(es\): (\d+) hits, ", line)
    assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 10, line


def test_layer_says_when_the_program_fixed_glibc_s_mmap_threshold(program, tmp_path):
    # GIVEN tests/native/programs/threshold.c, which with "mallopt" fixes the threshold at
    # 128 KiB itself, as TensorFlow's generator dataset does
    prog = program("threshold")
    # WHEN it runs under the layer with and without the call
    fixed = heapcast("layer", "--policy", "pools", "--", str(prog), "mallopt", cwd=tmp_path)
    alone = heapcast("layer", "--policy", "pools", "--", str(prog), cwd=tmp_path)
    # THEN glibc keeps the program's threshold (a 200 kB block is mapped), and one line says so
    assert (fixed.returncode, fixed.stdout, alone.stdout) == (0, "mmap\n", "heap\n")
    said = "heapcast layer: the program fixed glibc's mmap threshold itself (mallopt M_MMAP_THRESHOLD=131072)"
    assert said in fixed.stderr and "mallopt" not in alone.stderr


def test_layer_says_what_it_gave_back_to_stay_within_the_programs_peak(program, tmp_path):
    # GIVEN tests/native/programs/phases.c: 8 blocks of 2 MiB live, then 8 of 5 MiB, in turns,
    # every block mapped (glibc's threshold fixed at 128 KiB, as TensorFlow fixes it)
    argv = ["env", "MALLOC_MMAP_THRESHOLD_=131072", str(program("phases")), "4", "8"]
    argv += [str(2 << 20), "8", str(5 << 20)]
    # WHEN it runs under the layer
    r = heapcast("layer", "--policy", "pools", "-O", "proof=0", "--", *argv, cwd=tmp_path)
    # THEN the summary says how many kept blocks went back for the bound, and the peak: B's 40 MiB
    assert r.returncode == 0, r.stderr
    m = re.search(r"; (\d+) to stay within the program's own peak of ([\d.]+) MB live\)", r.stderr)
    assert m and int(m[1]) > 0 and float(m[2]) == pytest.approx(8 * 5 * 2**20 / 1e6, abs=0.1)


def test_layer_says_it_stepped_aside_where_the_program_reuses_nothing(program, tmp_path):
    # GIVEN phases.c, whose 2 MiB and 5 MiB blocks never fit each other's requests
    argv = ["env", "MALLOC_MMAP_THRESHOLD_=131072", str(program("phases")), "4", "8"]
    argv += [str(2 << 20), "8", str(5 << 20)]
    # WHEN it runs under the layer's default proof, then with proof=0
    r = heapcast("layer", "--policy", "pools", "--", *argv, cwd=tmp_path)
    eager = heapcast("layer", "--policy", "pools", "-O", "proof=0", "--", *argv, cwd=tmp_path)
    # THEN the layer kept nothing and says why and how to make it keep; with proof=0 it kept
    assert r.returncode == 0 == eager.returncode, r.stderr
    assert r.stdout == eager.stdout
    assert ": stepped aside: 0 of its requests could have reused a block it freed, fewer than " \
        "the 2 the layer waits for (-O proof=0 keeps from the start)" in r.stderr  # fmt: skip
    assert " 0 blocks kept " in r.stderr
    assert "stepped aside" not in eager.stderr and " 0 blocks kept " not in eager.stderr


def test_layer_lists_the_policies_by_their_names_and_takes_the_old_ones(program, tmp_path):
    # GIVEN the layer's help, and phases.c (blocks reused: the layer keeps them, proof=0)
    usage = heapcast("layer", "--help", cwd=tmp_path)
    # THEN the policies are listed by their names now, never the seed studies' ones
    assert usage.returncode == 0 and "{largest,pools,guided,off,place}" in usage.stdout
    assert "seed00" not in usage.stdout
    # WHEN run with a former name (issue 46) and with the name now
    argv = ["env", "MALLOC_MMAP_THRESHOLD_=131072", str(program("phases")), "4", "8"]
    argv += [str(2 << 20), "8", str(2 << 20)]
    old = heapcast("layer", "--policy", "seed001", "-O", "proof=0", "--", *argv, cwd=tmp_path)
    new = heapcast("layer", "--policy", "pools", "-O", "proof=0", "--", *argv, cwd=tmp_path)
    # THEN the old one runs as the new one, said in one line, with the same hits
    assert old.returncode == new.returncode == 0, old.stderr
    assert old.stdout == new.stdout
    assert old.stderr.splitlines()[0] == "heapcast layer: policy seed001 is now pools"
    hits = r"heapcast layer \(pools, online\): 1 process\(es\): (\d+) hits, "
    got = [re.search(hits, r.stderr) for r in (old, new)]
    assert got[0] and got[1] and got[0][1] == got[1][1] != "0", old.stderr


def test_layer_refuses_a_missing_table_file_and_says_how(tmp_path):
    r = heapcast("layer", "--predictor", "table:missing.hclt", "--", "true", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"heapcast layer: --predictor table:missing.hclt: no such file " \
        f"{tmp_path / 'missing.hclt'}\n"  # fmt: skip
    r = heapcast("layer", cwd=tmp_path)
    assert r.returncode == 2 and "give a program to run" in r.stderr


def test_layer_reads_the_registered_models_table_by_alias_or_version(tmp_path):
    """`--predictor model` fetches the champion's table from the root's registry and the layer
    uses it (its stats say table=1); an empty registry is said, naming the root."""
    import dataclasses

    import numpy as np

    from tasks.learning.labels import REUSE_CLASSES
    from tasks.learning.table.distill import ClassTable
    from tasks.registry.register import register_outcome
    from tasks.registry.tracking import TrackingConfig
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

    empty = tmp_path / "empty"
    r = heapcast("layer", "--policy", "guided", "--predictor", "model", "--root", str(empty),
                 "--", "true", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "no registered version 'champion'" in r.stderr, r.stderr
    data = tmp_path / "data"
    outcome = dataclasses.replace(
        make_outcome(tiny_model(), 0.8),
        class_table=ClassTable(np.ones((32, REUSE_CLASSES)), np.full(REUSE_CLASSES, 0.2)),
    )
    version = register_outcome(outcome, TrackingConfig(root=str(data))).model_version
    code = "b = [bytearray(1 << 20) for _ in range(50)]; print('ok')"
    for which in ("model", f"model:{version}"):
        r = heapcast("layer", "--policy", "guided", "--predictor", which, "--root", str(data),
                     "--stats", "--", sys.executable, "-c", code, cwd=tmp_path)  # fmt: skip
        assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
        assert "refused:" not in r.stderr
        assert re.search(r"\btable=1\b", r.stderr) and "table_refused=0" in r.stderr, r.stderr
    # WHEN run again, the table kept on this host by version serves: MLflow is never imported
    # (an `mlflow` that cannot be imported comes first on the path)
    import os

    from tasks.core.storage import Root
    from tasks.registry.table_files import table_dir

    (tmp_path / "no-mlflow" / "mlflow").mkdir(parents=True)
    (tmp_path / "no-mlflow" / "mlflow" / "__init__.py").write_text(
        "raise ImportError('heapcast layer imported mlflow with the table here')\n"
    )
    no_mlflow = {**os.environ, "PYTHONPATH": str(tmp_path / "no-mlflow")}
    for which in ("model", f"model:{version}"):
        r = subprocess.run(
            [str(HEAPCAST), "layer", "--policy", "guided", "--predictor", which, "--root",
             str(data), "--stats", "--", sys.executable, "-c", code],
            cwd=tmp_path, capture_output=True, text=True, env=no_mlflow,
        )  # fmt: skip
        assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
        assert re.search(r"\btable=1\b", r.stderr) and "table_refused=0" in r.stderr, r.stderr
    # a file cut short is refused, said, and fetched again
    kept = table_dir(Root.from_url(str(data))) / f"v{version}.hcltab"
    whole = kept.read_bytes()
    kept.write_bytes(whole[:100])
    r = heapcast("layer", "--policy", "guided", "--predictor", "model", "--root", str(data),
                 "--stats", "--", sys.executable, "-c", code, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0 and kept.read_bytes() == whole, r.stderr
    assert f"heapcast layer: {kept} refused: its payload does not match its header" in r.stderr
    assert re.search(r"\btable=1\b", r.stderr), r.stderr


def _tune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`heapcast tune` from this checkout (python -m cli.main), as a user runs it."""
    root = Path(__file__).resolve().parents[2]
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "tune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )


def test_tune_prints_the_table_and_the_line_to_paste(tmp_path):
    r = _tune(
        "--candidates", "glibc,jemalloc", "--repetitions", "5", "--max-repetitions", "5",
        "-o", str(tmp_path / "t.html"), "--", "sort", "--version", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "candidate" in r.stdout and "jemalloc" in r.stdout and "×" in r.stdout
    # the last line is the line to paste: the command, with the winner's settings in front
    assert r.stdout.rstrip().splitlines()[-2].strip().endswith("/sort --version")
    assert (tmp_path / "t.html").is_file()


def test_tune_names_a_failing_program(tmp_path):
    r = _tune("--", "false", cwd=tmp_path)
    assert r.returncode == 1
    assert "heapcast tune: " in r.stderr and "exits 1 under glibc" in r.stderr
    r = _tune(cwd=tmp_path)
    assert r.returncode == 1 and "give a program" in r.stderr
