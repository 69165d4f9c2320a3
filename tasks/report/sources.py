"""What a report reads: a run, resolved from what the user named, as a sequence of `Part`s (one
trace file or one events part each) whose rows come in Arrow batches.

A run is named as
- a folder of raw traces (`*.hct`): each file converted in-process by the dataset's converter
  (`convert_groups`, a row group of up to 1 M rows at a time), never written;
- a run folder of the events dataset (`<root>/events/workload=<w>/run=<r>/`), read a batch at a
  time, only the columns the report uses;
- one or more `.hct` or `.parquet` files;
- `WORKLOAD/RUN` under the data root: its events when converted, else its raw traces.

Bad input is named: a folder with nothing to read and a run that does not exist raise
`ReportInputError`; a file that cannot be read among good ones is a warning (`RunInput.warnings`)
and the others are reported (docs/report.md#what-a-report-reads).
"""

from __future__ import annotations

import json
import mmap
import os
import queue
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from tasks.core.storage import Root
from tasks.dataset.convert import convert_groups
from tasks.dataset.events_reader import EVENTS_DIR, EventsNotFound, RunParts
from tasks.format.trace_reader import TraceFormatError, parse_header, parse_trace, read_trace

# The columns of EVENTS_SCHEMA the report reads (the others are never decoded).
COLUMNS = (
    "pid",
    "ppid",
    "tid",
    "time_ns",
    "op",
    "size",
    "addr",
    "freed_size",
    "caller",
    "lifetime_ns",
    "lifetime_calls",
    "token",
)
# Read where a part has them (events parts written before they existed do not): the caller's
# module and offset (traces recorded with their module map)
OPTIONAL_COLUMNS = ("caller_module", "caller_offset")
BATCH_ROWS = 1 << 20
TRACE_SUFFIX = ".hct"
PARQUET_SUFFIX = ".parquet"
MANIFEST_NAME = "manifest.json"  # tasks.replay.manifest / tasks.dataset.partitions
# <pid>-<start_realtime_ns>[-k].hct (FORMAT.md) and its part, part-<pid>-<ns>[-k].parquet
_NAME_NS = re.compile(r"^(?:part-)?(\d+)-(\d+)(?:-\d+)?\.(?:hct|parquet)$")


_LOCAL = LocalFileSystem()


class ReportInputError(ValueError):
    """Nothing can be reported from what was named; the message names it and says why."""


@dataclass
class Part:
    """One process image's file (a raw trace, or an events part: a part may hold several pids,
    as hand-made datasets do), and what is known of it before its rows are read."""

    name: str
    batches: Iterator[pa.Table | pa.RecordBatch]
    pid: int | None = None
    ppid: int | None = None
    cmdline: tuple[str, ...] = ()
    start_ns: int | None = None  # CLOCK_REALTIME start (header / file name): orders images
    rows: int | None = None  # rows it holds, when known before reading them
    one_pid: bool = False  # every row is of `pid`: the pid and ppid columns are not read


@dataclass
class RunInput:
    """A resolved run: where its files are and what the run's own metadata says."""

    label: str  # what the user named, for titles and messages
    kind: str  # "raw" or "events"
    files: list[str]
    fs: Any = None  # an fsspec filesystem for a remote root; None: local paths
    manifest: dict[str, Any] | None = None  # raw/<w>/<r>/manifest.json (a replay's)
    summary: dict[str, Any] | None = None  # events/.../_summary.json (the conversion's)
    # a run folder of the events dataset: its committed parts, through the one reader
    parts: RunParts | None = None
    # the run's raw traces: `files` for a raw run; for a run of the events dataset, those of
    # the data root's raw/<w>/<r>/ when they are still there (the call stacks are read from
    # them: tasks.report.run_stacks)
    traces: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind == "raw" and not self.traces:
            self.traces = list(self.files)

    @property
    def command(self) -> list[str] | None:
        if self.manifest and self.manifest.get("command"):
            return list(self.manifest["command"])
        return None


