"""The one reader of the events dataset (DESIGN.md: data contracts): every stage reads events
through it; `partitions` is the writer.

    list_runs(root)                              the runs, each with its summary
    read_run(root, w, r, columns)                one run as a table, in CALL ORDER
    iter_batches(root, w, r, columns)            the same rows a record batch at a time
    RunParts.of_run(root, w, r) / .of_folder()   the committed parts, for a reader per part
    read_stacks(root, w, r)                      the run's stacks table (STACKS_SCHEMA)
    read_stack_frames(root, w, r)                the same as StackFrames: events' stack -> frames

CALL ORDER: one part per raw trace file (per process image), parts in the order of their names,
within a part the process's calls in time order; a reader that wants per-thread order sorts by (pid,
thread, seq) itself. THE MANIFEST RULE: a run's committed parts are those its `_summary.json` lists,
so a reader never sees two commits' parts mixed; a listed part gone is retried once. Both in full:
docs/dataset.md#reading-the-events. Errors name the workload, the run and the file, and say what to
do.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tasks.core.distinct import distinct_rows
from tasks.core.storage import Root
from tasks.dataset.events_schema import EVENTS_SCHEMA, STACKS_SCHEMA
from tasks.format.frames import Frames
from tasks.format.trace_reader import rows_of

EVENTS_DIR = "events"
SUMMARY_NAME = "_summary.json"
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
PARTS_KEY = "parts"  # the summary's list of committed part files (the manifest)
STACKS_KEY = "stacks"  # the summary's facts of the run's stacks table, with its file's name
STACKS_NAME = "_stacks.parquet"  # the run's stacks table (a plain reader of events skips it)
COMMIT_KEY = "commit"  # the commit's id: object-store parts carry it in their names
BATCH_ROWS = 1 << 17  # pyarrow's own default
# A part written by a commit on an object store: part-<stem>.<16 hex digits>.parquet
_COMMIT_TAGGED = re.compile(r"\.[0-9a-f]{16}\.parquet$")


class EventsNotFound(FileNotFoundError):
    """The run (or the dataset) is not there; the message names it and says what to do."""


class EventsChanged(RuntimeError):
    """The run was converted again while it was read, twice in a row; read it again."""


class EventsReadError(ValueError):
    """A committed part cannot be read as events; the message names the file."""


def committed_name(part: str, commit: str) -> str:
    """The name an object-store commit gives `part` (`part-<stem>.parquet`)."""
    return f"{part.removesuffix(PART_SUFFIX)}.{commit}{PART_SUFFIX}"


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


def _name(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


# ------------------------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class EventsRun:
    """One run of the events dataset and its conversion summary (None: a hand-made run)."""

    workload: str
    run: str
    summary: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.workload}/{self.run}"


def _ls_dirs(fs: Any, path: str, key: str) -> list[tuple[str, str]]:
    """(value, path) of the visible `key=value` folders in `path`."""
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        name = _name(e["name"])
        if e["type"] == "directory" and name.startswith(f"{key}="):
            out.append((name.split("=", 1)[1], e["name"]))
    return sorted(out)


def _read_summary(fs: Any, folder: str) -> dict[str, Any] | None:
    try:
        out = json.loads(fs.cat_file(posixpath.join(folder, SUMMARY_NAME)))
    except FileNotFoundError:
        return None
    return out if isinstance(out, dict) else None


def list_runs(root: Root, workloads: Iterable[str] | None = None) -> list[EventsRun]:
    """The runs of the events dataset (of `workloads` only, if given), sorted, each with its
    summary; a run folder with neither a summary nor a part is not a run. None: []."""
    fs = root.fs
    fs.invalidate_cache()
    wanted = set(workloads) if workloads is not None else None
    found = []
    for w, w_path in _ls_dirs(fs, root.join(EVENTS_DIR), "workload"):
        if wanted is not None and w not in wanted:
            continue
        for r, r_path in _ls_dirs(fs, w_path, "run"):
            summary = _read_summary(fs, r_path)
            if summary is not None or _listed_parts(fs, r_path):
                found.append(EventsRun(w, r, summary))
    return found


def has_dataset(root: Root) -> bool:
    """Whether the root holds an events dataset folder at all."""
    return root.fs.exists(root.join(EVENTS_DIR))


# ----------------------------------------------------------------------------- one run's parts


def _listed_parts(fs: Any, folder: str, handle: _FolderHandle | None = None) -> list[str]:
    """Names of the parts in a folder without a manifest: visible Parquet files, less those a
    commit in progress is copying in (commit-tagged names: not committed until listed)."""
    try:
        if handle is not None:
            names = os.listdir(handle.base)
        else:
            names = [_name(p) for p in fs.ls(folder, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(
        n for n in names if _visible(n) and n.endswith(PART_SUFFIX) and not _COMMIT_TAGGED.search(n)
    )


class _FolderHandle:
    """A local folder held open, so that its files are resolved in the folder this handle
    opened even after a commit renames another folder into its place (Linux /proc/self/fd).
    Elsewhere, the folder's path."""

    def __init__(self, folder: str) -> None:
        self.fd: int | None = None
        self.base = folder
        if os.path.isdir("/proc/self/fd"):
            try:
                self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                raise
            except OSError:  # not a folder one may open: read it by its path
                self.fd = None
            else:
                self.base = f"/proc/self/fd/{self.fd}"

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:  # a RunParts handed on (a report's input) and never closed
        self.close()


