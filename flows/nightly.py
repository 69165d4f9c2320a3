"""Flow `nightly`: trace, dataset, train (and register), whatif, a summary. See prefect.yaml.

Composition only. Each stage is a subflow whose final state is kept, so a failing stage does not
stop the night: `dataset` and `train` go on with whatever data there is, and the night fails at
the end only when no model could be trained. A night whose data is broken (every replay failed)
trains and registers nothing: the champion is left alone and the summary says why. The summary
(tasks/nightly/summary.py) is published as the `nightly-summary` markdown artifact. With the
`allocators` option the `allocators` stage runs last; its failure, like the others', is reported
in the summary, not raised.

    python -m flows.nightly --quick          # the quick subset, embedded services
    python -m flows.nightly --root s3://bucket/heapcast
    python -m flows.nightly --quick --allocators   # and the allocators stage
"""

from __future__ import annotations

import argparse
import sys
import time

from prefect import flow

from flows.allocators import allocators
from flows.dataset import dataset
from flows.trace import trace
from flows.train import train_flow
from flows.whatif import whatif
from tasks.nightly.params import NightlyParams
from tasks.nightly.summary import (
    NightlySummary,
    NothingTrained,
    broken_data,
    champion_version,
    finish,
    mlflow_ui_command,
    publish_summary,
    skipped,
    stage_outcome,
    summarize,
)
from tasks.report.night import report_night
from tasks.whatif.night import whatif_plan


@flow(name="nightly")
def nightly(params: NightlyParams = NightlyParams()) -> NightlySummary:
    """Replay the workloads, convert them, train, evaluate and register; publish the summary."""
    stages = params.stages()
    before = champion_version(stages.tracking)
    traced = stage_outcome("trace", trace(stages.trace, return_state=True))
    converted = stage_outcome("dataset", dataset(stages.dataset, return_state=True))
    broken = broken_data(traced)
    if broken is None:
        trained = stage_outcome("train", train_flow(stages.train, return_state=True))
    else:
        trained = skipped("train", f"tonight's data is broken: {broken}")
    after = champion_version(stages.tracking)
    # A heap report per evaluation run of tonight's model; a failed report never fails the night.
    heap_reports = report_night(stages.train.root, trained)
    # What tonight's model buys an allocator; a failure here never fails the night.
    plan = whatif_plan(stages.train.root, trained)
    replayed = (
        skipped("whatif", plan)
        if isinstance(plan, str)
        else stage_outcome("whatif", whatif(plan, return_state=True))
    )
    # Only with the `allocators` option (it has a weekly deployment of its own); after training,
    # so that the night's model never waits for the measurements.
    measured = (
        [stage_outcome("allocators", allocators(stages.allocators, return_state=True))]
        if stages.allocators is not None
        else []
    )
    summary = summarize(
        stages.train.root,
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
    a = ap.parse_args(argv)
    params = NightlyParams(
        root=a.root,
        quick=a.quick,
        trace={"runner": a.runner},
        allocators=a.allocators,
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
    print(f"MLflow UI: {mlflow_ui_command(params.stages().tracking)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