def _read_json(path: str, fs: Any = None) -> dict[str, Any] | None:
    try:
        data = fs.cat_file(path) if fs is not None else Path(path).read_bytes()
        out = json.loads(data)
    except (FileNotFoundError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


def _from_folder(folder: Path, label: str) -> RunInput:
    if not folder.is_dir():
        raise ReportInputError(f"{folder}: no such folder")
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and _visible(p.name))
    hct = [str(folder / n) for n in names if n.endswith(TRACE_SUFFIX)]
    parts = [str(folder / n) for n in names if n.endswith(PARQUET_SUFFIX)]
    if hct:
        run = RunInput(label, "raw", hct, manifest=_read_json(str(folder / MANIFEST_NAME)))
        if parts:
            run.warnings.append(
                f"{folder}: holds both raw traces and Parquet files; reporting the "
                f"{len(hct)} trace(s), ignoring {len(parts)} .parquet file(s)"
            )
        return run
    if parts:
        committed = RunParts.of_folder(_LOCAL, str(folder), str(folder), label, local=True)
        run = _events_input(label, committed)
        # the replay's manifest, when the folder sits in a data root's events/workload=/run=
        w, r = folder.parent.name, folder.name
        if w.startswith("workload=") and r.startswith("run="):
            raw = folder.parents[2] / "raw" / w[len("workload=") :] / r[len("run=") :]
            run.manifest = _read_json(str(raw / MANIFEST_NAME))
            if raw.is_dir():
                run.traces = sorted(
                    str(p) for p in raw.glob(f"*{TRACE_SUFFIX}") if _visible(p.name)
                )
        return run
    sub = sorted(p.name for p in folder.iterdir() if p.is_dir())
    hint = ""
    if any(s.startswith("workload=") for s in sub) or "events" in sub or "raw" in sub:
        hint = (
            "; this looks like a data root or the events dataset: name one run, as "
            "WORKLOAD/RUN with --root, or its folder events/workload=<w>/run=<r>"
        )
    elif sub:
        hint = f"; it has sub-folders ({', '.join(sub[:5])}): name one run's folder"
    raise ReportInputError(
        f"{folder}: no heapcast traces (*{TRACE_SUFFIX}) and no events parts "
        f"(*{PARQUET_SUFFIX}) in this folder{hint}"
    )


def _events_input(label: str, committed: RunParts) -> RunInput:
    """A run of the events dataset: the parts its summary commits (tasks.dataset.events_reader),
    read through `committed`."""
    files = [f"{committed.url}/{n}" for n in committed.names]
    return RunInput(
        label, "events", files, fs=committed.fs, summary=committed.summary, parts=committed
    )


def _from_files(paths: list[Path], label: str) -> RunInput:
    folders = [str(p) for p in paths if p.is_dir()]
    if folders and len(paths) > 1:
        raise ReportInputError(
            f"{', '.join(folders)}: a folder among several names; give one run folder, or "
            "trace (.hct) or part (.parquet) files"
        )
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ReportInputError(f"{', '.join(missing)}: no such file")
    kinds = {p.suffix for p in paths}
    if kinds == {TRACE_SUFFIX}:
        return RunInput(label, "raw", [str(p) for p in paths])
    if kinds == {PARQUET_SUFFIX}:
        return RunInput(label, "events", [str(p) for p in paths])
    raise ReportInputError(
        f"{label}: give raw traces (*{TRACE_SUFFIX}) or events parts (*{PARQUET_SUFFIX}), "
        f"not {', '.join(sorted(k or '(no suffix)' for k in kinds))}"
    )


