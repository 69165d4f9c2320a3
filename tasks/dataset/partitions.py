"""The events dataset: every raw run converted to Parquet with Dask, one task per raw file.

Each raw file becomes one part under `events/workload=<w>/run=<r>/`; a run of stack traces also
gets its stacks table there, `_stacks.parquet` (tasks.dataset.stacks_table); `_summary.json`
lists the committed parts. A run's partition is replaced atomically and idempotently: parts are staged in
`events/_staging/`, then committed by a swap (local folder) or by the summary's single write
(object store); a failed conversion leaves nothing. Every stage reads through `events_reader`.

The layout and the commit rules: docs/dataset.md#replacing-a-runs-partition
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import errno
import hashlib
import json
import logging
import mmap
import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from tasks.core.config import StrictModel, default_root
from tasks.core.storage import Root
from tasks.dataset.convert import FileStats, convert_groups
from tasks.dataset.dask_cluster import dask_client
from tasks.dataset.events_reader import (
    COMMIT_KEY,
    EVENTS_DIR,
    PART_PREFIX,
    PARTS_KEY,
    STACKS_KEY,
    STACKS_NAME,
    SUMMARY_NAME,
    committed_name,
    list_runs,
    read_run,
)
from tasks.dataset.events_schema import EVENTS_SCHEMA, PARTITION_COLUMNS
from tasks.dataset.stacks_table import ProcessStacks, run_stacks
from tasks.dataset.tokens import N_TOKENS
from tasks.dataset.worker_heap import heap_kept
from tasks.format.trace_reader import (
    RECORD_DTYPE,
    Trace,
    TraceFormatError,
    parse_trace,
    read_trace,
)

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"
MANIFEST_NAME = "manifest.json"
SYSROOT_DIR = "sysroot"  # a raw run's copies of a container's modules (tasks/replay)
FRAMES_DIR = "_frames"  # in a staging folder: each file's stacks, unnamed, until the run's table
# Bump when the conversion's output changes for the same input: it is part of the fingerprint,
# so every run converted by an older converter is out of date.
CONVERTER_VERSION = "3"

# Parquet settings, chosen by benchmarks/bench_convert.py on real traces: monotone or
# slowly-varying integers (time, seq) delta-encode to a few bits; columns with few distinct values
# (sizes) or many repeats (addresses are reused) dictionary-encode; lifetimes, freed sizes,
# tokens and op compress best as byte-stream-split planes under zstd (op: half the CPU of a
# dictionary for +0.01 B/event); constant ids (pid, tid) are plain (zstd takes them to nothing,
# without a dictionary's hashing). Times stay in ns. Large write batches: the writer's cost per
# batch, not per value, dominates on constant columns. zstd level 1, except where a higher level
# pays (measured on 22.5 M events): time_ns at 2 (-0.05 B/event), addr and size at 3 (-0.04),
# together +1% of the write's CPU; higher levels cost more than they save.
DELTA_COLUMNS = ("seq", "time_ns")
SPLIT_COLUMNS = ("lifetime_ns", "lifetime_calls", "freed_size", "token", "op")
PLAIN_COLUMNS = ("pid", "ppid", "thread", "tid", "alignment", "caller")
PARQUET_OPTIONS: dict[str, Any] = dict(
    compression="zstd",
    compression_level={**{f.name: 1 for f in EVENTS_SCHEMA}, "time_ns": 2, "addr": 3, "size": 3},
    use_dictionary=[
        f.name for f in EVENTS_SCHEMA if f.name not in DELTA_COLUMNS + SPLIT_COLUMNS + PLAIN_COLUMNS
    ],
    column_encoding={
        **{c: "DELTA_BINARY_PACKED" for c in DELTA_COLUMNS},
        **{c: "BYTE_STREAM_SPLIT" for c in SPLIT_COLUMNS},
        **{c: "PLAIN" for c in PLAIN_COLUMNS},
    },
    write_batch_size=1 << 20,
    write_statistics=["time_ns", "pid", "thread", "op", "token"],
)


@dataclass(frozen=True, order=True)
class RunRef:
    """One run of one workload: the folder raw/<workload>/<run>/."""

    workload: str
    run: str

    def __str__(self) -> str:
        return f"{self.workload}/{self.run}"


class DatasetError(RuntimeError):
    """A run that cannot be converted at all; the message names it."""


class DiskFull(DatasetError):
    """The data root's disk filled up during a conversion; the message names the run and the
    free space it needs. The run's previous partition is intact."""


