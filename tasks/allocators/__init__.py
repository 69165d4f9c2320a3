"""Allocators: which allocator suits each workload, by measurement.

Takes in the workload catalog (configs/workloads.yaml), configs/allocators.yaml (the candidates, the
repetitions, the recommendation rule), a runner (docker or the host) and, where it has the
workloads, the events dataset. Gives out, under `<root>/allocators/`, a Parquet summary (one row per
workload x allocator), a Parquet table of every run, a markdown table, plots and one MLflow run per
measurement: docs/allocators.md#the-stages-modules.

Open `measure` first, then `stats` over `decide`, `heap`, `report`; `tune` (with `trace_facts`,
`advise`, `rounds`) is `heapcast tune`; `seeds` measures the layer's cases. A flow composes:

    cfg = load_allocators_config()
    build_images(images_for(cfg, workloads, quick))            # tasks.replay.images, docker only
    outcome = publish(measure_all(root, cfg, workloads, quick, runner), root, cfg)
"""

from tasks.allocators.config import AllocatorsConfig, AllocatorsParams, load_allocators_config
from tasks.allocators.measure import AllocatorMissing, Measurements, images_for, measure_all
from tasks.allocators.report import AllocatorsOutcome, publish

__all__ = [
    "AllocatorMissing",
    "AllocatorsConfig",
    "AllocatorsParams",
    "AllocatorsOutcome",
    "Measurements",
    "images_for",
    "load_allocators_config",
    "measure_all",
    "publish",
]
