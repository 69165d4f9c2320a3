"""Allocators: which allocator suits each workload, by measurement.

Takes in the workload catalog (configs/workloads.yaml), configs/allocators.yaml (the candidates:
LD_PRELOAD libraries with their Debian packages, glibc's tunables and the allocators' knobs; the
repetitions; the recommendation rule),
a runner (docker images with the allocators installed, or the host) and, where it has the
workloads, the events dataset (`<root>/events`). Gives out, under `<root>/allocators/`, a Parquet
summary (one row per workload x allocator: median and spread of wall time, CPU time, peak memory,
faults; output checked against glibc's; the recommendation with its margin and whether it is
beyond the noise; the workload's heap features), a Parquet table of every run, a markdown table,
plots of time against peak memory, and one MLflow run per measurement in its own experiment.

Open `measure` first (how runs are made side by side, each verified in force by
tasks.replay.runners.preload), then `stats` (checks and the rule) over `decide` (the rank test,
Holm's correction, the margin's interval), `heap` (features from the events), `report` (what is
written). `tune` is `heapcast tune -- PROGRAM`: any program on this host, the same analysis,
over candidates derived from one traced run (`trace_facts` reads the facts, `advise` derives
and rules out) and rounds stopped once the choice is decided (`rounds`).
`seeds` measures the layer's cases (the seeds' numpy_temporaries and numpy_training_loop, and
numpy_pipeline: a reader thread's chunks freed by the main thread) under the mallocs
and heapcast's layer (`kind: layer` candidates; `layer-table` reads the registered model's table,
`model_table` fetches it) and says per case, in ms and MB, what the model's table bought against
the online counter and each against no prediction (flows.allocators `--seeds`, the night's
`seeds` option).
A flow composes:

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