# Parquet bytes per event assumed when a run has no earlier partition to measure: synthetic
# and real traces (benchmarks/results/convert.json: 2.3) stay well under it.
BYTES_PER_ROW_GUESS = 8.0


# ----------------------------------------------------------------------------------- listing


def _basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def _ls(fs: Any, path: str) -> list[dict[str, Any]]:
    try:
        return fs.ls(path, detail=True)
    except FileNotFoundError:
        return []


def list_raw_runs(
    root: Root, workloads: Iterable[str] | None = None, runs: Iterable[str] | None = None
) -> list[RunRef]:
    """Runs that have raw files, optionally only of `workloads` / named `runs`.

    A name in `runs` matches a run folder name or `workload/run`.
    """
    fs = root.fs
    fs.invalidate_cache()
    wanted_w = set(workloads) if workloads else None
    wanted_r = set(runs) if runs else None
    found = []
    for w_entry in _ls(fs, root.join("raw")):
        if w_entry["type"] != "directory":
            continue
        w = _basename(w_entry["name"])
        if w.startswith((".", "_")) or (wanted_w is not None and w not in wanted_w):
            continue
        for r_entry in _ls(fs, w_entry["name"]):
            r = _basename(r_entry["name"])
            if r_entry["type"] != "directory" or r.startswith((".", "_")):
                continue
            if wanted_r is not None and r not in wanted_r and f"{w}/{r}" not in wanted_r:
                continue
            ref = RunRef(w, r)
            named = wanted_r is not None
            # A failed replay keeps its partial trace for inspection, but is not training
            # data unless asked for by name (tasks/replay/manifest.py).
            if raw_files(root, ref) and (named or replay_ok(root, ref)):
                found.append(ref)
    return sorted(found)


def replay_ok(root: Root, run: RunRef) -> bool:
    """False when the run's manifest says its replay failed; True without a manifest
    (traces made by hand with `heapcast trace`)."""
    path = posixpath.join(root.raw_run(run.workload, run.run), MANIFEST_NAME)
    try:
        manifest = json.loads(root.fs.cat_file(path))
    except FileNotFoundError:
        return True
    if not manifest.get("ok", True):
        log.warning(
            "skipping %s/%s: its replay failed (%s); name the run to convert it anyway",
            run.workload,
            run.run,
            manifest.get("error"),
        )
        return False
    return True


def raw_files(root: Root, run: RunRef) -> list[dict[str, Any]]:
    """The files of a raw run to convert (everything but the manifest and hidden files)."""
    out = []
    for e in _ls(root.fs, root.raw_run(run.workload, run.run)):
        name = _basename(e["name"])
        if e["type"] == "file" and name != MANIFEST_NAME and not name.startswith((".", "_")):
            out.append(e)
    return sorted(out, key=lambda e: e["name"])


def raw_fingerprint(root: Root, run: RunRef) -> str:
    """A hash of what the run's conversion depends on: the manifest's bytes, each raw file's
    name, size and modification time, and the converter version."""
    fs = root.fs
    h = hashlib.sha256(
        f"converter {CONVERTER_VERSION} schema "
        f"{EVENTS_SCHEMA.metadata[b'heapcast.events.version'].decode()}\n".encode()
    )
    manifest = posixpath.join(root.raw_run(run.workload, run.run), MANIFEST_NAME)
    if fs.exists(manifest):
        h.update(b"manifest\n" + fs.cat_file(manifest) + b"\n")
    for e in raw_files(root, run):
        mtime = e.get("mtime") or e.get("LastModified") or e.get("ETag") or ""
        h.update(f"{_basename(e['name'])}\t{e['size']}\t{mtime}\n".encode())
    return h.hexdigest()


def read_summary(root: Root, run: RunRef) -> dict[str, Any] | None:
    """The run's stored summary, or None when the run has not been converted."""
    path = posixpath.join(root.events_run(run.workload, run.run), SUMMARY_NAME)
    try:
        return json.loads(root.fs.cat_file(path))
    except FileNotFoundError:
        return None


def runs_to_convert(
    root: Root,
    workloads: Iterable[str] | None = None,
    runs: Iterable[str] | None = None,
    force: bool = False,
) -> list[RunRef]:
    """Runs with raw traces and no up-to-date events (all of them with `force`)."""
    todo = []
    for run in list_raw_runs(root, workloads, runs):
        if force:
            todo.append(run)
            continue
        summary = read_summary(root, run)
        if summary is None or summary.get("fingerprint") != raw_fingerprint(root, run):
            todo.append(run)
    return todo


