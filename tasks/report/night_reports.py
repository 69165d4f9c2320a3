"""The heap reports of a night and of a training run.

- `report_night` (a Prefect task, run by the nightly after training): one HTML page per
  evaluation run of tonight's model, under `<root>/reports/<night>/<workload>-<run>.html`, and
  their headline figures as a `NightReports`, which the `nightly-summary` shows. A run whose
  report fails is named with the reason; it never fails the night. The night's folder holds one
  copy of plotly.js; `prune_nights` deletes the oldest night folders beyond `keep_nights`.
- `report_training_run` (a Prefect task, run by the `train` flow before registration): the page
  of the model's first training run, self-contained (plotly.js inlined), logged by registration
  as the MLflow artifact `report/<workload>-<run>.html`.

Pages are made by `summary.make_report` (the same page as `heapcast report WORKLOAD/RUN`). Why
the two shapes: docs/report.md#a-nights-reports.
"""

from __future__ import annotations

import datetime as _dt
import posixpath
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE as NO_CACHE
from pydantic import BaseModel, Field

from tasks.core.storage import Root
from tasks.learning.outcome import DatasetRef, RegisteredModel
from tasks.report.page import PLOTLY_JS, fmt_bytes, plotly_js
from tasks.report.summary import make_report

REPORTS_DIR = "reports"  # under the data root, next to raw/ and events/
# The evaluation tables of tasks.learning.evaluate.TABLES (not imported from there: that module
# pulls numpy-heavy learning code into the summary).
EVAL_TABLES = ("unseen_runs", "unseen_programs", "heldout_workloads")
NIGHT_FORMAT = "%Y-%m-%dT%H%M%SZ"  # a night folder's name: the UTC time its reports were made
_NIGHT_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{6}Z")
KEEP_NIGHTS = 14  # night folders kept under reports/ (the nightly's `reports_keep_nights`)


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
    pruned: list[str] = Field(default_factory=list)  # older night folders deleted tonight
    prune_failed: str | None = None  # why the older nights could not be deleted

    def markdown(self) -> str:
        if self.skipped:
            return "\n".join([f"No heap reports tonight: {self.skipped}.", *self._retention()])
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
        return "\n".join([*lines, *self._retention()])

    def _retention(self) -> list[str]:
        out = []
        if self.pruned:
            names = ", ".join(f"`{posixpath.basename(p)}`" for p in self.pruned)
            out.append(f"Older nights deleted (retention): {names}.")
        if self.prune_failed:
            out.append(f"The older nights could not be deleted: {self.prune_failed}")
        return ["", *out] if out else []


def evaluation_runs(model: RegisteredModel) -> list[tuple[str, str, str]]:
    """(workload, run, table) of every run a registered model was evaluated on, each once,
    table order."""
    out: dict[tuple[str, str], str] = {}
    tables = (model.eval_runs, model.unseen_program_runs, model.heldout_runs)
    for table, runs in zip(EVAL_TABLES, tables, strict=True):
        for w, r in runs:
            out.setdefault((w, r), table)
    return [(w, r, t) for (w, r), t in out.items()]


def page_name(workload: str, run: str) -> str:
    return f"{workload}-{run}.html"


def night_name(now: _dt.datetime | None = None) -> str:
    """The folder of tonight's pages: the UTC time the reports were made (sorts by night)."""
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime(NIGHT_FORMAT)


def night_time(name: str) -> _dt.datetime | None:
    """The time of the night folder `name`, or None when the name is not a night's (exactly
    NIGHT_FORMAT, a real date and time): such a folder is not the night's to delete."""
    if not _NIGHT_NAME.fullmatch(name):
        return None
    try:
        return _dt.datetime.strptime(name, NIGHT_FORMAT)
    except ValueError:  # e.g. month 13: the shape of a night, but not one
        return None


def prune_nights(root: Root, keep: int, tonight: str | None = None) -> list[str]:
    """Delete the night folders under `<root>/reports/` older than the newest `keep` (tonight's
    is never deleted); anything whose name is not a night's is left alone. Returns the deleted
    folders (paths inside root.fs), oldest first."""
    if keep < 1:
        raise ValueError(f"keep_nights is {keep}: keep at least 1 night (tonight's)")
    fs = root.fs
    folder = root.join(REPORTS_DIR)
    fs.invalidate_cache(folder)  # S3 listings are cached: tonight's folder is new
    if not fs.exists(folder):
        return []
    nights = []
    for entry in fs.ls(folder, detail=True):
        name = posixpath.basename(entry["name"].rstrip("/"))
        when = night_time(name)
        if entry["type"] == "directory" and when is not None:
            nights.append((when, entry["name"].rstrip("/"), name))
    nights.sort(reverse=True)  # newest first
    old = [path for _, path, name in nights[keep:] if name != tonight]
    for path in reversed(old):
        fs.rm(path, recursive=True)
    return old[::-1]


