"""heapcast's layer as a candidate of the allocators stage (issue 21, measured for real): its
settings checked, its stats file placed in each run's measure folder, its loading verified by
the probe, its counters read, and the seeds' cases summed up in one line of ms and MB."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.allocators.config import LAYER_DIR, LAYER_OPTIONS, Allocator, load_allocators_config
from tasks.allocators.measure import read_layer_stats
from tasks.allocators.seeds import seed_lines
from tasks.core.config import ConfigError, load_config
from tasks.core.storage import Root
from tasks.nightly.markdown import markdown_text
from tasks.nightly.summary_model import NightlySummary
from tasks.replay.runners.base import SANDBOX_PATHS, program_env
from tasks.replay.runners.preload import verify
from tests.tasks.allocators.programs_build import measure_alloc_mix
from tests.tasks.allocators.tables import make_measurements, written_table

CFG = load_allocators_config()
LAYER_C = Path(__file__).resolve().parents[3] / "native" / "layers" / "layer.c"


def test_a_candidate_may_give_every_layer_option_but_stats():
    """The stage's list is the layer's own table (HL_OPTIONS), less the option it sets itself."""
    text = LAYER_C.read_text()
    table = text[text.index("#define HL_OPTIONS(X)") : text.index("enum hl_policy")]
    names = set(re.findall(r"X\((\w+),", table))
    assert LAYER_OPTIONS == names - {"stats"}


def test_the_layers_policies_are_candidates_with_their_counters_collected():
    for name, policy in (
        ("layer-largest", "largest"),
        ("layer-pools", "pools"),
        ("layer-guided", "guided"),
    ):
        a = CFG.get(name)
        assert a.kind == "layer" and a.malloc_family == "layer"
        assert a.spec.host_library == LAYER_DIR / "libheapcast_layer.so"
        assert a.spec.library is None  # not looked for inside the image: mounted from here
        (setting,) = a.spec.env
        assert setting == (
            "HEAPCAST_LAYER",
            f"{a.env['HEAPCAST_LAYER']},stats={{measure}}/layer-stats",
        )
        assert f"policy={policy}" in a.env["HEAPCAST_LAYER"]
        # the line a user pastes has the settings, not the stage's stats file
        assert a.line() == (
            f"LD_PRELOAD={LAYER_DIR}/libheapcast_layer.so HEAPCAST_LAYER={a.env['HEAPCAST_LAYER']}"
        )


def test_the_policies_former_names_name_the_candidates_now(tmp_path):
    """issue 46: layer-seed002 is layer-largest, layer-seed001(-all) layer-pools(-all), as
    --candidates, a candidate's HEAPCAST_LAYER and a stored night's summary table give them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.allocators.config import current_allocator
    from tasks.allocators.report import ADVICE_COLUMNS, last_advice

    assert current_allocator("layer-seed002") == "layer-largest"
    assert current_allocator("layer-seed001-all") == "layer-pools-all"
    assert current_allocator("layer-guided") == "layer-guided"
    assert CFG.get("layer-seed002") == CFG.get("layer-largest")
    assert CFG.get("layer-seed001-all") == CFG.get("layer-pools-all")
    assert CFG.resolve("layer-seed001") == "layer-pools" and CFG.resolve("glibc") == "glibc"
    Allocator(name="old", kind="layer", library="x.so", env={"HEAPCAST_LAYER": "policy=seed002"})
    # GIVEN a night's summary table written under the old names
    row = dict.fromkeys(ADVICE_COLUMNS)
    row.update(case="c", baseline="glibc", recommendation="layer-seed002", runs=5)
    rows = [{**row, "allocator": "glibc"}, {**row, "allocator": "layer-seed002"}]
    rows[1]["best_challenger"] = "layer-seed001"
    folder = tmp_path / "allocators" / "summary" / "night=20260101T000000"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-0.parquet")
    # WHEN read back THEN its advice names the candidates as they are now
    (advice,) = last_advice(Root.from_url(str(tmp_path))).advice
    assert (advice.recommendation, advice.best_challenger) == ("layer-largest", "layer-pools")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "gives its settings in env.HEAPCAST_LAYER"),
        ({"env": {"HEAPCAST_LAYER": "policy=lru"}}, "policy: 'lru' is not one of"),
        ({"env": {"HEAPCAST_LAYER": "policy=largest,capp=1G"}}, "'capp=1G' is not NAME=VALUE"),
        ({"env": {"HEAPCAST_LAYER": "cap=1G"}}, "give the policy"),
        ({"env": {"HEAPCAST_LAYER": "policy=guided,stats=/tmp/x"}}, "`stats` is set by the stage"),
        (
            {"env": {"HEAPCAST_LAYER": "policy=guided"}, "library": "/opt/lib.so"},
            "file name under",
        ),
        (
            {"env": {"HEAPCAST_LAYER": "policy=off", "MALLOC_CONF": "narenas:2"}},
            "tunes jemalloc's malloc, but this candidate runs layer's",
        ),
    ],
)
def test_a_bad_layer_candidate_is_refused_saying_what_to_write(fields, message):
    spec = {"name": "mine", "kind": "layer", "library": "libheapcast_layer.so", **fields}
    with pytest.raises(ValidationError, match=message):
        Allocator(**spec)


