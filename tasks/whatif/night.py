"""The whatif stage's Prefect tasks: a trained model's evaluation runs through the policy grid.

What the `whatif` flow (flows/whatif.py) composes: `resolve_model`, `model_ref`,
`load_predictor`, `replay_run` (once per run, guided configs once per predictor), `write_table`,
`summarize`, `log_to_mlflow`, `publish`. The policies heapcast's layer runs (largest, pools,
layer_guided: its online counter, its regret, and the version's class table where it logged one)
are the layer's own decisions, the policy core's (tasks/whatif/policy_core.py).

The steps, the predictors (causal and `_optimistic`), the table, the representative config and
the MLflow names: docs/whatif.md#the-flow
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import Field, field_validator

from tasks.core.config import StrictModel, default_root
from tasks.core.policy_names import RENAMED_POLICIES, current_policy
from tasks.core.storage import Root
from tasks.dataset.events_reader import list_runs
from tasks.dataset.sites import NO_CALL_SITES, has_call_sites
from tasks.dataset.token_runs import ScoredRun, read_scored_run
from tasks.learning.answers import RunAnswers
from tasks.learning.counters.baselines import NONE, TOP_K
from tasks.learning.counters.online import OnlineCounter
from tasks.learning.outcome import RegisteredModel
from tasks.learning.table.distill import keep_soon
from tasks.learning.table.layer_file import HEADER, layer_entries, read_table_file
from tasks.learning.train_config import TrainConfig
from tasks.registry.champion import champion_config
from tasks.registry.headline import PREFIX, WhatifHeadline, log_table
from tasks.registry.headline import whatif_metrics as headline_metrics
from tasks.registry.question_artifacts import TABLE_ARTIFACT, TABLE_FILE
from tasks.registry.tracking import TrackingConfig, configure, resolve_target, tracking_for
from tasks.whatif.events import COLUMNS as EVENTS_COLUMNS
from tasks.whatif.events import PART, prepare
from tasks.whatif.guided import (
    align_token_run,
    keep_at_free,
    next_call_top,
    predictions_from_topk,
    reuse_labels,
)
from tasks.whatif.policies import (
    GuidedConfig,
    LayerGuidedConfig,
    OracleConfig,
    PolicyConfig,
    _Policy,
)
from tasks.whatif.policy_core import (
    class_scores_of,
    context_scores_of,
    keyed,
    with_allocation_contexts,
    with_call_sites,
)
from tasks.whatif.sweep import GUIDED_HORIZON, OPTIMISTIC, default_grid, pareto_plot, sweep_run

ARTIFACT_KEY = "whatif"
ALL = "all"  # the workload slice that pools every run
THREAD_FUTURE = f"thread_future{OPTIMISTIC}"  # the true next calls of the freeing thread
# questions: the allocator questions' own network (tasks/learning/questions/network.py), logged
# with the version; it answers the reuse question at the free itself (causal at every horizon)
PREDICTORS = ("model", "questions", "online", THREAD_FUTURE)
# the questions' network's inputs beyond COLUMNS (and the run's stacks, read beside them)
QUESTIONS_COLUMNS = ("lifetime_ns", "caller_module", "caller_offset", "stack")
BELADY = f"belady{OPTIMISTIC}"  # clairvoyant: keeps by the next request of each class
CAUSAL_HORIZON = 1  # the prediction made at the free, for the next call: what a live cache has
HEURISTICS = ("largest", "pools", "lru")
POLICY_ORDER = (
    "none",
    "largest",
    "pools",
    "layer_guided",
    "layer_guided_regret",
    "layer_guided_table",
    "layer_guided_table_regret",
    "lru",
    "best_heuristic",
    "guided_model",
    "guided_questions",
    "guided_online",
    f"guided_model{OPTIMISTIC}",
    f"guided_online{OPTIMISTIC}",
    f"guided_{THREAD_FUTURE}",
    "guided_admit_model",
    "guided_admit_questions",
    "guided_admit_online",
    f"guided_admit_model{OPTIMISTIC}",
    f"guided_admit_online{OPTIMISTIC}",
    f"guided_admit_{THREAD_FUTURE}",
    BELADY,
    "oracle",
)
METRICS = (
    "hit_rate",
    "idle_bytes_mean",
    "idle_bytes_peak",
    "peak_footprint",
    "fault_bytes_avoided",
)
# Bytes idle in the cache (time-weighted mean, per run) at which policies are compared. It must
# bind: keeping every freed block holds 0.2 to 1.8 MB idle on the quick night's runs, so at
# 1 MiB and more every policy keeps everything and they all tie (measured: 16 MiB gave the same
# hit rate to every policy on every workload). The summary also shows the pooled answer at each
# of SWEEP_BUDGETS, since which policy wins changes with the budget.
DEFAULT_IDLE_BUDGET = 64 << 10
SWEEP_BUDGETS = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20)


class WhatifParams(StrictModel):
    """Parameters of the `whatif` flow."""

    root: str = Field(default_factory=default_root, description="data root (folder or s3:// URL)")
    model: str = Field(
        default="champion",
        description="the registered version to replay for: an alias (champion) or a version number",
    )
    runs: list[str] | None = Field(
        default=None,
        description="runs as 'workload/run'; empty: the evaluation runs the model's MLflow run records",
    )
    horizon: int = Field(
        default=CAUSAL_HORIZON,
        ge=1,
        description="calls of a thread within which a predicted allocation keeps a freed block; "
        "1 (causal): the prediction made at the free; more reads later predictions, and the "
        "model's and the online counter's rows are then named *_optimistic",
    )
    idle_budget: int = Field(
        default=DEFAULT_IDLE_BUDGET,
        gt=0,
        description="bytes held idle (time-weighted mean) at which policies are compared",
    )
    policies: list[PolicyConfig] | None = Field(
        default=None, description="the policy grid; empty: tasks.whatif.sweep.default_grid()"
    )
    recompute: bool = Field(
        default=False,
        description="compute the model's and the questions' network's answers here rather than "
        "read those the evaluation logged with the version (the same numbers on the same calls)",
    )

    def grid(self) -> list[_Policy]:
        """The policies swept, always with the oracle's bound at exactly `idle_budget` (the
        figure the policy table compares with)."""
        grid = list(self.policies) if self.policies is not None else default_grid()
        at_budget = OracleConfig(budget=float(self.idle_budget))
        return grid if at_budget in grid else [*grid, at_budget]


@dataclass(frozen=True)
class ModelRef:
    """The registered version replayed for, the runs to replay, and its training config."""

    model: RegisteredModel
    runs: tuple[tuple[str, str], ...]
    config: dict[str, Any] | None  # its training config (config.json), None when absent

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def version(self) -> str:
        return self.model.version

    @property
    def run_id(self) -> str:
        return self.model.run_id

    @property
    def max_eval_tokens(self) -> int | None:
        """The calls of each run the model's evaluation scored (data.max_eval_tokens; None: all):
        whatif replays the runs as the evaluation scored them."""
        if self.config is None:
            return None
        return TrainConfig.model_validate(self.config).data.max_eval_tokens


@dataclass
class RunReplay:
    """One run's rows, or why it could not be replayed."""

    workload: str
    run: str
    rows: pd.DataFrame | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


