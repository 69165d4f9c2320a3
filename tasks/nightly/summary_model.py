"""The night's summary as data: `NightlySummary` (the nightly flow's return value) and its parts.

Made by `tasks/nightly/night_summary.py` (`summarize`), rendered by `tasks/nightly/terminal.py`
(`terminal_text`: one screen) and `tasks/nightly/markdown.py` (`markdown_text`: every table, the
Prefect artifact and the summary file); both open with the verdict (`tasks/nightly/verdict.py`).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tasks.allocators.report import LastAdvice
from tasks.allocators.seeds import SeedLine
from tasks.report.night_reports import NightReports
from tasks.whatif.night import AtBudget


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
    """The night in one object: each stage's end, the evaluation, the champion, what the
    predictions and the layer bought, the advice, the heap reports, where the pages are."""

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
    # the allocator's questions per evaluation table
    # (tasks/learning/questions/reuse.py: question_lines)
    allocator_questions: list[str] = Field(default_factory=list)
    # ... and per program never trained on (tasks/learning/questions/reuse.py: program_lines)
    program_questions: list[str] = Field(default_factory=list)
    # what the calling context bought the questions' counters over one frame, on unseen runs
    # (tasks/learning/questions/reuse.py: context_line); "" without stacks
    context: str = ""
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
    summary_file: str = ""  # where publish_summary writes markdown_text() (the full tables)
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

    def stage(self, name: str) -> StageReport | None:
        """The report of the stage `name`, or None when it did not run."""
        return next((st for st in self.stages if st.name == name), None)
