"""A small events dataset built from synthetic token sequences, for tests and demos.

Real traces come from replay + convert; this writes the same layout and schema
(`<root>/events/workload=<w>/run=<r>/part-0.parquet`, EVENTS_SCHEMA) from sequences that a model
and an n-gram can learn: each thread is a walk over a workload's motifs (the next motif is the
previous one plus a random step of 1 or 2, so it takes a motif's worth of context to know where
the walk is), with a little token noise. Runs of one workload share the motifs (the program)
and differ in seed and step odds (the input). Vectorised: no loop per event.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.storage import Root
from tasks.dataset.events_schema import CALLER_MODULE_TYPE, EVENTS_SCHEMA
from tasks.dataset.tokens import FREE_OFFSET
from tasks.format.trace_reader import Op


def motif_walk(
    n: int,
    motifs: np.ndarray,
    rng: np.random.Generator,
    p_step1: float = 0.7,
    noise: float = 0.02,
) -> np.ndarray:
    """n tokens: motifs[walk] flattened, walk = cumsum of steps in {1, 2}, then noise."""
    n_motifs, length = motifs.shape
    n_blocks = -(-n // length)
    steps = np.where(rng.random(n_blocks) < p_step1, 1, 2)
    walk = (np.cumsum(steps) + rng.integers(n_motifs)) % n_motifs
    tokens = motifs[walk].ravel()[:n].copy()
    noisy = rng.random(n) < noise
    tokens[noisy] = rng.integers(1, 64, noisy.sum())
    return tokens.astype(np.uint8)


def workload_motifs(workload: str, n_motifs: int = 6, length: int = 8) -> np.ndarray:
    """A workload's motifs: allocation tokens 3..20 and frees of them (the program's habits)."""
    rng = np.random.default_rng(zlib.crc32(workload.encode()))
    allocs = rng.integers(3, 21, (n_motifs, length))
    is_free = rng.random((n_motifs, length)) < 0.4
    return np.where(is_free, allocs + FREE_OFFSET, allocs).astype(np.uint8)


def events_table(threads: list[np.ndarray], pid: int = 1000) -> pa.Table:
    """EVENTS_SCHEMA rows for one process whose threads have the given token sequences."""
    tokens = np.concatenate(threads).astype(np.uint8)
    n = len(tokens)
    thread = np.repeat(np.arange(len(threads)), [len(t) for t in threads]).astype(np.uint16)
    seq = (
        np.arange(n)
        - np.repeat(np.cumsum([0] + [len(t) for t in threads[:-1]]), [len(t) for t in threads])
    ).astype(np.uint64)
    is_free = tokens >= FREE_OFFSET
    cls = np.where(is_free, tokens - FREE_OFFSET, tokens).astype(np.uint64)
    size = np.where(cls > 0, np.uint64(1) << np.maximum(cls, 1).astype(np.uint64) - np.uint64(1), 0)
    size = size.astype(np.uint64)
    null = pa.nulls(n, pa.uint64())
    cols = {
        "pid": pa.array(np.full(n, pid, np.uint32)),
        "ppid": pa.array(np.full(n, 1, np.uint32)),
        "thread": pa.array(thread),
        "tid": pa.array((pid + thread).astype(np.uint32)),
        "seq": pa.array(seq),
        "time_ns": pa.array(np.arange(n, dtype=np.int64) * 100),
        "op": pa.array(np.where(is_free, int(Op.FREE), int(Op.MALLOC)).astype(np.uint8)),
        "size": pa.array(np.where(is_free, 0, size).astype(np.uint64)),
        "alignment": null,
        "addr": pa.array((np.arange(n, dtype=np.uint64) * np.uint64(16)) + np.uint64(0x10000)),
        "freed_addr": null,
        "freed_size": pa.array(np.where(is_free, size, 0).astype(np.uint64)),
        "caller": null,
        "lifetime_ns": pa.nulls(n, pa.int64()),
        "lifetime_calls": pa.nulls(n, pa.int64()),
        "token": pa.array(tokens),
        "caller_module": pa.nulls(n, CALLER_MODULE_TYPE),
        "caller_offset": null,
        "stack": pa.nulls(n, pa.uint64()),
    }
    return pa.table(cols, schema=EVENTS_SCHEMA)


def write_synthetic_events(
    root: Root,
    workloads: dict[str, int] | None = None,
    tokens_per_run: int = 20_000,
    threads: int = 3,
    seed: int = 0,
) -> dict[str, list[str]]:
    """Write {workload: n_runs} runs (run names "r0", "r1", ...); return what was written.

    Each run is two processes of `threads` threads; thread lengths vary (one is short).
    Rows of a run are written shuffled across processes, as a converter might, to exercise
    the reader's ordering.
    """
    workloads = workloads or {"alpha": 3, "beta": 2, "gamma": 2}
    fs = root.fs
    written: dict[str, list[str]] = {}
    for w, n_runs in workloads.items():
        motifs = workload_motifs(w)
        for r in range(n_runs):
            rng = np.random.default_rng([seed, zlib.crc32(w.encode()), r])
            p_step1 = 0.55 + 0.3 * rng.random()
            tables = []
            for pid in (100 + r, 200 + r):
                weights = np.array([0.6] + [0.4 / max(threads - 1, 1)] * (threads - 1))
                lengths = np.maximum((weights * tokens_per_run / 2).astype(int), 30)
                lengths[-1] = 30  # one short thread (shorter than a context of 100)
                seqs = [motif_walk(int(m), motifs, rng, p_step1) for m in lengths]
                tables.append(events_table(seqs, pid=pid))
            table = pa.concat_tables(tables)
            table = table.take(rng.permutation(table.num_rows))
            path = root.events_run(w, f"r{r}")
            fs.makedirs(path, exist_ok=True)
            with fs.open(f"{path}/part-0.parquet", "wb") as f:
                pq.write_table(table, f)
            written.setdefault(w, []).append(f"r{r}")
    return written
