"""The placement layer placing by the registered model's lifetime table as a candidate
(`jemalloc-place-table`, issue 45: what the lifetime predictions bought against the online
counter, in MB): the table handed to every run as the layer's reuse table is to the guided layer
(its copy in the run's measure folder, its version required), a run whose layer refused it or
never asked it failing instead of measuring the online counter under the table's name, a
version without a lifetime table reported unavailable with the reason, and the seeds' summary
comparing it with the online counter and the placement with jemalloc alone."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.measure import check_allocators, table_error
from tasks.allocators.place import JEMALLOC, PLACE_LIBRARY, read_place_stats
from tasks.allocators.seeds import seed_config, seed_lines
from tests.tasks.allocators.programs_build import measure_table_candidate
from tests.tasks.allocators.tables import make_measurements, written_lifetime_table, written_table

CFG = load_allocators_config()
PLACE = {"kind": "place", "library": JEMALLOC, "package": "libjemalloc2"}
NAME = "jemalloc-place-table"


def test_the_candidate_names_the_lifetime_table_and_its_version_in_every_run(tmp_path):
    a = CFG.get(NAME)
    assert (a.kind, a.table, a.table_kind) == ("place", "model", "lifetime")
    assert a.place_mode == "predict" and a.model_table is None
    assert a.predictor == "the model's lifetime table"
    t = written_lifetime_table(tmp_path, 7)
    cfg = CFG.with_lifetime_table(t)
    b = cfg.get(NAME)
    # the run's own copy in its measure folder (its own name: the layer's table may be there
    # too), the version required (another is refused), the stats line beside it
    assert b.table_copy == "heapcast.hclife" != cfg.get("layer-table").table_copy
    assert b.place_env() == {
        "HEAPCAST_PLACE": "mode=predict,table={measure}/heapcast.hclife,model=7,"
        "stats={measure}/place-stats"
    }
    assert b.place_env("/m")["HEAPCAST_PLACE"].startswith("mode=predict,table=/m/heapcast.hclife,")
    # the probe sees the layer; its settings come apart (place_request)
    assert b.spec.host_library == PLACE_LIBRARY and b.spec.env == ()
    # the line to paste: the table on this host
    assert b.line() == (
        f"LD_PRELOAD={PLACE_LIBRARY}:{JEMALLOC} HEAPCAST_PLACE=mode=predict,table={t.path},model=7"
    )
    assert b.predictor == "the model's lifetime table (v7)"
    assert CFG.get("jemalloc-place").predictor == "online counter"
    assert CFG.get("jemalloc").predictor is None
    # each table goes to its own candidates only
    assert cfg.get("layer-table").model_table is None
    assert cfg.get("jemalloc-place") == CFG.get("jemalloc-place")
    both = cfg.with_model_table(written_table(tmp_path, 7))
    assert both.get(NAME).model_table == t and both.get("layer-table").model_table.path.suffix == (
        ".hcltab"
    )
    assert CFG.needs_table and CFG.needs_lifetime_table
    assert "model_table" not in b.model_dump()
    # the full night measures it beside the online counter and jemalloc, the quick one does not
    assert NAME in CFG.seeds.allocators and NAME not in CFG.seeds.quick_allocators
    assert ("jemalloc-place-table", "jemalloc-place") in CFG.seeds.compare
    assert ("jemalloc-place", "jemalloc") in CFG.seeds.compare


def test_a_place_candidate_with_the_table_is_accepted():
    a = Allocator(name="p", **PLACE, table="model", env={"HEAPCAST_PLACE": "mode=predict,pct=40"})
    assert a.table_kind == "lifetime" and a.predictor == "the model's lifetime table"
    # a table file given by hand, without `table: model`: the file in words
    b = Allocator(name="q", **PLACE, env={"HEAPCAST_PLACE": "mode=predict,table=/t/x.hclife"})
    assert b.table_kind is None and b.predictor == "lifetime table /t/x.hclife"
    c = Allocator(name="s", **PLACE, env={"HEAPCAST_PLACE": "mode=size"})
    assert c.predictor == "size"


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"env": {"HEAPCAST_PLACE": "mode=predict,table=/t/v3.hclife"}},
            "allocator 't': with `table: model` the stage sets table in HEAPCAST_PLACE (the "
            "model's lifetime table and its version); leave them out",
        ),
        (
            {"env": {"HEAPCAST_PLACE": "mode=predict,table=/t/v3.hclife,model=3"}},
            "the stage sets model and table in HEAPCAST_PLACE",
        ),
        (
            {"env": {"HEAPCAST_PLACE": "mode=size"}},
            "allocator 't': `table: model` on a place candidate needs mode=predict, not size",
        ),
        (
            {"kind": "malloc", "env": {}},
            "allocator 't': `table: model` is a guided layer's predictor (kind: layer, "
            "env.HEAPCAST_LAYER policy=guided: the reuse table) or a place candidate's (kind: "
            "place, mode=predict: the lifetime table)",
        ),
        (
            {
                "kind": "layer",
                "library": "libheapcast_layer.so",
                "package": None,
                "env": {"HEAPCAST_LAYER": "policy=pools"},
            },
            "allocator 't': `table: model` is a guided layer's predictor",
        ),
    ],
)
def test_a_table_candidate_that_cannot_read_its_table_is_refused(fields, message):
    spec = {"name": "t", **PLACE, "table": "model", "env": {"HEAPCAST_PLACE": "mode=predict"}}
    with pytest.raises(ValidationError, match=re.escape(message)):
        Allocator(**{**spec, **fields})


def test_a_run_that_refused_the_table_or_never_asked_it_does_not_count(tmp_path):
    line = (
        "heapcast place: pid={pid} mode=predict long=5 sampled=10 dropped=0 freed_short=9 "
        "freed_long=1 evicted_long=0 sites_seen=3 sites_long=1 table={table} "
        "table_refused={refused} table_answers={answers} counter_answers=4\n"
    )
    stats = tmp_path / "place-stats"
    stats.write_text(
        line.format(pid=7, table=1, refused=0, answers=30)
        + line.format(pid=8, table=0, refused=1, answers=0)
    )
    got = read_place_stats(stats)
    assert (got["place_table"], got["place_table_refused"], got["place_table_answers"]) == (
        1,
        1,
        30,
    )
    assert got["place_counter_answers"] == 8
    a = CFG.with_lifetime_table(written_lifetime_table(tmp_path, 7)).get(NAME)
    assert "did not use the model's lifetime table v7" in table_error(a, got)
    assert "refused in 1 of 2" in table_error(a, got)
    used = {**got, "place_table": 2, "place_table_refused": 0}
    assert table_error(a, used) is None
    # in use, but it knew none of the run's keys: the counter placed everything
    assert "placed no allocation" in table_error(a, {**used, "place_table_answers": 0})
    # not a table candidate: nothing to check
    assert table_error(CFG.get("jemalloc-place"), got) is None


def test_a_version_without_a_lifetime_table_is_reported_unavailable_not_a_crash(
    tmp_path, monkeypatch
):
    """The night's version registered before lifetime tables were logged: the layer's table
    candidates get theirs, the placement's is reported unavailable, the reason in the log."""
    import tasks.registry.question_artifacts as qa
    from tasks.allocators.model_table import with_model_table
    from tasks.registry.tracking import TrackingConfig

    fetched = []

    def fetch_table(tracking, model, dest):
        fetched.append(("reuse", model))
        return written_table(dest, 3)

    def fetch_lifetime_table(tracking, model, dest):
        fetched.append(("lifetime", model))
        raise FileNotFoundError(f"model heapcast v{model} (run r) has no table/heapcast.hclife")

    monkeypatch.setattr(qa, "fetch_table", fetch_table)
    monkeypatch.setattr(qa, "fetch_lifetime_table", fetch_lifetime_table)
    (tmp_path / "dest").mkdir()
    nowhere = TrackingConfig(root=str(tmp_path / "no-store"))
    got = with_model_table.fn(CFG, nowhere, "3", tmp_path / "dest")
    assert fetched == [("reuse", "3"), ("lifetime", "3")]  # once each
    assert got.get("layer-table").model_table.version == 3
    assert got.get(NAME).model_table is None
    missing = check_allocators(None, "local", None, [got.get(NAME), got.get("layer-table")])
    assert list(missing) == [NAME]
    assert "reads the registered model's lifetime table, and none was given" in str(missing[NAME])
    # a version whose lifetime table is there: handed over
    monkeypatch.setattr(
        qa, "fetch_lifetime_table", lambda t, m, d: written_lifetime_table(d, int(m))
    )
    assert with_model_table.fn(CFG, nowhere, "3", tmp_path / "dest").get(NAME).predictor == (
        "the model's lifetime table (v3)"
    )
    # a layer table file given apart: the registry is not asked for the lifetime table
    filed = with_model_table.fn(CFG, nowhere, "3", tmp_path, str(written_table(tmp_path, 9).path))
    assert filed.get(NAME).model_table is None and filed.get("layer-table").model_table.version == 9


