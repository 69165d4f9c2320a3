"""Flow `nightly`: trace, dataset, train (and register), whatif, a summary. See prefect.yaml.

Composition only. Each stage is a subflow whose final state is kept, so a failing stage does not
stop the night; the night fails at the end only when no model could be trained, and a night
whose data is broken registers nothing. The summary (tasks/nightly/night_summary.py) is the
`nightly-summary` markdown artifact and one screen in the terminal. The form's strings are
resolved once, here (`params.stages()`), into the night's `NightContext`, which every step
takes; the registered model is handed on as a `RegisteredModel`. In full:
docs/pipeline.md#the-nightly-flow.

    python -m flows.nightly --quick          # the quick subset, embedded services
    python -m flows.nightly --root s3://bucket/heapcast
    python -m flows.nightly --quick --allocators   # and the allocators stage
    python -m flows.nightly --help           # the night's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys
import time

from prefect import flow

from flows.allocators import allocators_with, seed_cases_with
from flows.command_line import fields, nested, parameters
from flows.command_line import nightly_parser as build_parser
from flows.dataset import dataset_with
from flows.trace import trace_with
from flows.train import train_with
from flows.whatif import whatif_with
from tasks.allocators import AllocatorsOutcome
from tasks.allocators.seeds import SeedsOutcome
from tasks.learning.outcome import TrainResult
from tasks.nightly.night_summary import (
    NothingTrained,
    broken_data,
    champion_version,
    finish,
    publish_summary,
    registered_model,
    skipped,
    stage_outcome,
    summarize,
)
from tasks.nightly.params import NightlyParams
from tasks.nightly.summary_model import NightlySummary
from tasks.nightly.terminal import terminal_text
from tasks.replay.replays import TraceSummary
from tasks.report.night_reports import report_night
from tasks.whatif.night import WhatifSummary, whatif_plan


@flow(name="nightly")
def nightly(params: NightlyParams = NightlyParams()) -> NightlySummary:
    """Replay the workloads, convert them, train, evaluate and register; publish the summary."""
    stages = params.stages()
    ctx = stages.context  # the night's root, tracking config and catalog, resolved once
    before = champion_version(ctx.tracking)
    traced = stage_outcome(
        "trace", trace_with(stages.trace, ctx.root, ctx.catalog, return_state=True), TraceSummary
    )
    converted = stage_outcome(
        "dataset", dataset_with(stages.dataset, ctx.root, return_state=True), list
    )
    broken = broken_data(traced)
    if broken is None:
        trained = stage_outcome(
            "train",
            train_with(stages.train, ctx.root, ctx.tracking, return_state=True),
            TrainResult,
        )
    else:
        trained = skipped("train", f"tonight's data is broken: {broken}")
    after = champion_version(ctx.tracking)
    model = registered_model(trained)  # the version tonight's train stage registered, or None
    # A heap report per evaluation run of tonight's model; a failed report never fails the night.
    heap_reports = report_night(ctx.root, model, keep_nights=stages.reports_keep_nights)
    # What tonight's model buys an allocator; a failure here never fails the night.
    plan = whatif_plan(ctx.root, model, quick=stages.whatif_smallest_runs)
    replayed = (
        skipped("whatif", plan)
        if isinstance(plan, str)
        else stage_outcome(
            "whatif",
            whatif_with(plan, ctx.root, ctx.tracking, model, return_state=True),
            WhatifSummary,
        )
    )
    # Only with the `allocators` option (it has a weekly deployment of its own); after training,
    # so that the night's model never waits for the measurements.
    measured = (
        [
            stage_outcome(
                "allocators",
                allocators_with(stages.allocators, ctx.root, ctx.tracking, return_state=True),
                AllocatorsOutcome,
            )
        ]
        if stages.allocators is not None
        else []
    )
    # Only with the `seeds` option: what heapcast's layer buys on the layer's cases, measured
    # (logged on tonight's model's run when one was registered).
    if stages.seeds is not None:
        measured.append(
            stage_outcome(
                "seeds",
                seed_cases_with(
                    stages.seeds,
                    ctx.root,
                    ctx.tracking,
                    model,
                    return_state=True,
                ),
                SeedsOutcome,
            )
        )
    summary = summarize(
        ctx,
        [traced, converted, trained, replayed, *measured],
        before,
        after,
        heap_reports=heap_reports,
    )
    publish_summary(summary, ctx.root)
    return finish(summary)


def run(args: argparse.Namespace) -> int:
    """The night with `build_parser`'s arguments; 1 when it trained no model."""
    values = fields(args, {"root", "quick", "allocators", "seeds", "reports_keep_nights"})
    if "runner" in args:  # the replays' and the measurements' runner
        values["trace"] = {"runner": args.runner}
        values["allocators_params"] = {"runner": args.runner}
    values = nested(getattr(args, "param", None), into=values)  # --param wins
    params = parameters(NightlyParams, values, args.prog)
    t0 = time.monotonic()
    try:
        summary = nightly(params)
    except NothingTrained as err:
        # the night's summary still says what every stage did, the verdict first
        if err.summary is not None:
            print(terminal_text(err.summary))
        print(f"{args.prog}: the night trained no model: {err}", file=sys.stderr)
        return 1
    # one screen, 100 columns at most; every table is in the summary file and the
    # `nightly-summary` artifact (tasks/nightly/markdown.py)
    print(terminal_text(summary))
    print(f"nightly finished in {time.monotonic() - t0:.0f} s; data: {summary.root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