class Predictor:
    """The registered version's predictors for the replay: its two Keras networks (the next-call
    model in sequence mode with its context, and the questions' network), each with why it is
    missing, and the MLflow run whose logged answers (tasks/registry/answer_artifacts.py) the replay reads
    first. With a `loader` the networks are loaded once, on first need, by whichever replay
    thread needs them first: a night whose every answer was logged never loads them (nor
    TensorFlow)."""

    def __init__(
        self,
        model: Any = None,
        context: int = 0,
        batch_size: int = 64,
        error: str | None = None,
        questions: Any = None,
        questions_error: str | None = None,
        *,
        run_id: str = "",
        loader: Callable[[Predictor], None] | None = None,
        class_scores: np.ndarray | None = None,
    ) -> None:
        self._model, self.context, self.batch_size, self._error = model, context, batch_size, error
        self._questions, self._questions_error = questions, questions_error
        self.run_id = run_id  # where the evaluation's answers are logged ("": none to read)
        self._loader = loader
        self._lock = threading.Lock()
        # the layer table's class scores the version logged (layer_guided with table=true)
        self._scores: tuple[np.ndarray | None, str | None] | None = (
            None if class_scores is None else (class_scores_of(class_scores), None)
        )
        self._scores_lock = threading.Lock()

    def class_scores(self) -> tuple[np.ndarray | None, str | None]:
        """The class scores of the layer table the version logged, fetched once on first
        need; or None and why there are none (a version without a table, no run)."""
        with self._scores_lock:
            if self._scores is None:
                self._scores = (
                    _fetch_class_scores(self.run_id)
                    if self.run_id
                    else (None, "no MLflow run to read the layer's table from")
                )
            return self._scores

    def _load(self) -> None:
        with self._lock:
            if self._loader is not None:
                loader, self._loader = self._loader, None
                loader(self)

    def set_model(self, model: Any, context: int, batch_size: int) -> None:
        self._model, self.context, self.batch_size = model, context, batch_size

    def set_questions(self, questions: Any) -> None:
        self._questions = questions

    def fail(self, error: str | None = None, questions_error: str | None = None) -> None:
        self._error = error or self._error
        self._questions_error = questions_error or self._questions_error

    @property
    def model(self) -> Any:
        self._load()
        return self._model

    @property
    def error(self) -> str | None:
        self._load()
        return self._error

    @property
    def questions(self) -> Any:
        self._load()
        return self._questions

    @property
    def questions_error(self) -> str | None:
        self._load()
        return self._questions_error


class AtBudget(StrictModel):
    """One workload's answer at the idle budget: the best heuristic, guided by the model, and
    the oracle's bound (hit rates of the representative configs, see docs/whatif.md)."""

    workload: str
    budget: int | None = None  # the idle budget of this answer, when not the summary's own
    best_heuristic: str | None = None  # largest, pools or lru
    best_heuristic_hit_rate: float | None = None
    guided_hit_rate: float | None = None  # guided_model; None when the model could not load
    # guided_questions: the questions' network; None when the version logged none
    questions_hit_rate: float | None = None
    oracle_hit_rate: float | None = None
    # the layer's own guided policy (its online counter; the policy core's decisions)
    layer_guided_hit_rate: float | None = None

    @field_validator("best_heuristic")
    @classmethod
    def _current(cls, v: str | None) -> str | None:
        return None if v is None else current_policy(v)  # a stored night's former name


