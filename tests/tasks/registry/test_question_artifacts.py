"""Registration logs the allocator's questions and the layer's table with the version
(tasks/registry/question_artifacts.py)."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.scores import OVERALL, QuestionScores
from tasks.learning.table.distill import ClassTable, TableAgreement
from tasks.learning.table.layer_file import MAGIC
from tasks.registry.register import register_outcome
from tasks.registry.tracking import TrackingConfig
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def _questions() -> tuple[QuestionScores, ...]:
    out = []
    for table in ("unseen_runs", "unseen_programs"):
        for q in ("reuse", "lifetime_calls"):
            for i, p in enumerate(("majority", "class_online", "site_online", "table")):
                if p == "table" and q != "reuse":
                    continue  # the table answers the reuse question only
                for sl in ("sqlite3", OVERALL):
                    out.append(
                        QuestionScores(q, p, sl, table, 100, 0.5 + i / 10, 1.0 - i / 10, 100)
                    )
    return tuple(out)


def test_question_scores_and_the_layer_table_are_logged_with_the_version(tmp_path):
    from mlflow import MlflowClient

    counts = np.zeros((32, REUSE_CLASSES))
    counts[20, 0] = 9.0  # class 20: reused within 1 call in training
    counts[20, 4] = 1.0
    outcome = dataclasses.replace(
        make_outcome(tiny_model(), 0.8),
        question_scores=_questions(),
        class_table=ClassTable(counts, np.full(REUSE_CLASSES, 0.2)),
        table_agreement=(TableAgreement("unseen_programs", 100, 0.75, 0.9, 0.8),),
    )
    result = register_outcome(outcome, TrackingConfig(root=str(tmp_path)))
    client, run_id = MlflowClient(), result.run_id

    # one MLflow table per evaluation table, one row per question, workload and predictor
    for table in ("unseen_runs", "unseen_programs"):
        doc = json.loads(
            Path(client.download_artifacts(run_id, f"questions/{table}.json")).read_text()
        )
        rows = [dict(zip(doc["columns"], r)) for r in doc["data"]]
        assert len(rows) == 14
        assert {(r["question"], r["predictor"]) for r in rows if r["workload"] == OVERALL} >= {
            ("reuse", "table"), ("lifetime_calls", "site_online")
        }  # fmt: skip
    # a few headline numbers, not hundreds
    metrics = client.get_run(run_id).data.metrics
    assert metrics["reuse.unseen_programs.top1/all.table"] == 0.8
    assert metrics["reuse.unseen_programs.top1/all.class_online"] == 0.6
    assert metrics["table.unseen_programs.coverage"] == 0.75
    assert not any(k.startswith("lifetime_calls.") for k in metrics)
    # the layer's table, written for this very version, named for what it is made from
    raw = Path(client.download_artifacts(run_id, "table/heapcast.hcltab")).read_bytes()
    magic, fmt, model, tokens, size, _ = struct.unpack_from("<8sIIIIQ", raw)
    # format 3: the class scores, then one word per known (call site, class): none here, the
    # test's runs have no callers
    assert (magic, fmt, tokens, size, len(raw)) == (MAGIC, 3, 64, 4096, 32 + 4096)
    assert model == int(result.model_version)
    # class 20's score: P(reuse within 4096 calls), reuse classes 0..3 each smoothed by 0.1
    assert raw[32 + (32 + 20) * 64 + 20] == round(255 * (9.0 + 4 * 0.1) / (10 + 5 * 0.1))
    tag = client.get_run(run_id).data.tags["heapcast.table"]
    assert tag.startswith("table/heapcast.hcltab") and "training runs' statistics" in tag
    agreement = client.download_artifacts(run_id, "questions/table_agreement.json")
    assert json.loads(Path(agreement).read_text())["rows"][0]["coverage"] == 0.75


def test_the_questions_network_is_logged_with_the_version_and_loads_back(tmp_path):
    from mlflow import MlflowClient

    from tasks.learning.questions.network import (
        N_FEATURES,
        QuestionNetwork,
        build_network,
        load_question_network,
    )

    net = QuestionNetwork(build_network(8), train_calls=1234, epochs=1, seconds=0.5)
    outcome = dataclasses.replace(
        make_outcome(tiny_model(), 0.8),
        question_scores=_questions(),
        class_table=ClassTable(np.ones((32, REUSE_CLASSES)), np.full(REUSE_CLASSES, 0.2)),
        question_network=net,
    )
    result = register_outcome(outcome, TrackingConfig(root=str(tmp_path)))
    client, run_id = MlflowClient(), result.run_id
    metrics = client.get_run(run_id).data.metrics
    assert metrics["questions.network.train_calls"] == 1234
    # the network itself, and the table named as distilled from it
    path = client.download_artifacts(run_id, "questions/network.keras")
    x = {
        "tokens": np.array([[1, 33, 2]], np.int32),
        "sites": np.zeros((1, 3), np.int32),
        "features": np.random.default_rng(0).random((1, 3, N_FEATURES)).astype(np.float32),
        "frames": np.random.default_rng(1).integers(0, 50, (1, 3, 8, 5)).astype(np.int32),
    }
    want, got = net.model.predict(x, verbose=0), load_question_network(path).predict(x, verbose=0)
    for q in want:
        np.testing.assert_allclose(got[q], want[q], rtol=1e-5)
    assert (
        "distilled from the questions' network"
        in client.get_run(run_id).data.tags["heapcast.table"]
    )
    # AND fetched for answering only with the inputs it was trained on: this code's, tagged
    import pytest

    from tasks.learning.questions.network import INPUTS_VERSION
    from tasks.registry.question_artifacts import TAG_NETWORK_INPUTS, fetch_question_network

    assert client.get_run(run_id).data.tags[TAG_NETWORK_INPUTS] == str(INPUTS_VERSION)
    fetched = fetch_question_network(run_id, tmp_path / "fetched")
    for q, v in fetched.predict(x, verbose=0).items():
        np.testing.assert_allclose(v, want[q], rtol=1e-5)
    # a network logged before the tag (inputs version 1: the reuse counters that never learnt
    # "later"), or on version 2's inputs (no stacks), is refused in one line naming the run and
    # what to do
    client.set_tag(run_id, TAG_NETWORK_INPUTS, "2")
    with pytest.raises(ValueError, match=rf"run {run_id}: .* inputs v2, this code computes v3"):
        fetch_question_network(run_id, tmp_path / "v2")
    client.delete_tag(run_id, TAG_NETWORK_INPUTS)
    with pytest.raises(ValueError, match=rf"run {run_id}: .* inputs v1, this code computes v3"):
        fetch_question_network(run_id, tmp_path / "old")


def test_the_layers_table_is_fetched_by_version_or_alias_for_the_allocators_stage(tmp_path):
    """What the allocators stage's table-guided layer reads: the registered version's file,
    by number or by the alias; nothing on a store with no version; a version that logged no
    table named as such."""
    import pytest

    from tasks.registry.question_artifacts import fetch_table

    tracking = TrackingConfig(root=str(tmp_path / "data"))
    assert fetch_table(tracking, "champion", tmp_path / "t") is None  # nothing registered yet
    counts = np.ones((32, REUSE_CLASSES))
    with_table = dataclasses.replace(
        make_outcome(tiny_model(), 0.8),
        question_scores=_questions(),
        class_table=ClassTable(counts, np.full(REUSE_CLASSES, 0.2)),
    )
    first = register_outcome(with_table, tracking)
    by_alias = fetch_table(tracking, "champion", tmp_path / "t")  # the first version takes it
    by_number = fetch_table(tracking, first.model_version, tmp_path / "n")
    assert by_alias is not None and by_number is not None
    assert by_alias.version == by_number.version == int(first.model_version)
    assert (
        by_alias.run_id == first.run_id and by_alias.path.name == f"v{first.model_version}.hcltab"
    )
    assert by_alias.path.read_bytes()[:8] == MAGIC
    assert by_alias.path.read_bytes() == by_number.path.read_bytes()
    assert fetch_table(tracking, "999", tmp_path / "t") is None  # no such version
    # a version whose run logged no table (registered before tables were logged)
    bare = register_outcome(make_outcome(tiny_model(), 0.7), tracking)
    assert bare.model_version != first.model_version
    with pytest.raises(FileNotFoundError, match=f"v{bare.model_version} .* has no table/heapcast"):
        fetch_table(tracking, bare.model_version, tmp_path / "t")


def test_the_nights_registered_table_is_format_4_with_the_allocation_contexts(tmp_path):
    """The night's path: the questions' evaluation trains the network on runs with stacks,
    distills the table (its contexts too), and registration logs that table: a format 4 file
    whose context entries are the distilled keys, each with enough training frees."""
    from mlflow import MlflowClient

    from tasks.dataset.frame_tokens import RunStacks
    from tasks.dataset.token_runs import TokenRun
    from tasks.learning.questions.evaluation import question_evaluation
    from tasks.learning.split import Split
    from tasks.learning.table.distill import CONTEXT_DEPTH, MIN_CONTEXT_FREES
    from tasks.learning.table.layer_file import HEADER, layer_entries
    from tasks.learning.train_config import QuestionsConfig
    from tests.tasks.learning.questions.test_network import FRAMES, _one_process

    def run(name: str) -> TokenRun:
        return TokenRun("sqlite3", name, np.zeros(0, np.uint8), np.zeros(1, np.int64))

    # GIVEN two training runs and an unseen one, every call but a free with a stack
    events = {("sqlite3", f"r{i}"): _one_process(20 + i, 600) for i in range(3)}
    frames = {k: RunStacks.of(FRAMES, 8) for k in events}
    split = Split([run("r0"), run("r1")], [], [run("r2")], [])
    # WHEN the night's evaluation runs and its outcome is registered
    q = question_evaluation(
        split, events, QuestionsConfig(units=8, epochs=1, batch_size=4), frames=frames
    )
    ctx = q.table.context_counts
    assert ctx is not None and len(ctx.context) > 0 and ctx.depth == CONTEXT_DEPTH
    assert (ctx.frees() >= MIN_CONTEXT_FREES - 1e-6).all()
    # (some of the unseen run's frees are answered by their allocations' contexts)
    assert q.agreement[0].context_coverage > 0
    outcome = dataclasses.replace(
        make_outcome(tiny_model(), 0.8),
        question_scores=_questions(),
        class_table=q.table,
        table_agreement=q.agreement,
        question_network=q.network,
    )
    result = register_outcome(outcome, TrackingConfig(root=str(tmp_path)))
    client, run_id = MlflowClient(), result.run_id
    raw = Path(client.download_artifacts(run_id, "table/heapcast.hcltab")).read_bytes()
    # THEN the logged file is format 4 and holds every distilled key with its keep score
    fmt = HEADER.unpack_from(raw)[1]
    got = layer_entries(fmt, raw[HEADER.size :])
    assert fmt == 4 and got.depth == CONTEXT_DEPTH
    assert got.contexts["context"].tolist() == ctx.context.tolist()
    assert (got.contexts["word"] >> 8).tolist() == ctx.cls.tolist()
    assert (got.contexts["word"] & 0xFF).tolist() == ctx.keep_scores().tolist()
    run_data = client.get_run(run_id).data
    assert run_data.metrics["table.context_entries"] == len(ctx.context)
    assert run_data.metrics["table.file_bytes"] == len(raw)
    assert f"({len(ctx.context)} keys, format 4)" in run_data.tags["heapcast.table"]
