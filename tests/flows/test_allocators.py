"""The `allocators` flow under Prefect's test API, for real, and the `nightly` option that runs it.

GIVEN a tiny catalog (the test program tests/tasks/allocators/programs/alloc_mix.c as two
      workloads, one of which exits 3 under jemalloc) and a config of two allocators, glibc and
      jemalloc, 5 rounds (the fewest the config accepts) without warm-up, the local runner
WHEN  the `allocators` flow measures them
THEN  the Parquet tables are under `<root>/allocators/`, the `allocators` artifact and the plot
      are published, and one MLflow run holds `<workload>.<allocator>.wall_s`; the failing pair
      is recorded as failed and the rest measured;
AND   `nightly` runs the stage only with its `allocators` option, and a failing stage does not
      fail the night.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from prefect import flow

from tasks.allocators.config import AllocatorsParams, load_allocators_config
from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel, TrainResult
from tasks.nightly.markdown import markdown_text
from tasks.nightly.params import NightlyParams
from tasks.replay.replays import TraceSummary
from tasks.whatif.night import WhatifSummary
from tests.conftest import in_ci, need_tool
from tests.tasks.allocators.programs_build import (
    GENERATOR,
    alloc_mix_workloads,
    build_alloc_mix,
    generator_for,
)
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

TWO = ["glibc", "jemalloc"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def alloc_mix(tmp_path_factory) -> Path:
    need_tool("gcc", "gcc")
    jemalloc = load_allocators_config().get("jemalloc").library
    if not os.path.exists(jemalloc):
        msg = f"{jemalloc} is missing on this host (scripts/setup.sh installs libjemalloc2)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return build_alloc_mix(tmp_path_factory.mktemp("alloc_mix"))


@pytest.fixture
def tiny(alloc_mix, tmp_path, monkeypatch) -> dict:
    """AllocatorsParams' fields for the tiny catalog and config, the local runner, a fresh root."""
    from tasks.replay.inputs import GENERATORS

    # The flow's tasks run in this process: the catalog finds the generator registered here.
    monkeypatch.setitem(GENERATORS, GENERATOR, generator_for(alloc_mix))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(alloc_mix_workloads(2000, fail_under="jemalloc")))
    cfg = load_allocators_config()
    config = tmp_path / "allocators.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "allocators": [cfg.get(n).model_dump() for n in TWO],
                "baseline": "glibc",
                "repetitions": 5,
                "warmup": 0,
                "inputs": None,
            }
        )
    )
    return {
        "catalog": str(catalog),
        "config": str(config),
        "runner": "local",
        "root": str(tmp_path / "data"),
    }


def test_allocators_flow_publishes_table_artifact_plot_and_mlflow_run(prefect_harness, tiny):
    from mlflow import MlflowClient
    from prefect.artifacts import Artifact

    from flows.allocators import allocators
    from tasks.registry.tracking import resolve_target, tracking_for

    out = allocators(AllocatorsParams(**tiny))

    root = Path(tiny["root"])
    # the Parquet summary: one row per workload x allocator, the failing pair recorded as such
    (summary_file,) = (root / "allocators" / "summary").glob("night=*/part-0.parquet")
    assert str(summary_file) == out.summary_path
    summary = pq.read_table(summary_file).to_pandas().set_index(["case", "allocator"])
    assert summary["status"].to_dict() == {
        ("alloc_mix", "glibc"): "ok",
        ("alloc_mix", "jemalloc"): "ok",
        ("alloc_mix_failing", "glibc"): "ok",
        ("alloc_mix_failing", "jemalloc"): "failed",
    }
    assert (summary.loc[("alloc_mix", "glibc"), "wall_s_median"]) > 0
    samples = pq.read_table(out.samples_path).to_pandas()
    assert len(samples) == 2 * 2 * 5  # workloads x allocators x rounds, all measured
    assert [r.case for r in out.recommendations] == ["alloc_mix", "alloc_mix_failing"]
    assert out.recommendations[1].allocator == "glibc"  # the only one that ran cleanly
    assert any(f.startswith("alloc_mix_failing under jemalloc") for f in out.failed)
    # the plot, one point per allocator
    with open(f"{out.report_dir}/allocators.png", "rb") as f:
        assert f.read(8) == PNG
    # the markdown artifact
    art = Artifact.get("allocators")
    assert art is not None and art.data == out.markdown
    assert "alloc_mix_failing" in art.data and "jemalloc" in art.data
    # one MLflow run in the stage's own experiment, under the root's embedded store
    client = MlflowClient(resolve_target(tracking_for(Root.from_url(tiny["root"]))).tracking_uri)
    exp = client.get_experiment_by_name("heapcast-allocators")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_id == out.mlflow_run_id
    for name in ("alloc_mix.glibc", "alloc_mix.jemalloc", "alloc_mix_failing.glibc"):
        assert run.data.metrics[f"{name}.wall_s"] > 0
        assert run.data.metrics[f"{name}.peak_rss_mb"] > 0
    assert run.data.tags["status.alloc_mix_failing.jemalloc"] == "failed"


