"""Flow `allocators`: each catalog workload under glibc, jemalloc, tcmalloc and mimalloc, measured
side by side, one allocator recommended per workload (tasks/allocators/). Scheduled weekly in
prefect.yaml; `nightly` runs it too with its `allocators` option.

Results under `<root>/allocators/` (summary and samples Parquet, the markdown table, plots), the
`allocators` markdown artifact, and one run in MLflow's `heapcast-allocators` experiment.

python -m flows.allocators                       # the workloads' medium inputs, runner auto
python -m flows.allocators sqlite3 --runner local
python -m flows.allocators --seeds [--quick]      # the layer's cases, mallocs and the layer
python -m flows.allocators --seeds --table-model 7  # the layer guided by version 7's table
python -m flows.allocators --seeds --table-file T   # ... by a table file (native/TABLE.md)
python -m flows.allocators --help        # the flow's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow, get_run_logger

from flows.command_line import allocators_parser as build_parser
from flows.command_line import fields, parameters
from tasks.allocators import (
    AllocatorsOutcome,
    AllocatorsParams,
    images_for,
    load_allocators_config,
    measure_all,
    publish,
)
from tasks.allocators.measure import scratch_parent
from tasks.allocators.model_table import with_model_table
from tasks.allocators.seeds import (
    SeedsOutcome,
    log_on_model_run,
    measure_seed_cases,
    seed_config,
    summarize_seed_cases,
)
from tasks.core.config import ConfigError
from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel
from tasks.registry.tracking import TrackingConfig, tracking_for
from tasks.replay.images import build_images
from tasks.replay.runners.select import resolve_runner_kind


def measure_allocators(
    params: AllocatorsParams, root: Root, tracking: TrackingConfig
) -> AllocatorsOutcome:
    """Measure the selected workloads under every configured allocator; publish the answers."""
    log = get_run_logger()
    config = load_allocators_config(params.config)
    config = with_model_table(
        config, tracking, params.table_model, scratch_parent(root) / "tables", params.table_file
    )
    kind, why = resolve_runner_kind(params.runner)
    log.info(why)
    if kind == "docker":
        build_images(images_for(config, params.workloads, params.quick, params.catalog))
    measured = measure_all(root, config, params.workloads, params.quick, kind, params.catalog)
    return publish(measured, root, config, to_mlflow=params.mlflow, tracking=tracking)


def measure_seeds(
    params: AllocatorsParams,
    root: Root,
    tracking: TrackingConfig,
    model: RegisteredModel | None = None,
) -> SeedsOutcome:
    """The layer's cases under the mallocs and heapcast's layer (configs/allocators.yaml,
    `seeds`; `params.quick`: its quick_repetitions), the table-guided layer reading `model`'s
    table (else `params.table_model`'s), published like any allocators measurement, summed up
    per case in ms and MB, and logged on `model`'s run when given."""
    log = get_run_logger()
    config = with_model_table(
        load_allocators_config(params.config),
        tracking,
        model.version if model is not None else params.table_model,
        scratch_parent(root) / "tables",
        params.table_file,
    )
    seeds = seed_config(config, params.quick)
    kind, why = resolve_runner_kind(params.runner)
    log.info(why)
    if kind == "docker":
        build_images(
            images_for(
                seeds, config.seeds.workloads if config.seeds else None, False, params.catalog
            )
        )
    measured = measure_seed_cases(root, config, params.quick, kind, params.catalog)
    published = publish(measured, root, seeds, to_mlflow=params.mlflow, tracking=tracking)
    outcome = summarize_seed_cases(measured, config, published)
    if published.mlflow_run_id is not None:  # the measurement's run, heapcast-allocators
        log_on_model_run(outcome.lines, tracking, published.mlflow_run_id)
    if model is not None and params.mlflow:
        log_on_model_run(outcome.lines, tracking, model.run_id)
        outcome = outcome.model_copy(update={"model_run_id": model.run_id})
    return outcome


seed_cases_with = flow(name="seed-cases")(measure_seeds)


# The default task runner on purpose: the measurement is one task whose runs are sequential by
# design (two measured runs at once would measure each other).
# The same flow for a caller that has resolved the root and the tracking config (the nightly).
allocators_with = flow(name="allocators")(measure_allocators)


@flow(name="allocators")
def allocators(params: AllocatorsParams = AllocatorsParams()) -> AllocatorsOutcome:
    """Measure the selected workloads under every configured allocator; publish the answers."""
    root = Root.from_url(params.root)  # resolved once, here; the tasks take the Root
    return measure_allocators(params, root, tracking_for(root))


@flow(name="seed-cases")
def seed_cases(params: AllocatorsParams = AllocatorsParams()) -> SeedsOutcome:
    """The layer's cases under the mallocs and heapcast's layer (weekly, prefect.yaml)."""
    root = Root.from_url(params.root)  # resolved once, here; the tasks take the Root
    return measure_seeds(params, root, tracking_for(root))


def run(args: argparse.Namespace) -> int:
    """The flow (`seed_cases` with --seeds) with `build_parser`'s arguments; 1 when a
    (workload, allocator) pair failed or was unavailable, as in `trace`."""
    params = parameters(
        AllocatorsParams, fields(args, set(AllocatorsParams.model_fields)), args.prog
    )
    try:  # the allocators config, checked before the flow starts
        load_allocators_config(params.config)
    except ConfigError as err:
        print(f"{args.prog}: {err}", file=sys.stderr)
        return 2
    if args.seeds:
        seeded = seed_cases(params)
        print(seeded.markdown())
        print(f"results: {seeded.allocators.report_dir}")
        return 1 if seeded.allocators.failed else 0
    outcome = allocators(params)
    print(outcome.markdown)
    print(f"results: {outcome.report_dir}")
    return 1 if outcome.failed else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
