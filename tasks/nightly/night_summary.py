"""What a night did: each stage's outcome, what failed and why, the evaluation, the champion.

`stage_outcome` turns a subflow's final state into a typed `StageOutcome`; `summarize` makes the
`NightlySummary`, rendered by `markdown()` (the Prefect artifact and a file) and `terminal()`.
Sections: what the predictions bought, the heap reports, the allocator advice, the champion.
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
from pydantic import BaseModel, Field

from tasks.allocators.report import AllocatorsOutcome, LastAdvice, last_advice
from tasks.allocators.seeds import SeedLine, SeedsOutcome
from tasks.core.storage import Root
from tasks.learning.evaluate import evaluation_markdown
from tasks.learning.outcome import RegisteredModel, TrainResult
from tasks.learning.questions.reuse import program_lines, question_lines
from tasks.learning.scores import BASELINES, HEDGED_NEXT, MODEL, ONLINE_COUNTER, OVERALL, Evaluation
from tasks.nightly.advice import advice_section
from tasks.nightly.params import NightContext
from tasks.nightly.terminal import terminal_text, verdict_lines
from tasks.registry.champion import current_champion, decision_from_json
from tasks.registry.headline import table_headlines
from tasks.registry.register import TAG_DECISION
from tasks.registry.tracking import CHAMPION_ALIAS, TrackingConfig, quiet_mlflow_env, resolve_target
from tasks.replay.replays import TraceSummary
from tasks.report.night_reports import NightReports
from tasks.report.page import fmt_bytes
from tasks.whatif.night import AtBudget, WhatifSummary

STAGES = ("trace", "dataset", "train")
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


class StageReport(BaseModel):
    name: str
    state: str
    ok: bool
    detail: str = ""
    error: str | None = None


class TableVerdict(BaseModel):
    """The model's top-1 on one evaluation table (all its workloads) against the online counter
    and the best baseline, on the same positions."""

    table: str  # unseen_runs | unseen_programs | heldout_workloads
    positions: int
    model: float
    online_counter: float | None
    best_baseline: str
    best_baseline_top1: float
    # the network mixed with the counter and the majority per thread (None: not scored)
    hedged: float | None = None


class Promotion(BaseModel):
    """The registry's decision on tonight's version, as registration left it on the model's run
    (tasks/registry/champion.py: PromotionDecision): both scores on tonight's evaluation."""

    decision: str  # first | promoted | kept | not_comparable
    metric: str
    candidate_version: str
    candidate_score: float
    previous_version: str | None = None
    previous_score: float | None = None
    reevaluated: bool = False