def write_shared_plotly(root: Root, folder: str) -> str:
    """plotly.js once in `folder` (a path inside root.fs), for the pages written there to load;
    returns its path."""
    dest = posixpath.join(folder, PLOTLY_JS)
    root.fs.makedirs(folder, exist_ok=True)
    root.fs.pipe_file(dest, plotly_js().encode())
    return dest


def write_run_report(root: Root, workload: str, run: str, dest: str, table: str = "") -> RunReport:
    """The page of `workload/run` under `root`, written at `dest` (a path inside root.fs),
    loading plotly.js from the shared copy next to it (`write_shared_plotly`); raises what
    make_report raises when the run cannot be read."""
    spec = f"{workload}/{run}"
    if root.is_local:
        res = make_report(spec, dest, root=root, plotly_src=PLOTLY_JS)
        where = dest
    else:  # made locally, then copied: make_report writes local files only
        with tempfile.TemporaryDirectory(prefix="heapcast-report-") as tmp:
            local = Path(tmp) / page_name(workload, run)
            res = make_report(spec, local, root=root, plotly_src=PLOTLY_JS)
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


def report_evaluation_runs(
    root: Root, model: RegisteredModel, night: str | None = None
) -> NightReports:
    """A page per evaluation run of `model` under `<root>/reports/<night>/`. A run whose page
    fails is in `failed` with the reason; the others are written."""
    night = night or night_name()
    folder = root.join(REPORTS_DIR, night)
    out = NightReports(folder=folder if root.is_local else root.url_of(REPORTS_DIR, night))
    runs = evaluation_runs(model)
    if not runs:
        out.skipped = "tonight's training evaluated on no run"
        return out
    write_shared_plotly(root, folder)
    for w, r, table in runs:
        dest = f"{folder}/{page_name(w, r)}"
        try:
            out.reports.append(write_run_report(root, w, r, dest, table))
        except Exception as err:  # any failure is this run's alone: the night goes on
            out.failed[f"{w}/{r}"] = f"{type(err).__name__}: {err}"
    return out


@task(name="report-evaluation-runs", cache_policy=NO_CACHE)
def report_night(
    root: Root,
    model: RegisteredModel | None,
    night: str | None = None,
    keep_nights: int = KEEP_NIGHTS,
) -> NightReports:
    """The heap report of each evaluation run of tonight's registered model (None: no model
    was trained and registered tonight), then the night folders beyond the last `keep_nights`
    deleted. Never raises: the summary says what failed."""
    night = night or night_name()
    if model is None:
        out = NightReports(skipped="no model was trained tonight")
    else:
        try:
            out = report_evaluation_runs(root, model, night)
        except Exception as err:  # e.g. the data root cannot be written: the night goes on
            out = NightReports(skipped=f"the reports failed: {type(err).__name__}: {err}")
    try:
        out.pruned = prune_nights(root, keep_nights, tonight=night)
    except Exception as err:  # the reports are written: an old folder left is not fatal
        out.prune_failed = f"{type(err).__name__}: {err}"
    return out


def training_report(root: Root, dataset: DatasetRef, folder: Path) -> Path:
    """The page of the first training run of `dataset`, written in `folder` (local). One run,
    not all: registration logs it and the quick night must stay short; the nightly's own
    pages cover the evaluation runs. Raises when the run cannot be read."""
    if not dataset.train_runs:
        raise ValueError("the model has no training run")
    w, r = dataset.train_runs[0]
    return make_report(f"{w}/{r}", Path(folder) / page_name(w, r), root=root).html_path


@dataclass(frozen=True)
class TrainingReport:
    """The training data's page for registration, or why there is none (the model does not
    depend on it: registration goes on and says why)."""

    path: Path | None
    error: str | None = None


@task(name="report-training-run", cache_policy=NO_CACHE)
def report_training_run(root: Root, dataset: DatasetRef, folder: Path) -> TrainingReport:
    """The heap report of the model's first training run, written in `folder`, for
    registration to log. Never raises: a page that cannot be made is the reason why."""
    try:
        return TrainingReport(training_report(root, dataset, folder))
    except Exception as err:  # noqa: BLE001 - named on the registered run, never fatal
        return TrainingReport(None, f"{type(err).__name__}: {err}")
