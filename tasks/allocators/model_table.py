"""The registered model's tables for the allocators stage's `table: model` candidates
(configs/allocators.yaml): the reuse table for the table-guided layer, the lifetime table for
the placement layer (`jemalloc-place-table`), each fetched once per measurement from the
version's MLflow run (tasks.registry.question_artifacts.fetch_table, fetch_lifetime_table) into a
local folder that outlives the measurement's runs, and handed to the candidates
(AllocatorsConfig.with_model_table, with_lifetime_table). The night names the version it
registered; the flows on their own name `AllocatorsParams.table_model` (the alias `champion` by
default).

Without a table (a fresh store, or a version registered before that table was logged) the
candidates stay without one and each case reports them unavailable, saying why: a run without
its table would be the online counter under the table's name. A table file given apart
(`table_file`) is a reuse table: the lifetime table's candidates are then left without theirs.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.allocators.config import AllocatorsConfig
from tasks.allocators.measure import run_logger
from tasks.learning.table.layer_file import ModelTable, read_table_file
from tasks.registry.tracking import TrackingConfig


@task(name="fetch-model-table", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)
def with_model_table(
    config: AllocatorsConfig,
    tracking: TrackingConfig,
    model: str,
    dest: Path,
    table_file: str | None = None,
) -> AllocatorsConfig:
    """`config` with version `model`'s tables (a version number or an alias) handed to its
    `table: model` candidates, downloaded under `dest`: the reuse table to the layer's, the
    lifetime table to the placement layer's; or, for the layer's, the file `table_file`
    (checked as the layer checks it: a file it would refuse stops here, naming the file); as it
    is when none reads one."""
    log = run_logger()
    if table_file is not None:  # checked even where no candidate reads it: a typo says so
        table = read_table_file(Path(table_file))
        if config.needs_lifetime_table:
            log.warning(
                "a layer table file was given: the placement's lifetime table candidates are "
                "not measured (their table comes from a registered version only)"
            )
        if not config.needs_table:
            log.warning(f"{table.path}: no candidate of this config reads a layer table")
            return config
        log.info(f"the layer's table: {table.path} (model v{table.version}), a file")
        return config.with_model_table(table)
    if config.needs_table:
        config = config.with_model_table(_fetched(tracking, model, dest, "reuse"))
    if config.needs_lifetime_table:
        config = config.with_lifetime_table(_fetched(tracking, model, dest, "lifetime"))
    return config


def _fetched(tracking: TrackingConfig, model: str, dest: Path, kind: str) -> ModelTable | None:
    """Version `model`'s table of `kind` ("reuse": the layer's, "lifetime": the placement's)
    under `dest`, or None, said in the log: no such version, or it logged no such table."""
    # deferred: MLflow's import is slow
    from tasks.registry.question_artifacts import fetch_lifetime_table, fetch_table

    fetch, what = (
        (fetch_table, "the layer's table")
        if kind == "reuse"
        else (fetch_lifetime_table, "the placement's lifetime table")
    )
    log = run_logger()
    try:
        table = fetch(tracking, model, dest)
    except FileNotFoundError as err:
        log.warning(f"{what} candidates are not measured: {err}")
        return None
    if table is None:
        log.warning(
            f"no registered version {model!r} of {tracking.model_name}: {what} candidates "
            "are reported unavailable"
        )
    else:
        log.info(f"{what}: model v{table.version} (run {table.run_id}), {table.path}")
    return table