def test_the_layers_setting_on_a_malloc_candidate_is_refused():
    with pytest.raises(
        ValidationError, match="tunes layer's malloc, but this candidate runs glibc"
    ):
        Allocator(name="g", env={"HEAPCAST_LAYER": "policy=largest"})


def test_a_seeds_section_naming_an_unknown_allocator_names_the_file_and_field(tmp_path):
    text = (LAYER_DIR.parent.parent / "configs" / "allocators.yaml").read_text()
    bad = tmp_path / "allocators.yaml"
    bad.write_text(text.replace("- [layer-table, layer-guided]", "- [layer-table, layer-nosuch]"))
    with pytest.raises(ConfigError, match="layer-nosuch not among the allocators"):
        load_config(type(CFG), bad)


def test_the_runner_puts_the_stats_file_in_the_measure_folder_and_the_probe_accepts_it(tmp_path):
    from tasks.replay.workloads import load_catalog

    w = load_catalog().get("numpy_temporaries")
    spec = CFG.get("layer-largest").spec
    env = program_env(w, w.inputs[0], SANDBOX_PATHS, False, extra=spec.env, measure="/m")
    assert env["HEAPCAST_LAYER"] == "policy=largest,stats=/m/layer-stats"
    with pytest.raises(ValueError, match="names the measure folder, but the run has none"):
        program_env(w, w.inputs[0], SANDBOX_PATHS, False, extra=spec.env)
    line = (
        "start\tpid=7\tsecure=0\texe=/usr/bin/python3\tmalloc=/heapcast/lib/libheapcast_layer.so"
        "\tenv.HEAPCAST_LAYER={}\n"
    )
    seen = verify(spec, line.format(env["HEAPCAST_LAYER"]), None)
    assert seen.applied, seen.reason
    other = verify(spec, line.format("policy=pools,stats=/m/layer-stats"), None)
    assert not other.applied and "HEAPCAST_LAYER" in other.reason


def test_the_layers_counters_are_summed_over_the_processes(tmp_path):
    stats = tmp_path / "layer-stats"
    assert read_layer_stats(stats) == {}
    stats.write_text(
        "pid=7 policy=1 table=0 hits=80 misses=68 kept=148 bytes_kept_peak=4096 given_back=64 "
        "bytes_given_back=100 bytes_advised=0 decayed=0 passed=9 double_frees=0 untracked=1 "
        "proof=4 proven=1 proof_hits=4 unproven=6\n"
        "pid=9 policy=1 table=0 hits=2 misses=1 kept=3 bytes_kept_peak=8192 given_back=1 "
        "bytes_given_back=5 bytes_advised=7 decayed=0 passed=1 double_frees=1 untracked=0 "
        "proof=4 proven=0 proof_hits=1 unproven=2 table_sites=3 table_contexts=5\n"
    )
    got = read_layer_stats(stats)
    # the frees a format 4 table's context entries answered, and its site entries
    assert (got["layer_table_contexts"], got["layer_table_sites"]) == (5, 3)
    assert got["layer_processes"] == 2 and got["layer_hits"] == 82 and got["layer_kept"] == 151
    assert got["layer_bytes_kept_peak"] == 8192  # the largest, not the sum
    assert got["layer_bytes_given_back"] == 105 and got["layer_double_frees"] == 1
    # one of the two processes had its proof (the other stepped aside), 8 frees passed meanwhile
    assert (got["layer_proven"], got["layer_unproven"]) == (1, 8)