def _from_root(workload: str, run: str, root: Root, label: str) -> RunInput:
    if root.is_local:
        events = Path(root.events_run(workload, run))
        raw = Path(root.raw_run(workload, run))
        if events.is_dir() and any(events.glob(f"*{PARQUET_SUFFIX}")):
            return _from_folder(events, label)
        if raw.is_dir() and any(raw.glob(f"*{TRACE_SUFFIX}")):
            return _from_folder(raw, label)
        where = f"{events} or {raw}"
    else:
        fs = root.fs
        raw_s = root.raw_run(workload, run)
        try:
            committed = RunParts.of_run(root, workload, run)
        except EventsNotFound:
            committed = None
        try:
            names = sorted(fs.ls(raw_s, detail=False))
        except FileNotFoundError:
            names = []
        files = [n for n in names if n.endswith(TRACE_SUFFIX) and _visible(n.rsplit("/", 1)[-1])]
        if committed is not None and committed.names:
            found = _events_input(label, committed)
            found.manifest = _read_json(f"{raw_s}/{MANIFEST_NAME}", fs)
            found.traces = files
            return found
        if files:
            return RunInput(
                label, "raw", files, fs=fs, manifest=_read_json(f"{raw_s}/{MANIFEST_NAME}", fs)
            )
        where = f"{root.url_of(EVENTS_DIR, f'workload={workload}', f'run={run}')} or {root.url_of('raw', workload, run)}"
    raise ReportInputError(
        f"{label}: no such run under the data root {root.url} (nothing to read in {where}); "
        "pass --root, or the run's folder"
    )


