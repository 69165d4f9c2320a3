"""What a night did: each stage's outcome, what failed and why, the evaluation, the champion.

`stage_outcome` turns a subflow's final state into a typed `StageOutcome`; `summarize` reads
each stage's outcome (one reader a stage, `STAGE_READERS`) into the `NightlySummary`
(tasks/nightly/summary_model.py); `publish_summary` writes its page (tasks/nightly/markdown.py)
as the Prefect artifact and a file; the terminal prints tasks/nightly/terminal.py's screen.
The night fails only when nothing could be trained (`finish`).

The sections and the broken-data rules: docs/results.md#how-the-summary-is-made
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.settings import get_current_settings
from prefect.states import State

from tasks.allocators.report import AllocatorsOutcome, LastAdvice, last_advice
from tasks.allocators.seeds import SeedsOutcome
from tasks.core.storage import Root
from tasks.learning.evaluate import evaluation_markdown
from tasks.learning.outcome import RegisteredModel, TrainResult
from tasks.learning.questions.reuse import context_line, program_lines, question_lines
from tasks.learning.scores import BASELINES, HEDGED_NEXT, MODEL, ONLINE_COUNTER, OVERALL, Evaluation
from tasks.nightly.markdown import markdown_text
from tasks.nightly.params import NightContext
from tasks.nightly.summary_model import NightlySummary, Promotion, StageReport, TableVerdict
from tasks.registry.champion import current_champion, decision_from_json
from tasks.registry.headline import table_headlines
from tasks.registry.register import TAG_DECISION
from tasks.registry.tracking import CHAMPION_ALIAS, TrackingConfig, quiet_mlflow_env, resolve_target
from tasks.replay.replays import TraceSummary
from tasks.report.night_reports import NightReports
from tasks.whatif.night import WhatifSummary

ARTIFACT_KEY = "nightly-summary"
SUMMARY_DIR = "nightly"  # <root>/nightly/<finished_at>.md: the full summary of each night


class NothingTrained(RuntimeError):
    """The night produced no model: the `train` stage failed (the summary says why, and
    travels with the error so that the command line can still print it)."""

    def __init__(self, message: str, summary: NightlySummary | None = None):
        super().__init__(message)
        self.summary = summary


T = TypeVar("T")


@dataclass(frozen=True)
class StageOutcome(Generic[T]):
    """One stage's end: its Prefect state type, the failure message, and its return value
    (the stage's own type; None unless the stage completed)."""

    name: str
    state: str  # COMPLETED, FAILED, CRASHED, CANCELLED, ...
    message: str | None
    value: T | None = None

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


def stage_outcome(name: str, state: State, returns: type[T]) -> StageOutcome[T]:
    """A subflow's final state (from `flow(..., return_state=True)`) as a StageOutcome whose
    value is a `returns` (a completed stage that returned anything else is a failed one)."""
    kind = state.type.value
    if state.is_completed():
        value = state.result(raise_on_failure=False)
        if not isinstance(value, returns):
            why = f"returned a {type(value).__name__}, not a {returns.__name__}"
            return StageOutcome(name, "FAILED", why)
        return StageOutcome(name, kind, None, value)
    why = state.message or ""
    err = state.result(raise_on_failure=False)
    if isinstance(err, BaseException):
        why = f"{type(err).__name__}: {err}"
    return StageOutcome(name, kind, why or f"ended {kind}")


def skipped(name: str, why: str) -> StageOutcome:
    """A stage the night did not run, and why."""
    return StageOutcome(name, "SKIPPED", why)


def registered_model(trained: StageOutcome[TrainResult]) -> RegisteredModel | None:
    """The version tonight's train stage registered, or None when it did not complete."""
    return trained.value.model if trained.value is not None else None


def broken_data(trace: StageOutcome[TraceSummary]) -> str | None:
    """Why tonight's data must not reach the registry, or None: every replay failed (a stage
    that ran no replay at all, e.g. a bad parameter, is not a verdict on the data)."""
    runs = trace.value.runs if trace.value is not None else []
    if not runs or any(r.ok for r in runs):
        return None
    why = "; ".join(f"{r.workload}/{r.input}: {r.error or 'failed'}" for r in runs)
    return f"every replay failed ({len(runs)} of {len(runs)}): {why}"[:2000]


def trained_where(outcome) -> str:
    """'; trained with jax on gpu: NVIDIA H200, mixed_bfloat16, batch 1024, 9.1 M positions/s'."""
    where = getattr(outcome, "placement", None) or {}
    if not where:
        return ""
    replicas = int(where.get("replicas", "1"))
    rate = outcome.predictions_per_second
    speed = f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.0f} k"
    return (
        f"; trained with {where['backend']} on {where['device']}"
        + (f" x{replicas}" if replicas > 1 else "")
        + f", {where['precision']}, batch {where['batch_size']}, {speed} positions/s"
    )