def test_the_seed_summary_line_gives_ms_mb_and_what_each_prediction_bought():
    from tasks.learning.table.layer_file import ModelTable

    cfg = CFG.with_model_table(ModelTable(path=Path("/t/v12.hcltab"), version=12, run_id="r"))
    runs = {
        "glibc": [(1.30, 100.0), (1.32, 101.0), (1.31, 100.0)],
        "tcmalloc": [(1.00, 110.0), (1.01, 110.0), (1.02, 111.0)],
        "layer-largest": [(1.00, 104.0), (0.99, 104.0), (1.01, 104.0)],
        "layer-guided": [(0.95, 102.0), (0.96, 102.0), (0.94, 102.0)],
        "layer-table": [(0.93, 101.0), (0.92, 101.0), (0.94, 101.0)],
    }
    m = make_measurements(runs, case="numpy_temporaries/small", config=cfg)
    (line,) = seed_lines(m, cfg)
    text = line.text()
    assert text.startswith("numpy_temporaries/small, 3 rounds only (quick: too few")
    assert "glibc 1310 ms 100 MB" in text and "layer-guided 950 ms 102 MB" in text
    # the model's table against the online counter, each layer named by what it decides from
    assert (
        "bought: layer-table (the model's table (v12)) -20 ms -1.0 MB vs layer-guided (online "
        "counter) (p=0.2, RSS p=0.1)" in text
    )
    assert "layer-guided (online counter) -50 ms -2.0 MB vs layer-largest (no prediction)" in text
    assert "layer-guided (online counter) -360 ms +2.0 MB vs glibc (p=0.1, RSS p=0.1)" in text
    page = markdown_text(NightlySummary(root="/r", finished_at="now", stages=[], seed_lines=[text]))
    assert "## What the layer bought, measured (seeds' cases; medians, ms and MB)" in page
    assert f"- {text}" in page
    # a night without the seeds' cases says so where their figures would be
    quiet = markdown_text(NightlySummary(root="/r", finished_at="now", stages=[]))
    assert "Not measured tonight: the night's `seeds` option is off" in quiet


def test_five_rounds_say_so_and_a_side_without_a_successful_run_is_said():
    """A compared side measured tonight with no successful run is said; a pair whose side
    tonight's list leaves out (layer-table, the regrets, the placement here) is not."""
    five = [(1.0, 100.0)] * 5
    m = make_measurements(
        {"glibc": five, "layer-largest": five}, case="c", unavailable={"layer-guided": "gone"}
    )
    text = seed_lines(m, CFG)[0].text()
    assert text.startswith("c, 5 rounds: ") and "bought" not in text
    assert text.endswith(
        "; nothing to compare for layer-guided vs layer-largest, layer-guided vs glibc (a side "
        "had no successful run)"
    ), text


# ------------------------------------------------------------------ a real run, in a container


@pytest.mark.integration
def test_the_layer_measured_in_docker_is_verified_loaded_and_its_counters_read(
    sqlite3_image, alloc_catalog, tmp_path
):
    """alloc_mix (three threads, a few blocks from 128 KiB up) under glibc and layer-largest
    through the docker runner: the layer mounted from native/build, verified by the probe,
    the output unchanged, the counters read from the run's measure folder."""
    cfg = CFG.model_copy(
        update={
            "allocators": [CFG.get("glibc"), CFG.get("layer-largest")],
            "warmup": 0,
            "max_repetitions": None,
        }
    )
    w = alloc_catalog.get("alloc_mix")
    m = measure_alloc_mix(w, cfg, tmp_path, "docker", repetitions=1)
    by = {s.allocator: s for s in m.samples}
    assert all(s.ok and s.applied for s in m.samples), [s.error for s in m.samples]
    assert by["glibc"].stdout_sha256 == by["layer-largest"].stdout_sha256
    layer = by["layer-largest"]
    assert layer.layer_processes == 1 and by["glibc"].layer_processes is None
    assert layer.layer_hits + layer.layer_misses > 0 and layer.layer_double_frees == 0
    assert layer.layer_bytes_kept_peak > 0


