"""The layer's table kept on this host by model version (tasks/registry/table_cache.py).

GIVEN a real embedded MLflow store with three versions (v1 and v2 logged a table, v3 none)
WHEN `model_table` is asked for the champion or a number
THEN the first call fetches the version's table, later ones read it here without MLflow (a fresh
interpreter never imports it), an alias moved to another version fetches that version's table,
a cut or changed file is refused and fetched again, and a version without a table keeps its
error; a tracking server answers the alias through its REST API alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.core.storage import Root
from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.table.distill import ClassTable
from tasks.learning.table.layer_file import HEADER, MAGIC, read_table_file, write_layer_table
from tasks.registry import table_cache, table_files
from tasks.registry.register import register_outcome
from tasks.registry.table_cache import NoSuchVersion, alias_version, model_table
from tasks.registry.table_files import table_dir, table_fault, write_atomically
from tasks.registry.tracking import CHAMPION_ALIAS, TrackingConfig, resolve_target
from tests.localhost import free_port, mlflow_server
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def _with_table(top1: float, seed: int, keep: float):
    counts = np.ones((32, REUSE_CLASSES))
    counts[:, 0] = keep  # a different table per version
    return dataclasses.replace(
        make_outcome(tiny_model(), top1, seed=seed),
        class_table=ClassTable(counts, np.full(REUSE_CLASSES, 0.2)),
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A data root whose registry holds v1 and v2 with a table and v3 without one."""
    root = Root.from_url(str(tmp_path_factory.mktemp("cache") / "data"))
    tracking = TrackingConfig(root=root.url)
    versions = [
        int(register_outcome(o, tracking).model_version)
        for o in (
            _with_table(0.80, 0, 1.0),
            _with_table(0.85, 1, 9.0),
            make_outcome(tiny_model(), 0.70, seed=2),
        )
    ]
    assert versions == [1, 2, 3]
    return root, tracking


def _point(tracking: TrackingConfig, version: int) -> None:
    from mlflow import MlflowClient

    uri = resolve_target(tracking).tracking_uri
    MlflowClient(uri, uri).set_registered_model_alias(
        tracking.model_name, CHAMPION_ALIAS, str(version)
    )


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """An empty table folder for each test (HEAPCAST_SCRATCH, as users can set it)."""
    monkeypatch.setenv("HEAPCAST_SCRATCH", str(tmp_path / "scratch"))
    return tmp_path / "scratch" / "tables"


