"""The layer (native/layers/layer.c) loads the table the learning stage writes
(tasks/learning/table/distill.py, native/TABLE.md): the real layer, a real written file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from tasks.dataset.convert import events_from_trace
from tasks.dataset.sites import SITE_VOCABULARY, call_sites
from tasks.learning.labels import REUSE_CLASSES, request_and_free_classes
from tasks.learning.table.distill import ClassTable
from tasks.learning.table.layer_file import write_layer_table
from tests.native.test_layer import BIG, _env, _stats, heapcast_layer  # noqa: F401 (fixture)

MAJORITY = np.full(REUSE_CLASSES, 1.0 / REUSE_CLASSES)


def _table(soon: bool) -> ClassTable:
    """Every size class's training frees: all reused within 1 call (soon), or all never."""
    counts = np.zeros((32, REUSE_CLASSES))
    counts[:, 0 if soon else REUSE_CLASSES - 1] = 100.0
    return ClassTable(counts, MAJORITY)


def _run(layer: Path, exe: Path, table: Path, model: int, stats: Path):
    setting = f"policy=guided,predictor=table:{table},model={model},proof=0,stats={stats}"
    return subprocess.run(
        [exe, "5", "1", *BIG], capture_output=True, text=True, env=_env(layer, setting)
    )


def test_the_layer_keeps_what_the_written_table_says(heapcast_layer, program, tmp_path):  # noqa: F811
    exe = program("bigblocks")
    kept = {}
    for soon in (True, False):
        # GIVEN a table written for version 7 whose every class is reused soon / never
        table = write_layer_table(tmp_path / f"{soon}.hcltab", _table(soon), 7)
        stats = tmp_path / f"stats-{soon}"
        # WHEN the layer runs with it, told to expect version 7
        r = _run(heapcast_layer, exe, table, 7, stats)
        # THEN it loads the table silently and keeps blocks only when the table says soon
        assert r.returncode == 0 and r.stderr == ""
        (row,) = _stats(stats)
        assert row["table"] == 1 and row["table_refused"] == 0
        kept[soon] = row["kept"]
    assert kept[True] > 0 and kept[False] == 0


def test_a_table_of_another_model_version_is_refused_in_one_line(heapcast_layer, program, tmp_path):  # noqa: F811
    # GIVEN a table the writer made for version 7, deployed next to version 8
    table = write_layer_table(tmp_path / "v7.hcltab", _table(True), 7)
    stats = tmp_path / "stats"
    r = _run(heapcast_layer, program("bigblocks"), table, 8, stats)
    # THEN one line says so, and the program runs with the online counter, output unchanged
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        f"heapcast layer: table file {table} refused: it comes from another model version; "
        "the guided policy uses the online counter"
    ]
    (row,) = _stats(stats)
    assert row["table"] == 0 and row["table_refused"] == 1


def _site_table(keys: set[tuple[int, int]], classes_soon: bool) -> ClassTable:
    """The (site, class) keys given never reused (their entries keep nothing); every class
    reused within 1 call (classes_soon: the class scores keep all) or never."""
    counts = np.zeros((32, REUSE_CLASSES))
    counts[:, 0 if classes_soon else REUSE_CLASSES - 1] = 100.0
    sites = np.zeros((SITE_VOCABULARY, 32, REUSE_CLASSES))
    for s, c in keys:
        sites[s, c, REUSE_CLASSES - 1] = 100.0
    return ClassTable(counts, MAJORITY, sites)


def test_the_layer_finds_the_call_sites_the_dataset_names(
    heapcast_layer,  # noqa: F811
    program,
    run_traced,
    tmp_path,
):
    # GIVEN the program's frees traced with callers, and their call-site keys as the dataset
    # and the training name them (module path + offset, hashed: tasks/dataset/sites.py)
    exe = program("bigblocks")
    run = run_traced([exe, "5", "1", *BIG], HEAPCAST_CALLER="1")
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    events = events_from_trace(trace)
    _, free_cls = request_and_free_classes(events)
    site = call_sites(events)
    at = free_cls >= 18  # the large blocks' frees (BIG: 300 kB and up)
    keys = {(int(s), int(c)) for s, c in zip(site[at], free_cls[at], strict=True)}
    assert keys and all(s >= 0 for s, _ in keys)
    elsewhere = {((s + 1) % SITE_VOCABULARY, c) for s, c in keys} - keys
    kept, sited = {}, {}
    for name, ks, soon in (("named", keys, True), ("elsewhere", elsewhere, False)):
        # WHEN a format 3 table whose entries at those keys say "never reused", while every
        # class says "soon", guides the layer; and, as a control, one whose entries sit at the
        # next site bucket, every class saying "never"
        table = write_layer_table(tmp_path / f"{name}.hcltab", _site_table(ks, soon), 7)
        stats = tmp_path / f"stats-{name}"
        r = _run(heapcast_layer, exe, table, 7, stats)
        assert r.returncode == 0 and r.stderr == "" and r.stdout == run.proc.stdout
        (row,) = _stats(stats)
        assert row["table"] == 1
        kept[name], sited[name] = row["kept"], row["table_sites"]
    # THEN the layer computed the same keys from its frees' return addresses: it answered every
    # large free by its site's entry and kept nothing
    assert sited["named"] > 0 and kept["named"] == 0
    # AND at keys it never computes, no entry answered: it asked its online counter there,
    # which keeps blocks this program reuses (the classes' "never" is not asked)
    assert sited["elsewhere"] == 0 and kept["elsewhere"] > 0