def test_the_nights_seeds_option_is_off_by_default_and_quick_with_the_quick_night():
    from tasks.nightly.params import NightlyParams

    assert NightlyParams().stages().seeds is None
    seeds = NightlyParams(seeds=True, quick=True, root="/tmp/r").stages().seeds
    assert seeds is not None and seeds.quick and seeds.root == "/tmp/r"
    assert NightlyParams(seeds=True, root="/tmp/r").stages().seeds.quick is False


def test_heapcast_tune_measures_a_layer_candidate_verified_with_its_counters(tmp_path):
    """`heapcast tune` on this host: the layer preloaded from native/build, verified by the
    probe (its HEAPCAST_LAYER with the stats file in each run's folder), counters read."""
    from tasks.allocators.measure import build_layers
    from tasks.allocators.tune import tune

    build_layers([CFG.get("layer-largest")])
    prog = tmp_path / "prog.py"
    # 8 MiB blocks, every one mapped: the program fixes glibc's mmap threshold at 128 KiB (as
    # TensorFlow does), so glibc's heap never takes them and the layer's proof comes at once
    prog.write_text(
        "import ctypes\nctypes.CDLL(None).mallopt(-3, 131072)  # M_MMAP_THRESHOLD\n"
        "for i in range(40):\n    b = bytearray(8 << 20)\nprint('done')\n"
    )
    out = tune(
        [sys.executable, str(prog)],
        CFG,
        candidates=["glibc", "layer-largest"],
        repetitions=5,
        max_repetitions=5,
    )
    layer = [s for s in out.measurements.samples if s.allocator == "layer-largest"]
    # at least the rounds before tune may drop a candidate that cannot win (tasks.allocators.rounds)
    assert len(layer) >= 2 and all(s.ok and s.applied for s in layer), [s.error for s in layer]
    # the traced run saw the program fix the threshold itself
    assert any(c.startswith("M_MMAP_THRESHOLD=131072") for c in out.facts.mallopt_calls)
    assert all(s.layer_processes == 1 and s.layer_hits > 0 for s in layer)


@pytest.fixture(scope="module")
def numpy_image(engine):
    from tasks.replay.images import build_all

    return build_all(["numpy"], host=engine)[-1]


