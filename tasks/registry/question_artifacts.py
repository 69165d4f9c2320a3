"""The allocator's questions (tasks/learning/questions/reuse.py) and the layer's table
(tasks/learning/table/distill.py), logged with a registered version.

Per evaluation table, every predictor's scores on every question as one MLflow table
(`questions/<table>.json`: one row per question, workload and predictor), rather than hundreds
of metrics; three headline metrics; and the layer's table file (`table/heapcast.hcltab`) written
for this version, with its coverage and agreement (`questions/table_agreement.json`), and the
questions' network itself (`questions/network.keras`, tasks/learning/questions/network.py
load_question_network reads it). Beside the layer's table, the placement layer's lifetime table
(`table/heapcast.hclife`, native/TABLE.md), distilled here from the network over the training
runs' allocations by the training (TrainOutcome.lifetime_table).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict
from pathlib import Path

from tasks.learning.outcome import TrainOutcome
from tasks.learning.questions.hedge import HEDGED
from tasks.learning.scores import OVERALL
from tasks.learning.table.distill import MIN_CONTEXT_FREES
from tasks.learning.table.layer_file import ModelTable, model_version_number, write_layer_table
from tasks.registry.table_files import (
    lifetime_file,
    table_file,
    write_atomically,
    write_lifetime_table,
)
from tasks.registry.tracking import TrackingConfig, configure, resolve_target

TABLE_ARTIFACT = "table"
NETWORK_ARTIFACT = "questions"
NETWORK_FILE = "network.keras"
TABLE_FILE = "heapcast.hcltab"
TAG_TABLE = "heapcast.table"  # where the layer's table is, and what it is made from
LIFETIME_FILE = "heapcast.hclife"  # the placement's lifetime table, beside the layer's
TAG_LIFETIME = "heapcast.lifetime_table"  # where it is, or why none was made
# the inputs the logged questions' network was trained on (question_network.INPUTS_VERSION);
# a network logged before the tag existed reads version 1
TAG_NETWORK_INPUTS = "heapcast.questions_inputs"
HEADLINE_TABLE = "unseen_programs"  # the table the goals are about


def question_rows(outcome: TrainOutcome) -> dict[str, dict[str, list]]:
    """{evaluation table: its columns (question, workload, predictor, positions,
    positions_without_site, top1, log_loss)}, the form mlflow.log_table takes."""
    out: dict[str, dict[str, list]] = {}
    for s in outcome.question_scores:
        cols = out.setdefault(
            s.table,
            {k: [] for k in ("question", "workload", "predictor", "positions",
                             "positions_without_site", "top1", "log_loss")},
        )  # fmt: skip
        for k, v in (
            ("question", s.question), ("workload", s.slice), ("predictor", s.predictor),
            ("positions", s.positions), ("positions_without_site", s.positions_without_site),
            ("top1", s.top1), ("log_loss", s.log_loss),
        ):  # fmt: skip
            cols[k].append(v)
    return out


def headline_metrics(outcome: TrainOutcome) -> dict[str, float]:
    """A few numbers: on programs never trained on, the reuse question's top-1 of the counter
    the layer runs, of the table and of the network, and the table's coverage of those frees."""
    out: dict[str, float] = {}
    for s in outcome.question_scores:
        if (s.question, s.table, s.slice) == ("reuse", HEADLINE_TABLE, OVERALL) and (
            s.predictor in ("class_online", "table", "network", HEDGED)
        ):
            out[f"reuse.{HEADLINE_TABLE}.top1/{OVERALL}.{s.predictor}"] = float(s.top1)
    for a in outcome.table_agreement:
        if a.table == HEADLINE_TABLE:
            out[f"table.{HEADLINE_TABLE}.coverage"] = float(a.coverage)
            # the share the table answers by call site (format 3); NaN: no site keys
            if math.isfinite(a.site_coverage):
                out[f"table.{HEADLINE_TABLE}.site_coverage"] = float(a.site_coverage)
            # ... and by the freed block's allocation context (format 4)
            if math.isfinite(a.context_coverage):
                out[f"table.{HEADLINE_TABLE}.context_coverage"] = float(a.context_coverage)
    return out


def log_lifetime_table(outcome: TrainOutcome, version: str) -> None:
    """Inside the version's active MLflow run: the placement's lifetime table for `version`
    (table/heapcast.hclife, distilled by the training: TrainOutcome.lifetime_table), or the tag
    saying why none was made."""
    import mlflow  # deferred: start-up time

    if outcome.question_network is None:
        mlflow.set_tag(TAG_LIFETIME, "not made: training built no questions' network")
        return
    if outcome.lifetime_table is None:
        mlflow.set_tag(TAG_LIFETIME, "not made: training distilled no lifetime table")
        return
    keys, scores = outcome.lifetime_table
    if len(keys) == 0:
        mlflow.set_tag(TAG_LIFETIME, "not made: no training allocation had a call site")
        return
    with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
        path = write_lifetime_table(
            Path(tmp) / LIFETIME_FILE, keys, scores, model_version_number(version)
        )
        mlflow.log_artifact(str(path), TABLE_ARTIFACT)
    mlflow.set_tag(
        TAG_LIFETIME,
        f"{TABLE_ARTIFACT}/{LIFETIME_FILE}: the placement's lifetime table, {len(keys)} (call "
        "site, size class) keys, distilled from the questions' network (its mean P(lifetime "
        f"beyond 65536 calls or never freed) at the training allocations), for model version "
        f"{version}",
    )