# ------------------------------------------------------------------------------------ nightly


@flow(name="trace")
def _no_trace(params, root: Root, catalog) -> TraceSummary:
    """Stands in for a stage the composition test does not need (they have tests of their own):
    no replay."""
    return TraceSummary(runner="local", runner_reason="", tracer="", root=root.url, runs=[])


@flow(name="dataset")
def _no_dataset(params, root: Root) -> list:
    """Stands in for a stage the composition test does not need: nothing converted."""
    return []


@flow(name="train")
def _no_train(params, root: Root, tracking) -> TrainResult:
    """Stands in for a stage the composition test does not need: a model evaluated on no run."""
    return TrainResult(make_outcome(tiny_model(), 0.8), RegisteredModel("m", "1", "r", (), (), ()))


@flow(name="whatif")
def _no_whatif(params, root: Root, tracking, model: RegisteredModel) -> WhatifSummary:
    """Stands in for a stage the composition test does not need: nothing replayed."""
    return WhatifSummary(
        model_name=model.name,
        model_version=model.version,
        model_run_id="r",
        idle_budget=params.idle_budget,
    )


@pytest.fixture
def night_without_other_stages(monkeypatch):
    """`nightly` with trace, dataset, train and whatif as empty flows; the allocators stage is
    real."""
    import flows.nightly

    monkeypatch.setattr(flows.nightly, "trace_with", _no_trace)
    monkeypatch.setattr(flows.nightly, "dataset_with", _no_dataset)
    monkeypatch.setattr(flows.nightly, "train_with", _no_train)
    monkeypatch.setattr(flows.nightly, "whatif_with", _no_whatif)
    return flows.nightly.nightly


def test_nightly_runs_the_allocators_stage_only_with_its_option(
    prefect_harness, tiny, night_without_other_stages
):
    nightly = night_without_other_stages
    data = tiny.pop("root")
    stage = {**tiny, "workloads": ["alloc_mix"]}

    off = nightly(NightlyParams(root=data, allocators_params=stage))
    assert "allocators" not in [s.name for s in off.stages]
    assert not (Path(data) / "allocators").exists()

    on = nightly(NightlyParams(root=data, allocators=True, allocators_params=stage))
    # the stage runs last (other stages may follow training; they are not this test's concern)
    assert [s.name for s in on.stages][:3] == ["trace", "dataset", "train"]
    assert (on.stages[-1].name, on.stages[-1].ok) == ("allocators", True)
    assert [s.name for s in on.stages].count("allocators") == 1
    assert on.stages[-1].detail.startswith("recommended: alloc_mix: ")
    # the night's root, not the stage's own default
    assert len(list((Path(data) / "allocators" / "summary").glob("night=*/part-0.parquet"))) == 1
    assert "| allocators | ok |" in markdown_text(on)


def test_a_failing_allocators_stage_does_not_fail_the_night(
    prefect_harness, tiny, night_without_other_stages
):
    stage = {**tiny, "workloads": ["no-such-workload"]}
    summary = night_without_other_stages(
        NightlyParams(root=tiny["root"], allocators=True, allocators_params=stage)
    )
    measured = summary.stages[-1]
    assert (measured.name, measured.ok) == ("allocators", False)
    assert "no-such-workload" in measured.error
    assert summary.trained  # the night itself completed


def test_nightly_shares_root_and_quick_with_the_allocators_stage():
    assert NightlyParams().stages().allocators is None
    stages = NightlyParams(
        root="/data/night", quick=True, allocators=True, allocators_params={"runner": "local"}
    ).stages()
    assert stages.allocators == AllocatorsParams(root="/data/night", quick=True, runner="local")