@pytest.mark.integration
def test_the_seeds_cases_measured_in_their_containers_published_and_logged_on_the_models_run(
    numpy_image, tmp_path
):
    """The layer's cases (numpy_temporaries, numpy_training_loop: seed 001's loop, and
    numpy_pipeline) under glibc, layer-largest, layer-guided, layer-table (a model's table
    copied into each container's measure folder) and layer-guided-regret, one quick round: every
    run verified with the same output, the table used in every process, the layer's counters in
    the samples Parquet, a line per case, the figures on a model's run. On the pipeline the
    online counter keeps nothing (the main thread frees the reader's chunks and never asks for
    one), where no prediction, the table (every class: keep) and the counter overruled by the
    process's regrets reuse them."""
    import mlflow
    import pyarrow.parquet as pq

    from tasks.allocators.report import write_outcome
    from tasks.allocators.seeds import log_on_model_run, measure_seed_cases, seed_config
    from tasks.registry.tracking import TrackingConfig, configure

    w = load_catalog_workload("numpy_training_loop")
    assert [i.name for i in w.inputs] == ["small", "medium"] and not any(i.quick for i in w.inputs)
    assert w.deterministic
    seeds = CFG.seeds.model_copy(
        update={
            "allocators": [
                "glibc",
                "layer-largest",
                "layer-guided",
                "layer-table",
                "layer-guided-regret",
            ],  # fmt: skip
            "quick_allocators": None,  # the quick round measures `allocators`
            "quick_repetitions": 1,
        }
    )
    table = written_table(tmp_path, 5)
    cfg = CFG.with_model_table(table).model_copy(update={"seeds": seeds, "warmup": 0})
    root = Root.from_url(str(tmp_path / "root"))
    m = measure_seed_cases.fn(root, cfg, True, "docker")
    cases = ("numpy_temporaries", "numpy_training_loop", "numpy_pipeline")
    assert {c.label for c in m.cases} == set(cases)
    assert m.repetitions == 1 and len(m.samples) == 3 * 5
    assert all(s.ok and s.applied for s in m.samples), [s.error for s in m.samples]
    for case in cases:
        outputs = {s.stdout_sha256 for s in m.samples if s.case == case}
        assert len(outputs) == 1  # the layer never changes the output
        hits = {s.allocator: s.layer_hits for s in m.samples if s.case == case}
        counter_keeps = case != "numpy_pipeline"
        assert (hits["layer-guided"] > 0) == counter_keeps, (case, hits)
        assert hits["layer-largest"] > 0 and hits["layer-table"] > 0, (case, hits)
        assert hits["layer-guided-regret"] > 0, (case, hits)
        if not counter_keeps:  # the process's misses, not the freeing thread's counter
            (r,) = [s for s in m.samples if s.case == case and s.allocator == "layer-guided-regret"]
            assert r.layer_regret_hits >= 1 and r.layer_regret_keeps >= r.layer_hits, r
        (t,) = [s for s in m.samples if s.case == case and s.allocator == "layer-table"]
        assert t.layer_table == t.layer_processes >= 1 and t.layer_table_refused == 0
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    out = write_outcome(root, m, seed_config(cfg), to_mlflow=False, tracking=tracking)
    samples = pq.read_table(out.samples_path).to_pandas()
    assert (samples.loc[samples["allocator"] == "layer-largest", "layer_hits"] > 0).all()
    lines = seed_lines(m, cfg)
    assert [line.case for line in lines] == list(cases)
    assert all(" ms " in line.text() and " MB" in line.text() for line in lines)
    assert "layer-table (the model's table (v5)) " in lines[0].text()
    assert "vs layer-guided (online counter)" in lines[0].text()
    # the registered model's run gets the figures, each layer named by what it decides from
    configure(tracking)
    with mlflow.start_run() as run:
        pass
    log_on_model_run.fn(lines, tracking, run.info.run_id)
    got = mlflow.get_run(run.info.run_id).data
    # a few figures (the model's table against the counter and against no prediction), named
    # short enough for a chart card's title
    assert set(got.metrics) == {
        f"layer/vs_{who}.{c}"
        for c in ("temporaries", "training_loop", "pipeline")
        for who in ("counter", "none")
    }
    # and every figure in one table the UI shows as such
    shown = mlflow.load_table("layer/cases.json", run_ids=[run.info.run_id])
    pair = shown[(shown["case"] == "numpy_pipeline") & (shown["allocator"] == "layer-table")]
    assert set(pair["against"]) == {"", "layer-guided", "layer-largest", "glibc"}
    assert got.metrics["layer/vs_counter.pipeline"] == pytest.approx(
        float(pair.loc[pair["against"] == "layer-guided", "wall_ms"].iloc[0])
    )
    assert {"case", "predictor", "wall_ms", "peak_mb", "p_wall", "p_peak", "rounds"} <= set(shown)
    assert got.tags["heapcast.layer.bought"].startswith("measured: numpy_temporaries, 1 round")


def load_catalog_workload(name: str):
    from tasks.replay.workloads import load_catalog

    return load_catalog().get(name)


def test_the_quick_nights_seed_allocators_are_a_subset_with_the_baseline(tmp_path):
    from tasks.allocators.seeds import seed_config

    quick = seed_config(CFG, quick=True).names()
    assert quick == CFG.seeds.quick_allocators and "layer-table" in quick and "glibc" in quick
    assert seed_config(CFG).names() == CFG.seeds.allocators  # the weekly flow: all of them
    text = (LAYER_DIR.parent.parent / "configs" / "allocators.yaml").read_text()
    for bad_list, message in (
        ("[glibc, tcmalloc, layer-largest, layer-guided, glibc-fixed]", "glibc-fixed are not"),
        ("[tcmalloc, layer-largest, layer-guided, layer-table]", "include the baseline 'glibc'"),
    ):
        bad = tmp_path / "allocators.yaml"
        line = "quick_allocators: [glibc, tcmalloc, layer-largest, layer-guided, layer-table]"
        assert line in text  # the shipped list, replaced below
        bad.write_text(text.replace(line, f"quick_allocators: {bad_list}"))
        with pytest.raises(ConfigError, match=message):
            load_config(type(CFG), bad)