@task(name="summarize-night", cache_policy=NO_CACHE)
def summarize(
    context: NightContext,
    outcomes: list[StageOutcome[Any]],
    champion_before: str | None,
    champion_after: str | None,
    heap_reports: NightReports | None = None,
) -> NightlySummary:
    """The night's summary from its stages' outcomes, the champion before and after, and the
    evaluation runs' heap reports."""
    by_name = {o.name: o for o in outcomes}
    reports: list[StageReport] = []
    fields: dict[str, Any] = {}
    for (
        name,
        read,
    ) in STAGE_READERS.items():  # in the night's order: whatif's headline follows train's
        outcome = by_name.get(name)
        if outcome is None:
            continue
        report, found = read(outcome, context)
        found["headline"] = {**fields.get("headline", {}), **found.get("headline", {})}
        fields.update(found)
        reports.append(report)
    now = _dt.datetime.now(_dt.UTC)
    command, url = mlflow_ui_command(context.tracking)
    return NightlySummary(
        root=context.root.url,
        allocator_advice=advice_under(context.root),
        mlflow_ui=command,
        mlflow_ui_url=url,
        prefect_ui=prefect_ui_url(),
        summary_file=context.root.url_of(SUMMARY_DIR, f"{now:%Y%m%dT%H%M%SZ}.md"),
        stages=reports,
        champion_before=champion_before,
        champion_after=champion_after,
        finished_at=now.isoformat(timespec="seconds"),
        heap_reports=heap_reports,
        **fields,
    )


# Each stage's outcome read into its line of the summary and the summary's fields it fills.
StageRead = tuple[StageReport, dict[str, Any]]


def _report(o: StageOutcome, detail: str = "") -> StageReport:
    return StageReport(name=o.name, state=o.state, ok=o.ok, detail=detail, error=o.message)


def read_trace(trace: StageOutcome[TraceSummary], context: NightContext) -> StageRead:
    """The replays that ran and those that failed, and why."""
    runs = trace.value.runs if trace.value is not None else []
    ok = [f"{r.workload}/{r.input}" for r in runs if r.ok]
    failed = {f"{r.workload}/{r.input}": r.error or "failed" for r in runs if not r.ok}
    detail = ""
    if trace.ok:
        runner = trace.value.runner if trace.value is not None else "?"
        detail = f"{len(ok)} of {len(runs)} replays ok (runner {runner})"
        if failed:
            detail += "; failed: " + ", ".join(failed)
    return _report(trace, detail), {"replays_ok": ok, "replays_failed": failed}


def read_dataset(dataset: StageOutcome[list], context: NightContext) -> StageRead:
    """The runs converted tonight, with their rows."""
    converted = [
        f"{s['workload']}/{s['run']} ({s.get('rows', 0):,} rows)" for s in (dataset.value or [])
    ]
    detail = ""
    if dataset.ok:
        detail = f"{len(converted)} run(s) converted" + (
            ": " + ", ".join(converted) if converted else " (all up to date)"
        )
    return _report(dataset, detail), {"converted": converted}