class WhatifSummary(StrictModel):
    """What the flow returns and the nightly summary reads."""

    model_name: str
    model_version: str
    model_run_id: str
    table_url: str | None = None
    runs_ok: list[str] = Field(default_factory=list)
    runs_failed: dict[str, str] = Field(default_factory=dict)  # workload/run -> why
    idle_budget: int
    metrics: dict[str, float] = Field(default_factory=dict)
    at_budget: list[AtBudget] = Field(default_factory=list)  # per workload, `all` last
    by_budget: list[AtBudget] = Field(default_factory=list)  # `all`, at each of SWEEP_BUDGETS
    policies: list[dict[str, Any]] = Field(default_factory=list)  # whatif/policies.json
    markdown: str = ""


# ----------------------------------------------------------------------------- model and runs


def parse_runs(text: str | list[str] | None) -> list[tuple[str, str]]:
    """'w/r,w/r' (an MLflow param) or ['w/r', ...] -> [(w, r)]; an entry cut short by the
    param's length limit (no '/') is dropped."""
    items = text.split(",") if isinstance(text, str) else list(text or [])
    out = []
    for item in items:
        w, sep, r = item.strip().partition("/")
        if sep and w and r:
            out.append((w, r))
    return list(dict.fromkeys(out))


RUN_PARAMS = ("dataset.eval_runs", "dataset.unseen_program_runs", "dataset.heldout_runs")


def _client(tracking: TrackingConfig):
    configure(tracking)
    # deferred: imported on first use, for start-up time
    from mlflow import MlflowClient  # deferred for start-up time (configure quiets it first)

    target = resolve_target(tracking)
    return MlflowClient(target.tracking_uri, target.registry_uri)


@task(name="whatif-resolve-model", retries=2, retry_delay_seconds=[5, 15], cache_policy=NO_CACHE)
def resolve_model(params: WhatifParams, tracking: TrackingConfig) -> RegisteredModel:
    """The registered version `params.model` names (an alias, or a version number: digits) and
    the evaluation runs its MLflow run records: the whatif flow's edge when it runs on its own."""
    client = _client(tracking)
    name = tracking.model_name
    if params.model.isdigit():
        version = client.get_model_version(name, params.model)
    else:
        version = client.get_model_version_by_alias(name, params.model)
    logged = client.get_run(version.run_id).data.params
    eval_runs, unseen, heldout = (tuple(parse_runs(logged.get(key, ""))) for key in RUN_PARAMS)
    return RegisteredModel(
        name=name,
        version=str(version.version),
        run_id=version.run_id,
        eval_runs=eval_runs,
        unseen_program_runs=unseen,
        heldout_runs=heldout,
    )


@task(name="whatif-model-ref", retries=2, retry_delay_seconds=[5, 15], cache_policy=NO_CACHE)
def model_ref(model: RegisteredModel, params: WhatifParams, tracking: TrackingConfig) -> ModelRef:
    """The model, the runs to replay (`params.runs`, else its evaluation runs) and its training
    config (config.json of its run)."""
    runs = parse_runs(params.runs) if params.runs is not None else list(model.evaluation_runs)
    return ModelRef(model, tuple(runs), champion_config(_client(tracking), model))


def registered_ref(params: WhatifParams, root: Root) -> ModelRef:
    """The version `params.model` names, resolved as the whatif flow does at its edge, outside a
    flow (the benchmarks that read a version's runs and answers)."""
    tracking = tracking_for(root)
    return model_ref.fn(resolve_model.fn(params, tracking), params, tracking)


@task(name="whatif-load-model", cache_policy=NO_CACHE)
def load_predictor(ref: ModelRef) -> Predictor:
    """The version's predictors: its networks loaded on first need (`_load_networks`), its
    logged answers read per run. A network that cannot be loaded is named in the artifact and
    the runs are still replayed without it."""
    return Predictor(run_id=ref.run_id, loader=lambda p: _load_networks(ref, p))


def _load_networks(ref: ModelRef, predictor: Predictor) -> None:
    """The version as a sequence-mode model and its questions' network, into `predictor`."""
    try:
        # deferred: imported on first use (TensorFlow), for start-up time
        from tasks.learning.nextcall.model import as_sequence_model
        from tasks.registry.champion import load_version

        if ref.config is None:
            raise ValueError(f"run {ref.run_id} has no config.json: the model's context is unknown")
        cfg = TrainConfig.model_validate(ref.config)
        model = as_sequence_model(load_version(ref.name, ref.version), cfg)
        predictor.set_model(model, cfg.context, cfg.eval_batch_size)
    except Exception as err:  # noqa: BLE001 - reported in the artifact, not fatal
        predictor.fail(error=f"{type(err).__name__}: {err}"[:500])
    try:
        # deferred: imported on first use (MLflow, TensorFlow), for start-up time
        from tasks.registry.question_artifacts import fetch_question_network

        with tempfile.TemporaryDirectory(prefix="heapcast-questions-") as tmp:
            # the tracking URI load_version used
            predictor.set_questions(fetch_question_network(ref.run_id, Path(tmp)))
    except Exception as err:  # noqa: BLE001 - an older version logged none: said, not fatal
        predictor.fail(questions_error=f"{type(err).__name__}: {err}"[:300])


