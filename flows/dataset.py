"""Flow `dataset`: convert every raw run without up-to-date events (or those named) to Parquet."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from tasks.config import StrictModel, default_root
from tasks.dataset import RunRef, convert_run, runs_to_convert, summary_markdown
from tasks.storage import Root


class DatasetParams(StrictModel):
    """What to convert, where, and on which Dask cluster."""

    root: str = Field(default_factory=default_root, description="data root: folder or s3:// URL")
    workloads: list[str] | None = Field(None, description="only these workloads (default: all)")
    runs: list[str] | None = Field(None, description="only these runs: `run` or `workload/run`")
    scheduler: str | None = Field(None, description="Dask scheduler address; local cluster if unset")
    force: bool = Field(False, description="convert even runs whose events are up to date")


@task(retries=2, retry_delay_seconds=5)
def find_runs(params: DatasetParams) -> list[RunRef]:
    """Runs with raw traces and no up-to-date events."""
    return runs_to_convert(Root.from_url(params.root), params.workloads, params.runs,
                           params.force)


@task(retries=1, retry_delay_seconds=10, task_run_name="convert-{run.workload}-{run.run}")
def convert(run: RunRef, root: str, scheduler: str | None = None) -> dict[str, Any]:
    """Convert one run's raw traces into its events partition; returns the run's summary."""
    return convert_run(Root.from_url(root), run, scheduler=scheduler)


@task
def publish_summary(summary: dict[str, Any]) -> None:
    """The run's summary as a Markdown artifact."""
    key = "events-" + "".join(c if c.isalnum() else "-"
                              for c in f"{summary['workload']}-{summary['run']}".lower())
    create_markdown_artifact(markdown=summary_markdown(summary), key=key[:100],
                             description=f"events of {summary['workload']}/{summary['run']}")


@flow(name="dataset")
def dataset(params: DatasetParams = DatasetParams()) -> list[dict[str, Any]]:
    """Convert runs to the events dataset; one summary per converted run."""
    runs = find_runs(params)
    summaries = [convert(run, params.root, params.scheduler) for run in runs]
    for s in summaries:
        publish_summary(s)
    return summaries


if __name__ == "__main__":
    dataset()