class NightlySummary(BaseModel):
    """The night in one object (the flow's return value) and one Markdown page."""

    root: str
    finished_at: str
    stages: list[StageReport]
    replays_ok: list[str] = Field(default_factory=list)  # workload/input
    replays_failed: dict[str, str] = Field(default_factory=dict)  # workload/input -> why
    converted: list[str] = Field(default_factory=list)  # workload/run (rows)
    trained: bool = False
    model_top1: float | None = None
    best_baseline: str | None = None
    best_baseline_top1: float | None = None
    evaluation_markdown: str = ""
    # the allocator's questions per evaluation table (tasks/learning/questions/reuse.py: question_lines)
    allocator_questions: list[str] = Field(default_factory=list)
    # ... and per program never trained on (tasks/learning/questions/reuse.py: program_lines)
    program_questions: list[str] = Field(default_factory=list)
    champion_before: str | None = None
    champion_after: str | None = None
    registration: str | None = None  # the registry's decision and its reason, when returned
    not_registered: str | None = None  # why nothing was registered tonight (no model trained)
    # the heap report of each evaluation run (tasks/report/night_reports.py): figures and pages
    heap_reports: NightReports | None = None
    # whatif at the idle budget, per workload (tasks/whatif/night.py): what the predictions bought
    whatif_budget: int | None = None
    whatif_at_budget: list[AtBudget] = Field(default_factory=list)
    whatif_by_budget: list[AtBudget] = Field(default_factory=list)  # all workloads, per budget
    # the seeds' cases under the mallocs and the layer (tasks/allocators/seeds.py), one per case
    seed_lines: list[str] = Field(default_factory=list)
    # the newest allocator recommendation per case under the root (tasks/allocators/report.py)
    allocator_advice: LastAdvice = Field(default_factory=lambda: LastAdvice(advice=[], problems=[]))
    # the MLflow UI over this night's store: the command that starts it ("" for a server) and
    # the address to open
    mlflow_ui: str = ""
    mlflow_ui_url: str = ""
    prefect_ui: str = ""  # where the night's flow run is shown ("" on Prefect's ephemeral API)
    summary_file: str = ""  # where publish_summary writes markdown() (the full tables)
    # tonight's version and its top-1 per evaluation table against the online counter
    model_name: str | None = None
    model_version: str | None = None
    tables: list[TableVerdict] = Field(default_factory=list)
    promotion: Promotion | None = None
    promotion_unread: str | None = None  # why the promotion decision could not be read
    seed_cases: list[SeedLine] = Field(default_factory=list)  # seed_lines' figures
    # the model run's headline metrics under their MLflow names (tasks/registry/headline.py):
    # registration's, then the whatif stage's
    headline: dict[str, float] = Field(default_factory=dict)

    @property
    def champion_changed(self) -> bool:
        return self.champion_after is not None and self.champion_after != self.champion_before

    def terminal(self, width: int = 100) -> str:
        """What a person reads in a minute, no line wider than `width`: the verdict (the
        champion, what the predictions bought, where the pages are), a line per stage, then
        narrow tables; the wide ones stay in `markdown()`."""
        return terminal_text(self, width)

    def markdown(self) -> str:
        ok = sum(s.ok for s in self.stages)
        lines = [
            f"# heapcast nightly: {ok} of {len(self.stages)} stages completed"
            + ("" if self.trained else " (no model trained)"),
            "",
            *(f"- {line}" for line in verdict_lines(self)),
            "",
            f"Finished {self.finished_at}. Data root: `{self.root}`.",
        ]
        if self.mlflow_ui_url:
            start = f"`{self.mlflow_ui}`, then " if self.mlflow_ui else ""
            lines.append(f"MLflow UI: {start}{self.mlflow_ui_url}.")
        lines += [
            "",
            "| stage | state | what ran | why it failed |",
            "|---|---|---|---|",
        ]
        for s in self.stages:
            lines.append(
                f"| {s.name} | {'ok' if s.ok else '**' + s.state.lower() + '**'} | "
                f"{_cell(s.detail)} | {_cell(s.error or '')} |"
            )
        lines += ["", "## Champion", ""]
        if self.champion_changed:
            lines.append(
                f"**The champion changed**: version {self.champion_before or '(none)'} "
                f"→ version {self.champion_after}."
            )
        elif self.champion_after is not None:
            lines.append(f"The champion did not change: version {self.champion_after}.")
        else:
            lines.append("No champion in the registry.")
        if self.registration:
            lines.append(f"Registration: {self.registration}")
        if self.not_registered:
            lines += [
                "",
                f"**Nothing was registered tonight**: {self.not_registered}. "
                "The champion is left alone.",
            ]
        if self.headline:
            lines += [
                "",
                "## Headline (the model's MLflow run: tasks/registry/headline.py)",
                "",
                "| metric | value |",
                "|---|---|",
            ]
            lines += [f"| {k} | {v:.6g} |" for k, v in self.headline.items()]
        if self.replays_failed:
            lines += ["", "## Failed replays", "", "| run | why |", "|---|---|"]
            lines += [f"| {k} | {_cell(v)} |" for k, v in self.replays_failed.items()]
        if self.evaluation_markdown:
            lines += [
                "",
                "## Evaluation (runs never seen in training)",
                "",
                self.evaluation_markdown.strip(),
            ]
        if self.allocator_questions:
            lines += [
                "",
                "## The allocator's questions: the network against the counters",
                "",
                "Reuse: at a free, is its class requested again soon in the process? Lifetime: "
                "at an allocation, how long will the block live? Every answer is causal.",
                "",
                *(f"- {line}" for line in self.allocator_questions),
            ]
        if self.program_questions:
            lines += [
                "",
                "Per program never trained on, the best of the model's answers (network, "
                "network_survival, network_hedged) against the best baseline (majority, "
                "class_online, site_online, site_survival), and whether network_hedged alone "
                "(the one answer, not picked per cell) is ahead of that baseline:",
                "",
                *(f"- {line}" for line in self.program_questions),
            ]
        if self.whatif_at_budget and self.whatif_budget is not None:
            lines += ["", *self._bought()]
        lines += [
            "",
            "## What the layer bought, measured (seeds' cases; medians, ms and MB)",
            "",
            *(
                [f"- {line}" for line in self.seed_lines]
                if self.seed_lines
                else [
                    "Not measured tonight: the night's `seeds` option is off (the scheduled night "
                    "and `make run`'s quick night, with fewer rounds, turn it on; "
                    "`python -m flows.allocators --seeds` measures them)."
                ]
            ),
        ]
        lines += ["", *advice_section(self.allocator_advice)]
        if self.heap_reports is not None:
            lines += ["", "## Heap reports (evaluation runs)", "", self.heap_reports.markdown()]
        return "\n".join(lines) + "\n"

    def _bought(self) -> list[str]:
        """What the predictions bought: per workload, hit rates at the whatif idle budget; then
        all workloads pooled, at each sweep budget."""
        header = (
            "best heuristic | guided by the model | guided by the reuse network | oracle (bound) |"
        )
        lines = [
            f"## What the predictions bought (whatif, at {fmt_bytes(self.whatif_budget)} "
            "held idle)",
            "",
            "Causal: each guided decision is made at the free, from what the cache has then "
            "(the model's next-call top-k; the reuse network's P(class requested again within "
            "16 calls) >= 1/2).",
            "",
            f"| workload | {header}",
            "|---|---|---|---|---|",
        ]
        lines += [_bought_row(a.workload, a) for a in self.whatif_at_budget]
        if self.whatif_by_budget:
            lines += [
                "",
                "All workloads, by idle budget (which policy wins depends on it; where every",
                "policy keeps every freed block, they tie):",
                "",
                f"| held idle | {header}",
                "|---|---|---|---|---|",
            ]
            lines += [_bought_row(fmt_bytes(a.budget or 0), a) for a in self.whatif_by_budget]
        return lines