def table_file_scores(path: Path) -> np.ndarray:
    """A layer table file's scores as the replay asks them (policy_core.class_scores_of): its
    class scores, its site entries, and a format 4 file's allocation-context entries at its
    depth (TableScores.contexts, asked before the sites); a file the layer would refuse raises
    ValueError."""
    read_table_file(path)
    raw = path.read_bytes()
    got = layer_entries(HEADER.unpack_from(raw)[1], raw[HEADER.size :])
    return class_scores_of(
        got.keep_scores.tobytes() + got.sites.tobytes(),
        context_scores_of(got.contexts, got.depth),
    )


def _fetch_class_scores(run_id: str) -> tuple[np.ndarray | None, str | None]:
    """The scores of the layer table a version's run logged (`table/heapcast.hcltab`,
    tasks/registry/question_artifacts.py), checked as the layer checks it: its class scores,
    with its call-site entries where it has some (formats 3 and 4; policy_core.TableScores,
    which the replay asks as the layer asks them), and a format 4 file's context entries,
    which a free asks first by its block's allocation context (from the run's stacks); or None
    and why."""
    try:
        # deferred: imported on first use (MLflow), for start-up time
        import mlflow

        with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
            path = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=f"{TABLE_ARTIFACT}/{TABLE_FILE}", dst_path=tmp
            )
            return table_file_scores(Path(path)), None
    except Exception as err:  # noqa: BLE001 - an older version logged none: said, not fatal
        return None, f"no layer table for layer_guided_table: {type(err).__name__}: {err}"[:300]


# ----------------------------------------------------------------------------- one run


def _top_per_row(run: ScoredRun, top_at_positions: np.ndarray) -> np.ndarray:
    """A predictor's top-5 at the run's scored positions -> [rows, 5] per row of its table
    (a thread's first call, which nothing predicts, gets empty slots)."""

    top = np.full((run.tokens.n_tokens, TOP_K), NONE, np.uint8)
    top[run.positions] = top_at_positions
    return align_token_run(run.table, top)


