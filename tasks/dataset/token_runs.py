"""Per-thread token sequences of a run from the events dataset, and the positions that get scored.

A run's tokens are held as the trace itself: one flat uint8 array, the threads one after the
other (each ordered by `seq`), and `offsets` marking where each thread starts (n_threads + 1
entries). Scored positions are index arrays into that flat array, so no window is materialised.
Every stage that reads a run's calls in order (learning, the allocator's questions, whatif)
reads them here. A stage that reads each call's stack as well (the next-call network with
model.frame_depth) asks read_run for it: it comes with the tokens, cut with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from tasks.core.storage import Root
from tasks.dataset.events_reader import (
    EVENTS_DIR,
    EventsNotFound,
    StackFrames,
    has_dataset,
    read_stack_frames,
)
from tasks.dataset.events_reader import list_runs as list_events_runs
from tasks.dataset.events_reader import read_run as read_events_run
from tasks.dataset.tokens import N_TOKENS

T = TypeVar("T")

COLUMNS = ["pid", "thread", "seq", "token"]
# what read_run(..., stacks=True) reads besides: each call's stack, and what pairs a free with its block's
# allocation (the process's call order and the allocation's lifetime in calls)
STACK_COLUMNS = ["time_ns", "lifetime_calls", "stack"]


@dataclass(frozen=True)
class CallStacks:
    """Each call's stack, aligned with a TokenRun's tokens (TokenRun.stacks; read by
    read_run(..., stacks=True)): `rows[i]` is call i's row of
    frame_tokens.stack_tokens(frames, depth), 0 where it has none. A free, at which the tracer
    takes no stack, reads its block's allocation's (a free's next calls follow from where its
    block came from)."""

    rows: np.ndarray  # int32 [n], aligned with the run's tokens
    frames: StackFrames  # the run's stacks (read_stack_frames)

    def take(self, calls) -> CallStacks:
        """The stacks of the calls `calls` (a slice or a mask of the run's tokens)."""
        return CallStacks(self.rows[calls], self.frames)


@dataclass(frozen=True)
class TokenRun:
    """The token sequences of one run (or a part of one): flat tokens + thread offsets, and
    each call's stack where it was read (the next-call network with model.frame_depth), cut
    with the tokens."""

    workload: str
    run: str
    tokens: np.ndarray  # uint8 [n]
    offsets: np.ndarray  # int64 [n_threads + 1], offsets[0] == 0, offsets[-1] == n
    part: str = "all"  # "all", or "head"/"tail" when a run was cut for validation
    stacks: CallStacks | None = None

    def __post_init__(self) -> None:
        if self.offsets[0] != 0 or self.offsets[-1] != len(self.tokens):
            raise ValueError(f"{self.name}: offsets do not span the tokens")
        if self.stacks is not None and len(self.stacks.rows) != len(self.tokens):
            raise ValueError(f"{self.name}: {len(self.stacks.rows)} stack rows for its tokens")

    @property
    def name(self) -> str:
        suffix = "" if self.part == "all" else f"[{self.part}]"
        return f"{self.workload}/{self.run}{suffix}"

    @property
    def n_tokens(self) -> int:
        return int(len(self.tokens))

    @property
    def n_threads(self) -> int:
        return int(len(self.offsets) - 1)

    def thread_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def position_in_thread(self) -> np.ndarray:
        """For every token, its index within its thread (int64 [n])."""
        lengths = self.thread_lengths()
        return np.arange(self.n_tokens, dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)

    def head(self, max_tokens: int | None) -> TokenRun:
        """The first `max_tokens` tokens (whole threads in order, the last one cut); None: all."""
        if max_tokens is None or max_tokens >= self.n_tokens:
            return self
        offsets = np.concatenate([self.offsets[self.offsets < max_tokens], [max_tokens]])
        kept = (
            None
            if self.stacks is None
            else CallStacks(self.stacks.rows[:max_tokens], self.stacks.frames)
        )
        return TokenRun(self.workload, self.run, self.tokens[:max_tokens], offsets, self.part, kept)

    def split_tail(self, fraction: float) -> tuple[TokenRun, TokenRun]:
        """(head, tail): the time-ordered last `fraction` of every thread goes to the tail."""
        lengths = self.thread_lengths()
        tail_len = np.floor(lengths * fraction).astype(np.int64)
        head_len = lengths - tail_len
        in_head = self.position_in_thread() < np.repeat(head_len, lengths)
        head_off = np.concatenate([[0], np.cumsum(head_len)])
        tail_off = np.concatenate([[0], np.cumsum(tail_len)])
        stacks = self.stacks
        head_calls = None if stacks is None else stacks.take(in_head)
        tail_calls = None if stacks is None else stacks.take(~in_head)
        w, r = self.workload, self.run
        return (
            TokenRun(w, r, self.tokens[in_head], head_off, "head", head_calls),
            TokenRun(w, r, self.tokens[~in_head], tail_off, "tail", tail_calls),
        )


def concat_runs(runs: list[TokenRun], workload: str = "*", run: str = "*") -> TokenRun:
    """Several runs as one (threads never join: boundaries are kept)."""
    if not runs:
        return TokenRun(workload, run, np.zeros(0, np.uint8), np.zeros(1, np.int64))
    tokens = np.concatenate([r.tokens for r in runs])
    starts = np.cumsum([0] + [r.n_tokens for r in runs[:-1]])
    offsets = np.concatenate([r.offsets[:-1] + s for r, s in zip(runs, starts)] + [[len(tokens)]])
    return TokenRun(workload, run, tokens, offsets.astype(np.int64))


def list_runs(root: Root) -> dict[str, list[str]]:
    """{workload: sorted runs} of the events dataset (tasks.dataset.events_reader)."""
    if not has_dataset(root):
        raise EventsNotFound(
            f"{root.url_of(EVENTS_DIR)}: no events dataset; run the dataset flow first"
        )
    found: dict[str, list[str]] = {}
    for r in list_events_runs(root):
        found.setdefault(r.workload, []).append(r.run)
    return found


def read_run(
    root: Root, workload: str, run: str, max_tokens: int | None = None, stacks: bool = False
) -> TokenRun:
    """One run's tokens, per thread (per (pid, thread)), each thread ordered by seq; its first
    `max_tokens` (TokenRun.head) when given; with `stacks`, each call's stack (TokenRun.stacks:
    4 bytes a call and the run's frames, what the next-call network with model.frame_depth
    reads)."""
    table = read_events_run(root, workload, run, COLUMNS + (STACK_COLUMNS if stacks else []))
    tokens = token_run(table, workload, run)
    if stacks:
        frames = read_stack_frames(root, workload, run)
        rows = call_stack_rows(table, frames)
        order = thread_order(table)
        calls = CallStacks(rows if order is None else rows[order], frames)
        tokens = TokenRun(workload, run, tokens.tokens, tokens.offsets, stacks=calls)
    return tokens.head(max_tokens)


def event_stack_rows(
    frames: StackFrames, stack: pa.ChunkedArray | pa.Array | np.ndarray
) -> np.ndarray:
    """int32 [n]: each event's row of stack_tokens(frames, ...), 0 where it has no stack (a
    free, a trace without stacks, an id the stacks table lacks)."""
    return (frames.index(stack) + 1).astype(np.int32)


def call_stack_rows(
    table: pa.Table, frames: StackFrames, order: np.ndarray | None = None
) -> np.ndarray:
    """int32 [n], the table's row order: each event's row of stack_tokens(frames, ...), a free
    without a stack its block's allocation's (the row `lifetime_calls` calls of its process
    after the allocation, the process's calls ordered by time, thread and seq); 0: none.
    `order`: that process order where the caller has it (tasks.learning.labels.process_order)."""
    rows = event_stack_rows(frames, table.column("stack"))
    pid = table.column("pid").to_numpy().astype(np.int64)
    if order is None:
        order = np.lexsort(
            (table.column("seq").to_numpy(), table.column("thread").to_numpy(),
             table.column("time_ns").to_numpy(), pid)
        )  # fmt: skip
    life = table.column("lifetime_calls").fill_null(0).to_numpy().astype(np.int64)[order]
    p = pid[order]
    last = np.flatnonzero(np.append(p[1:] != p[:-1], True))  # each process's last call
    end = last[np.searchsorted(last, np.arange(len(p)))]
    at = np.arange(len(p)) + life
    alloc = np.flatnonzero((life > 0) & (at <= end))
    ordered = rows[order]
    free = at[alloc]
    borrow = ordered[free] == 0
    ordered[free[borrow]] = ordered[alloc[borrow]]
    rows[order] = ordered
    return rows


def thread_key(table: pa.Table) -> np.ndarray:
    """uint64 per row: its thread, (pid << 16) | thread (a run's threads in this key's order)."""
    pid = table.column("pid").to_numpy().astype(np.uint64)
    return (pid << np.uint64(16)) | table.column("thread").to_numpy().astype(np.uint64)


def thread_order(table: pa.Table) -> np.ndarray | None:
    """The rows of one run's events (columns pid, thread, seq) per thread, each by seq (the
    TokenRun's order); None where the table is in that order already."""
    seq = table.column("seq").to_numpy()
    key = thread_key(table)
    # Parts arrive in call order (a process's calls in time order, threads interleaved): sort
    # only when needed (a stable lexsort otherwise).
    if len(key) > 1 and not (
        np.all(key[1:] >= key[:-1]) and np.all((key[1:] != key[:-1]) | (seq[1:] > seq[:-1]))
    ):
        return np.lexsort((seq, key))
    return None


def token_run(table: pa.Table, workload: str, run: str) -> TokenRun:
    """The tokens of one run's events (columns pid, thread, seq, token; any row order), per
    thread (per (pid, thread)), each thread ordered by seq."""
    if table.num_rows == 0:
        raise ValueError(f"run {workload}/{run} has no events")
    token = table.column("token").to_numpy().astype(np.uint8)
    key = thread_key(table)
    order = thread_order(table)
    if order is not None:
        key, token = key[order], token[order]
    if int(token.max(initial=0)) >= N_TOKENS:
        raise ValueError(f"run {workload}/{run}: token {int(token.max())} outside 0..63")
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    offsets = np.concatenate([starts, [len(token)]]).astype(np.int64)
    return TokenRun(workload, run, token, offsets)


def head_rows(table: pa.Table, max_tokens: int | None) -> pa.Table:
    """The rows of one run's events (columns pid, thread, seq; any row order) whose tokens are
    `token_run(table, ...).head(max_tokens)`, in the table's row order: the part of a run the
    evaluation scores when data.max_eval_tokens caps it, which every stage that reads the same
    run beside the evaluation (the allocator's questions, whatif) reads too, so that their
    answers are made on the same calls. None, or a cap the run fits in: the table itself."""
    if max_tokens is None or table.num_rows <= max_tokens:
        return table
    order = np.lexsort((table.column("seq").to_numpy(), thread_key(table)))
    keep = np.zeros(table.num_rows, bool)
    keep[order[:max_tokens]] = True
    return table.filter(pa.array(keep))


class RunsRead(Mapping[tuple[str, str], T]):
    """(workload, run) -> `read(workload, run)` for the runs named, read when asked and never
    held: a caller keeps the runs it needs at once and lets the others go, so that a night's runs
    are not in memory together."""

    def __init__(self, runs: list[tuple[str, str]], read: Callable[[str, str], T]) -> None:
        self._runs = list(dict.fromkeys(runs))
        self._read = read

    def __getitem__(self, key: tuple[str, str]) -> T:
        if key not in self._runs:
            raise KeyError(key)
        return self._read(*key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, key: object) -> bool:
        return key in self._runs


def head_events(
    root: Root, runs: list[tuple[str, str]], columns: list[str], max_rows: int | None
) -> RunsRead[pa.Table]:
    """`columns` of each run's events cut to the rows of the tokens that `max_rows` keeps
    (head_rows): what a stage that answers beside the evaluation reads of each run."""
    cols = list(columns)
    return RunsRead(runs, lambda w, r: head_rows(read_events_run(root, w, r, cols), max_rows))


def eval_positions(run: TokenRun) -> np.ndarray:
    """Scored positions, defined once for every predictor: every token but a thread's first.

    Position p's label is tokens[p]; a predictor may look at tokens[p - k : p] of the same
    thread only.
    """
    pos = run.position_in_thread()
    return np.flatnonzero(pos >= 1).astype(np.int64)


@dataclass(frozen=True)
class ScoredRun:
    """A run as the next-call evaluation scored it: its events' rows (the first `max_tokens`
    calls when capped: head_rows), their token sequences and the scored positions. Every stage
    that answers on the same calls as the evaluation (the allocator's questions, whatif) reads
    a run so, and takes what it needs from here."""

    table: pa.Table
    tokens: TokenRun
    positions: np.ndarray  # eval_positions(tokens)
    frames: StackFrames | None = None  # the run's call stacks, where read (read_scored_run)

    @classmethod
    def of(
        cls, table: pa.Table, workload: str, run: str, frames: StackFrames | None = None
    ) -> ScoredRun:
        """The run whose rows `table` holds (columns pid, thread, seq, token; any order)."""
        tokens = token_run(table, workload, run)
        return cls(table, tokens, eval_positions(tokens), frames)


def read_scored_run(
    root: Root,
    workload: str,
    run: str,
    columns: tuple[str, ...] | list[str],
    max_tokens: int | None = None,
    part_column: str | None = None,
    stacks: bool = False,
) -> ScoredRun:
    """The run's `columns` (with those of its tokens) through the dataset's one reader, cut to
    the rows the evaluation scores (EventsNotFound when the run is not there); with `stacks`,
    its call stacks too (the `stack` column among `columns` names each row's)."""
    wanted = list(dict.fromkeys([*columns, *COLUMNS]))
    events = read_events_run(root, workload, run, wanted, part_column=part_column)
    frames = read_stack_frames(root, workload, run) if stacks else None
    return ScoredRun.of(head_rows(events, max_tokens), workload, run, frames)