@dataclass
class RunParts:
    """The committed parts of one run, resolved once (the manifest rule: docs/dataset.md#reading-the-events):
    their names in call order, the summary, and how to open each. Close it when done (or use
    it as a context manager): a local one holds its folder open."""

    label: str  # workload/run, or the folder a user named
    url: str  # the run folder, for messages
    fs: Any
    folder: str
    names: list[str]
    summary: dict[str, Any] | None
    handle: _FolderHandle | None = None

    @classmethod
    def of_folder(cls, fs: Any, folder: str, url: str, label: str, local: bool) -> RunParts:
        """The committed parts of the run folder `folder` of `fs` (EventsNotFound if none)."""
        handle = None
        try:
            if local:
                handle = _FolderHandle(folder)
                summary = _read_summary_local(handle)
            else:
                fs.invalidate_cache(folder)
                summary = _read_summary(fs, folder)
            if summary is not None and isinstance(summary.get(PARTS_KEY), list):
                names = [str(n) for n in summary[PARTS_KEY]]
            else:
                names = _listed_parts(fs, folder, handle)
        except FileNotFoundError:
            names, summary = [], None
        if not names and summary is None:
            if handle is not None:
                handle.close()
            raise EventsNotFound(
                f"{url}: no events of {label} (no {SUMMARY_NAME} and no parts); convert the run "
                "with the dataset flow first, or check the workload and run names"
            )
        return cls(label, url, fs, folder, names, summary, handle)

    @classmethod
    def of_run(cls, root: Root, workload: str, run: str) -> RunParts:
        folder = root.events_run(workload, run)
        url = root.url_of(EVENTS_DIR, f"workload={workload}", f"run={run}")
        try:
            return cls.of_folder(root.fs, folder, url, f"{workload}/{run}", root.is_local)
        except EventsNotFound:
            runs = [str(r) for r in list_runs(root, [workload])]
            raise EventsNotFound(
                f"{url}: no events of run {workload}/{run} (runs of {workload}: "
                f"{', '.join(runs) or 'none'}); convert it with the dataset flow first, or "
                "check the workload and run names"
            ) from None

    def __enter__(self) -> RunParts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()

    def paths(self) -> list[str]:
        """Each part's path (a local one through the open folder)."""
        if self.handle is not None:
            return [self.handle.path(n) for n in self.names]
        return [posixpath.join(self.folder, n) for n in self.names]

    def open(self, i: int) -> pq.ParquetFile:
        """Part i opened (FileNotFoundError when it is gone: the run was committed again)."""
        path = self.paths()[i]
        try:
            if self.handle is not None:
                return pq.ParquetFile(path, pre_buffer=True)
            return pq.ParquetFile(self.fs.open(path, "rb"), pre_buffer=True)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as err:
            raise EventsReadError(
                f"{posixpath.join(self.url, self.names[i])}: not a readable events part "
                f"of {self.label} ({err}); convert the run again (dataset flow with force)"
            ) from err


def _read_summary_local(handle: _FolderHandle) -> dict[str, Any] | None:
    try:
        with open(handle.path(SUMMARY_NAME), "rb") as f:
            out = json.loads(f.read())
    except FileNotFoundError:
        if handle.fd is None and not os.path.isdir(handle.base):
            raise
        return None
    return out if isinstance(out, dict) else None


# ------------------------------------------------------------------------------------- reading


def _schema(columns: list[str]) -> pa.Schema:
    """The chosen columns as EVENTS_SCHEMA types: a part written before a column existed reads
    it as nulls."""
    unknown = [c for c in columns if EVENTS_SCHEMA.get_field_index(c) < 0]
    if unknown:
        raise EventsReadError(
            f"no events column(s) {', '.join(unknown)} (events columns: "
            f"{', '.join(EVENTS_SCHEMA.names)}); ask for events columns"
        )
    return pa.schema([EVENTS_SCHEMA.field(c) for c in columns])


def _dataset(parts: RunParts, schema: pa.Schema) -> pads.Dataset:
    """The parts as one pyarrow dataset, fragments in call order (the order of their paths)."""
    fs = pafs.LocalFileSystem() if parts.handle is not None else parts.fs
    return pads.dataset(parts.paths(), filesystem=fs, format="parquet", schema=schema)