# -------------------------------------------------------------------------------- conversion


def write_events(tables: Iterable[pa.Table], where: Any) -> None:
    """Write consecutive events tables (EVENTS_SCHEMA) as one Parquet file, a row group each
    (convert_groups: up to GROUP_ROWS rows): to a local path, or an open binary file. Each
    table can be released once written."""
    # The writer's buffers from malloc (not Arrow's default mimalloc pool): during a conversion
    # they reuse the memory tasks.dataset.worker_heap keeps instead of faulting in fresh pages
    # (measured: -0.15 CPU-s per 22.5 M-event file).
    with pq.ParquetWriter(
        where, EVENTS_SCHEMA, memory_pool=pa.system_memory_pool(), **PARQUET_OPTIONS
    ) as writer:
        for table in tables:
            writer.write_table(table, row_group_size=max(table.num_rows, 1))


def part_name(raw_name: str) -> str:
    stem = raw_name[:-4] if raw_name.endswith(".hct") else raw_name
    return f"{PART_PREFIX}{stem}.parquet"


def _read_raw(raw_path: str, root: Root) -> Trace:
    """A raw trace; a local file is memory-mapped (its records are viewed in the page cache, not
    copied into Python bytes), anything else is read through the root's filesystem."""
    if not root.is_local:
        return read_trace(raw_path, fs=root.fs)
    try:
        with open(raw_path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return read_trace(raw_path)  # its error names the empty file
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            data = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    except FileNotFoundError:
        raise TraceFormatError(f"{raw_path}: no such trace file") from None
    return parse_trace(data, raw_path)


def convert_file(raw_path: str, root: Root, out_dir: str) -> dict[str, Any]:
    """Dask task: convert one raw file into `out_dir`/part-<stem>.parquet; small facts back.

    A file that is not a readable trace is not fatal: the result says why it was skipped.
    """
    fs = root.fs
    name = _basename(raw_path)
    with heap_kept():
        try:
            trace = _read_raw(raw_path, root)
        except TraceFormatError as err:
            return {"file": name, "skipped": str(err)}
        stacks = ProcessStacks.of_trace(trace)
        tables, stats = convert_groups(trace, stacks)
        part = part_name(name)
        out = posixpath.join(out_dir, part)
        if root.is_local:
            write_events(tables, out)  # Arrow's own file, not a Python file object
        else:
            with fs.open(out, "wb") as f:
                write_events(tables, f)
    h = trace.header
    warnings = _file_warnings(raw_path, trace.dropped_bytes)
    facts: dict[str, Any] = {}
    if stacks is not None:
        frames = stacks.table()
        _write_table(root, frames, posixpath.join(out_dir, FRAMES_DIR, part))
        warnings += stacks.warnings()
        facts["distinct_stacks"] = stacks.count()
    return {
        "file": name,
        "part": part,
        "pid": h.pid,
        "ppid": h.ppid,
        "cmdline": list(h.cmdline),
        "dropped_bytes": trace.dropped_bytes,
        "warnings": warnings,
        **facts,
        **stats.to_dict(),
    }


def _write_table(root: Root, table: pa.Table, path: str) -> None:
    """A small table (a file's or a run's stacks) as one Parquet file in the root's filesystem."""
    root.fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if root.is_local:
        pq.write_table(table, path, compression="zstd")
    else:
        with root.fs.open(path, "wb") as f:
            pq.write_table(table, f, compression="zstd")


def _read_table(root: Root, path: str) -> pa.Table:
    if root.is_local:
        return pq.read_table(path)
    with root.fs.open(path, "rb") as f:
        return pq.read_table(f)


@contextmanager
def _local_sysroot(root: Root, run: RunRef, sysroot: str | None, modules: list[str]):
    """A local folder holding the run's modules at their paths, or None: `sysroot` as given (a
    local folder), else the raw run's `sysroot/` when it has one; on an object store, the
    `modules` it holds are fetched into a temporary folder first."""
    if sysroot is not None:
        yield Path(sysroot)
        return
    fs = root.fs
    remote = posixpath.join(root.raw_run(run.workload, run.run), SYSROOT_DIR)
    if not fs.isdir(remote):
        yield None
    elif root.is_local:
        yield Path(remote)
    else:
        with tempfile.TemporaryDirectory(prefix="heapcast-sysroot-") as tmp:
            for m in modules:  # a loop over the run's modules
                src = posixpath.join(remote, m.lstrip("/"))
                if m.startswith("/") and fs.isfile(src):
                    dst = Path(tmp) / m.lstrip("/")
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(src, str(dst))
            yield Path(tmp)


def write_run_stacks(
    root: Root, run: RunRef, staging: str, sysroot: str | None = None
) -> dict[str, Any]:
    """Dask task: the run's stacks table from its files' (staged under FRAMES_DIR), named, into
    `staging`/STACKS_NAME; the facts for the run's summary."""
    fs = root.fs
    frames_dir = posixpath.join(staging, FRAMES_DIR)
    paths = sorted(p for p in fs.ls(frames_dir, detail=False) if p.endswith(".parquet"))
    tables = [_read_table(root, p) for p in paths]
    modules = sorted({m for t in tables for m in t.column("module").unique().to_pylist() if m})
    with _local_sysroot(root, run, sysroot, modules) as local:
        found = run_stacks(tables, local)
    _write_table(root, found.table, posixpath.join(staging, STACKS_NAME))
    fs.rm(frames_dir, recursive=True)
    warnings = []
    if found.unreadable_modules:
        m = found.unreadable_modules
        warnings.append(
            f"{run}: {len(m)} module(s) of its stacks cannot be read here ({', '.join(m[:3])}"
            f"{', ...' if len(m) > 3 else ''}): their frames are unnamed (module + offset); "
            "convert it where the binaries are, or give the run a sysroot "
            "(docs/dataset.md#call-stacks)"
        )
    return {
        "file": STACKS_NAME,
        "stacks": found.stacks,
        "frames": found.frames,
        "named": found.named,
        "sysroot": _sysroot_label(sysroot, root, run),
        "warnings": warnings,
    }


def _sysroot_label(sysroot: str | None, root: Root, run: RunRef) -> str | None:
    """The sysroot the names came from, for the summary: as given, or the raw run's."""
    if sysroot is not None:
        return sysroot
    remote = posixpath.join(root.raw_run(run.workload, run.run), SYSROOT_DIR)
    return root.url_of("raw", run.workload, run.run, SYSROOT_DIR) if root.fs.isdir(remote) else None


def _file_warnings(raw_path: str, dropped_bytes: int) -> list[str]:
    # Said here rather than caught from the reader's warning: warnings.catch_warnings is not
    # thread-safe, and Dask workers may run several files in threads.
    if not dropped_bytes:
        return []
    return [
        f"{raw_path}: dropped a truncated last record ({dropped_bytes} bytes); the process "
        "was probably killed or its disk filled while writing"
    ]


def _merge_stats(results: list[dict[str, Any]]) -> dict[str, Any]:
    total = FileStats()
    ops: dict[str, int] = {}
    hist = [0] * N_TOKENS
    for r in results:
        total.rows += r["rows"]
        total.threads += r["threads"]
        total.unpaired_frees += r["unpaired_frees"]
        total.never_freed += r["never_freed"]
        total.failed_allocations += r["failed_allocations"]
        total.peak_live_bytes = max(total.peak_live_bytes, r["peak_live_bytes"])
        for k, v in r["ops"].items():
            ops[k] = ops.get(k, 0) + v
        hist = [a + b for a, b in zip(hist, r["token_hist"])]
    total.ops = dict(sorted(ops.items()))
    total.token_hist = hist
    return total.to_dict()


def convert_run(
    root: Root,
    run: RunRef,
    client: Any = None,
    scheduler: str | None = None,
    sysroot: str | None = None,
) -> dict[str, Any]:
    """Convert one raw run into its events partition (atomically replaced); its summary.

    `client`: a dask.distributed Client to use; else one is opened on `scheduler` (an address)
    or on the local cluster (tasks.dataset.dask_cluster). `sysroot`: a local folder holding the
    run's modules at their paths, where its stacks' frames are named (default: the raw run's
    `sysroot/` folder when it has one, else this host's files; docs/dataset.md#call-stacks).
    """
    if client is None:
        with dask_client(scheduler) as c:
            return convert_run(root, run, client=c, sysroot=sysroot)

    fs = root.fs
    files = raw_files(root, run)
    if not files:
        raise DatasetError(
            f"{root.url_of('raw', run.workload, run.run)}: no raw trace files to "
            "convert; replay the workload first"
        )
    fingerprint = raw_fingerprint(root, run)
    staging_base = root.join(EVENTS_DIR, STAGING_DIR, run.workload, run.run)
    staging = posixpath.join(staging_base, uuid.uuid4().hex)
    # Largest files first, so a big file does not start last and hold the run up.
    files = sorted(files, key=lambda e: -int(e["size"]))
    try:
        fs.makedirs(staging, exist_ok=True)
        futures = client.map(
            convert_file, [e["name"] for e in files], root=root, out_dir=staging, pure=False
        )
        results = _gather_all(client, futures)
        stacks = None
        if any("distinct_stacks" in r for r in results):  # the run's stacks table, named once
            stacks = client.submit(
                write_run_stacks, root, run, staging, sysroot, pure=False
            ).result()
        summary = _run_summary(run, fingerprint, results, stacks)
        for line in summary["warnings"]:
            log.warning("%s", line)
        _commit(root, run, staging, staging_base, summary)
    except BaseException as err:
        # Never leave a partial output behind: invisible to readers, but it holds disk space.
        staged = _tree_bytes(fs, staging)
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
        if is_disk_full(err):
            raise DiskFull(disk_full_message(root, run, files, staged, err)) from err
        raise
    return summary


def _gather_all(client: Any, futures: list) -> list[dict[str, Any]]:
    """Every task's result; when one failed, its error, raised only once no task runs any
    more (none may write into a staging folder being removed). A full disk wins."""
    errors = []
    for f in futures:  # each waits for its task (through its own client: none is the default)
        try:
            err = f.exception()
        except Exception as lost:  # cancelled, or its worker died
            err = lost
        if err is not None:
            errors.append(err)
    if errors:
        raise next((e for e in errors if is_disk_full(e)), errors[0])
    return client.gather(futures)


def _run_summary(
    run: RunRef,
    fingerprint: str,
    results: list[dict[str, Any]],
    stacks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    done = sorted((r for r in results if "skipped" not in r), key=lambda r: r["file"])
    skipped = sorted(
        ({"file": r["file"], "reason": r["skipped"]} for r in results if "skipped" in r),
        key=lambda r: r["file"],
    )
    summary = {
        "workload": run.workload,
        "run": run.run,
        "fingerprint": fingerprint,
        "converted_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "converter_version": CONVERTER_VERSION,
        **_merge_stats(done),
        "processes": len(done),
        "skipped": skipped,
        "files": done,
        # what a reader should know: each file's warnings, then the stacks table's
        "warnings": [w for r in done for w in r.get("warnings", [])]
        + (stacks["warnings"] if stacks else []),
    }
    if stacks is not None:
        summary[STACKS_KEY] = stacks
    return summary


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC (or a quota), however it surfaced: Python, Arrow, or a Dask worker's copy."""
    if isinstance(err, DiskFull):
        return True
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return "No space left on device" in text or "Disk quota exceeded" in text


def _tree_bytes(fs: Any, path: str) -> int:
    try:
        return sum(int(e.get("size") or 0) for e in fs.find(path, detail=True).values())
    except (FileNotFoundError, OSError):
        return 0


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def space_needed(root: Root, run: RunRef, files: list[dict[str, Any]], staged: int = 0):
    """(bytes, how) a conversion of `files` needs free: its rows (at most one per raw record)
    times the bytes per row of the run's previous partition (BYTES_PER_ROW_GUESS without one),
    and at least what was staged when the disk filled, plus a margin."""
    raw_bytes = sum(int(e["size"]) for e in files)
    rows = raw_bytes / RECORD_DTYPE.itemsize
    previous = read_summary(root, run) or {}
    part_bytes = _tree_bytes(root.fs, root.events_run(run.workload, run.run))
    if previous.get("rows") and part_bytes:
        per_row = part_bytes / previous["rows"]
        how = f"{per_row:.1f} bytes per event, as its previous partition"
    else:
        per_row = BYTES_PER_ROW_GUESS
        how = f"{per_row:.0f} bytes per event, an upper estimate"
    estimate = int(rows * per_row * 1.25)
    needed = max(estimate, int(staged * 1.25)) + (1 << 20)
    return needed, f"~{rows:,.0f} events in {_mib(raw_bytes)} of raw traces at {how}"


def disk_full_message(
    root: Root, run: RunRef, files: list[dict[str, Any]], staged: int, err: BaseException
) -> str:
    where = root.join(EVENTS_DIR)
    needed, how = space_needed(root, run, files, staged)
    try:
        free = _mib(shutil.disk_usage(where).free) if root.is_local else "unknown"
    except OSError:
        free = "unknown"
    return (
        f"{run}: the data root's disk is full ({err}). Converting {run} needs about "
        f"{_mib(needed)} free under {root.url_of(EVENTS_DIR)} ({how}); {free} free now. "
        f"Nothing of {run} changed: its previous partition is intact and the partial output "
        "was removed. Free some space (or give the data root a larger disk) and run the "
        "`dataset` flow again."
    )


def _commit(
    root: Root, run: RunRef, staging: str, staging_base: str, summary: dict[str, Any]
) -> None:
    """Make the staged parts the run's partition (why it is safe:
    docs/dataset.md#replacing-a-runs-partition).

    The summary is the commit record and the manifest: it lists the committed parts, and the
    one reader (events_reader) reads exactly those."""
    fs = root.fs
    final = root.events_run(run.workload, run.run)
    commit = uuid.uuid4().hex[:16]
    if root.is_local:
        summary.update({COMMIT_KEY: commit, PARTS_KEY: sorted(f["part"] for f in summary["files"])})
        fs.pipe_file(posixpath.join(staging, SUMMARY_NAME), json.dumps(summary, indent=1).encode())
        fs.makedirs(posixpath.dirname(final), exist_ok=True)
        if not (fs.exists(final) and _exchange(staging, final)):
            old = staging + ".old"
            if fs.exists(final):
                fs.mv(final, old, recursive=True)
            fs.mv(staging, final, recursive=True)
        fs.rm(staging_base, recursive=True)  # the old partition, now in staging
        return
    # Object store: new names for this commit's parts, so no object a reader of the previous
    # summary may open is overwritten; then the summary (one object write) moves readers over.
    for f in summary["files"]:
        staged = f["part"]
        f["part"] = committed_name(staged, commit)
        fs.copy(posixpath.join(staging, staged), posixpath.join(final, f["part"]))
    stacks = summary.get(STACKS_KEY)
    if stacks is not None:
        stacks["file"] = committed_name(STACKS_NAME, commit)
        fs.copy(posixpath.join(staging, STACKS_NAME), posixpath.join(final, stacks["file"]))
    parts = sorted(f["part"] for f in summary["files"])
    summary.update({COMMIT_KEY: commit, PARTS_KEY: parts})
    fs.pipe_file(posixpath.join(final, SUMMARY_NAME), json.dumps(summary, indent=1).encode())
    # Only now the stale parts (the previous commit's, or a killed commit's): a reader still on
    # the previous summary finds one gone and reads again through the new one.
    fs.invalidate_cache(final)
    kept = set(parts) | ({stacks["file"]} if stacks is not None else set())
    stale_stacks = STACKS_NAME.removesuffix(".parquet") + "."
    for e in _ls(fs, final):
        name = _basename(e["name"])
        if name.startswith((PART_PREFIX, stale_stacks)) and name not in kept:
            fs.rm_file(e["name"])
    fs.rm(staging_base, recursive=True)
    fs.invalidate_cache()


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap two local folders in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where
    the C library or the file system cannot (the caller falls back to two renames)."""

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), a)


def sweep_staging(root: Root, converting: Iterable[RunRef] = ()) -> list[str]:
    """Remove what killed conversions left in events/_staging (invisible to readers, but it
    holds disk space) for runs whose partition is up to date (nothing converts those), except
    `converting`; returns the folders removed. A run that is out of date keeps its leftovers
    until its next conversion, whose commit clears them."""
    fs = root.fs
    skip = set(converting)
    removed = []
    for w_entry in _ls(fs, root.join(EVENTS_DIR, STAGING_DIR)):
        for r_entry in _ls(fs, w_entry["name"]):
            run = RunRef(_basename(w_entry["name"]), _basename(r_entry["name"]))
            summary = read_summary(root, run)
            if run in skip or summary is None:
                continue
            if summary.get("fingerprint") == raw_fingerprint(root, run):
                fs.rm(r_entry["name"], recursive=True)
                removed.append(r_entry["name"])
    return removed


# ----------------------------------------------------------------------------------- reading


def events_dataset_schema() -> pa.Schema:
    return EVENTS_SCHEMA.append(pa.field("workload", pa.string())).append(
        pa.field("run", pa.string())
    )


def read_events(
    root: Root,
    workloads: Iterable[str] | None = None,
    runs: Iterable[str] | None = None,
    columns: list[str] | None = None,
) -> pa.Table:
    """Events of the named workloads/runs (all by default) as one Arrow table, with the
    partition columns `workload` and `run`; each run read through the one reader
    (tasks.dataset.events_reader), its rows in call order."""
    schema = events_dataset_schema()
    columns = list(columns or schema.names)
    event_columns = [c for c in columns if c not in PARTITION_COLUMNS]
    wanted_runs = set(runs) if runs else None
    tables = []
    for found in list_runs(root, workloads or None):
        if wanted_runs is not None and found.run not in wanted_runs:
            continue
        t = read_run(root, found.workload, found.run, event_columns)
        for name, value in (("workload", found.workload), ("run", found.run)):
            if name in columns:
                t = t.append_column(name, pa.repeat(pa.scalar(value, pa.string()), t.num_rows))
        tables.append(t.select(columns))
    if not tables:
        return schema.empty_table().select(columns)
    return pa.concat_tables(tables)


def summary_markdown(summary: dict[str, Any]) -> str:
    """The run's summary as Markdown (the flow publishes it as a Prefect artifact)."""
    lines = [
        f"# Events of {summary['workload']}/{summary['run']}",
        "",
        f"- rows: {summary['rows']:,} from {summary['processes']} process(es), "
        f"{summary['threads']} thread(s)",
        f"- unpaired frees: {summary['unpaired_frees']:,}; blocks never freed: "
        f"{summary['never_freed']:,}; failed allocations: {summary['failed_allocations']:,}",
        f"- peak live bytes (largest process): {summary['peak_live_bytes']:,}",
        f"- fingerprint: `{summary['fingerprint'][:16]}`",
        "",
        "| operation | events |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:,} |" for k, v in summary["ops"].items()]
    hist = summary["token_hist"]
    lines += ["", "| token | events |", "|---:|---:|"]
    lines += [f"| {t} | {c:,} |" for t, c in enumerate(hist) if c]
    stacks = summary.get(STACKS_KEY)
    if stacks:
        lines += [
            "",
            f"- call stacks: {stacks['stacks']:,} distinct, {stacks['frames']:,} distinct "
            f"frames, {stacks['named']:,} of them named",
        ]
    if summary["skipped"]:
        lines += ["", "## Skipped files", ""]
        lines += [f"- `{s['file']}`: {s['reason']}" for s in summary["skipped"]]
    if summary.get("warnings"):
        lines += ["", "## Warnings", ""]
        lines += [f"- {w}" for w in summary["warnings"]]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- the flow's


class DatasetParams(StrictModel):
    """What the `dataset` flow converts, where, and on which Dask cluster."""

    root: str = Field(default_factory=default_root, description="data root: folder or s3:// URL")
    workloads: list[str] | None = Field(None, description="only these workloads (default: all)")
    runs: list[str] | None = Field(None, description="only these runs: `run` or `workload/run`")
    scheduler: str | None = Field(
        default_factory=lambda: os.environ.get("HEAPCAST_DASK_SCHEDULER") or None,
        description="Dask scheduler address ($HEAPCAST_DASK_SCHEDULER); a local cluster if unset",
    )
    force: bool = Field(False, description="convert even runs whose events are up to date")


class ConversionFailed(RuntimeError):
    """Some runs could not be converted; the others were. The message names each and why."""


def conversion_outcomes(
    runs: list[RunRef], states: list[Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Split the final states of the runs' conversions into summaries and failure lines."""
    summaries, failures = [], []
    for run, state in zip(runs, states):
        if state.is_completed():
            summaries.append(state.result())
        else:
            try:
                state.result()
                why = state.message or state.name
            except Exception as err:  # the conversion's own error, after its retries
                why = f"{type(err).__name__}: {err}"
            failures.append(f"{run}: {why}")
    return summaries, failures


def fail_if_any(failures: list[str]) -> None:
    """Raise once every run was attempted, so one bad run never stops the others."""
    if failures:
        raise ConversionFailed(
            f"{len(failures)} run(s) could not be converted:\n  " + "\n  ".join(failures)
        )
