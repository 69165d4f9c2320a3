"""Hand-made measurements: the figures of each run given, the rest filled in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.allocators.config import Allocator, load_allocators_config
from tasks.allocators.measure import CaseInfo, Measurements, Sample, Unavailable, round_orders
from tasks.dataset.events_schema import CALLER_MODULE_TYPE, EVENTS_SCHEMA
from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.table.distill import N_SIZE_CLASSES, ClassTable
from tasks.learning.table.layer_file import ModelTable, write_layer_table

OK_HASH = "a" * 64


def written_table(folder: Path, version: int) -> ModelTable:
    """A real layer table file (every class: keep) written for model `version`."""
    counts = np.zeros((N_SIZE_CLASSES, REUSE_CLASSES))
    counts[:, 0] = 10.0  # every class requested again at once: keep
    path = write_layer_table(
        folder / f"v{version}.hcltab", ClassTable(counts, counts[0] / 10.0), version
    )
    return ModelTable(path=path, version=version, run_id="run")


def written_lifetime_table(
    folder: Path, version: int, keys=range(4096 * 32), score: int = 255
) -> ModelTable:
    """A real lifetime table file (native/TABLE.md; by default every (call site, size class)
    key known, long) written for model `version`, as the stage hands it to a place candidate."""
    from tasks.registry.table_files import write_lifetime_table

    keys = sorted(set(keys))
    path = write_lifetime_table(folder / f"v{version}.hclife", keys, [score] * len(keys), version)
    return ModelTable(path=path, version=version, run_id="run")


def make_measurements(
    runs: dict[str, list[tuple[float, float]]],
    *,
    case: str = "prog",
    hashes: dict[str, list[str]] | None = None,
    exit_codes: dict[str, list[int]] | None = None,
    unavailable: dict[str, str] | None = None,
    cases: dict[str, dict[str, list[tuple[float, float]]]] | None = None,
    config=None,
) -> Measurements:
    """{allocator: [(wall_s, peak_rss_mb) per round]} of one case (or several: `cases`), in the
    project config's allocators; `hashes`/`exit_codes` override per run; `unavailable`:
    {allocator: message} for allocators never run."""
    cfg = config or load_allocators_config()
    all_cases = cases or {case: runs}
    used = {n for r in all_cases.values() for n in r} | set(unavailable or {})
    allocators: list[Allocator] = [a for a in cfg.allocators if a.name in used]
    samples = []
    infos = []
    for label, case_runs in all_cases.items():
        infos.append(CaseInfo(label=label, workload=label, input="small", expected_exit_code=0))
        names = [a.name for a in allocators if a.name in case_runs]
        reps = max(len(v) for v in case_runs.values())
        for rep in range(reps):
            for pos, name in enumerate(round_orders(names, reps)[rep]):
                if rep >= len(case_runs[name]):
                    continue
                wall, rss = case_runs[name][rep]
                code = (exit_codes or {}).get(name, [0] * reps)[rep]
                sha = (hashes or {}).get(name, [OK_HASH] * reps)[rep]
                samples.append(
                    Sample(
                        case=label,
                        workload=label,
                        input="small",
                        allocator=name,
                        rep=rep + 1,
                        position=pos + 1,
                        traced=False,
                        ok=code == 0,
                        exit_code=code,
                        timed_out=False,
                        wall_s=wall,
                        cpu_s=wall * 0.9,
                        user_s=wall * 0.8,
                        sys_s=wall * 0.1,
                        peak_rss_mb=rss,
                        max_process_rss_mb=rss * 1.2,
                        minor_faults=int(rss * 250),
                        major_faults=0,
                        peak_source="cgroup-v1 memory.max_usage_in_bytes",
                        run_s=wall + 0.4,
                        stdout_sha256=sha,
                        stdout_bytes=120,
                        error=None if code == 0 else f"exit code {code}, expected 0",
                        started_at="2026-11-23T02:00:00+00:00",
                    )
                )
    unav = [
        Unavailable(
            case=label,
            workload=label,
            allocator=name,
            library=cfg.get(name).library,
            package=cfg.get(name).package,
            message=msg,
        )
        for label in all_cases
        for name, msg in (unavailable or {}).items()
    ]
    return Measurements(
        night="20261123T020000Z",
        runner="docker",
        runner_detail="hand-made",
        host="test",
        traced=False,
        allocators=allocators,
        baseline="glibc",
        repetitions=max(len(v) for r in all_cases.values() for v in r.values()),
        warmup=1,
        cases=infos,
        samples=samples,
        unavailable=unav,
        started_at="2026-11-23T02:00:00+00:00",
        elapsed_s=12.0,
    )


def runs_of(walls: list[float], rss: float) -> list[tuple[float, float]]:
    return [(w, rss) for w in walls]


def events_table(rows: list[tuple[int, int, int, int, int | None]]) -> pa.Table:
    """rows of (pid, thread, op, size, lifetime_ns); the other columns filled in."""
    n = len(rows)
    pid, thread, op, size, life = (list(c) for c in zip(*rows))
    u64 = lambda v: pa.array(np.asarray(v, dtype=np.uint64))  # noqa: E731
    null = pa.nulls(n, pa.uint64())
    return pa.table(
        {
            "pid": pa.array(np.asarray(pid, np.uint32)),
            "ppid": pa.array(np.ones(n, np.uint32)),
            "thread": pa.array(np.asarray(thread, np.uint16)),
            "tid": pa.array(np.asarray(pid, np.uint32) + np.asarray(thread, np.uint32)),
            "seq": u64(range(n)),
            "time_ns": pa.array(np.arange(n, dtype=np.int64)),
            "op": pa.array(np.asarray(op, np.uint8)),
            "size": u64(size),
            "alignment": null,
            "addr": u64(np.arange(n) * 16 + 4096),
            "freed_addr": null,
            "freed_size": null,
            "caller": null,
            "lifetime_ns": pa.array(life, pa.int64()),
            "lifetime_calls": pa.nulls(n, pa.int64()),
            "token": pa.array(np.zeros(n, np.uint8)),
            "caller_module": pa.nulls(n, CALLER_MODULE_TYPE),
            "caller_offset": null,
            "stack": pa.nulls(n, pa.uint64()),
        },
        schema=EVENTS_SCHEMA,
    )
