"""The layer guided by the registered model's table as a candidate (issue 21: what the model's
table buys against the online counter, measured): the table handed to every run, its version
required, a refused table failing the run instead of measuring the online counter under the
table's name, and a candidate with no table reported unavailable with the reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.allocators.config import LAYER_DIR, Allocator, load_allocators_config
from tasks.allocators.measure import read_layer_stats, table_error
from tests.tasks.allocators.programs_build import measure_table_candidate
from tests.tasks.allocators.tables import written_table

CFG = load_allocators_config()
LAYER = {"kind": "layer", "library": "libheapcast_layer.so"}


def test_the_table_candidate_names_the_model_table_and_its_version_in_every_run(tmp_path):
    a = CFG.get("layer-table")
    assert a.table == "model" and a.model_table is None and a.predictor == "the model's table"
    t = written_table(tmp_path, 7)
    b = CFG.with_model_table(t).get("layer-table")
    (setting,) = b.spec.env
    # the run's own copy in its measure folder, the version required (another is refused)
    assert setting == (
        "HEAPCAST_LAYER",
        "policy=guided,predictor=table:{measure}/heapcast.hcltab,model=7,"
        "stats={measure}/layer-stats",
    )
    assert b.line() == (
        f"LD_PRELOAD={LAYER_DIR}/libheapcast_layer.so "
        f"HEAPCAST_LAYER=policy=guided,predictor=table:{t.path},model=7"
    )
    assert b.predictor == "the model's table (v7)"
    assert CFG.get("layer-guided").predictor == "online counter"
    assert CFG.get("layer-largest").predictor == "no prediction"
    assert CFG.get("glibc").predictor is None
    # the config's other candidates are left as they are, and the table is no config field
    assert CFG.with_model_table(t).get("layer-guided") == CFG.get("layer-guided")
    assert "model_table" not in b.model_dump()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"env": {"HEAPCAST_LAYER": "policy=largest"}}, "is a guided layer's predictor"),
        ({"kind": "malloc", "library": None, "env": {}}, "is a guided layer's predictor"),
        (
            {"env": {"HEAPCAST_LAYER": "policy=guided,predictor=online"}},
            "the stage sets predictor",
        ),
        ({"env": {"HEAPCAST_LAYER": "policy=guided,model=3"}}, "the stage sets model"),
    ],
)
def test_a_table_candidate_that_cannot_read_the_models_table_is_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        Allocator(**{"name": "t", **LAYER, "table": "model", **fields})


def test_a_run_that_did_not_use_the_table_does_not_count(tmp_path):
    stats = tmp_path / "layer-stats"
    stats.write_text(
        "pid=7 policy=3 table=1 hits=2 misses=1 kept=3 table_refused=0\n"
        "pid=8 policy=3 table=0 hits=0 misses=1 kept=0 table_refused=1\n"
    )
    got = read_layer_stats(stats)
    assert got["layer_table"] == 1 and got["layer_table_refused"] == 1
    a = CFG.with_model_table(written_table(tmp_path, 7)).get("layer-table")
    assert "refused in 1 of 2" in table_error(a, got)
    assert table_error(a, {**got, "layer_table": 2, "layer_table_refused": 0}) is None
    # not a table candidate: nothing to check
    assert table_error(CFG.get("layer-guided"), got) is None


def test_the_table_guided_layer_measured_on_this_host(alloc_catalog, tmp_path):
    """alloc_mix (blocks from 128 KiB up, three threads) on the local runner under glibc, the
    layer with the model's table, the layer handed a table of another version than the one
    it is told, and the table candidate given none: the first two measured and the table
    used in every process, the third failed with the refusal, the fourth unavailable."""
    table = written_table(tmp_path, 7)
    m, by = measure_table_candidate(alloc_catalog, CFG, "layer-table", table, tmp_path)
    assert by["glibc"].ok and by["layer-table"].ok, [s.error for s in m.samples]
    assert (
        by["layer-table"].applied and by["layer-table"].stdout_sha256 == by["glibc"].stdout_sha256
    )
    t = by["layer-table"]
    assert t.layer_table == t.layer_processes >= 1 and t.layer_table_refused == 0
    assert t.layer_hits + t.layer_misses > 0
    w = by["layer-table-v8"]
    assert not w.ok and "did not use the model's table v8" in w.error and w.layer_table_refused
    assert [u.allocator for u in m.unavailable] == ["layer-table-none"]
    assert "reads the registered model's table, and none was given" in m.unavailable[0].message


def test_a_table_file_is_measured_as_the_layer_reads_it_and_a_refused_one_stops_the_stage(
    tmp_path,
):
    """`--table-file` (AllocatorsParams.table_file): a table distilled apart is handed to the
    table candidates with the model version its header names, the registry untouched (no
    tracking server here); a file the layer would refuse (cut, changed, not a table, an older
    format) stops the stage with one message naming it, before any run measures the online
    counter under the table's name."""
    from tasks.allocators.model_table import with_model_table
    from tasks.learning.table.layer_file import HEADER, read_table_file
    from tasks.registry.tracking import TrackingConfig

    t = written_table(tmp_path, 9)
    nowhere = TrackingConfig(root=str(tmp_path / "no-store"))
    got = with_model_table.fn(CFG, nowhere, "champion", tmp_path / "dest", str(t.path))
    assert got.get("layer-table").predictor == "the model's table (v9)"
    assert got.get("layer-table").model_table.path == t.path
    assert not (tmp_path / "dest").exists() and not (tmp_path / "no-store").exists()
    assert read_table_file(t.path).version == 9
    data = t.path.read_bytes()
    bad = {
        "cut.hcltab": (data[:-1], "does not match its header"),
        "changed.hcltab": (data[:-1] + bytes([data[-1] ^ 1]), "does not match its header"),
        "other.hcltab": (b"not a table at all, not even close" * 2, "not a table"),
        "format1.hcltab": (data[:8] + (1).to_bytes(4, "little") + data[12:], "format 1"),
        "tokens.hcltab": (data[:16] + (63).to_bytes(4, "little") + data[20:], "63 tokens"),
    }
    assert HEADER.size == 32
    for name, (content, message) in bad.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=message) as err:
            with_model_table.fn(CFG, nowhere, "champion", tmp_path / "dest", str(tmp_path / name))
        assert str(tmp_path / name) in str(err.value)
    with pytest.raises(ValueError, match="cannot be read"):
        read_table_file(tmp_path / "missing.hcltab")
    # a config without table candidates still has the file checked (a typo is not ignored)
    plain = CFG.model_copy(update={"allocators": [CFG.get("glibc"), CFG.get("layer-guided")]})
    assert not plain.needs_table
    assert with_model_table.fn(plain, nowhere, "champion", tmp_path, str(t.path)) is plain
    with pytest.raises(ValueError, match="cannot be read"):
        with_model_table.fn(plain, nowhere, "champion", tmp_path, str(tmp_path / "typo"))
