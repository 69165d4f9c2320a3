"""What `publish` writes, from hand-made measurements: Parquet, markdown, plots, one MLflow run.

GIVEN two cases measured under the four allocators (one of them with jemalloc failing, one with
mimalloc missing) and the events of one of them in the dataset
WHEN the outcome is written to a data root with an embedded MLflow store
THEN the tables, the markdown table, the plots and the run are all there and agree.
"""

from __future__ import annotations

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from tasks.allocators.config import load_allocators_config
from tasks.allocators.report import mlflow_metrics, publish, write_outcome
from tasks.core.storage import Root
from tasks.format.trace_reader import Op
from tasks.registry.tracking import TrackingConfig
from tests.tasks.allocators.tables import events_table, make_measurements, runs_of

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

BASE = [1.00, 1.02, 0.98, 1.01, 0.99]
FAST = [0.80, 0.81, 0.79, 0.82, 0.80]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("root")
    root = Root.from_url(str(tmp))
    path = root.events_run("sqlite3", "small")
    root.fs.makedirs(path, exist_ok=True)
    m_op = int(Op.MALLOC)
    pq.write_table(
        events_table([(1, 0, m_op, 32, 1000), (1, 0, m_op, 200 * 1024, 3000)]),
        f"{path}/part-0.parquet",
    )
    m = make_measurements(
        {},
        cases={
            "sqlite3": {
                "glibc": runs_of(BASE, 100.0),
                "jemalloc": runs_of(FAST, 104.0),
                "tcmalloc": runs_of([0.9] * 5, 150.0),
            },
            "git": {
                "glibc": runs_of(BASE, 50.0),
                "jemalloc": runs_of(FAST, 50.0),
                "tcmalloc": runs_of([1.1] * 5, 50.0),
            },
        },
        unavailable={"mimalloc": "allocator 'mimalloc': install libmimalloc2.0"},
    )
    # jemalloc fails on git (a bad exit code): git's answer must come from the others
    for s in m.samples:
        if s.case == "git" and s.allocator == "jemalloc" and s.rep == 2:
            s.ok, s.exit_code, s.error = False, 1, "exit code 1, expected 0"
    cfg = load_allocators_config()
    tracking = TrackingConfig(root=str(tmp))
    out = write_outcome(root, m, cfg, tracking=tracking)
    return root, m, out, tracking


def test_summary_and_samples_tables(written):
    root, m, out, _ = written
    summary = pq.read_table(out.summary_path).to_pandas()
    assert len(summary) == 2 * 4  # two cases x four allocators (mimalloc: unavailable)
    row = summary.set_index(["case", "allocator"])
    assert row.loc[("sqlite3", "jemalloc"), "recommended"]
    assert row.loc[("sqlite3", "jemalloc"), "recommendation"] == "jemalloc"
    assert row.loc[("sqlite3", "glibc"), "wall_s_median"] == pytest.approx(1.0)
    assert row.loc[("sqlite3", "tcmalloc"), "memory_vs_baseline"] == pytest.approx(1.5)
    assert row.loc[("sqlite3", "mimalloc"), "status"] == "unavailable"
    assert row.loc[("git", "jemalloc"), "status"] == "failed"
    assert row.loc[("git", "glibc"), "recommendation"] == "glibc"
    # what the nightly summary's advice reads: the objective, each candidate's line to paste
    # (the measured definition's `Allocator.line`, empty for glibc) and the MLflow experiment
    assert row.loc[("sqlite3", "jemalloc"), "objective"] == "time"
    jemalloc = next(a for a in m.allocators if a.name == "jemalloc")
    assert row.loc[("sqlite3", "jemalloc"), "line"] == jemalloc.line() != ""
    assert row.loc[("sqlite3", "glibc"), "line"] == ""
    assert set(summary["experiment"]) == {load_allocators_config().experiment}
    # heap features where the dataset has the workload, null where not
    assert row.loc[("sqlite3", "glibc"), "heap_large_share"] == pytest.approx(0.5)
    assert row.loc[("sqlite3", "glibc"), "heap_threads"] == 1
    assert summary.loc[summary["case"] == "git", "heap_events"].isna().all()
    samples = pq.read_table(out.samples_path).to_pandas()
    assert len(samples) == len(m.samples) and set(samples["night"]) == {m.night}
    # every night reads back as one dataset, partitioned by night
    every = pads.dataset(root.join("allocators", "summary"), partitioning="hive").to_table()
    assert set(every.column("night").to_pylist()) == {m.night}