def read_train(train: StageOutcome[TrainResult], context: NightContext) -> StageRead:
    """The evaluation, the questions, the registered version and the registry's decision; or
    why nothing was registered."""
    fields: dict[str, Any] = {"trained": train.ok}
    if not train.ok:
        fields["not_registered"] = train.message or f"the train stage ended {train.state}"
    result = train.value
    if result is None:
        return _report(train), fields
    outcome, reg = result.outcome, result.model
    evaluation = outcome.evaluation
    model = evaluation.get(MODEL)
    best = max((evaluation.get(b) for b in BASELINES), key=lambda s: s.top1)
    fields.update(
        model_top1=model.top1,
        best_baseline=best.predictor,
        best_baseline_top1=best.top1,
        evaluation_markdown=evaluation_markdown(evaluation, outcome.notes),
        allocator_questions=question_lines(list(outcome.question_scores), outcome.table_agreement),
        program_questions=program_lines(list(outcome.question_scores)),
        context=context_line(list(outcome.question_scores)),
        model_name=reg.name,
        model_version=reg.version,
        tables=table_verdicts(evaluation),
        headline=dict(reg.headline),
        registration=f"version {reg.version} of {reg.name}: {reg.decision} ({reg.reason})",
    )
    try:
        fields["promotion"] = promotion_of(context.tracking, reg.run_id)
    except Exception as err:  # the store unreachable: said in the verdict, never fatal
        fields["promotion_unread"] = f"{type(err).__name__}: {err}"[:400]
    detail = (
        f"model top-1 {model.top1:.4f} vs best baseline {best.predictor} "
        f"{best.top1:.4f} on {model.positions:,} unseen positions"
    ) + trained_where(outcome)
    return _report(train, detail), fields


def read_whatif(replayed: StageOutcome[WhatifSummary], context: NightContext) -> StageRead:
    """What the predictions bought (the whatif flow's summary; its page is the `whatif`
    artifact) and its headline metrics."""
    v = replayed.value
    if v is None:
        return _report(replayed), {}
    detail = f"{len(v.runs_ok)} run(s) replayed for v{v.model_version} -> {v.table_url}"
    if v.runs_failed:
        detail += "; not replayed: " + ", ".join(v.runs_failed)
    fields = {
        "headline": dict(v.metrics),
        "whatif_budget": v.idle_budget,
        "whatif_at_budget": v.at_budget,
        "whatif_by_budget": v.by_budget,
    }
    return _report(replayed, detail), fields


def read_allocators(measured: StageOutcome[AllocatorsOutcome], context: NightContext) -> StageRead:
    """The allocator recommended per case, and the pairs that failed."""
    answers = measured.value
    recs = answers.recommendations if answers is not None else []
    detail = "; ".join(f"{r.case}: {r.allocator or 'none'}" for r in recs)
    failed = answers.failed if answers is not None else []
    if failed:
        detail += f"; {len(failed)} pair(s) failed or unavailable"
    return _report(measured, ("recommended: " + detail) if measured.ok else ""), {}


def read_seeds(seeds: StageOutcome[SeedsOutcome], context: NightContext) -> StageRead:
    """What the layer bought on the seeds' cases."""
    seeded = seeds.value
    lines = list(seeded.lines) if seeded else []
    fields = {"seed_lines": [line.text() for line in lines], "seed_cases": lines}
    return _report(seeds, f"{len(lines)} case(s) measured" if seeded else ""), fields


STAGE_READERS = {
    "trace": read_trace,
    "dataset": read_dataset,
    "train": read_train,
    "whatif": read_whatif,
    "allocators": read_allocators,
    "seeds": read_seeds,
}


def advice_under(root: Root) -> LastAdvice:
    """The newest allocator advice under `root`; an unreachable root is a line in the summary,
    never a failed night."""
    try:
        return last_advice(root)
    except Exception as err:
        where = root.url_of("allocators", "summary")
        return LastAdvice(advice=[], problems=[f"{where}: {type(err).__name__}: {err}"])


def table_verdicts(evaluation: Evaluation) -> list[TableVerdict]:
    """Per evaluation table: the model, the online counter and the best baseline (top-1)."""
    out = []
    for h in table_headlines(evaluation):
        online, hedged = (
            evaluation.find(p, OVERALL, h.table) for p in (ONLINE_COUNTER, HEDGED_NEXT)
        )
        out.append(
            TableVerdict(
                table=h.table,
                positions=h.positions,
                model=h.top1_model,
                online_counter=None if online is None else float(online.top1),
                best_baseline=h.best_baseline_top1,
                best_baseline_top1=h.top1_best_baseline,
                hedged=None if hedged is None else float(hedged.top1),
            )
        )
    return out