def _runs(n=3, wall=1.0, rss=100.0):
    return [(wall + i * 0.01, rss) for i in range(n)]


def test_the_summary_says_what_the_lifetime_predictions_bought_in_mb(tmp_path):
    """Full night: the table against the online counter, the placement against jemalloc alone
    (MB); quick night (no placement in its list): the pairs are not said at all; a side with
    no successful run is said once."""
    cfg = CFG.with_lifetime_table(written_lifetime_table(tmp_path, 7))
    full = {
        "glibc": _runs(),
        "jemalloc": _runs(rss=60.0),
        "jemalloc-place": _runs(rss=50.0),
        "jemalloc-place-table": _runs(rss=40.0),
    }
    m = make_measurements(full, case="numpy_pipeline/small", config=cfg)
    text = seed_lines(m, cfg)[0].text()
    assert (
        "bought: jemalloc-place-table (the model's lifetime table (v7)) +0 ms -10.0 MB vs "
        "jemalloc-place (online counter) (p=1, RSS p=0.1), jemalloc-place (online counter) +0 ms "
        "-10.0 MB vs jemalloc (p=1, RSS p=0.1)" in text
    ), text
    assert "nothing to compare" not in text  # the layer's pairs: not measured tonight
    # the quick night's list: no placement, nothing said about its pairs
    quick = seed_config(cfg, quick=True).names()
    assert "jemalloc-place" not in quick
    q = make_measurements({n: _runs() for n in quick}, case="c", config=cfg)
    (line,) = seed_lines(q, cfg)
    assert "jemalloc" not in line.text() and not line.missing
    assert (line.bought[0].who, line.bought[0].against) == ("layer-table", "layer-guided")
    assert not any("regret" in b.who for b in line.bought)  # the full night's variants
    # measured tonight but no successful run (no lifetime table registered): said
    gone = make_measurements(
        {k: v for k, v in full.items() if k != NAME},
        case="c",
        config=cfg,
        unavailable={NAME: "no lifetime table"},
    )
    (line,) = seed_lines(gone, cfg)
    assert line.missing == ["jemalloc-place-table vs jemalloc-place"]
    assert [(b.who, b.against) for b in line.bought] == [("jemalloc-place", "jemalloc")]


def test_the_place_table_candidate_measured_on_this_host(alloc_catalog, tmp_path):
    """alloc_mix (three threads) on the local runner under jemalloc-place with the model's
    lifetime table (every key known), with a table of another version than the one it is told,
    and given none: the first measured with the table answering, the second failed with the
    refusal, the third unavailable."""
    table = written_lifetime_table(tmp_path, 7)
    m, by = measure_table_candidate(alloc_catalog, CFG, NAME, table, tmp_path, short="place-table")
    t = by[NAME]
    assert by["glibc"].ok and t.ok, [s.error for s in m.samples]
    assert t.applied and t.stdout_sha256 == by["glibc"].stdout_sha256
    assert t.place_table == t.place_processes >= 1 and t.place_table_refused == 0
    assert t.place_table_answers > 0 and t.place_long > 0  # every key long
    w = by["place-table-v8"]
    assert not w.ok and "did not use the model's lifetime table v8" in w.error
    assert w.place_table_refused == w.place_processes
    assert [u.allocator for u in m.unavailable] == ["place-table-none"]
    assert "lifetime table, and none was given" in m.unavailable[0].message