def log_questions(outcome: TrainOutcome, version: str) -> None:
    """Inside the version's active MLflow run: the question tables, the headline metrics, and
    the layer's table for `version` (when training built one)."""
    import mlflow  # deferred: start-up time

    for table, cols in question_rows(outcome).items():
        mlflow.log_table(data=cols, artifact_file=f"questions/{table}.json")
    headline = headline_metrics(outcome)
    if headline:
        mlflow.log_metrics(headline)
    net = outcome.question_network
    if net is not None:
        mlflow.log_metrics(
            {"questions.network.train_calls": net.train_calls,
             "questions.network.seconds": net.seconds}
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="heapcast-questions-") as tmp:
            path = Path(tmp) / NETWORK_FILE
            net.model.save(path)
            mlflow.log_artifact(str(path), NETWORK_ARTIFACT)
        from tasks.learning.questions.network import INPUTS_VERSION  # deferred: Keras

        mlflow.set_tag(TAG_NETWORK_INPUTS, str(INPUTS_VERSION))
    log_lifetime_table(outcome, version)
    if outcome.class_table is None:
        mlflow.set_tag(TAG_TABLE, "not made: training built no table")
        return
    if outcome.table_agreement:
        mlflow.log_dict(
            {"rows": [asdict(a) for a in outcome.table_agreement]},
            "questions/table_agreement.json",
        )
    with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
        path = write_layer_table(
            Path(tmp) / TABLE_FILE, outcome.class_table, model_version_number(version)
        )
        mlflow.log_artifact(str(path), TABLE_ARTIFACT)
        size = path.stat().st_size
    ctx = outcome.class_table.context_counts
    n_ctx = 0 if ctx is None else len(ctx.context)
    mlflow.log_metrics({"table.context_entries": n_ctx, "table.file_bytes": size})
    keys = (
        f"each allocation context (depth {ctx.depth}) and size class with at least "
        f"{MIN_CONTEXT_FREES} training frees ({n_ctx} keys, format 4), "
        if n_ctx
        else ""
    )
    made_from = (
        f"distilled from the questions' network (its mean answer at the training frees of {keys}"
        "each call site and size class, and of each size class)"
        if net is not None
        else f"from the training runs' statistics (per {keys}call site and size class, and per "
        "size class)"
    )
    mlflow.set_tag(
        TAG_TABLE,
        f"{TABLE_ARTIFACT}/{TABLE_FILE}: the layer's table {made_from}, for model version {version}",
    )


def fetch_table(tracking: TrackingConfig, model: str, dest: Path) -> ModelTable | None:
    """The layer's table of the registered version `model` names (a version number, or an
    alias such as `champion`), downloaded into the folder `dest` as `v<version>.hcltab`; None
    when no such version is registered yet (a fresh store: nothing to read). A version whose
    run logged no table (one registered before tables existed) raises, naming it."""
    return _fetch(tracking, model, dest, TABLE_FILE, table_file, "the layer's table", TAG_TABLE)


def fetch_lifetime_table(tracking: TrackingConfig, model: str, dest: Path) -> ModelTable | None:
    """The placement's lifetime table of the version `model` names, as fetch_table (into
    `dest` as `v<version>.hclife`)."""
    return _fetch(
        tracking, model, dest, LIFETIME_FILE, lifetime_file, "the lifetime table", TAG_LIFETIME
    )


def _fetch(
    tracking, model: str, dest: Path, name: str, local, what: str, tag: str
) -> ModelTable | None:
    """fetch_table's body: the artifact `name` of the version's run, as local(dest, version);
    `tag`: the run's tag that says why a file was not made."""
    configure(tracking)
    from mlflow import MlflowClient  # deferred: mlflow's import is slow
    from mlflow.exceptions import MlflowException

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    try:
        if model.isdigit():
            version = client.get_model_version(tracking.model_name, model)
        else:
            version = client.get_model_version_by_alias(tracking.model_name, model)
    except MlflowException:
        return None  # no model, no such alias or version yet
    number = model_version_number(str(version.version))
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
        try:
            got = client.download_artifacts(version.run_id, f"{TABLE_ARTIFACT}/{name}", tmp)
        except (MlflowException, OSError) as err:
            why = client.get_run(version.run_id).data.tags.get(tag, "")
            raise FileNotFoundError(
                f"model {tracking.model_name} v{number} (run {version.run_id}) has no "
                f"{TABLE_ARTIFACT}/{name}: registered before {what} was logged with each "
                f"version{f' ({why})' if why.startswith('not made') else ''}; name a newer "
                f"version ({err})"
            ) from None
        # under its final name only whole (a killed fetch leaves no half file there)
        path = write_atomically(local(dest, number), Path(got).read_bytes())
    return ModelTable(path=path, version=number, run_id=version.run_id)


def fetch_question_network(run_id: str, dest: Path):
    """The questions' network a version's run logged (`questions/network.keras`), downloaded
    into the folder `dest` and loaded for answering: a keras.Model. A network trained on other
    inputs than this code computes (TAG_NETWORK_INPUTS against INPUTS_VERSION) raises, naming
    the run and what to do, rather than answer from inputs it never saw. The tracking URI is the
    caller's (mlflow.set_tracking_uri, or a store `configure` set up)."""
    import mlflow  # deferred: start-up time

    from tasks.learning.questions.network import INPUTS_VERSION, load_question_network

    logged = mlflow.get_run(run_id).data.tags.get(TAG_NETWORK_INPUTS, "1")
    if logged != str(INPUTS_VERSION):
        raise ValueError(
            f"run {run_id}: its questions' network was trained on inputs v{logged}, this code "
            f"computes v{INPUTS_VERSION} (question_network.INPUTS_VERSION): answer with a "
            "version this code trained (the train flow, or make run)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    path = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=f"{NETWORK_ARTIFACT}/{NETWORK_FILE}", dst_path=str(dest)
    )
    return load_question_network(path)