@contextmanager
def _named(parts: RunParts) -> Iterator[None]:
    """A part that cannot be read: an error naming it (where the user would look for it)."""
    try:
        yield
    except FileNotFoundError:
        raise  # gone: the caller reads again through the new summary
    except (pa.ArrowException, OSError) as err:
        base = parts.handle.base if parts.handle is not None else parts.folder
        why = str(err).replace(base, parts.url)
        raise EventsReadError(
            f"{parts.url}: a part of {parts.label} is not a readable events part ({why}); "
            "convert the run again (dataset flow with force)"
        ) from err


def _empty(columns: list[str], part_column: str | None) -> pa.Table:
    fields = [EVENTS_SCHEMA.field(c) for c in columns]
    if part_column:
        fields.append(pa.field(part_column, pa.uint32()))
    return pa.schema(fields).empty_table()


def _columns(columns: Iterable[str] | None) -> list[str]:
    return list(columns) if columns is not None else list(EVENTS_SCHEMA.names)


def _read_parts(parts: RunParts, columns: list[str], part_column: str | None) -> pa.Table:
    schema = _schema(columns)
    if not parts.names:
        return _empty(columns, part_column)
    with _named(parts):
        dataset = _dataset(parts, schema)
        if not part_column:
            return dataset.to_table(columns=columns)
        tables = []
        for i, fragment in enumerate(dataset.get_fragments()):
            t = fragment.to_table(schema=schema, columns=columns)
            tables.append(t.append_column(part_column, pa.array(np.full(t.num_rows, i, np.uint32))))
        return pa.concat_tables(tables)


def _changed(parts: RunParts, err: BaseException) -> EventsChanged:
    return EventsChanged(
        f"{parts.url}: a part of {parts.label} listed by its {SUMMARY_NAME} went away while "
        f"it was read, twice ({err}): the run is being converted again right now; read it "
        "again once the dataset flow is done"
    )


def read_run(
    root: Root,
    workload: str,
    run: str,
    columns: Iterable[str] | None = None,
    part_column: str | None = None,
) -> pa.Table:
    """One run's events (`columns` of EVENTS_SCHEMA, all by default) in call order (module
    docstring). `part_column`: also a uint32 column of that name holding each row's part number
    (0, 1, ...: a part is one process image). EventsNotFound when the run is not there."""
    cols = _columns(columns)
    for attempt in (0, 1):
        with RunParts.of_run(root, workload, run) as parts:
            try:
                return _read_parts(parts, cols, part_column)
            except FileNotFoundError as err:
                if attempt:
                    raise _changed(parts, err) from err
    raise AssertionError("unreachable")