def _bought_row(first: str, a: AtBudget) -> str:
    best = _rate(a.best_heuristic_hit_rate)
    if a.best_heuristic is not None:
        best = f"{a.best_heuristic} {best}"
    return (
        f"| {first} | {best} | {_rate(a.guided_hit_rate)} | {_rate(a.questions_hit_rate)} | "
        f"{_rate(a.oracle_hit_rate)} |"
    )


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


def _rate(hit_rate: float | None) -> str:
    return "n/a" if hit_rate is None else f"{hit_rate:.4f}"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:400]


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
    summary: dict[str, Any] = {}

    trace = by_name.get("trace")
    if trace is not None:
        runs = trace.value.runs if trace.value is not None else []
        summary["replays_ok"] = [f"{r.workload}/{r.input}" for r in runs if r.ok]
        summary["replays_failed"] = {
            f"{r.workload}/{r.input}": r.error or "failed" for r in runs if not r.ok
        }
        detail = (
            (
                f"{len(summary['replays_ok'])} of {len(runs)} replays ok "
                f"(runner {trace.value.runner if trace.value is not None else '?'})"
            )
            if trace.ok
            else ""
        )
        if trace.ok and summary["replays_failed"]:
            detail += "; failed: " + ", ".join(summary["replays_failed"])
        reports.append(
            StageReport(
                name="trace", state=trace.state, ok=trace.ok, detail=detail, error=trace.message
            )
        )

    dataset = by_name.get("dataset")
    if dataset is not None:
        converted = [
            f"{s['workload']}/{s['run']} ({s.get('rows', 0):,} rows)" for s in (dataset.value or [])
        ]
        summary["converted"] = converted
        detail = (
            (
                f"{len(converted)} run(s) converted"
                + (": " + ", ".join(converted) if converted else " (all up to date)")
            )
            if dataset.ok
            else ""
        )
        reports.append(
            StageReport(
                name="dataset",
                state=dataset.state,
                ok=dataset.ok,
                detail=detail,
                error=dataset.message,
            )
        )

    train = by_name.get("train")
    if train is not None:
        result: TrainResult | None = train.value
        detail = ""
        if result is not None:
            evaluation, notes = result.outcome.evaluation, result.outcome.notes
            model = evaluation.get(MODEL)
            best = max((evaluation.get(b) for b in BASELINES), key=lambda s: s.top1)
            summary.update(
                model_top1=model.top1,
                best_baseline=best.predictor,
                best_baseline_top1=best.top1,
                evaluation_markdown=evaluation_markdown(evaluation, notes),
                allocator_questions=question_lines(
                    list(result.outcome.question_scores), result.outcome.table_agreement
                ),
                program_questions=program_lines(list(result.outcome.question_scores)),
            )
            detail = (
                f"model top-1 {model.top1:.4f} vs best baseline {best.predictor} "
                f"{best.top1:.4f} on {model.positions:,} unseen positions"
            ) + trained_where(result.outcome)
            reg = result.model
            summary.update(
                model_name=reg.name,
                model_version=reg.version,
                tables=table_verdicts(evaluation),
                headline=dict(reg.headline),
            )
            try:
                summary["promotion"] = promotion_of(context.tracking, reg.run_id)
            except Exception as err:  # the store unreachable: said in the verdict, never fatal
                summary["promotion_unread"] = f"{type(err).__name__}: {err}"[:400]
            summary["registration"] = (
                f"version {reg.version} of {reg.name}: {reg.decision} ({reg.reason})"
            )
        summary["trained"] = train.ok
        if not train.ok:
            summary["not_registered"] = train.message or f"the train stage ended {train.state}"
        reports.append(
            StageReport(
                name="train", state=train.state, ok=train.ok, detail=detail, error=train.message
            )
        )

    replayed = by_name.get("whatif")
    if replayed is not None:
        # the whatif flow's WhatifSummary (tasks/whatif/night.py); its page is the `whatif` artifact
        v: WhatifSummary | None = replayed.value
        detail = ""
        if v is not None:
            detail = f"{len(v.runs_ok)} run(s) replayed for v{v.model_version} -> {v.table_url}"
            summary["headline"] = {**summary.get("headline", {}), **v.metrics}
            if v.runs_failed:
                detail += "; not replayed: " + ", ".join(v.runs_failed)
            summary.update(
                whatif_budget=v.idle_budget,
                whatif_at_budget=v.at_budget,
                whatif_by_budget=v.by_budget,
            )
        reports.append(
            StageReport(
                name="whatif",
                state=replayed.state,
                ok=replayed.ok,
                detail=detail,
                error=replayed.message,
            )
        )

    measured = by_name.get("allocators")
    if measured is not None:
        answers: AllocatorsOutcome | None = measured.value
        recs = answers.recommendations if answers is not None else []
        detail = "; ".join(f"{r.case}: {r.allocator or 'none'}" for r in recs)
        failed = answers.failed if answers is not None else []
        if failed:
            detail += f"; {len(failed)} pair(s) failed or unavailable"
        reports.append(
            StageReport(
                name="allocators",
                state=measured.state,
                ok=measured.ok,
                detail=("recommended: " + detail) if measured.ok else "",
                error=measured.message,
            )
        )

    seeds = by_name.get("seeds")
    if seeds is not None:
        seeded: SeedsOutcome | None = seeds.value
        summary["seed_lines"] = [line.text() for line in seeded.lines] if seeded else []
        summary["seed_cases"] = list(seeded.lines) if seeded else []
        reports.append(
            StageReport(
                name="seeds",
                state=seeds.state,
                ok=seeds.ok,
                detail=f"{len(seeded.lines)} case(s) measured" if seeded else "",
                error=seeds.message,
            )
        )

    try:
        advice = last_advice(context.root)
    except Exception as err:  # the root unreachable: a line in the summary, never a failed night
        where = context.root.url_of("allocators", "summary")
        advice = LastAdvice(advice=[], problems=[f"{where}: {type(err).__name__}: {err}"])

    now = _dt.datetime.now(_dt.UTC)
    command, url = mlflow_ui_command(context.tracking)
    return NightlySummary(
        root=context.root.url,
        allocator_advice=advice,
        mlflow_ui=command,
        mlflow_ui_url=url,
        prefect_ui=prefect_ui_url(),
        summary_file=context.root.url_of(SUMMARY_DIR, f"{now:%Y%m%dT%H%M%SZ}.md"),
        stages=reports,
        champion_before=champion_before,
        champion_after=champion_after,
        finished_at=now.isoformat(timespec="seconds"),
        heap_reports=heap_reports,
        **summary,
    )


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
def publish_summary(summary: NightlySummary) -> str:
    """The night's summary as a Prefect markdown artifact and the file `summary.summary_file`
    (a file that cannot be written is a warning, never a failed night); returns the markdown."""
    markdown = summary.markdown()
    create_markdown_artifact(
        markdown=markdown,
        key=ARTIFACT_KEY,
        description="heapcast nightly: stages, failures, evaluation, champion",
    )
    if summary.summary_file:
        try:
            write_summary_file(summary.summary_file, markdown)
        except Exception as err:  # the root unreachable now: the artifact still has it all
            get_run_logger().warning(
                "the night's summary could not be written to %s: %s: %s",
                summary.summary_file,
                type(err).__name__,
                err,
            )
    return markdown


def write_summary_file(url: str, markdown: str) -> None:
    """`markdown` at `url` (a path under the data root, local or s3://)."""
    parent, name = url.rsplit("/", 1)
    root = Root.from_url(parent)
    root.fs.makedirs(root.path, exist_ok=True)
    with root.fs.open(root.join(name), "w") as f:
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
