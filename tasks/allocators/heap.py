"""The heap behaviour beside each answer: what allocator folklore says matters, from the events.

Read from the events dataset through the dataset's one reader (tasks.dataset.events_reader), per
run, in Arrow batches (numpy per batch, no per-event Python): the size-class mix of allocation
calls, the share of large blocks (`large_block_bytes`) by count and bytes, the most threads one
process used and the processes, the median lifetime of the freed blocks, the realloc share. Each
feature: docs/allocators.md#the-heap-features.

The run measured is preferred (run = the input's name); else another run of the workload, named
in the result; none when the dataset does not hold the workload.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.compute as pc
from pydantic import BaseModel

from tasks.core.storage import Root
from tasks.dataset.events_reader import EventsNotFound, iter_batches, list_runs
from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS

SMALL_BYTES = 64
MEDIUM_BYTES = 1024
COLUMNS = ["pid", "thread", "op", "size", "lifetime_ns"]


class HeapFeatures(BaseModel):
    workload: str
    run: str
    events: int
    allocations: int
    le64_share: float  # allocation calls of <= 64 B
    le1k_share: float  # 65 B - 1 KiB
    lt_large_share: float  # 1 KiB - large_block_bytes
    large_share: float  # >= large_block_bytes, by count
    large_bytes_share: float  # >= large_block_bytes, by bytes requested
    large_block_bytes: int
    processes: int
    threads: int  # the most threads in one process
    median_lifetime_us: float | None  # of the blocks freed
    realloc_share: float  # realloc calls among allocation calls

    def size_mix(self) -> str:
        """`61/30/8/1` style: percent <=64 B / <=1 KiB / < large / >= large."""
        parts = (self.le64_share, self.le1k_share, self.lt_large_share, self.large_share)
        return "/".join(f"{p * 100:.0f}" for p in parts)


def heap_features(
    root: Root, workload: str, run: str, large_block_bytes: int = 128 * 1024
) -> HeapFeatures | None:
    """The features of one run of the events dataset; None when it has no events."""
    batches = iter_batches(root, workload, run, COLUMNS)
    try:
        first = next(batches)
    except (EventsNotFound, StopIteration):  # no such run, or one without rows
        return None
    alloc_ops = np.array([int(o) for o in ALLOCATING_OPS + REALLOCATING_OPS], dtype=np.uint8)
    realloc_ops = np.array([int(o) for o in REALLOCATING_OPS], dtype=np.uint8)
    events = allocations = reallocs = 0
    bins = np.zeros(4, dtype=np.int64)
    large_bytes = total_bytes = 0
    lifetimes: list[np.ndarray] = []
    threads: list[np.ndarray] = []
    edges = np.array([SMALL_BYTES, MEDIUM_BYTES, large_block_bytes - 1], dtype=np.uint64)
    for batch in itertools.chain([first], batches):
        events += batch.num_rows
        op = batch.column("op").to_numpy()
        size = batch.column("size").to_numpy()
        is_alloc = np.isin(op, alloc_ops) & (size > 0)
        sizes = size[is_alloc]
        allocations += int(sizes.size)
        reallocs += int((np.isin(op, realloc_ops) & (size > 0)).sum())
        bins += np.bincount(np.searchsorted(edges, sizes, side="left"), minlength=4)[:4]
        is_large = sizes >= large_block_bytes
        large_bytes += int(sizes[is_large].sum(dtype=np.uint64))
        total_bytes += int(sizes.sum(dtype=np.uint64))
        life = pc.drop_null(batch.column("lifetime_ns").filter(is_alloc)).to_numpy()
        if life.size:
            lifetimes.append(life)
        pid = batch.column("pid").to_numpy().astype(np.uint64)
        thread = batch.column("thread").to_numpy().astype(np.uint64)
        threads.append(np.unique((pid << np.uint64(16)) | thread))
    if events == 0:
        return None
    pairs = np.unique(np.concatenate(threads)) if threads else np.zeros(0, np.uint64)
    per_pid = np.unique(pairs >> np.uint64(16), return_counts=True)[1]
    shares = bins / allocations if allocations else np.zeros(4)
    life_all = np.concatenate(lifetimes) if lifetimes else np.zeros(0)
    return HeapFeatures(
        workload=workload,
        run=run,
        events=events,
        allocations=allocations,
        le64_share=float(shares[0]),
        le1k_share=float(shares[1]),
        lt_large_share=float(shares[2]),
        large_share=float(shares[3]),
        large_bytes_share=large_bytes / total_bytes if total_bytes else 0.0,
        large_block_bytes=large_block_bytes,
        processes=int(per_pid.size),
        threads=int(per_pid.max()) if per_pid.size else 0,
        median_lifetime_us=float(np.median(life_all)) / 1e3 if life_all.size else None,
        realloc_share=reallocs / allocations if allocations else 0.0,
    )


def features_for(
    root: Root, workload: str, run: str, large_block_bytes: int = 128 * 1024
) -> HeapFeatures | None:
    """The features of `run` of `workload`, else of its first other run, else None."""
    runs = [r.run for r in list_runs(root, [workload])]
    for r in ([run] if run in runs else []) + [r for r in runs if r != run]:
        f = heap_features(root, workload, r, large_block_bytes)
        if f is not None:
            return f
    return None
