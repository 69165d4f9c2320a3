"""The placement's lifetime table (native/TABLE.md, "The placement's lifetime table"): its file
written and read back as the layer reads it (tasks/registry/table_files.py), distilled from the
questions' network per (allocation call site, size class) (question_network.distilled_lifetime),
kept on this host by version like the layer's table, and logged with a registered version."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

from tasks.core.storage import Root
from tasks.learning.labels import LIFETIME_CLASSES, NO_LABEL
from tasks.registry import table_files
from tasks.registry.table_cache import model_table
from tasks.registry.table_files import (
    LIFE_MAGIC,
    lifetime_bytes,
    lifetime_fault,
    lifetime_file,
    read_lifetime_table,
    table_dir,
    write_lifetime_table,
)
from tasks.registry.tracking import TrackingConfig


def test_the_file_round_trips_and_says_which_keys_are_long(tmp_path):
    keys = np.array([3 * 32 + 5, 3 * 32 + 9, 4095 * 32 + 31], np.uint32)
    scores = np.array([255, 127, 128], np.uint8)
    path = write_lifetime_table(tmp_path / "t.hclife", keys, scores, 7)
    raw = path.read_bytes()
    magic, fmt, model, classes, size, _ = struct.unpack_from("<8sIIIIQ", raw)
    assert (magic, fmt, model, classes, size, len(raw)) == (LIFE_MAGIC, 1, 7, 32, 12, 44)
    # one little-endian word per key: (site * 32 + class) << 8 | score
    assert struct.unpack_from("<I", raw, 32)[0] == (3 * 32 + 5) << 8 | 255
    got = read_lifetime_table(path)
    assert (got.version, got.keys, got.scores) == (7, keys.tolist(), scores.tolist())
    assert got.long_keys() == {3 * 32 + 5, 4095 * 32 + 31}  # score >= 128: P(long) >= ~1/2
    assert lifetime_fault(path, 7) == ""
    assert "model version 7, not 8" in lifetime_fault(path, 8)
    # an empty table is a table: it knows no key, the counter answers everything
    empty = write_lifetime_table(tmp_path / "e.hclife", [], [], 1)
    assert read_lifetime_table(empty).keys == []


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:-2], "does not match its header"),
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "does not match its header"),
        (lambda b: b"HCLTAB\x00\x01" + b[8:], "no HCLIFE header"),
        (lambda b: b[:8] + struct.pack("<I", 2) + b[12:], "format 2"),
        (lambda b: b[:10], "no HCLIFE header"),
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage, why):
    path = write_lifetime_table(tmp_path / "t.hclife", [1, 2, 3], [10, 200, 30], 3)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"lifetime table {path}: .*{why}"):
        read_lifetime_table(path)
    assert why in lifetime_fault(path, 3)


def test_keys_out_of_order_are_refused_by_the_writer_and_the_reader(tmp_path):
    with pytest.raises(ValueError, match="rise strictly"):
        lifetime_bytes([5, 5], [1, 2], 1)
    with pytest.raises(ValueError, match="0..255"):
        lifetime_bytes([5], [256], 1)
    # a file whose words do not rise (checksum right): corrupt
    words = struct.pack("<2I", 9 << 8, 4 << 8)
    head = table_files._HEADER.pack(LIFE_MAGIC, 1, 1, 32, 8, table_files._fnv1a64(words))
    path = tmp_path / "t.hclife"
    path.write_bytes(head + words)
    with pytest.raises(ValueError, match="out of order"):
        read_lifetime_table(path)


def test_a_sound_local_file_is_used_without_a_store_and_a_bad_one_fetched_again(
    tmp_path, monkeypatch
):
    root = Root.from_url(str(tmp_path / "data"))
    tracking = TrackingConfig(root=root.url)
    path = write_lifetime_table(lifetime_file(table_dir(root), 4), [7], [255], 4)

    def no_store(*a, **k):
        raise AssertionError("the store was asked for a table that is here")

    monkeypatch.setattr("tasks.registry.question_artifacts.fetch_lifetime_table", no_store)
    got = model_table(root, "4", tracking, kind="lifetime")
    assert (got.path, got.version, got.refused) == (path, 4, "")
    # cut: fetched again (here: a stand-in for the store that writes the version's file)
    path.write_bytes(path.read_bytes()[:-1])

    def fetch(tracking, model, dest):
        from tasks.learning.table.layer_file import ModelTable

        p = write_lifetime_table(lifetime_file(dest, int(model)), [7], [0], int(model))
        return ModelTable(path=p, version=int(model), run_id="r")

    monkeypatch.setattr("tasks.registry.question_artifacts.fetch_lifetime_table", fetch)
    got = model_table(root, "4", tracking, kind="lifetime")
    assert "refused" in got.refused and read_lifetime_table(got.path).scores == [0]


def _inputs(sites, tokens, labels):
    from tasks.learning.questions.network import N_FEATURES, QuestionInputs

    n = len(tokens)
    return QuestionInputs(
        order=np.arange(n),
        starts=np.eye(1, n, dtype=bool)[0],
        tokens=np.asarray(tokens, np.int32),
        sites=np.asarray(sites, np.int32),
        features=np.zeros((n, N_FEATURES), np.float32),
        labels={"lifetime_calls": np.asarray(labels, np.int32)},
        free_class=np.full(n, -1),
    )


def test_the_network_is_distilled_per_allocation_site_and_class():
    """GIVEN the network's lifetime answers at five calls: three allocations of class 6 from site
    10 (sites are stored + 1), one of class 9 from site 10, a free, and an allocation without a
    site, WHEN distilled, THEN one entry per (site, class) allocated, its score the mean
    P(lifetime class >= 4: beyond 65536 calls, or never freed); nothing for the free or the
    allocation without a site (the counter answers there)."""
    from tasks.learning.questions.network import LONG_LIFETIME_CLASS, distilled_lifetime

    assert LONG_LIFETIME_CLASS == 4 and LIFETIME_CLASSES == 6
    inp = _inputs(
        sites=[11, 11, 11, 11, 11, 0],
        tokens=[6, 6, 6, 9, 32 + 6, 6],
        labels=[0, 5, 4, 1, NO_LABEL, 5],
    )
    p = np.zeros((6, LIFETIME_CLASSES))
    p[:, 0] = 1.0
    p[0] = [0, 0, 0, 0, 0.5, 0.5]  # long: 1.0
    p[1] = [0.5, 0, 0, 0, 0, 0.5]  # 0.5
    p[2] = [0, 0, 0, 0.9, 0.1, 0]  # 0.1
    keys, scores = distilled_lifetime([inp], [{"lifetime_calls": p}])
    assert keys.tolist() == [10 * 32 + 6, 10 * 32 + 9]
    assert scores.tolist() == [round(255 * (1.0 + 0.5 + 0.1) / 3), 0]


@pytest.mark.slow
def test_the_lifetime_table_is_logged_with_the_version_and_fetched_by_it(tmp_path):
    """GIVEN an outcome with a questions' network, WHEN registered, THEN the version's run holds
    table/heapcast.hclife written for that version from the table the training distilled
    (TrainOutcome.lifetime_table), fetched into the host's folder by number; a version without
    one says why in its tag, and asking for its table names the version."""
    from mlflow import MlflowClient

    from tasks.learning.questions.network import QuestionNetwork, build_network
    from tasks.registry.question_artifacts import TAG_LIFETIME, fetch_lifetime_table
    from tasks.registry.register import register_outcome
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

    net = QuestionNetwork(build_network(8), train_calls=10, epochs=1, seconds=0.1)
    outcome = dataclasses.replace(make_outcome(tiny_model(), 0.8), question_network=net)
    tracking = TrackingConfig(root=str(tmp_path / "data"))
    # no table distilled: not made, and the tag says why
    bare = register_outcome(outcome, tracking)
    tag = MlflowClient().get_run(bare.run_id).data.tags[TAG_LIFETIME]
    assert tag == "not made: training distilled no lifetime table", tag
    with pytest.raises(FileNotFoundError, match=r"has no table/heapcast.hclife.*not made"):
        fetch_lifetime_table(tracking, bare.model_version, tmp_path / "none")

    table = (np.array([5 * 32 + 6], np.uint32), np.array([200], np.uint8))
    again = make_outcome(tiny_model(), 0.8, seed=1)  # another outcome: registered afresh
    result = register_outcome(
        dataclasses.replace(again, question_network=net, lifetime_table=table), tracking
    )
    tag = MlflowClient().get_run(result.run_id).data.tags[TAG_LIFETIME]
    assert tag.startswith("table/heapcast.hclife") and "1 (call site, size class) keys" in tag, tag
    got = fetch_lifetime_table(tracking, result.model_version, tmp_path / "t")
    assert got.path == Path(tmp_path / "t" / f"v{result.model_version}.hclife")
    table = read_lifetime_table(got.path)
    assert (table.version, table.keys, table.scores) == (
        int(result.model_version),
        [5 * 32 + 6],
        [200],
    )
    # and kept on this host by version (the CLI's --predictor model:N)
    local = model_table(tracking.root, result.model_version, kind="lifetime")
    assert (
        local.version == int(result.model_version)
        and lifetime_fault(local.path, local.version) == ""
    )