def iter_batches(
    root: Root,
    workload: str,
    run: str,
    columns: Iterable[str] | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """One run's events a record batch (at most `batch_rows` rows) at a time, in call order;
    memory holds a few batches of the chosen columns, whatever the run's size."""
    cols = _columns(columns)
    for attempt in (0, 1):
        yielded = False
        with RunParts.of_run(root, workload, run) as parts:
            try:
                for batch in iter_part_batches(parts, cols, batch_rows):
                    yielded = True
                    yield batch
                return
            except FileNotFoundError as err:
                if attempt or yielded:
                    raise _changed(parts, err) from err


def iter_part_batches(
    parts: RunParts, columns: list[str], batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The batches of every part of `parts`, in call order; a few batches are read ahead."""
    schema = _schema(columns)
    if not parts.names:
        return
    with _named(parts):
        dataset = _dataset(parts, schema)
        yield from dataset.to_batches(
            columns=columns, batch_size=batch_rows, batch_readahead=4, fragment_readahead=2
        )


# -------------------------------------------------------------------------------- call stacks


def _read_stacks_file(parts: RunParts) -> pa.Table:
    """The stacks table the summary names; an empty one where it names none (a run of traces
    without stacks, or converted before the stacks table existed)."""
    stacks = (parts.summary or {}).get(STACKS_KEY)
    if not isinstance(stacks, dict) or not stacks.get("file"):
        return STACKS_SCHEMA.empty_table()
    name = str(stacks["file"])
    path = (
        parts.handle.path(name) if parts.handle is not None else posixpath.join(parts.folder, name)
    )
    try:
        if parts.handle is not None:
            table = pq.read_table(path)
        else:
            with parts.fs.open(path, "rb") as f:
                table = pq.read_table(f)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as err:
        raise EventsReadError(
            f"{posixpath.join(parts.url, name)}: not a readable stacks table of {parts.label} "
            f"({err}); convert the run again (dataset flow with force)"
        ) from err
    return table.select(STACKS_SCHEMA.names).cast(STACKS_SCHEMA)


def read_stacks(root: Root, workload: str, run: str) -> pa.Table:
    """The run's call stacks (STACKS_SCHEMA: one row per (stack, depth), sorted so), the same
    commit as its events (the manifest rule); empty where the run has none. An event's `stack`
    is a row group's `stack` here (docs/dataset.md#call-stacks)."""
    for attempt in (0, 1):
        with RunParts.of_run(root, workload, run) as parts:
            try:
                return _read_stacks_file(parts)
            except FileNotFoundError as err:
                if attempt:
                    raise _changed(parts, err) from err
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class StackFrames:
    """A stacks table (STACKS_SCHEMA) for joins: `frames` the distinct frames (the stacks'
    contract, tasks.stacks.profile.Frames), and each stack's frames as rows of them, innermost
    first (`ids[k]`'s are `frame_rows[start[k]:start[k + 1]]`)."""

    frames: Frames
    ids: np.ndarray  # uint64, the stack ids, ascending
    start: np.ndarray  # int64 [len(ids) + 1]
    frame_rows: np.ndarray  # int32

    @classmethod
    def of_table(cls, table: pa.Table) -> StackFrames:
        """From a stacks table (sorted by stack, depth, as read_stacks gives it)."""
        t = table.unify_dictionaries().combine_chunks()
        stack = t.column("stack").to_numpy()
        offset = t.column("offset").to_numpy()
        module = _dictionary_codes(t.column("module"))
        function = _dictionary_codes(t.column("function"))
        mod_names = _dictionary_values(t.column("module"))
        fn_names = _dictionary_values(t.column("function"))
        # a frame is (module, offset, function): distinct rows of the three, numbered in their
        # order (as uint64: a null code last)
        inverse, uniq = distinct_rows(
            [module.astype(np.uint64), offset.astype(np.uint64), function.astype(np.uint64)]
        )
        frames = Frames(
            function=tuple(fn_names[int(f)] if f >= 0 else "" for f in uniq[:, 2].astype(np.int64)),
            module=tuple(mod_names[int(m)] if m >= 0 else "" for m in uniq[:, 0].astype(np.int64)),
            offset=uniq[:, 1].astype(np.uint64),
        )  # loops over distinct frames
        first = np.ones(len(stack), bool)
        first[1:] = stack[1:] != stack[:-1]
        at = np.flatnonzero(first)
        return cls(
            frames=frames,
            ids=stack[at],
            start=np.append(at, len(stack)).astype(np.int64),
            frame_rows=inverse.reshape(-1).astype(np.int32),
        )

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, stacks: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
        """The row (int64, into `ids`) of each event's stack; -1 for null or an id not here."""
        if isinstance(stacks, pa.ChunkedArray | pa.Array):
            valid = stacks.is_valid().to_numpy(zero_copy_only=False)
            stacks = stacks.fill_null(0).to_numpy(zero_copy_only=False)
        else:
            valid = np.ones(len(stacks), bool)
        return np.where(valid, rows_of(self.ids, stacks), -1)

    def of(self, stack: int) -> np.ndarray:
        """The frames (rows of `frames`, int32) of one stack id, innermost first; empty if it is
        not here."""
        k = int(self.index(np.array([stack], np.uint64))[0])
        if k < 0:
            return np.zeros(0, np.int32)
        return self.frame_rows[self.start[k] : self.start[k + 1]]

    def matrix(self, stacks: pa.Array | pa.ChunkedArray | np.ndarray, depth: int | None = None):
        """int32 [len(stacks), D]: each event's frames (rows of `frames`), innermost first, -1
        past its outermost frame and for an event without a stack; D: the deepest stack here
        (or `depth`). One numpy step a depth, not a loop over events."""
        k = self.index(stacks)
        length = np.diff(self.start)
        deepest = int(length.max(initial=0))
        d = deepest if depth is None else depth
        out = np.full((len(k), d), -1, np.int32)
        has = k >= 0
        base = self.start[np.maximum(k, 0)]
        n = np.where(has, length[np.maximum(k, 0)], 0) if len(length) else np.zeros(len(k), int)
        for i in range(min(d, deepest)):
            ok = n > i
            out[ok, i] = self.frame_rows[base[ok] + i]
        return out


def _dictionary_codes(column: pa.ChunkedArray) -> np.ndarray:
    """The int64 dictionary indices of a one-chunk dictionary column; -1 where null."""
    if column.num_chunks == 0:
        return np.zeros(0, np.int64)
    return column.chunk(0).indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _dictionary_values(column: pa.ChunkedArray) -> list[str]:
    return column.chunk(0).dictionary.to_pylist() if column.num_chunks else []


def read_stack_frames(root: Root, workload: str, run: str) -> StackFrames:
    """The run's stacks as StackFrames: `read_stack_frames(...).matrix(events["stack"])` gives
    every event's frames."""
    return StackFrames.of_table(read_stacks(root, workload, run))
