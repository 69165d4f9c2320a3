"""Flow `dataset`: convert every raw run without up-to-date events (or those named) to Parquet.

python -m flows.dataset                  # what is new under the data root (or `heapcast dataset`)
python -m flows.dataset sqlite3 --force  # every run of a workload, again
python -m flows.dataset --help           # the flow's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.command_line import dataset_parser as build_parser
from flows.command_line import fields, parameters
from tasks.core.storage import Root
from tasks.dataset.partitions import (
    ConversionFailed,
    DatasetParams,
    RunRef,
    conversion_outcomes,
    convert_run,
    fail_if_any,
    runs_to_convert,
    summary_markdown,
    sweep_staging,
)


@task(retries=2, retry_delay_seconds=5)
def find_runs(params: DatasetParams, root: Root) -> list[RunRef]:
    """Runs with raw traces and no up-to-date events (and what killed conversions left in
    staging, of the others, removed)."""
    runs = runs_to_convert(root, params.workloads, params.runs, params.force)
    sweep_staging(root, runs)
    return runs


@task(retries=1, retry_delay_seconds=10, task_run_name="convert-{run.workload}-{run.run}")
def convert(run: RunRef, root: Root, scheduler: str | None = None) -> dict[str, Any]:
    """Convert one run's raw traces into its events partition; returns the run's summary."""
    return convert_run(root, run, scheduler=scheduler)


@task
def publish_summary(summary: dict[str, Any]) -> None:
    """The run's summary as a Markdown artifact."""
    key = "events-" + "".join(
        c if c.isalnum() else "-" for c in f"{summary['workload']}-{summary['run']}".lower()
    )
    create_markdown_artifact(
        markdown=summary_markdown(summary),
        key=key[:100],
        description=f"events of {summary['workload']}/{summary['run']}",
    )


def convert_runs(params: DatasetParams, root: Root) -> list[dict[str, Any]]:
    """Convert runs to the events dataset; one summary per converted run. A run that fails
    does not stop the others: the flow fails at the end, naming each failed run."""
    runs = find_runs(params, root)
    states = [convert(run, root, params.scheduler, return_state=True) for run in runs]
    summaries, failures = conversion_outcomes(runs, states)
    for s in summaries:
        publish_summary(s)
    fail_if_any(failures)
    return summaries


# The same flow for a caller that has resolved the root already (the nightly).
dataset_with = flow(name="dataset")(convert_runs)


@flow(name="dataset")
def dataset(params: DatasetParams = DatasetParams()) -> list[dict[str, Any]]:
    """Convert runs to the events dataset; one summary per converted run. A run that fails
    does not stop the others: the flow fails at the end, naming each failed run."""
    return convert_runs(params, Root.from_url(params.root))  # resolved once, here


def run(args: argparse.Namespace) -> int:
    """The flow with `build_parser`'s arguments; 1 when a run could not be converted."""
    params = parameters(DatasetParams, fields(args, set(DatasetParams.model_fields)), args.prog)
    try:
        summaries = dataset(params)
    except ConversionFailed as err:  # the others were converted; the message names each failed
        print(f"{args.prog}: {err}", file=sys.stderr)
        return 1
    for s in summaries:
        print(f"{s['workload']}/{s['run']}: {s['rows']:,} events")
    if not summaries:
        print("nothing to convert: every run's events are up to date (--force converts again)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