def test_markdown_table_has_one_row_per_case_with_heap_and_answer(written):
    _, _, out, _ = written
    md = out.markdown
    assert "| workload | sizes % ≤64B/≤1K/<128K/≥128K | threads | median life | realloc |" in md
    sqlite_row = next(line for line in md.splitlines() if line.startswith("| sqlite3 |"))
    assert "| 50/0/0/50 |" in sqlite_row and "| 2.0 µs |" in sqlite_row
    assert "0.80× time · 1.04× mem ★" in sqlite_row
    assert "**jemalloc**: 20.0% faster than glibc" in sqlite_row and "beyond noise" in sqlite_row
    git_row = next(line for line in md.splitlines() if line.startswith("| git |"))
    assert "not in the events dataset" in git_row and "**failed**" in git_row
    assert "- git under jemalloc: failed: 1 of 5 runs failed: exit code 1" in md
    assert "- sqlite3 under mimalloc: unavailable: allocator 'mimalloc'" in md


def test_plots_and_report_files(written):
    root, _, out, _ = written
    names = sorted(p.rsplit("/", 1)[-1] for p in root.fs.find(out.report_dir))
    assert names == [
        "allocators.md",
        "allocators.png",
        "git.png",
        "measurements.json",
        "sqlite3.png",
    ]
    with root.fs.open(f"{out.report_dir}/allocators.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_one_mlflow_run_in_its_own_experiment(written):
    _, m, out, tracking = written
    from mlflow import MlflowClient

    from tasks.registry.tracking import resolve_target

    client = MlflowClient(resolve_target(tracking).tracking_uri)
    exp = client.get_experiment_by_name("heapcast-allocators")
    assert exp is not None
    run = client.get_run(out.mlflow_run_id)
    assert run.info.experiment_id == exp.experiment_id
    assert run.info.run_name == f"allocators-{m.night}"
    metrics = run.data.metrics
    assert metrics["sqlite3.glibc.wall_s"] == pytest.approx(1.0)
    assert metrics["sqlite3.jemalloc.peak_rss_mb"] == pytest.approx(104.0)
    assert metrics["sqlite3.margin"] == pytest.approx(0.2)
    assert "sqlite3.mimalloc.wall_s" not in metrics
    assert run.data.tags["recommended.sqlite3"] == "jemalloc"
    assert run.data.tags["status.sqlite3.mimalloc"] == "unavailable"
    arts = {a.path for a in client.list_artifacts(out.mlflow_run_id)}
    assert {"allocators.md", "allocators.png", "measurements.json", "plots"} <= arts
    assert set(mlflow_metrics(out.pairs, out.recommendations)) == set(metrics)


def test_publish_is_a_task_that_runs_outside_a_flow_too(tmp_path):
    m = make_measurements({"glibc": runs_of(BASE, 10.0), "jemalloc": runs_of(FAST, 10.0)})
    out = publish.fn(m, Root.from_url(str(tmp_path)), load_allocators_config(), to_mlflow=False)
    assert out.mlflow_run_id is None and out.recommendations[0].allocator == "jemalloc"
    assert (tmp_path / "allocators" / "reports" / f"night={m.night}" / "allocators.md").is_file()


def test_the_report_says_where_the_layer_stepped_aside():
    from tasks.allocators.report import stepped_aside

    # GIVEN two layer candidates on one workload, 3 rounds: largest never had its proof (it
    # passed on frees it would have kept), pools had it in every run but the first
    m = make_measurements(
        {"glibc": [(1.0, 10.0)] * 3, "layer-largest": [(1.0, 10.0)] * 3,
         "layer-pools": [(1.0, 10.0)] * 3},
        case="sqlite3",
    )  # fmt: skip
    seen = {"layer-pools": 0}
    for s in m.samples:
        if s.allocator.startswith("layer-"):
            first = s.allocator == "layer-pools" and seen["layer-pools"] == 0
            seen["layer-pools"] += s.allocator == "layer-pools"
            proven = 0 if s.allocator == "layer-largest" or first else 1
            s.layer_processes, s.layer_proven, s.layer_unproven = 1, proven, 3
    # THEN a line per candidate that stepped aside, with its runs and processes; glibc has none
    assert stepped_aside(m) == [
        "sqlite3 under layer-largest: in 3 of 3 runs (3 of 3 processes kept nothing)",
        "sqlite3 under layer-pools: in 1 of 3 runs (1 of 1 processes kept nothing)",
    ]
