"""Flow `nightly`: trace, dataset, train (and register), whatif, a summary. See prefect.yaml.

Composition only. Each stage is a subflow whose final state is kept, so a failing stage does not
stop the night: `dataset` and `train` go on with whatever data there is, and the night fails at
the end only when no model could be trained. A night whose data is broken (every replay failed)
trains and registers nothing: the champion is left alone and the summary says why. The summary
(tasks/nightly/summary.py) is published as the `nightly-summary` markdown artifact. With the
`allocators` option the `allocators` stage runs last; its failure, like the others', is reported
in the summary, not raised.

The form's strings are resolved once, here (`params.stages()`): the data root, the tracking
config and the catalog are the night's `NightContext`, which every step takes; the stages run as
the subflows that take it (`trace_with`, ...), so none resolves anything again. The model the
train stage registered is handed on as a `RegisteredModel` to the reports, whatif and the
summary.

    python -m flows.nightly --quick          # the quick subset, embedded services
    python -m flows.nightly --root s3://bucket/heapcast
    python -m flows.nightly --quick --allocators   # and the allocators stage
"""

from __future__ import annotations

import argparse
import sys
import time

from prefect import flow

from flows.allocators import allocators_with, seed_cases_with
from flows.dataset import dataset_with
from flows.trace import trace_with
from flows.train import train_with
from flows.whatif import whatif_with
from tasks.allocators import AllocatorsOutcome
from tasks.allocators.seeds import SeedsOutcome
from tasks.learning.outcome import TrainResult
from tasks.nightly.params import NightlyParams
from tasks.nightly.summary import (
    NightlySummary,
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
from tasks.replay.replays import TraceSummary
from tasks.report.night import report_night
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
    publish_summary(summary)
    return finish(summary)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="heapcast's whole pipeline, once")
    ap.add_argument(
        "--quick", action="store_true", help="quick workload inputs and configs/train-quick.yaml"
    )
    ap.add_argument("--root", default=None, help="data root: a folder or an s3:// URL")
    ap.add_argument("--runner", choices=["auto", "docker", "local"], default="auto")
    ap.add_argument("--allocators", action="store_true", help="also run the allocators stage, last")
    ap.add_argument(
        "--seeds", action="store_true", help="also measure the layer's cases under the layer"
    )
    a = ap.parse_args(argv)
    params = NightlyParams(
        root=a.root,
        quick=a.quick,
        trace={"runner": a.runner},
        allocators=a.allocators,
        seeds=a.seeds,
        allocators_params={"runner": a.runner},
    )
    t0 = time.monotonic()
    try:
        summary = nightly(params)
    except NothingTrained as err:
        print(f"heapcast: the night trained no model: {err}", file=sys.stderr)
        return 1
    print(summary.markdown())
    print(f"nightly finished in {time.monotonic() - t0:.0f} s")
    print(f"data: {summary.root}")
    if summary.champion_after is None:
        print("champion: none registered")
    else:
        print(
            f"champion: version {summary.champion_after} "
            f"({'changed tonight' if summary.champion_changed else 'unchanged'})"
        )
    print(f"MLflow UI: {summary.mlflow_ui}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
