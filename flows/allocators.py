"""Flow `allocators`: each catalog workload under glibc, jemalloc, tcmalloc and mimalloc, measured
side by side, one allocator recommended per workload (tasks/allocators/). Scheduled weekly in
prefect.yaml; `nightly` runs it too with its `allocators` option.

Results under `<root>/allocators/` (summary and samples Parquet, the markdown table, plots), the
`allocators` markdown artifact, and one run in MLflow's `heapcast-allocators` experiment.

python -m flows.allocators                       # the workloads' medium inputs, runner auto
python -m flows.allocators sqlite3 --runner local
"""

from __future__ import annotations

import argparse

from prefect import flow, get_run_logger

from tasks.allocators import (
    AllocatorsOutcome,
    AllocatorsParams,
    images_for,
    load_allocators_config,
    measure_all,
    publish,
)
from tasks.core.storage import Root
from tasks.registry.tracking import TrackingConfig, tracking_for
from tasks.replay.images import build_images
from tasks.replay.runners.select import resolve_runner_kind


def measure_allocators(
    params: AllocatorsParams, root: Root, tracking: TrackingConfig
) -> AllocatorsOutcome:
    """Measure the selected workloads under every configured allocator; publish the answers."""
    log = get_run_logger()
    config = load_allocators_config(params.config)
    kind, why = resolve_runner_kind(params.runner)
    log.info(why)
    if kind == "docker":
        build_images(images_for(config, params.workloads, params.quick, params.catalog))
    measured = measure_all(root, config, params.workloads, params.quick, kind, params.catalog)
    return publish(measured, root, config, to_mlflow=params.mlflow, tracking=tracking)


# The default task runner on purpose: the measurement is one task whose runs are sequential by
# design (two measured runs at once would measure each other).
# The same flow for a caller that has resolved the root and the tracking config (the nightly).
allocators_with = flow(name="allocators")(measure_allocators)


@flow(name="allocators")
def allocators(params: AllocatorsParams = AllocatorsParams()) -> AllocatorsOutcome:
    """Measure the selected workloads under every configured allocator; publish the answers."""
    root = Root.from_url(params.root)  # resolved once, here; the tasks take the Root
    return measure_allocators(params, root, tracking_for(root))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="which allocator suits each workload, measured")
    ap.add_argument("workloads", nargs="*", help="workload names (default: all)")
    ap.add_argument("--quick", action="store_true", help="only the quick inputs' workloads")
    ap.add_argument("--runner", choices=["auto", "docker", "local"], default="auto")
    ap.add_argument("--root", default=None, help="data root (fsspec URL)")
    ap.add_argument("--config", default=None, help="allocators config (configs/allocators.yaml)")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log an MLflow run")
    a = ap.parse_args()
    p = dict(
        workloads=a.workloads or None,
        quick=a.quick,
        runner=a.runner,
        config=a.config,
        mlflow=not a.no_mlflow,
    )
    if a.root:
        p["root"] = a.root
    outcome = allocators(AllocatorsParams(**p))
    print(outcome.markdown)
    print(f"results: {outcome.report_dir}")
    # a failed or unavailable (workload, allocator) pair is worth a non-zero exit, as in `trace`
    raise SystemExit(1 if outcome.failed else 0)