def predictions_for(
    run: ScoredRun,
    predictor: Predictor | None,
    horizon: int,
    answers: RunAnswers | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """{predictor name: keep/drop per row of `table`} and notes on where the answers came from
    and on the predictors left out. horizon 1: causal (keep_at_free, the top-5 made at the
    free); more: `<name>_optimistic`. The model's and the questions' network's answers are the
    ones `answers` (the evaluation's, logged with the version) holds for exactly these calls;
    the networks compute any others."""

    table, token_run = run.table, run.tokens

    def keep(name: str, top: np.ndarray) -> None:
        per_row = _top_per_row(run, top)
        if horizon == CAUSAL_HORIZON:
            out[name] = keep_at_free(table, next_call_top(table, per_row))
        else:
            out[f"{name}{OPTIMISTIC}"] = predictions_from_topk(table, per_row, horizon)

    out: dict[str, np.ndarray] = {}
    notes: list[str] = []
    name = f"{token_run.workload}/{token_run.run}"
    if predictor is not None and not has_call_sites(table):  # the questions' network reads them
        notes.append(f"{name}: this trace has {NO_CALL_SITES}")
    if predictor is not None:
        top = answers.top_for(token_run) if answers is not None else None
        if top is None and predictor.model is not None:
            # deferred: imported on first use, for start-up time
            from tasks.learning.nextcall.model import predict_positions

            top = predict_positions(
                predictor.model, token_run, predictor.context, predictor.batch_size
            ).top
            if answers is not None:
                notes.append(f"{name}: `model` answered here (not the calls it was evaluated on)")
        if top is not None:
            keep("model", top)
        else:
            notes.append(f"no `model` predictor: {predictor.error}")
        soon = answers.soon_for(table) if answers is not None else None
        if soon is None and predictor.questions is not None:
            # deferred: imported on first use (TensorFlow), for start-up time
            from tasks.learning.questions.network import soon_probability

            soon = soon_probability(table, predictor.questions, run.frames)
            if answers is not None:
                notes.append(
                    f"{name}: `questions` answered here (not the calls it was evaluated on)"
                )
        if soon is not None:
            out["questions"] = keep_soon(soon)
        else:
            notes.append(f"no `questions` predictor: {predictor.questions_error}")
    keep("online", OnlineCounter().predict(token_run, run.positions).top)
    out[THREAD_FUTURE] = reuse_labels(table, horizon=GUIDED_HORIZON)
    return out, notes


def replay_events(
    scored: ScoredRun,
    policies: list[_Policy],
    predictor: Predictor | None,
    horizon: int,
    answers: RunAnswers | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """One run's table through `policies`; the guided ones once per predictor."""

    table, workload, run = scored.table, scored.tokens.workload, scored.tokens.run
    x = prepare(table, workload, run)  # once: every sweep below shares it (and its baseline)
    plain = [p for p in policies if not isinstance(p, GuidedConfig)]
    guided = [p for p in policies if isinstance(p, GuidedConfig)]
    notes: list[str] = []
    scores = None
    if any(isinstance(p, LayerGuidedConfig) and p.table for p in plain):
        scores, why = predictor.class_scores() if predictor is not None else (None, None)
        if why:
            notes.append(why)
        if keyed(scores):  # the layer asks the frees' call sites
            with_call_sites(x, table)  # -1 without callers: the counter (NO_CALL_SITES noted)
        contexts = getattr(scores, "contexts", None)
        if contexts is not None:
            # a format 4 table asks each free's block's allocation context first; a run
            # without stacks has none, and its frees ask the sites, then the counter
            with_allocation_contexts(x, table, scored.frames, contexts.depth)
            if scored.frames is None or len(scored.frames) == 0:
                notes.append(
                    f"{workload}/{run}: no stacks read: the table's context entries answered "
                    "no free (sites, then the counter)"
                )
    frames = [sweep_run(x, plain, workload=workload, run=run, class_scores=scores)]
    if guided:
        preds, more = predictions_for(scored, predictor, horizon, answers)
        notes += more  # after the table's
        for name, keep in preds.items():
            frames.append(
                sweep_run(x, guided, workload=workload, run=run, predictions=keep, predictor=name)
            )
    return pd.concat(frames, ignore_index=True), notes


@task(
    name="whatif-replay-run",
    task_run_name="whatif-{workload}-{run}",
    cache_policy=NO_CACHE,
)
def replay_run(
    root: Root,
    workload: str,
    run: str,
    params: WhatifParams,
    predictor: Predictor | None = None,
    max_tokens: int | None = None,
) -> RunReplay:
    """One run through the grid; its events missing or unreadable: a RunReplay with the error.
    `max_tokens`: the run is replayed as the model's evaluation scored it (the rows of its first
    max_tokens calls, tasks.dataset.token_runs.head_rows), so the evaluation's answers apply."""

    try:
        # Read once: the simulator's table and the model's tokens are the same rows.
        extra = QUESTIONS_COLUMNS if predictor is not None else ()
        columns = (*EVENTS_COLUMNS, "token", *extra)
        scored = read_scored_run(
            root, workload, run, columns, max_tokens, part_column=PART, stacks=bool(extra)
        )
    except Exception as err:  # noqa: BLE001 - named in the artifact; the other runs go on
        return RunReplay(workload, run, error=f"{type(err).__name__}: {err}"[:500])
    answers, notes = None, []
    if predictor is not None and predictor.run_id and not params.recompute:
        # deferred: imported on first use (MLflow), for start-up time
        from tasks.registry.answer_artifacts import fetch_answers

        answers, why = fetch_answers(predictor.run_id, workload, run)
        if answers is None:
            notes.append(f"{workload}/{run}: the networks answered here ({why})")
    rows, more = replay_events(scored, params.grid(), predictor, params.horizon, answers)
    return RunReplay(workload, run, rows=rows, notes=notes + more)


# ----------------------------------------------------------------------------- results


def results_table(replays: list[RunReplay], ref: ModelRef) -> pd.DataFrame:
    frames = [r.rows for r in replays if r.ok and r.rows is not None and len(r.rows)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df["model_name"] = ref.name
    df["model_version"] = ref.version
    df["model_run_id"] = ref.run_id
    df["created_at"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return df


def table_path(root: Root, ref: ModelRef) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in ref.name)
    return root.join("whatif", f"{safe}-v{ref.version}.parquet")


@task(name="whatif-write-table", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def write_table(root: Root, replays: list[RunReplay], ref: ModelRef) -> str:
    """The rows of every replayed run under <root>/whatif/ (atomic, see TABLE); its URL."""

    df = results_table(replays, ref)
    final = table_path(root, ref)
    folder, name = final.rsplit("/", 1)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    fs = root.fs
    fs.makedirs(folder, exist_ok=True)
    with fs.open(tmp, "wb") as f:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), f)
    fs.mv(tmp, final)
    return root.url_of("whatif", name)


def policy_labels(df: pd.DataFrame) -> np.ndarray:
    """Per row: the policy, guided_<predictor> (priority mode) or guided_admit_<predictor>;
    belady, which reads every request's future, as BELADY (named optimistic); the layer's
    guided policy as layer_guided[_table][_regret] (LayerGuidedConfig.label); a stored table's
    former names (RENAMED_POLICIES) as the policies' names now."""
    df = df.assign(policy=df["policy"].replace(RENAMED_POLICIES))
    config = df["config"].astype(str)
    admit = config.str.contains('"mode":"admit"', regex=False)
    prefix = np.where(admit, "guided_admit_", "guided_")
    layer = (
        "layer_guided"
        + np.where(config.str.contains('"table":true', regex=False), "_table", "")
        + np.where(config.str.contains('"regret":true', regex=False), "_regret", "")
    )
    policy = np.where(df["policy"] == "belady", BELADY, df["policy"])
    policy = np.where(df["policy"] == "layer_guided", layer, policy)
    return np.where(df["policy"] == "guided", prefix + df["predictor"].astype(str), policy)


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, policy label, config): the figures pooled over runs (see
    docs/whatif.md#the-representative-config); workload ALL pools every run. `label`: the policy, guided_<predictor> for
    guided rows."""
    if df.empty:
        return df
    df = df.assign(
        label=policy_labels(df),
        hits_f=df["hit_rate"] * df["allocations"],
        wr=df["workload"] + "/" + df["run"],
    )
    both = pd.concat([df, df.assign(workload=ALL)], ignore_index=True)
    g = both.groupby(["workload", "label", "config"], sort=False)
    out = g.agg(
        hits_f=("hits_f", "sum"),
        allocations=("allocations", "sum"),
        idle_bytes_mean=("idle_bytes_mean", "mean"),
        idle_bytes_peak=("idle_bytes_peak", "max"),
        peak_footprint=("peak_footprint", "max"),
        live_peak=("live_peak", "max"),
        fault_bytes_avoided=("fault_bytes_avoided", "sum"),
        param=("param", "first"),
        runs=("wr", "nunique"),
    ).reset_index()
    out["hit_rate"] = np.where(
        out["allocations"] > 0, out["hits_f"] / out["allocations"].clip(1), 0.0
    )
    return out.drop(columns="hits_f")


def representatives(pool: pd.DataFrame, budget: float) -> pd.DataFrame:
    """Per (workload, label): the representative config (the rule: docs/whatif.md),
    with `over_budget`; plus a `best_heuristic` row per workload."""
    if pool.empty:
        return pool
    # the oracle's row is its bound at exactly the budget (WhatifParams.grid adds that config)
    exact = (pool["label"] == "oracle") & (pool["param"] == float(budget))
    has_exact = pool["workload"].isin(pool.loc[exact, "workload"])
    pool = pool[~((pool["label"] == "oracle") & has_exact & ~exact)]
    pool = pool.assign(over_budget=pool["idle_bytes_mean"] > budget)
    # under budget first, then the highest hit rate, then the fewest idle bytes; a policy with
    # nothing under the budget falls back to its config with the fewest idle bytes
    key = np.where(pool["over_budget"], -pool["idle_bytes_mean"], pool["hit_rate"])
    ranked = pool.assign(_under=~pool["over_budget"], _key=key, _idle=-pool["idle_bytes_mean"])
    ranked = ranked.sort_values(["_under", "_key", "_idle"], ascending=False, kind="stable")
    best = ranked.groupby(["workload", "label"], sort=False).head(1)
    heur = best[best["label"].isin(HEURISTICS)].sort_values(
        ["over_budget", "hit_rate", "idle_bytes_mean"], ascending=[True, False, True], kind="stable"
    )
    top_heur = (
        heur.groupby("workload", sort=False)
        .head(1)
        .assign(label="best_heuristic", heuristic=lambda d: d["config"].map(_kind))
    )
    rep = pd.concat([best, top_heur], ignore_index=True).drop(columns=["_under", "_key", "_idle"])
    oracle = rep[rep["label"] == "oracle"].set_index("workload")["hit_rate"]
    rep["oracle_gap"] = rep["workload"].map(oracle) - rep["hit_rate"]
    order = {p: i for i, p in enumerate(POLICY_ORDER)}
    rep["_o"] = rep["label"].map(order).fillna(len(order))
    rep["_w"] = rep["workload"] == ALL
    return rep.sort_values(["_w", "workload", "_o"], kind="stable").drop(columns=["_o", "_w"])


def at_budget(rep: pd.DataFrame) -> list[AtBudget]:
    """Per workload of `representatives(...)`: the best heuristic, guided_model and the oracle."""
    out: list[AtBudget] = []
    if rep.empty:
        return out
    for w, g in rep.groupby("workload", sort=False):  # a handful of workloads
        hit = dict(zip(g["label"], g["hit_rate"].astype(float), strict=True))
        best = g[g["label"] == "best_heuristic"]
        out.append(
            AtBudget(
                workload=str(w),
                best_heuristic=str(best["heuristic"].iloc[0]) if len(best) else None,
                best_heuristic_hit_rate=hit.get("best_heuristic"),
                guided_hit_rate=hit.get("guided_model"),
                questions_hit_rate=hit.get("guided_questions"),
                oracle_hit_rate=hit.get("oracle"),
                layer_guided_hit_rate=hit.get("layer_guided"),
            )
        )
    return out


def pooled_by_budget(pooled_df: pd.DataFrame, budgets=SWEEP_BUDGETS) -> list[AtBudget]:
    """The pooled (`all`) answer at each budget, from `pooled(results)`: which policy wins
    depends on it, and above what keeping everything holds idle they all tie."""
    out = []
    for b in budgets:
        pooled_at = [a for a in at_budget(representatives(pooled_df, b)) if a.workload == ALL]
        out += [a.model_copy(update={"budget": int(b)}) for a in pooled_at]
    return out


def _kind(config: str) -> str:
    return current_policy(json.loads(config).get("kind", "?"))


POLICY_COLUMNS = ("workload", "label", "config", "over_budget", "runs", *METRICS, "oracle_gap")


def policy_rows(rep: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (workload, policy): the representative config and its figures (the table
    `whatif/policies.json`); the oracle's row holds its hit rate only."""
    if rep.empty:
        return []
    df = rep[list(POLICY_COLUMNS)].rename(columns={"label": "policy"})
    figures = [m for m in (*METRICS, "oracle_gap") if m != "hit_rate"]
    df[figures] = df[figures].astype(float)
    df.loc[df["policy"] == "oracle", figures] = np.nan
    df = df.astype({"over_budget": bool, "runs": int})
    # NaN -> None, numpy -> plain; every digit a float64 has
    return json.loads(df.to_json(orient="records", double_precision=15))


def whatif_headline(rep: pd.DataFrame, params: WhatifParams) -> WhatifHeadline | None:
    """Guided by the model against the best heuristic over all runs; None when nothing ran."""
    if rep.empty:
        return None
    at_all = rep[rep["workload"] == ALL].set_index("label")
    if "best_heuristic" not in at_all.index:
        return None
    # the model's guided policy, named optimistic when it read predictions made after the free
    name = "guided_model" if params.horizon <= 1 else f"guided_model{OPTIMISTIC}"

    # a guided policy with no config under the budget is not compared at it: no figure
    def under_budget(label: str) -> float | None:
        ok = label in at_all.index and not at_all.at[label, "over_budget"]
        return float(at_all.at[label, "hit_rate"]) if ok else None

    return WhatifHeadline(
        horizon=params.horizon,
        idle_budget=params.idle_budget,
        best_heuristic=float(at_all.at["best_heuristic", "hit_rate"]),
        guided_model=under_budget(name),
        guided_questions=under_budget("guided_questions"),
    )


def _bytes(v: float) -> str:
    v = float(v)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return f"{v}"


def _param(r) -> str:
    cfg = json.loads(r.config)
    cfg.pop("kind", None)
    text = ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)
    if r.label == "best_heuristic":
        text = f"{r.heuristic}: {text}"
    return text + (" (over budget)" if r.over_budget else "")


def _markdown_intro(ref: ModelRef, params: WhatifParams, table_url: str | None) -> list[str]:
    """The summary's opening: the model, how the policies are compared and what each is, which
    calls each run is replayed on, where the answers come from, where the full table is."""
    lines = [
        f"# whatif: allocator caching with {ref.name} v{ref.version}",
        "",
        f"Model run `{ref.run_id}`. Each policy at its best hit rate with at most "
        f"{_bytes(params.idle_budget)} held idle (time-weighted mean per run). Guided policies "
        "release first the freed blocks whose class is not predicted: "
        + (
            "`model` and `online` (this model's and the online counter's top-5) decide at the "
            "free from the prediction made at the free for the thread's next call (causal: "
            "what a live cache has). "
            if params.horizon == CAUSAL_HORIZON
            else f"`model_optimistic` and `online_optimistic` read the predictions made at the "
            f"{params.horizon} calls after the free, which a live cache has only later "
            "(OPTIMISTIC). "
        )
        + "largest, pools and layer_guided* are the policies heapcast's layer runs, decided "
        "by its own code (the policy core): layer_guided keeps a block when its online counter "
        "(the thread's calls on blocks >= 128 KiB) puts the class in its top-2 within 4 calls, "
        "_regret lets the process's regrets overrule it, _table asks this version's class table "
        "instead (where it logged one); the clock and threads' timing are the trace's "
        f"(tasks.whatif.policy_core.UNTOLD_BY_A_TRACE). `{THREAD_FUTURE}`: the true next "
        f"{GUIDED_HORIZON} calls of the freeing thread "
        "(OPTIMISTIC: it reads the future; not an upper bound, the cache serves the whole "
        "process). Rows named *_optimistic are not achievable by a live cache. Oracle: the "
        "bound no policy passes at that budget. Page-fault bytes avoided: against no cache "
        "(the fault model in tasks/whatif/simulate.py).",
        "",
    ]
    if ref.max_eval_tokens is not None:
        lines += [
            f"Each run is replayed as the model's evaluation scored it: the calls of its first "
            f"{ref.max_eval_tokens:,} tokens (data.max_eval_tokens of the model's config; a "
            "small version of the runs).",
            "",
        ]
    lines += [
        "The `model` and `questions` answers are those the evaluation made on the same calls "
        "and logged with the version (answers/), unless a note below says they were computed "
        "here" + (" (params.recompute: computed here)." if params.recompute else "."),
        "",
    ]
    if table_url:
        lines += [f"Every config of every run: `{table_url}`.", ""]
    return lines


def _workload_table(w: str, g: pd.DataFrame) -> list[str]:
    """One workload's table: each policy at its best within the idle budget, the oracle's
    bound."""
    runs = int(g["runs"].max())
    lines = [
        f"## {w} ({runs} run{'s' if runs != 1 else ''})",
        "",
        "| policy | config | hit rate | idle mean | idle peak | peak footprint (live peak) "
        "| fault bytes avoided | gap to oracle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in g.itertuples(index=False):
        if r.label == "oracle":
            lines.append(
                f"| oracle (bound) | budget={_bytes(r.param)} | {r.hit_rate:.4f} | | | | | |"
            )
            continue
        name = f"**{r.label}**" if r.label.startswith(("guided", "best")) else r.label
        lines.append(
            f"| {name} | {_cell(_param(r))} | {r.hit_rate:.4f} | {_bytes(r.idle_bytes_mean)} "
            f"| {_bytes(r.idle_bytes_peak)} | {_bytes(r.peak_footprint)} "
            f"({_bytes(r.live_peak)}) | {_bytes(r.fault_bytes_avoided)} | "
            f"{r.oracle_gap:+.4f} |"
        )
    lines.append("")
    return lines


def summary_markdown(
    rep: pd.DataFrame,
    replays: list[RunReplay],
    ref: ModelRef,
    params: WhatifParams,
    table_url: str | None,
) -> str:
    lines = _markdown_intro(ref, params, table_url)
    failed = [r for r in replays if not r.ok]
    if failed:
        lines += ["## Runs not replayed", "", "| run | why |", "|---|---|"]
        lines += [f"| {r.workload}/{r.run} | {_cell(r.error or '')} |" for r in failed]
        lines.append("")
    notes = sorted({n for r in replays for n in r.notes})
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    if rep.empty:
        lines.append("No run could be replayed.")
        return "\n".join(lines) + "\n"
    for w, g in rep.groupby("workload", sort=False):
        lines += _workload_table(w, g)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:400]


@task(name="whatif-summarize", cache_policy=NO_CACHE)
def summarize(
    replays: list[RunReplay], ref: ModelRef, params: WhatifParams, table_url: str | None
) -> WhatifSummary:
    df = results_table(replays, ref)
    pooled_df = pooled(df)
    rep = representatives(pooled_df, params.idle_budget)
    head = whatif_headline(rep, params)
    return WhatifSummary(
        model_name=ref.name,
        model_version=ref.version,
        model_run_id=ref.run_id,
        table_url=table_url,
        runs_ok=[f"{r.workload}/{r.run}" for r in replays if r.ok],
        runs_failed={f"{r.workload}/{r.run}": r.error or "failed" for r in replays if not r.ok},
        idle_budget=params.idle_budget,
        metrics={} if head is None else headline_metrics(head),
        policies=policy_rows(rep),
        at_budget=at_budget(rep),
        by_budget=pooled_by_budget(pooled_df),
        markdown=summary_markdown(rep, replays, ref, params, table_url),
    )


@task(name="whatif-log-mlflow", retries=2, retry_delay_seconds=[10, 30], cache_policy=NO_CACHE)
def log_to_mlflow(
    summary: WhatifSummary, replays: list[RunReplay], tracking: TrackingConfig
) -> None:
    """The headline metrics, the Pareto plot, the markdown and the tables on the version's run
    (whatif/)."""

    client = _client(tracking)
    # deferred: imported on first use, for start-up time
    from mlflow.entities import Metric  # deferred for start-up time

    run_id = summary.model_run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in summary.metrics.items()]
    for i in range(0, len(metrics), 500):  # MLflow's batch limit is 1000 metrics
        client.log_batch(run_id, metrics=metrics[i : i + 500])
    frames = [r.rows for r in replays if r.ok and r.rows is not None and len(r.rows)]
    with tempfile.TemporaryDirectory(prefix="heapcast-whatif-") as tmp:
        folder = Path(tmp)
        (folder / "whatif.md").write_text(summary.markdown)
        if frames:
            df = pd.concat(frames, ignore_index=True)
            plot = df.assign(policy=policy_labels(df))
            pareto_plot(
                plot, folder / "pareto.png", title=f"{summary.model_name} v{summary.model_version}"
            )
            df.to_csv(folder / "whatif.csv", index=False)
        client.log_artifacts(run_id, str(folder), "whatif")
        if frames:
            log_table(client, run_id, df, "whatif/grid.json")
    log_table(client, run_id, pd.DataFrame(summary.policies), "whatif/policies.json")
    for k, v in summary.metrics.items():  # what the predictions bought, on the version page
        client.set_model_version_tag(
            summary.model_name, summary.model_version, "heapcast." + k.removeprefix(PREFIX), repr(v)
        )
    client.set_tag(run_id, "heapcast.whatif", summary.table_url or "")