def resolve(spec: str | Sequence[str], root: Root | None = None) -> RunInput:
    """The run named by `spec`: a folder, files, or `WORKLOAD/RUN` under `root` (the caller's
    data root; the CLI's --root). Raises ReportInputError naming what is wrong."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise ReportInputError("nothing to report: name a run folder, trace files or WORKLOAD/RUN")
    label = " ".join(specs)
    if len(specs) > 1:
        return _from_files([Path(s) for s in specs], label)
    s = specs[0]
    p = Path(s)
    if p.is_dir():
        return _from_folder(p, label)
    if p.is_file():
        return _from_files([p], label)
    m = re.fullmatch(r"([^/\s]+)/([^/\s]+)", s.strip("/"))
    if m and not s.startswith(("/", ".")):
        if root is None:
            raise ReportInputError(f"{s}: a WORKLOAD/RUN name needs a data root: pass --root")
        return _from_root(m[1], m[2], root, label)
    raise ReportInputError(f"{s}: no such file or folder (nor a WORKLOAD/RUN name)")


# ------------------------------------------------------------------------------------ reading


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def start_ns_of(name: str) -> int | None:
    """The start (CLOCK_REALTIME ns) in a trace's or part's file name, if it has one."""
    m = _NAME_NS.match(name)
    return int(m[2]) if m else None


def open_trace(path: str, fs: Any) -> tuple[Any, str | None]:
    """A Trace, and the warning for a truncated last record if any. A local file is
    memory-mapped (records viewed in the page cache, not copied). The truncated record is cut
    here, not left to the reader's warnings.warn: this runs in a reading thread, where
    warnings.catch_warnings is not safe."""

    if fs is not None:
        with fs.open(path, "rb") as f:
            data: Any = f.read()
    else:
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return read_trace(path), None  # its error names the empty file
                data = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        except FileNotFoundError:
            raise TraceFormatError(f"{path}: no such trace file") from None
    h = parse_header(data, path)
    dropped = (len(data) - h.header_size) % h.record_size
    why = None
    if dropped:
        data = memoryview(data)[: len(data) - dropped]
        why = (
            f"{path}: dropped a truncated last record ({dropped} bytes); the process was "
            "probably killed or its disk filled while writing"
        )
    return parse_trace(data, path), why


def _raw_parts(run: RunInput) -> Iterator[Part]:

    for path in run.files:
        name = _name(path)
        try:
            trace, why = open_trace(path, run.fs)
        except TraceFormatError as err:
            run.warnings.append(f"skipped {err}")
            continue
        except OSError as err:
            run.warnings.append(f"skipped {path}: {err}")
            continue
        if why:
            run.warnings.append(why)
        h = trace.header
        tables, stats = convert_groups(trace)  # plans the whole file: stats.rows is known
        yield Part(
            name,
            _guarded(tables, path, run),
            pid=h.pid,
            ppid=h.ppid,
            cmdline=tuple(h.cmdline),
            start_ns=h.start_realtime_ns,
            rows=stats.rows,
            one_pid=True,
        )


def _guarded(batches: Iterator[Any], path: str, run: RunInput) -> Iterator[Any]:
    """`batches`, read ahead in a thread, stopping with a warning naming `path` when reading
    them fails midway."""
    rows = 0
    try:
        for b in _read_ahead(batches):
            rows += b.num_rows
            yield b
    except (pa.ArrowException, OSError, ValueError) as err:
        run.warnings.append(f"{path}: reading stopped after {rows} rows: {err}")


class _Raised:
    def __init__(self, err: BaseException) -> None:
        self.err = err


def _read_ahead(it: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """The items of `it`, produced by a thread up to `depth` ahead of the consumer: decoding
    the next batch (Arrow, or the converter's numpy work: both release the GIL) overlaps with
    reducing this one. The producer's exceptions are raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for x in it:
                while not stop.is_set():
                    try:
                        q.put(x, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as err:  # handed to the consumer
            q.put(_Raised(err))

    worker = threading.Thread(target=produce, name="heapcast-report-read", daemon=True)
    worker.start()
    try:
        while True:
            x = q.get()
            if x is done:
                return
            if isinstance(x, _Raised):
                raise x.err
            yield x
    finally:
        stop.set()


def _pid_range(pf: Any) -> tuple[int, int] | None:
    """The smallest and largest pid of a Parquet file, from its row groups' statistics."""
    md = pf.metadata
    try:
        j = pf.schema_arrow.get_field_index("pid")
        lo = hi = None
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(j).statistics
            if st is None or not st.has_min_max:
                return None
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
    except (KeyError, ValueError):
        return None
    return None if lo is None else (int(lo), int(hi))


def _events_parts(run: RunInput) -> Iterator[Part]:

    by_part = {}
    for f in (run.summary or {}).get("files", []):
        if isinstance(f, dict) and "part" in f:
            by_part[f["part"]] = f
    for i, path in enumerate(run.files):
        name = _name(path)
        try:
            if run.parts is not None:
                pf = run.parts.open(i)
            else:
                pf = pq.ParquetFile(run.fs.open(path, "rb") if run.fs is not None else path)
            missing = [c for c in COLUMNS if c not in set(pf.schema_arrow.names)]
            if missing:
                raise ValueError(f"no column(s) {', '.join(missing)}")
            info = by_part.get(name, {})
            pid, ppid = info.get("pid"), info.get("ppid")
            rows = pf.metadata.num_rows
            pids = _pid_range(pf) if rows else None
            one_pid = pids is not None and pids[0] == pids[1] and pid in (None, pids[0])
            if one_pid:
                pid = pids[0]
                if ppid is None:  # the first row's: one column of one row group
                    ppid = int(pf.read_row_group(0, columns=["ppid"]).column(0)[0].as_py())
            skip = {"pid", "ppid"} if one_pid else set()
            if info.get("failed_allocations") == 0:
                skip.add("addr")  # only needed to tell failed allocations (analysis._rows)
            cols = [c for c in COLUMNS if c not in skip]
            cols += [c for c in OPTIONAL_COLUMNS if c in set(pf.schema_arrow.names)]
        except (pa.ArrowException, OSError, ValueError) as err:
            run.warnings.append(f"skipped {path}: not a readable events part ({err})")
            continue
        batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=cols, use_threads=True)
        yield Part(
            name,
            _guarded(batches, path, run),
            pid=pid,
            ppid=ppid,
            cmdline=tuple(info.get("cmdline") or ()),
            start_ns=start_ns_of(info.get("file") or name),
            rows=rows,
            one_pid=one_pid,
        )


def iter_parts(run: RunInput) -> Iterator[Part]:
    """The run's parts in file order; files that cannot be read are skipped with a warning in
    `run.warnings` that names them."""
    if run.kind == "raw":
        # the next file is opened and planned by the converter (whole-file numpy work) in a
        # thread while this one's rows are reduced
        return _read_ahead(_raw_parts(run), depth=1)
    return _events_parts(run)
