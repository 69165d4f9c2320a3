"""The heap reports of a night and of a training run.

- `report_night` (a Prefect task, run by the nightly after training): one HTML page per
  evaluation run of tonight's model (the runs of every evaluation table: unseen runs, unseen
  programs, held-out workloads), written under the data root as
  `<root>/reports/<night>/<workload>-<run>.html`, and their headline figures (heap calls, peak
  live bytes, leaks, processes) as a `NightReports`, which the `nightly-summary` shows. A run
  whose report fails is named with the reason; it never fails the night.
- `training_report` (called by tasks/registry/register.py): the page of the model's first
  training run, which registration logs as the MLflow artifact `report/<workload>-<run>.html`.

Pages are made by `summary.make_report` (the same page as `heapcast report WORKLOAD/RUN`).
"""

from __future__ import annotations

import datetime as _dt
import tempfile
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE as NO_CACHE
from pydantic import BaseModel, Field

from tasks.learning.outcome import outcome_parts

REPORTS_DIR = "reports"  # under the data root, next to raw/ and events/
# The evaluation tables of tasks.learning.evaluate.TABLES, and the DatasetRef field of each
# (not imported from there: that module pulls numpy-heavy learning code into the summary).
EVAL_TABLES = (
    ("unseen_runs", "eval_runs"),
    ("unseen_programs", "unseen_program_runs"),
    ("heldout_workloads", "heldout_runs"),
)


class RunReport(BaseModel):
    """One run's page and the figures the summary shows."""

    run: str  # workload/run
    table: str  # the evaluation table the run is in (one of EVAL_TABLES)
    path: str  # the page: a local path, or a URL under a remote data root
    events: int
    peak_bytes: int
    leaks: int  # blocks never freed
    leak_bytes: int
    processes: int  # process images (an exec starts a new one with the pid kept)
    warnings: list[str] = Field(default_factory=list)  # e.g. a corrupt file skipped


class NightReports(BaseModel):
    """The night's pages: written, failed (run -> why), or none at all and why."""

    folder: str = ""
    reports: list[RunReport] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    skipped: str | None = None

    def markdown(self) -> str:
        from tasks.report.page import fmt_bytes

        if self.skipped:
            return f"No heap reports tonight: {self.skipped}."
        lines = [f"One page per evaluation run, in `{self.folder}`.", ""]
        if self.reports:
            lines += [
                "| run | table | heap calls | peak live | leaked | processes | report |",
                "|---|---|---:|---:|---:|---:|---|",
            ]
            for r in self.reports:
                warn = f" ({len(r.warnings)} warning(s))" if r.warnings else ""
                lines.append(
                    f"| {r.run} | {r.table} | {r.events:,} | {fmt_bytes(r.peak_bytes)} | "
                    f"{r.leaks:,} blocks, {fmt_bytes(r.leak_bytes)} | {r.processes} | "
                    f"`{r.path}`{warn} |"
                )
        if self.failed:
            lines += ["", "Reports that failed (the night went on):", ""]
            lines += [f"- {run}: {' '.join(why.split())[:400]}" for run, why in self.failed.items()]
        return "\n".join(lines)


def evaluation_runs(dataset: Any) -> list[tuple[str, str, str]]:
    """(workload, run, table) of every run a DatasetRef evaluated on, each once, table order."""
    out: dict[tuple[str, str], str] = {}
    for table, attr in EVAL_TABLES:
        for w, r in getattr(dataset, attr, ()) or ():
            out.setdefault((w, r), table)
    return [(w, r, t) for (w, r), t in out.items()]


def page_name(workload: str, run: str) -> str:
    return f"{workload}-{run}.html"


def night_name(now: _dt.datetime | None = None) -> str:
    """The folder of tonight's pages: the UTC time the reports were made (sorts by night)."""
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y-%m-%dT%H%M%SZ")


def write_run_report(root: Any, workload: str, run: str, dest: str, table: str = "") -> RunReport:
    """The page of `workload/run` under `root` (a tasks.core.storage.Root), written at `dest`
    (a path inside root.fs); raises what make_report raises when the run cannot be read."""
    from tasks.report.summary import make_report

    if root.is_local:
        res = make_report(f"{workload}/{run}", dest, root=root.url)
        where = dest
    else:  # made locally, then copied: make_report writes local files only
        with tempfile.TemporaryDirectory(prefix="heapcast-report-") as tmp:
            res = make_report(
                f"{workload}/{run}", Path(tmp) / page_name(workload, run), root=root.url
            )
            root.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            root.fs.put_file(str(res.html_path), dest)
        where = f"{root.url.split('://', 1)[0]}://{dest}"
    rep = res.reports[0]
    return RunReport(
        run=f"{workload}/{run}",
        table=table,
        path=str(where),
        events=rep.events,
        peak_bytes=rep.peak_bytes,
        leaks=rep.leaks,
        leak_bytes=rep.leak_bytes,
        processes=len(rep.processes),
        warnings=list(res.warnings),
    )


def report_evaluation_runs(root_url: str, dataset: Any, night: str | None = None) -> NightReports:
    """A page per evaluation run of `dataset` (a DatasetRef) under `<root>/reports/<night>/`.
    A run whose page fails is in `failed` with the reason; the others are written."""
    from tasks.core.storage import Root

    root = Root.from_url(root_url)
    night = night or night_name()
    folder = root.join(REPORTS_DIR, night)
    out = NightReports(folder=folder if root.is_local else root.url_of(REPORTS_DIR, night))
    runs = evaluation_runs(dataset)
    if not runs:
        out.skipped = "tonight's training evaluated on no run"
        return out
    if root.is_local:
        Path(folder).mkdir(parents=True, exist_ok=True)
    for w, r, table in runs:
        dest = f"{folder}/{page_name(w, r)}"
        try:
            out.reports.append(write_run_report(root, w, r, dest, table))
        except Exception as err:  # any failure is this run's alone: the night goes on
            out.failed[f"{w}/{r}"] = f"{type(err).__name__}: {err}"
    return out


def dataset_of(value: Any) -> Any:
    """The DatasetRef of a train flow's return value (tasks.learning.outcome.outcome_parts),
    or None."""
    for c in outcome_parts(value):
        d = getattr(c, "dataset", None)
        if d is not None and hasattr(d, "eval_runs"):
            return d
    return None


@task(name="report-evaluation-runs", cache_policy=NO_CACHE)
def report_night(root: str, trained: Any, night: str | None = None) -> NightReports:
    """The heap report of each evaluation run of the train stage's model (`trained`: the
    nightly's StageOutcome for `train`). Never raises: the summary says what failed."""
    if not getattr(trained, "ok", False):
        return NightReports(skipped="no model was trained tonight")
    dataset = dataset_of(getattr(trained, "value", None))
    if dataset is None:
        return NightReports(skipped="the train stage returned no dataset")
    try:
        return report_evaluation_runs(root, dataset, night)
    except Exception as err:  # e.g. the data root cannot be written: the night goes on
        return NightReports(skipped=f"the reports failed: {type(err).__name__}: {err}")


def training_report(dataset: Any, folder: Path) -> Path:
    """The page of the first training run of `dataset` (a DatasetRef), written in `folder`
    (local). One run, not all: the page is made inside registration, which the quick night
    must keep short; the nightly's own pages cover the evaluation runs. Raises when the run
    cannot be read (registration logs the reason instead)."""
    from tasks.report.summary import make_report

    if not dataset.train_runs:
        raise ValueError("the model has no training run")
    w, r = dataset.train_runs[0]
    return make_report(f"{w}/{r}", Path(folder) / page_name(w, r), root=dataset.root).html_path
