"""The registered model's table for the allocators stage's table-guided layer (`table: model`
in configs/allocators.yaml): fetched once per measurement from the version's MLflow run
(tasks.registry.question_artifacts.fetch_table) into a local folder that outlives the measurement's
runs, and handed to the candidates (AllocatorsConfig.with_model_table). The night names the
version it registered; the flows on their own name `AllocatorsParams.table_model` (the alias
`champion` by default).

Without a table (a fresh store, or a version registered before tables were logged) the
candidates stay without one and each case reports them unavailable, saying why: a layer run
without its table would be the online counter under the table's name.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.allocators.config import AllocatorsConfig
from tasks.allocators.measure import run_logger
from tasks.learning.table import read_table_file
from tasks.registry.tracking import TrackingConfig


@task(name="fetch-model-table", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)
def with_model_table(
    config: AllocatorsConfig,
    tracking: TrackingConfig,
    model: str,
    dest: Path,
    table_file: str | None = None,
) -> AllocatorsConfig:
    """`config` with version `model`'s table (a version number or an alias) handed to its
    `table: model` candidates, downloaded under `dest`, or the file `table_file` (checked as the
    layer checks it: a file it would refuse stops here, naming the file); as it is when none
    reads one."""
    if table_file is not None:  # checked even where no candidate reads it: a typo says so
        table = read_table_file(Path(table_file))
        if not config.needs_table:
            run_logger().warning(f"{table.path}: no candidate of this config reads a table")
            return config
        run_logger().info(f"the layer's table: {table.path} (model v{table.version}), a file")
        return config.with_model_table(table)
    if not config.needs_table:
        return config
    from tasks.registry.question_artifacts import fetch_table  # deferred: MLflow's import is slow

    log = run_logger()
    try:
        table = fetch_table(tracking, model, dest)
    except FileNotFoundError as err:
        log.warning(f"the layer's table candidates are not measured: {err}")
        table = None
    if table is None:
        log.warning(
            f"no registered version {model!r} of {tracking.model_name}: the layer's table "
            "candidates are reported unavailable"
        )
    else:
        log.info(f"the layer's table: model v{table.version} (run {table.run_id}), {table.path}")
    return config.with_model_table(table)