@task(name="whatif-publish", cache_policy=NO_CACHE)
def publish(summary: WhatifSummary) -> str:
    """The page as the Prefect markdown artifact `whatif`."""

    create_markdown_artifact(
        markdown=summary.markdown,
        key=ARTIFACT_KEY,
        description=f"whatif: allocator policies with {summary.model_name} v{summary.model_version}",
    )
    return summary.markdown


def whatif_plan(
    root: Root, model: RegisteredModel | None, quick: bool = False
) -> WhatifParams | str:
    """The nightly's whatif step: parameters for tonight's registered model (its version, its
    evaluation runs; the quick night: the smallest of each workload's), or why it is skipped."""
    if model is None:
        return "no model was trained tonight"
    runs = list(model.evaluation_runs)
    if quick:
        runs = smallest_run_per_workload(root, runs)
    return WhatifParams(root=root.url, model=model.version, runs=[f"{w}/{r}" for w, r in runs])


def smallest_run_per_workload(root: Root, runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One run of each workload, the one with the fewest events (its conversion summary's rows;
    the first listed when none says), in the order given. The quick night replays these: every
    workload still has its line, at about 40% less replay time than all 8 evaluation runs
    (measured 122 -> ~75 s)."""
    rows = {
        (r.workload, r.run): int(r.summary.get("rows", 0)) if r.summary else None
        for r in list_runs(root, {w for w, _ in runs})
    }
    best: dict[str, tuple[str, str]] = {}
    for w, r in runs:
        held = best.get(w)
        n, m = rows.get((w, r)), rows.get(held) if held else None
        if held is None or (n is not None and (m is None or n < m)):
            best[w] = (w, r)
    return [run for run in runs if best.get(run[0]) == run]