def _in_fresh_python(root: Root, which: str) -> dict:
    """model_table in a new interpreter: what it returned, and whether MLflow got imported."""
    code = (
        "import json, sys\n"
        "from tasks.core.storage import Root\n"
        "from tasks.registry.table_cache import model_table\n"
        f"got = model_table(Root.from_url({root.url!r}), {which!r})\n"
        "print(json.dumps({'path': str(got.path), 'version': got.version,"
        " 'refused': got.refused, 'mlflow': 'mlflow' in sys.modules}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_the_champions_table_is_fetched_once_then_read_here_without_mlflow(store, scratch):
    root, tracking = store
    _point(tracking, 1)
    # WHEN asked the first time THEN it is fetched into the folder, under its version's name
    first = model_table(root, "champion")
    assert (first.path, first.version, first.refused) == (scratch / "v1.hcltab", 1, "")
    assert read_table_file(first.path).version == 1
    assert [p.name for p in scratch.iterdir()] == ["v1.hcltab"]  # no temporary file left
    # WHEN asked again, by alias or by number, in a new process THEN MLflow is not imported
    for which in ("champion", "1"):
        again = _in_fresh_python(root, which)
        assert again == {"path": str(first.path), "version": 1, "refused": "", "mlflow": False}


def test_an_explicit_version_here_asks_no_store(store, scratch, monkeypatch):
    root, tracking = store
    model_table(root, "2")

    def no_store(*args):
        raise AssertionError("the store was asked")

    monkeypatch.setattr(table_cache, "alias_version", no_store)
    monkeypatch.setattr("tasks.registry.question_artifacts.fetch_table", no_store)
    monkeypatch.setattr(table_cache, "resolve_target", no_store)
    got = model_table(root, "2", tracking)
    assert (got.path, got.version) == (scratch / "v2.hcltab", 2)


def test_an_alias_moved_to_another_version_fetches_that_versions_table(store, scratch):
    root, tracking = store
    _point(tracking, 1)
    one = model_table(root, "champion")
    # WHEN the alias moves THEN the cheap look-up sees it and the new version is fetched
    _point(tracking, 2)
    assert alias_version(tracking, "champion") == 2
    two = model_table(root, "champion")
    assert (two.path.name, two.version) == ("v2.hcltab", 2)
    assert read_table_file(two.path).version == 2
    assert one.path.read_bytes() != two.path.read_bytes() and one.path.is_file()
    # and moved back, the file already here serves, without MLflow
    _point(tracking, 1)
    assert _in_fresh_python(root, "champion")["version"] == 1


@pytest.mark.parametrize(
    "spoil, why",
    [
        (lambda b: b[: len(b) // 2], "payload does not match its header"),  # a cut file
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "payload does not match its header"),
        (lambda b: b"", "no HCLTAB header"),
        (lambda b: b[:12] + (9).to_bytes(4, "little") + b[16:], "model version 9, not 1"),
    ],
)
def test_a_spoilt_file_here_is_refused_and_fetched_again(store, scratch, spoil, why):
    root, tracking = store
    _point(tracking, 1)
    good = model_table(root, "champion").path
    whole = good.read_bytes()
    good.write_bytes(spoil(whole))
    got = model_table(root, "champion")
    assert got.refused.startswith(f"{good} refused: ") and why in got.refused, got.refused
    assert (got.path, got.version) == (good, 1) and good.read_bytes() == whole


def test_a_version_without_a_table_keeps_its_error(store, scratch):
    root, tracking = store
    with pytest.raises(FileNotFoundError, match=r"v3 \(run \w+\) has no table/heapcast.hcltab"):
        model_table(root, "3")
    _point(tracking, 3)
    try:
        with pytest.raises(FileNotFoundError, match="v3 .* has no table/heapcast.hcltab"):
            model_table(root, "champion")
    finally:
        _point(tracking, 1)
    assert not (scratch / "v3.hcltab").exists()


def test_no_registered_version_is_none_without_mlflow(store, scratch, tmp_path, monkeypatch):
    root, tracking = store

    def no_mlflow(*args):
        raise AssertionError("MLflow was asked")

    monkeypatch.setattr("tasks.registry.question_artifacts.fetch_table", no_mlflow)
    # a root with no store, and a store with no such alias
    assert model_table(Root.from_url(str(tmp_path / "empty")), "champion") is None
    assert model_table(root, "nightly") is None
    # MLflow's `latest` is no alias in the store's tables: MLflow answers it
    assert alias_version(tracking, "latest") is None


def test_the_header_check_is_the_layers(tmp_path):
    """table_fault reads the file as tasks.learning.table.distill writes it (native/TABLE.md)."""
    assert (table_files._HEADER.format, table_files._MAGIC) == (HEADER.format, MAGIC)
    table = ClassTable(np.ones((32, REUSE_CLASSES)), np.full(REUSE_CLASSES, 0.2))
    path = write_layer_table(tmp_path / "v5.hcltab", table, 5)
    assert table_fault(path, 5) == ""
    assert table_fault(path, 6) == "its header says model version 5, not 6"
    assert table_fault(tmp_path / "v7.hcltab", 7) == "it is not there"


def test_the_folder_is_the_allocators_stages_scratch(tmp_path, monkeypatch):
    from tasks.allocators.measure import scratch_parent

    monkeypatch.delenv("HEAPCAST_SCRATCH", raising=False)
    for url in (str(tmp_path / "data"), "s3://bucket/prefix"):
        root = Root.from_url(url)
        assert table_dir(root) == scratch_parent(root) / "tables"
    monkeypatch.setenv("HEAPCAST_SCRATCH", str(tmp_path / "s"))
    root = Root.from_url(str(tmp_path / "data"))
    assert table_dir(root) == scratch_parent(root) / "tables" == tmp_path / "s" / "tables"


def test_a_write_cut_short_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = write_atomically(tmp_path / "v1.hcltab", b"old")

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(table_files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["v1.hcltab"]


def test_an_unanswering_server_or_another_database_leaves_it_to_mlflow():
    # nothing listens on that port; a database this does not read
    assert (
        alias_version(TrackingConfig(tracking_uri=f"http://127.0.0.1:{free_port()}"), "x") is None
    )
    assert alias_version(TrackingConfig(tracking_uri="postgresql://h/db"), "champion") is None


@pytest.mark.integration
def test_a_tracking_server_answers_the_alias_over_rest(store, scratch, monkeypatch):
    """GIVEN scripts/mlflow-server.sh serving the store; THEN the alias is read through its REST
    API, an unknown one is said to be absent, and a table here is used without MLflow."""
    root, tracking = store
    _point(tracking, 2)
    local = model_table(root, "champion")
    with mlflow_server(Path(root.url)) as server:
        remote = TrackingConfig(tracking_uri=server.url)
        assert alias_version(remote, "champion") == 2
        assert alias_version(remote, "nightly") is None  # an unknown alias: MLflow says so
        with pytest.raises(NoSuchVersion):
            alias_version(remote.model_copy(update={"model_name": "other"}), "champion")

        def no_mlflow(*args):
            raise AssertionError("MLflow was asked")

        monkeypatch.setattr("tasks.registry.question_artifacts.fetch_table", no_mlflow)
        got = model_table(root, "champion", remote)
        assert (got.path, got.version) == (local.path, 2)
    _point(tracking, 1)