def promotion_of(tracking: TrackingConfig, run_id: str) -> Promotion | None:
    """The promotion decision registration left on the model's run (None: not recorded)."""
    quiet_mlflow_env()  # before mlflow is imported
    # deferred: imported on first use, for start-up time
    from mlflow import MlflowClient  # deferred for start-up time

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    text = client.get_run(run_id).data.tags.get(TAG_DECISION)
    if text is None:
        return None
    d = decision_from_json(text)
    return Promotion(
        decision=d.decision,
        metric=d.metric,
        candidate_version=str(d.candidate_version),
        candidate_score=d.candidate_score,
        previous_version=d.previous_champion_version,
        previous_score=d.champion_score,
        reevaluated=bool(d.champion_reevaluated),
    )


def prefect_ui_url() -> str:
    """The Prefect UI page of the running flow run; "" on Prefect's ephemeral API (no UI)."""
    ui = get_current_settings().ui_url
    if not ui:
        return ""
    run = runtime.flow_run.id
    return f"{ui.rstrip('/')}/runs/flow-run/{run}" if run else ui


@task(name="champion-version", retries=3, retry_delay_seconds=[5, 15, 30], cache_policy=NO_CACHE)
def champion_version(tracking: TrackingConfig) -> str | None:
    """The registered version holding the `champion` alias, or None (tracking server may fail)."""
    quiet_mlflow_env()  # before mlflow is imported
    # deferred: imported on first use, for start-up time
    from mlflow import MlflowClient  # deferred for start-up time

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    version = current_champion(client, tracking.model_name, CHAMPION_ALIAS)
    return None if version is None else str(version.version)


@task(name="publish-nightly-summary", cache_policy=NO_CACHE)
def publish_summary(summary: NightlySummary, root: Root) -> str:
    """The night's summary as a Prefect markdown artifact and the file `summary.summary_file`
    under `root` (a file that cannot be written is a warning, never a failed night); returns
    the markdown."""
    markdown = markdown_text(summary)
    create_markdown_artifact(
        markdown=markdown,
        key=ARTIFACT_KEY,
        description="heapcast nightly: stages, failures, evaluation, champion",
    )
    if summary.summary_file:
        try:
            write_summary_file(root, summary.summary_file, markdown)
        except Exception as err:  # the root unreachable now: the artifact still has it all
            get_run_logger().warning(
                "the night's summary could not be written to %s: %s: %s",
                summary.summary_file,
                type(err).__name__,
                err,
            )
    return markdown


def write_summary_file(root: Root, url: str, markdown: str) -> None:
    """`markdown` at `url`, a file under the night's summaries of `root` (local or s3://)."""
    name = url.rsplit("/", 1)[1]
    root.fs.makedirs(root.join(SUMMARY_DIR), exist_ok=True)
    with root.fs.open(root.join(SUMMARY_DIR, name), "w") as f:
        f.write(markdown)


MLFLOW_UI_LOCAL = "http://127.0.0.1:5000"


def mlflow_ui_command(tracking: TrackingConfig) -> tuple[str, str]:
    """(the command that starts the MLflow UI over the store this night wrote to, "" for a
    server; the address to open)."""
    target = resolve_target(tracking)
    if target.is_server:
        return "", target.tracking_uri
    return (
        f".venv/bin/mlflow ui --backend-store-uri {target.tracking_uri} "
        "--host 127.0.0.1 --port 5000"
    ), MLFLOW_UI_LOCAL


def finish(summary: NightlySummary) -> NightlySummary:
    """The summary, or NothingTrained when the night produced no model."""
    if not summary.trained:
        train = next((s for s in summary.stages if s.name == "train"), None)
        why = train.error if train is not None else "the train stage did not run"
        raise NothingTrained(
            f"nightly: no model was trained ({why}); see the "
            f"'{ARTIFACT_KEY}' artifact for every stage",
            summary,
        )
    return summary
