"""The `nightly` flow's parameters: the three stages' parameter models, and what they share.

One form in the Prefect UI: the stages' own parameters (each with its defaults from configs/), plus
two settings that apply to every stage at once: `root` (one data root for the whole night; empty:
the `train` stage's) and `quick` (the quick workload subset and configs/train-quick.yaml).
`allocators` and `seeds` (both off by default) add the allocators stage, or only the layer's cases,
to the night. Where the stages run is configuration, not code. In full:
docs/pipeline.md#the-nightly-flows-parameters.

The strings of the form are resolved once, where the night starts (`NightlyParams.stages`): the data
root, the tracking config and the catalog are a `NightContext` that every step takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from tasks.allocators.config import AllocatorsParams
from tasks.core.config import StrictModel
from tasks.core.storage import Root
from tasks.dataset.partitions import DatasetParams
from tasks.learning.train_config import QUICK_CONFIG, TrainParams
from tasks.registry.tracking import TrackingConfig, tracking_for
from tasks.replay.workloads import Catalog, TraceParams, load_catalog
from tasks.report.night_reports import KEEP_NIGHTS


class NightlyParams(StrictModel):
    """Parameters of the `nightly` flow: trace, dataset, train (and register), then a summary."""

    root: str | None = Field(
        default=None,
        description="one data root (folder or s3:// URL) for every stage; the train stage's when empty",
    )
    quick: bool = Field(
        default=False,
        description="the quick subset: quick workload inputs and configs/train-quick.yaml",
    )
    trace: TraceParams = Field(default_factory=TraceParams, description="flow `trace`")
    dataset: DatasetParams = Field(default_factory=DatasetParams, description="flow `dataset`")
    train: TrainParams = Field(default_factory=TrainParams, description="flow `train`")
    reports_keep_nights: int = Field(
        default=KEEP_NIGHTS,
        ge=1,
        description="heap report nights kept under <root>/reports/ (older night folders deleted)",
    )
    allocators: bool = Field(
        default=False,
        description="also run flow `allocators` (weekly on its own; adds several replays' time)",
    )
    allocators_params: AllocatorsParams = Field(
        default_factory=AllocatorsParams, description="flow `allocators`, when `allocators` is on"
    )

    seeds: bool = Field(
        default=False,
        description="also measure the layer's cases (numpy_temporaries, numpy_training_loop, numpy_pipeline) "
        "under glibc, jemalloc, tcmalloc, mimalloc and heapcast's layer (configs/allocators.yaml "
        "`seeds`; quick: its quick_repetitions); off by default: 63 container runs at 3 rounds, "
        "over a minute on an idle 2-core machine",
    )

    def stages(self) -> NightlyStages:
        """Each stage's parameters with the shared settings applied, and the night's context:
        the form's strings resolved, once."""
        root_url = self.root or self.train.root
        trace = self.trace.model_copy(update={"root": root_url})
        dataset = self.dataset.model_copy(update={"root": root_url})
        train = self.train.model_copy(update={"root": root_url})
        if self.quick:
            trace = trace.model_copy(update={"quick": True})
            train = train.model_copy(update={"config": str(QUICK_CONFIG)})
        # None when off: the night's flow has nothing to decide, it runs what is given
        allocators = self.allocators_params if self.allocators else None
        if allocators is not None:
            allocators = allocators.model_copy(update={"root": root_url})
        if allocators is not None and self.quick:
            allocators = allocators.model_copy(update={"quick": True})
        seeds = None
        if self.seeds:
            seeds = self.allocators_params.model_copy(
                update={"root": root_url, "quick": self.quick}
            )
        root = Root.from_url(root_url)  # the night's one resolution of its data root
        context = NightContext(root, tracking_for(root), load_catalog(trace.catalog))
        return NightlyStages(
            trace=trace,
            dataset=dataset,
            train=train,
            context=context,
            allocators=allocators,
            reports_keep_nights=self.reports_keep_nights,
            seeds=seeds,
            whatif_smallest_runs=self.quick,
        )


@dataclass(frozen=True)
class NightContext:
    """What every step of the night shares, resolved once where the night starts."""

    root: Root
    tracking: TrackingConfig  # where models and metrics go (configs/tracking.yaml for `root`)
    catalog: Catalog  # the workloads the `trace` stage replays


@dataclass(frozen=True)
class NightlyStages:
    """The stages' parameters (strings, as Prefect records them) and the night's context."""

    trace: TraceParams
    dataset: DatasetParams
    train: TrainParams
    context: NightContext
    allocators: AllocatorsParams | None = None  # the `allocators` stage, when the night runs it
    reports_keep_nights: int = KEEP_NIGHTS  # heap report nights kept (tasks.report.night_reports)
    seeds: AllocatorsParams | None = None  # the seeds' cases (flows.allocators.measure_seeds)
    whatif_smallest_runs: bool = False  # the quick night: whatif on each workload's smallest run
