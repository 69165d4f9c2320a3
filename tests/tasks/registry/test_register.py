"""Registration against a real SQLite MLflow store in a temporary folder.

GIVEN a tiny real Keras model and hand-made evaluations (model top-1 0.80, then 0.85, then 0.70)
WHEN each is registered in turn
THEN every run carries the whole config, dataset, code and library versions, stable metric names
for the model and every baseline per workload, per-epoch curves, the plots and tables, a
registry version, and the alias `champion` moves only on improvement.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tasks.core.config import PROJECT_DIR, ConfigError, load_config
from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel
from tasks.learning.scores import MODEL, OVERALL
from tasks.registry.register import (
    flatten_params,
    register,
    register_outcome,
)
from tasks.registry.tracking import TrackingConfig, configure, load_tracking_config, resolve_target
from tasks.report.night_reports import training_report
from tests.tasks.registry.outcome_factory import (
    CONTEXT,
    make_outcome,
    tiny_model,
)

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"


# ----------------------------------------------------------------------------- pure units


def test_flatten_params_dots_nested_config():
    p = flatten_params({"model": {"units": [8, 4], "kind": "gru"}, "x": None, "runs": {}}, "config")
    assert p == {
        "config.model.units": "[8, 4]",
        "config.model.kind": "gru",
        "config.x": "null",
        "config.runs": "{}",
    }


def test_tracking_config_resolves_embedded_server_and_s3(tmp_path, monkeypatch):
    local = resolve_target(TrackingConfig(root=str(tmp_path / "root")))
    assert local.tracking_uri == f"sqlite:///{tmp_path}/root/mlflow/mlflow.db"
    assert local.registry_uri == local.tracking_uri
    assert local.artifact_location == (tmp_path / "root/mlflow/artifacts").as_uri()

    server = resolve_target(TrackingConfig(tracking_uri="http://127.0.0.1:5000/"))
    assert (server.tracking_uri, server.artifact_location, server.is_server) == (
        "http://127.0.0.1:5000",
        None,
        True,
    )

    monkeypatch.setattr("tasks.registry.tracking.PROJECT_DIR", tmp_path / "proj")
    s3 = resolve_target(TrackingConfig(root="s3://bucket/prefix"))
    assert s3.tracking_uri == f"sqlite:///{tmp_path}/proj/data/mlflow-s3/bucket/prefix/mlflow.db"
    assert s3.artifact_location == "s3://bucket/prefix/mlflow/artifacts"


def test_a_config_without_a_store_is_an_error_not_a_default_root():
    # neither a server nor a data root: no store is picked behind the caller's back
    with pytest.raises(ValueError, match="neither tracking_uri nor root"):
        resolve_target(TrackingConfig())


def test_tracking_yaml_loads_and_typos_fail(tmp_path):
    cfg = load_tracking_config()
    assert (cfg.tracking_uri, cfg.experiment, cfg.model_name) == (None, "heapcast", NAME)
    bad = tmp_path / "t.yaml"
    bad.write_text("tracking_url: http://x\n")
    with pytest.raises(ConfigError, match="tracking_url"):
        load_config(TrackingConfig, bad)
    bad.write_text("tracking_uri: localhost:5000\n")
    with pytest.raises(ConfigError, match="tracking_uri"):
        load_config(TrackingConfig, bad)


def test_register_is_a_prefect_task_with_retries():
    assert register.retries == 2
    assert register.fn.__name__ == "register"


# ----------------------------------------------------------------------------- a real store


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def store(tmp_path_factory, model):
    """Three registrations in one SQLite store: 0.80 (first), 0.85 (better), 0.70 (worse)."""
    root = tmp_path_factory.mktemp("root")
    tracking = TrackingConfig(root=str(root))
    outcomes = [make_outcome(model, top1, seed=i) for i, top1 in enumerate((0.80, 0.85, 0.70))]
    # the first one's report could not be made: the train flow says why instead of a file
    why = "ReportInputError: sqlite3/r1: no such run under the data root"
    results = [
        register_outcome(o, tracking, report_error=why if i == 0 else None)
        for i, o in enumerate(outcomes)
    ]
    from mlflow import MlflowClient

    return {
        "tracking": tracking,
        "outcomes": outcomes,
        "results": results,
        "root": root,
        "client": MlflowClient(),
    }


def test_store_lives_inside_the_data_root(store):
    assert (store["root"] / "mlflow" / "mlflow.db").is_file()
    run_dir = store["root"] / "mlflow" / "artifacts" / store["results"][0].run_id
    assert (run_dir / "artifacts" / "plots" / "confusion_matrix.png").is_file()


def test_params_hold_config_dataset_code_and_libraries(store):
    run = store["client"].get_run(store["results"][0].run_id)
    p = run.data.params
    assert p["config.model.kind"] == "gru"
    assert p["config.model.units"] == "[8]"
    assert p["config.context"] == str(CONTEXT)
    assert p["config.data.runs.sqlite3.train"] == '["r1"]'
    assert p["dataset.root"] == "/tmp/heapcast-test-root"
    assert p["dataset.content_hash"] == store["outcomes"][0].dataset.content_hash
    assert p["dataset.workloads"] == "redis,sqlite3"
    assert p["dataset.train_runs"] == "sqlite3/r1,redis/r1"
    assert p["dataset.heldout_runs"] == "git/r1"
    assert p["dataset.validation_runs"] == "sqlite3/r3"
    assert run.data.tags["mlflow.note.content"].startswith("- validation of redis/r1")
    assert int(p["dataset.train_events"]) == store["outcomes"][0].dataset.train_tokens
    # Colleagues commit concurrently: HEAD may have moved since; the commit must exist in the repo.
    commit = p["code.git_commit"]
    assert len(commit) == 40 and run.data.tags["mlflow.source.git.commit"] == commit
    assert (
        subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=PROJECT_DIR
        ).returncode
        == 0
    )
    assert p["code.git_dirty"] in ("true", "false")
    import keras
    import mlflow
    import tensorflow as tf

    assert (p["lib.tensorflow"], p["lib.keras"], p["lib.mlflow"]) == (
        tf.__version__,
        keras.__version__,
        mlflow.__version__,
    )
    assert p["predictor.ngram.order"] == "7"
    # where it trained, as training reported it (tasks/learning/nextcall/backend.py)
    assert (p["train.backend"], p["train.device"], p["train.precision"]) == (
        "jax",
        "gpu: NVIDIA H200",
        "mixed_bfloat16",
    )
    assert p["train.batch_size"] == "1024" and p["train.replicas"] == "1"
    config_json = Path(store["client"].download_artifacts(run.info.run_id, "config.json"))
    assert json.loads(config_json.read_text()) == store["outcomes"][0].config


def test_dataset_logged_as_mlflow_input(store):
    run = store["client"].get_run(store["results"][0].run_id)
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "heapcast-events"
    assert inp.dataset.digest == store["outcomes"][0].dataset.content_hash[:36]
    assert "/tmp/heapcast-test-root" in inp.dataset.source
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"


def test_a_run_carries_the_headline_and_nothing_per_workload(store):
    for res, outcome in zip(store["results"], store["outcomes"]):
        m = store["client"].get_run(res.run_id).data.metrics
        ev = outcome.evaluation
        for table in ("unseen_runs", "heldout_workloads"):
            model, ngram = ev.get(MODEL, OVERALL, table), ev.get("ngram", OVERALL, table)
            assert m[f"headline/{table}.top1.model"] == pytest.approx(model.top1)
            # the factory's best baseline is the n-gram, by top-1 and by log-loss
            assert m[f"headline/{table}.top1.best_baseline"] == pytest.approx(ngram.top1)
            assert m[f"headline/{table}.top1.margin"] == pytest.approx(model.top1 - ngram.top1)
            assert m[f"log_loss/{table}.model"] == pytest.approx(model.log_loss)
            assert m[f"log_loss/{table}.best_baseline"] == pytest.approx(ngram.log_loss)
        assert m["train/predictions_per_second"] == 12345.0
        assert m["train/seconds"] == 3.5
        # the per-workload scores live in tables now (test_artifacts_hold_plots_and_tables)
        sections = {k.rsplit("/", 1)[0] for k in m}
        assert sections == {"headline", "log_loss", "train", "promotion"}, sections
        curves = {f"train/{c}" for c in outcome.history}
        assert res.scores == {
            k: v for k, v in m.items() if not k.startswith("promotion/") and k not in curves
        }
    # The same keys in every run: the compare view lines them up.
    keys = [
        {
            k
            for k in store["client"].get_run(r.run_id).data.metrics
            if not k.startswith("promotion/")
        }
        for r in store["results"]
    ]
    assert keys[0] == keys[1] == keys[2]


def test_curves_are_logged_per_epoch(store):
    hist = store["client"].get_metric_history(store["results"][0].run_id, "train/val_loss")
    assert [(h.step, h.value) for h in sorted(hist, key=lambda h: h.step)] == [
        (0, 2.0),
        (1, 1.6),
        (2, 1.4),
    ]


def test_artifacts_hold_plots_and_tables(store):
    import mlflow

    client, run_id = store["client"], store["results"][0].run_id
    plots = {Path(a.path).name for a in client.list_artifacts(run_id, "plots")}
    assert plots == {
        "confusion_matrix.png",
        "per_class_accuracy.png",
        "learning_curves.png",
        "token_histogram.png",
    }
    for name in plots:
        assert (
            Path(client.download_artifacts(run_id, f"plots/{name}")).read_bytes()[:8]
            == b"\x89PNG\r\n\x1a\n"
        )
    tables = {Path(a.path).name for a in client.list_artifacts(run_id, "evaluation")}
    assert {
        "evaluation.csv",
        "evaluation.json",
        "evaluation.md",
        "per_class_accuracy.csv",
        "confusion.csv",
    } <= tables
    md = Path(client.download_artifacts(run_id, "evaluation/evaluation.md")).read_text()
    assert "### Unseen runs of the trained workloads" in md and "| ngram top-1 |" in md
    rows = json.loads(
        Path(client.download_artifacts(run_id, "evaluation/evaluation.json")).read_text()
    )
    assert len(rows) == len(store["outcomes"][0].evaluation.scores)
    assert (
        rows[0]["table"] == "unseen_runs"
        and rows[0]["slice"] == "all"
        and rows[0]["predictor"] == "model"
    )
    # one table per evaluation table, in log_table's format, listed for the UI's table view
    for table, workload in (("unseen_runs", "sqlite3"), ("heldout_workloads", "git")):
        assert f"{table}.json" in tables
        df = mlflow.load_table(f"evaluation/{table}.json", run_ids=[run_id])
        ev = store["outcomes"][0].evaluation
        assert len(df) == len([s for s in ev.scores if s.table == table])
        row = df[(df["workload"] == workload) & (df["predictor"] == "ngram")].iloc[0]
        assert row["top1"] == pytest.approx(ev.get("ngram", workload, table).top1)
        assert row["margin_top1_vs_best_baseline"] == pytest.approx(
            ev.margin_over_best_baseline(workload, table)
        )
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "evaluation/unseen_runs.json", "type": "table"} in logged
    images = [a.path for a in client.list_artifacts(run_id, "images")]
    assert any(p.startswith("images/plots~confusion_matrix+step+0") for p in images)


def test_model_is_registered_with_signature_and_explicit_requirements(store):
    client = store["client"]
    assert [r.model_version for r in store["results"]] == ["1", "2", "3"]
    mv = client.get_model_version(NAME, "1")
    assert mv.run_id == store["results"][0].run_id
    assert mv.tags["heapcast.eval.content_hash"] == store["outcomes"][0].dataset.content_hash
    assert float(mv.tags["heapcast.eval.top1"]) == pytest.approx(0.80)
    from mlflow.models import get_model_info

    info = get_model_info(f"models:/{NAME}/1")
    assert info.signature.inputs.inputs[0].type == np.dtype("int32")
    assert info.signature.inputs.inputs[0].shape == (-1, CONTEXT)
    assert info.signature.outputs.inputs[0].shape == (-1, CONTEXT, 64)
    assert info.saved_input_example_info is not None
    import mlflow.artifacts

    reqs = Path(
        mlflow.artifacts.download_artifacts(f"models:/{NAME}/1/requirements.txt")
    ).read_text()
    import tensorflow as tf

    assert f"tensorflow=={tf.__version__}" in reqs and "keras==" in reqs and "mlflow==" in reqs


def test_alias_moves_only_on_improvement_and_decision_is_logged(store):
    first, better, worse = store["results"]
    assert (first.promoted, first.decision, first.champion_version) == (True, "first", "1")
    assert (better.promoted, better.decision, better.champion_version) == (True, "promoted", "2")
    assert (worse.promoted, worse.decision, worse.champion_version) == (False, "kept", "2")
    assert (worse.candidate_score, worse.champion_score) == (
        pytest.approx(0.70),
        pytest.approx(0.85),
    )
    client = store["client"]
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
    # The worse model is registered all the same.
    assert client.get_model_version(NAME, "3").run_id == worse.run_id
    run = client.get_run(worse.run_id)
    assert run.data.params["promotion.decision"] == "kept"
    assert run.data.params["promotion.previous_champion_version"] == "2"
    assert run.data.metrics["promotion/candidate.top1"] == pytest.approx(0.70)
    assert run.data.metrics["promotion/champion.top1"] == pytest.approx(0.85)
    assert run.data.metrics["promotion/promoted"] == 0.0
    assert run.data.tags["heapcast.promoted"] == "false"
    promoted_run = client.get_run(better.run_id)
    assert promoted_run.data.metrics["promotion/promoted"] == 1.0
    assert promoted_run.data.params["promotion.decision"] == "promoted"


def test_a_version_says_what_it_is_and_why_it_is_or_is_not_champion(store):
    client = store["client"]
    worse = client.get_model_version(NAME, "3")
    text = worse.description
    assert "Champion decision: **kept**: candidate v3 top1=0.700000; champion v2" in text
    assert "| unseen_runs | 1,000 | 70.0% | 90.0% (ngram) | -20.0 pts |" in text
    assert "does not beat ngram on unseen_runs" in text
    assert "calls of redis, sqlite3 (data c0ffeec0ffee)" in text
    assert worse.tags["heapcast.decision"] == "kept"
    assert worse.tags["heapcast.decision_reason"].startswith("candidate v3 top1=0.700000")
    assert worse.tags["heapcast.best_baseline.unseen_runs"] == "ngram"
    assert worse.tags["heapcast.margin.heldout_workloads"] == "-0.2000"
    assert worse.tags["heapcast.beats_baselines"] == "none"
    # tags a person filters on in the registry's search
    found = client.search_model_versions(f"name = '{NAME}' and tags.`heapcast.decision` = 'kept'")
    assert [str(v.version) for v in found] == ["3"]
    assert "**first**" in client.get_model_version(NAME, "1").description


def test_champion_loads_and_predicts_through_keras_and_pyfunc(store):
    import mlflow.keras
    import mlflow.pyfunc

    configure(store["tracking"])
    x = np.random.default_rng(1).integers(0, 64, size=(3, CONTEXT)).astype(np.int32)
    expected = store["outcomes"][1].model.predict(x, verbose=0)

    keras_model = mlflow.keras.load_model(f"models:/{NAME}@champion")
    k = keras_model.predict(x, verbose=0)
    assert k.shape == (3, CONTEXT, 64)
    np.testing.assert_allclose(k.sum(axis=-1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(k, expected, rtol=1e-5, atol=1e-6)

    pyfunc_model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    p = np.asarray(pyfunc_model.predict(x))
    assert p.shape == (3, CONTEXT, 64)
    np.testing.assert_allclose(p, expected, rtol=1e-5, atol=1e-6)


def test_configuring_one_root_does_not_capture_the_next(tmp_path, monkeypatch):
    # GIVEN no tracking server chosen by the user
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from tasks.registry.tracking import configure, resolve_target, tracking_for

    # WHEN one root is configured (MLflow exports its URI) and then another is resolved
    configure(tracking_for(Root.from_url(str(tmp_path / "a"))))
    second = resolve_target(tracking_for(Root.from_url(str(tmp_path / "b"))))
    # THEN the second root gets its own embedded store
    assert str(tmp_path / "b" / "mlflow" / "mlflow.db") in second.tracking_uri
    assert "MLFLOW_TRACKING_URI" not in os.environ


@pytest.mark.parametrize("loader_module", [None, "tasks.keras_pyfunc"])
def test_a_registered_hybrid_champion_loads_through_pyfunc_in_a_fresh_process(
    tmp_path, loader_module
):
    # GIVEN the hybrid model (custom n-gram layer inside) registered as the first champion;
    # with loader_module set, its MLmodel names the loader as versions registered before the
    # stage packages did (tasks.keras_pyfunc, now a forwarder), and must still load
    import subprocess
    import sys

    from tasks.learning.nextcall.model import NGramTable, build_hybrid
    from tasks.registry.register import register_outcome
    from tasks.registry.tracking import TrackingConfig, configure, resolve_target
    from tests.tasks.learning.nextcall.test_model import _flat, _threads, tiny

    rng = np.random.default_rng(5)
    table = NGramTable.fit(*_flat(_threads(rng, 2, 80, 6)), 3)
    _, hybrid = build_hybrid(
        tiny(model={"units": [8], "ngram_features": True, "ngram_order": 3}), table
    )
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    result = register_outcome(make_outcome(hybrid, 0.9), tracking)
    assert result.promoted
    x = np.asarray(_threads(rng, 2, CONTEXT, 6), np.int32)  # the logged signature's shape
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", hybrid.predict(x, verbose=0))
    mlmodels = list((tmp_path / "root").rglob("MLmodel"))
    assert mlmodels and all(
        "loader_module: tasks.registry.keras_pyfunc" in f.read_text() for f in mlmodels
    )
    if loader_module:
        for f in mlmodels:
            f.write_text(f.read_text().replace("tasks.registry.keras_pyfunc", loader_module))
    configure(tracking)
    uri = resolve_target(tracking).tracking_uri
    # WHEN a fresh Python (nothing of heapcast imported) loads models:/NAME@champion via pyfunc
    code = (
        "import sys, numpy as np, mlflow, mlflow.pyfunc\n"
        f"mlflow.set_tracking_uri({uri!r}); mlflow.set_registry_uri({uri!r})\n"
        f"m = mlflow.pyfunc.load_model('models:/{tracking.model_name}@champion')\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r}); y = np.load({str(tmp_path / 'y.npy')!r})\n"
        "print('same' if np.allclose(np.asarray(m.predict(x)), y, atol=1e-5) else 'differs')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    # THEN it predicts what the model predicted when it was trained
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "same"


# ----------------------------------------------------------------------------- the data's report


def test_run_logs_the_heap_report_of_its_training_data(model, tmp_path):
    import dataclasses

    from mlflow import MlflowClient

    from tests.tasks.report import scenario as sc

    # GIVEN a data root holding the model's first training run (the hand-made report scenario)
    data = tmp_path / "data"
    sc.write_raw(data / "raw" / "hand" / "r1")
    outcome = make_outcome(model, 0.8)
    outcome = dataclasses.replace(
        outcome,
        dataset=dataclasses.replace(
            outcome.dataset,
            root=Root.from_url(str(data)),
            train_runs=(("hand", "r1"), ("redis", "r1")),
        ),
    )
    # WHEN the flow's report step made its page and it is registered with it
    page = training_report(Root.from_url(str(data)), outcome.dataset, tmp_path / "page")
    result = register.fn(outcome, TrackingConfig(root=str(tmp_path / "root")), page)
    # THEN registration hands on a typed reference to the version and its evaluation runs
    assert result == RegisteredModel(
        name=NAME,
        version="1",
        run_id=result.run_id,
        eval_runs=outcome.dataset.eval_runs,
        unseen_program_runs=(),
        heldout_runs=outcome.dataset.heldout_runs,
        decision="first",
        reason=result.reason,
        headline=result.headline,
    )
    # with the headline figures its run was given (tasks/registry/headline.py)
    run_metrics = MlflowClient().get_run(result.run_id).data.metrics
    assert "headline/unseen_runs.top1.model" in dict(result.headline)
    assert dict(result.headline) == pytest.approx(
        {k: run_metrics[k] for k in dict(result.headline)}
    )
    assert result.evaluation_runs == (("sqlite3", "r2"), ("redis", "r2"), ("git", "r1"))
    client = MlflowClient()
    # THEN the run holds that run's heap report as report/hand-r1.html, named by its tag
    assert [a.path for a in client.list_artifacts(result.run_id, "report")] == [
        "report/hand-r1.html"
    ]
    page = Path(client.download_artifacts(result.run_id, "report/hand-r1.html")).read_text()
    assert "6.57 KiB (6,724 B)" in page  # the scenario's peak
    assert client.get_run(result.run_id).data.tags["heapcast.report"] == "report/hand-r1.html"


def test_a_report_that_cannot_be_made_does_not_stop_registration(store):
    # the first registration got why its report could not be made: it went on, the tag says why
    run = store["client"].get_run(store["results"][0].run_id)
    assert run.data.tags["heapcast.report"].startswith("not made: ReportInputError: sqlite3/r1")
    assert store["client"].list_artifacts(run.info.run_id, "report") == []
    assert store["results"][0].model_version == "1"
